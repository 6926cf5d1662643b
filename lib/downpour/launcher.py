"""``run_downpour``: one job on a ``LocalCluster``, with faults injected and every restart done for you.

The chief is ``python -m downpour`` with the chief's ``TF_CONFIG``, like every task. Faults for experiments are
not part of the job: ``run_downpour(job, faults=Faults(worker_at=..., ps_at=..., chief_at=...))``. ``worker_at``
kills worker 0 (a supervisor would start it again; the coordinator reconnects); ``ps_at`` kills a ps task (one
that does not hold the update counter, when there are two), restarts it and the chief with ``--resume``;
``chief_at`` kills the chief and restarts it with ``--resume``.

``run_downpour(DownpourConfig(data="downpour.data:idx", data_kwargs={"folder": "build/mnist"}, workers=2, ps=2))``
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from downpour.config import DownpourConfig
from downpour.faults import EXIT_PS_LOST
from downpour.jsonio import read_json
from downpour.local import LocalCluster
from downpour.result import DownpourResult


@dataclass(frozen=True)
class Faults:
    """Faults ``run_downpour`` injects, each at an update count (None: never). ``Faults(worker_at=6, ps_at=36)``

    ``worker_at`` kills worker 0 and starts it again; ``ps_at`` kills a ps task once the counter is past both
    ``ps_at`` and the last checkpoint, restarts it, then the chief with ``--resume``; ``chief_at`` kills the chief
    and restarts it with ``--resume``.

    The faults come one at a time, in the order the job sees them: a worker is started again only once the chief
    has said it lost (a worker back before the chief looked is taken back silently, by design), a killed chief
    only once every ps task has said it has gone, and the next fault waits for the restarted chief. Each event
    says whether it was ``acknowledged`` (False: not seen within ``ACK_TIMEOUT_S``, and the launcher went on).
    """

    worker_at: int | None = None
    ps_at: int | None = None
    chief_at: int | None = None

    def check(self, config: DownpourConfig) -> None:
        """A ``ValueError`` when the job cannot survive these faults (one worker; no checkpoints)."""
        from downpour.checks import check_positive_int

        for name in ("worker_at", "ps_at", "chief_at"):
            if getattr(self, name) is not None:
                check_positive_int(f"faults.{name}", getattr(self, name))
        if self.worker_at is not None and config.workers < 2:
            raise ValueError("faults.worker_at: needs workers >= 2, so that training can go on without one")
        for name in ("ps_at", "chief_at"):
            if getattr(self, name) is not None and not config.checkpoint_every:
                raise ValueError(f"faults.{name}: needs checkpoint_every > 0, so that the job can come back from a "
                                 "checkpoint")


# ----------------------------------------------------------------------------------------------------------
# The launcher: a LocalCluster, the chief, faults and restarts

ACK_TIMEOUT_S = 60.0
"""How long the launcher waits for the job to see a fault before it goes on (the event says ``acknowledged``)."""


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, read from ``/proc``; None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_downpour(config: DownpourConfig, cluster: Any = None, timeout_s: float = 600.0,
                 faults: Faults | None = None) -> DownpourResult:
    """Run one job on a ``LocalCluster`` (a new one, or ``cluster`` with enough tasks) and return its measurements.

    The chief is ``python -m downpour`` with the chief's ``TF_CONFIG`` (the job's first ``ps`` and
    ``workers`` tasks). ``faults`` (``Faults``) are injected as the job runs (a ps kill waits until the counter is
    past the last checkpoint, so the kill loses updates that the restart must redo); every restart is done here.
    Tasks found dead are restarted before a job. A chief that fails ends this with a ``RuntimeError`` of one line
    naming its log. ``run_downpour(DownpourConfig(data="downpour.data:idx", data_kwargs={"folder": "m"}, workers=2))``
    """
    faults = faults if faults is not None else Faults()
    faults.check(config)
    from downpour.data import dataset_function

    dataset_function(config)  # a job that names no data, or data that cannot be imported: a ValueError now
    if cluster is None:
        with LocalCluster(config.workers, config.ps, start_timeout=config.start_timeout) as own:
            result = _launch(config, own, timeout_s, faults)
        return dataclasses.replace(result, pids=own.pids)
    return _launch(config, cluster, timeout_s, faults)


def _launch(config: DownpourConfig, cluster: Any, timeout_s: float, injected: Faults) -> DownpourResult:
    if len(cluster.spec["worker"]) < config.workers or len(cluster.spec["ps"]) < config.ps:
        raise ValueError(f"run_downpour: the cluster has {len(cluster.spec['worker'])} worker and "
                         f"{len(cluster.spec['ps'])} ps tasks; the job needs {config.workers} and {config.ps}")
    for job, count in (("ps", config.ps), ("worker", config.workers)):
        for i in range(count):
            if cluster.processes[(job, i)].poll() is not None:
                cluster.restart(job, i)
    spec = {"chief": cluster.spec["chief"], "ps": cluster.spec["ps"][:config.ps],
            "worker": cluster.spec["worker"][:config.workers]}
    tasks = {f"{job}:{i}": cluster.processes[(job, i)].pid for job in ("ps", "worker") for i in range(len(spec[job]))}
    with tempfile.TemporaryDirectory(prefix="downpour-job-") as tmp:
        job = asdict(dataclasses.replace(config,
                                         checkpoint_dir=config.checkpoint_dir or str(Path(tmp) / "checkpoints")))
        job_path, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        progress = Path(f"{out}.progress.json")
        job_path.write_text(json.dumps(job))
        cpu_before = {name: cpu_seconds(pid) for name, pid in tasks.items()}
        # --ps-wait 0: a lost ps ends the chief (exit 75) and this launcher restarts the ps, then the chief, so that
        # each injected fault is one event it can account for (python -m downpour local leaves it to the chief)
        args = ("--job", str(job_path), "--out", str(out), "--ps-wait", "0")
        chief = cluster.start_chief(args, spec=spec)
        started = time.monotonic()
        faults = [f for f in (("worker", 0, injected.worker_at), ("ps", None, injected.ps_at),
                              ("chief", 0, injected.chief_at)) if f[2] is not None]
        events: list[dict[str, Any]] = []
        pending: dict[str, Any] | None = None  # the last fault injected, until the job has acknowledged it
        ps_down: tuple[int, float] | None = None
        cpu_steady: dict[str, float | None] | None = None
        cpu_finished: dict[str, float | None] | None = None

        def restart_chief() -> Any:
            progress.unlink(missing_ok=True)  # the next fault waits for the new chief's own progress
            return cluster.start_chief(args + ("--resume",), spec=spec)

        while True:
            # while a killed chief waits to be seen gone, it is not the job's chief: its exit code tells nothing
            code = None if pending is not None and pending["job"] == "chief" else chief.poll()
            state = read_json(progress, {})
            if cpu_steady is None and state.get("steady") and not events:
                cpu_steady = {name: cpu_seconds(pid) for name, pid in tasks.items()}
            if cpu_finished is None and state.get("finished") and not events:
                cpu_finished = {name: cpu_seconds(pid) for name, pid in tasks.items()}
            if code is None:
                if pending is not None:  # one fault at a time: the next waits until this one was seen
                    seen = _acknowledged(pending, state, cluster, spec)
                    if not seen and time.monotonic() - pending["at"] < ACK_TIMEOUT_S:
                        time.sleep(0.1)
                        continue
                    pending["event"]["acknowledged"] = seen
                    if pending["job"] == "worker":  # a supervisor starts it again; the coordinator reconnects
                        cluster.restart("worker", pending["index"], wait=False)
                    elif pending["job"] == "chief":
                        chief = restart_chief()
                    pending = None
                    continue
                for fault in list(faults):
                    if ps_down is not None:
                        break
                    job_name, index, at = fault
                    if state.get("version", 0) < at:
                        continue
                    if job_name == "ps" and state.get("version", 0) <= (state.get("checkpoint_version") or 0):
                        continue  # the counter sits on the last checkpoint: a kill now would lose no update
                    faults.remove(fault)
                    if job_name == "ps":
                        holder = state.get("version_task") or "ps:0"
                        index = next((i for i in range(config.ps) if f"ps:{i}" != holder), 0)
                    event = {"killed": f"{job_name}:{index}", "version_seen": state.get("version"),
                             "checkpoint_version": state.get("checkpoint_version"),
                             "seconds": time.monotonic() - started}
                    events.append(event)
                    mark = cluster.mark()
                    cluster.kill(job_name, index)
                    if job_name == "chief":
                        # the killed chief may have written a checkpoint after the progress file was read
                        event["checkpoint_version"] = read_json(Path(job["checkpoint_dir"]) / "latest.json", {}).get(
                            "version", event["checkpoint_version"])
                        event["restarted"] = "chief --resume"
                    elif job_name == "worker":
                        event["restarted"] = f"worker:{index} (the coordinator reconnects when it listens)"
                    else:
                        ps_down = (index, time.monotonic())
                    if job_name != "ps":  # a lost ps is acknowledged by the chief's exit code
                        pending = {"job": job_name, "index": index, "event": event, "mark": mark,
                                   "at": time.monotonic()}
                    break
                if ps_down is not None and time.monotonic() - ps_down[1] > 90:
                    cluster.kill("chief", 0)  # it did not notice the lost ps in time; treat it as lost anyway
                    continue
                if time.monotonic() - started > timeout_s:
                    cluster.keep_logs = True  # the message names them
                    raise TimeoutError(f"run_downpour: the job did not finish within {timeout_s:g} s; "
                                       f"chief log: {cluster.log_tail('chief', 0)}")
                time.sleep(0.1)
                continue
            if pending is not None and pending["job"] == "worker":  # the chief ended before it saw the worker go
                pending["event"]["acknowledged"] = False
                cluster.restart("worker", pending["index"], wait=False)
                pending = None
            if code == 0:
                break
            if ps_down is not None and code in (EXIT_PS_LOST, -9):
                index, _ = ps_down
                failure = state.get("failure", {})
                events[-1].update({"chief_exit": code, "acknowledged": code == EXIT_PS_LOST, **{
                    k: failure.get(k) for k in ("version_at_failure", "last_polled_version", "checkpoint_version",
                                                "error")}})
                cluster.restart("ps", index)
                events[-1]["restarted"] = f"ps:{index}, then chief --resume"
                ps_down = None
                chief = restart_chief()
                continue
            said = [line for line in cluster.log_tail("chief", 0, 4000).splitlines() if line.startswith("downpour:")]
            how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            last = said[-1] if said else f"it said nothing (full log: {cluster.full_log('chief', 0)})"
            cluster.keep_logs = True  # the message names them
            raise RuntimeError(f"run_downpour: the chief failed ({how}): {last}")
        result = DownpourResult.from_dict(json.loads(out.read_text()))
    cpu_after = {name: cpu_seconds(pid) for name, pid in tasks.items()}

    def used(start: dict[str, float | None] | None, end: dict[str, float | None] | None) -> dict[str, float | None]:
        return {name: (None if not start or not end or start[name] is None or end[name] is None
                       else end[name] - start[name]) for name in tasks}

    return dataclasses.replace(
        result, faults=events,
        task_cpu_s=used(cpu_before, cpu_after),  # CPU seconds of each server task during the job
        steady_task_cpu_s=used(cpu_steady, cpu_finished),  # ... during the timed (steady) window
        pids=cluster.pids,
        worker_limits=(f"each worker: intra_op_parallelism_threads={cluster.worker_threads}"
                       + (", pinned to one core (os.sched_setaffinity)" if cluster.pin_workers
                          and cluster.worker_threads == 1 and hasattr(os, "sched_setaffinity") else "")))


def _acknowledged(pending: dict[str, Any], state: dict[str, Any], cluster: Any, spec: dict[str, list[str]]) -> bool:
    """Whether the job has seen the fault ``pending``: the chief said the killed worker lost (its progress file
    lists it), or every ps task of the job said that the killed chief has gone (a worker started again just before
    may not have seen the chief yet, so it is not asked)."""
    if pending["job"] == "worker":
        return f"worker:{pending['index']}" in state.get("workers_lost", [])
    return all("has gone" in cluster.said("ps", i, since=pending["mark"]) for i in range(len(spec["ps"])))
