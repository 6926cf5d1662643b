"""Asynchronous Downpour SGD (Dean et al. 2012) for any Keras model, on TensorFlow's parameter-server runtime.

The model stays a Keras model; its variables become plain ``tf.Variable`` s on the ps tasks (large ones split
over them by a ``MinSizePartitioner``), and workers run it with ``keras.Model.stateless_call`` on values. The
chief (a ``ClusterCoordinator``) schedules the Downpour worker loop (``worker_function``) on the workers:

* fetch: read every parameter from the ps into a local copy, every ``n_fetch`` steps;
* compute: the gradients of one minibatch of the worker's own shard of the data, on the local copy;
  take the local step ``w -= lr * g`` and add ``g`` to an accumulator;
* transform and push, every ``n_push`` steps: ``T(sum g)`` (any ``"module:function"``) goes to the ps, which
  applies it as ``v -= lr * T(g)`` (``freezing.gradients.apply``) or with per-parameter Adagrad, next to the
  variable, and bumps a version counter.

Staleness of a push = updates the other workers applied between this worker's fetch and this push. Every
task is ``python -m study.ps_roles`` with a ``TF_CONFIG`` (``study.ps_roles``); ``run_downpour(config)`` starts
them on this machine with ``LocalCluster``, runs the chief, injects faults (a killed worker, ps task or
chief), restarts what was killed, and returns the chief's measurements.

``DownpourConfig(n_fetch=1, n_push=1)`` is the plain asynchronous SGD of the earlier version of this module.

The code: ``ps_config`` (the job), ``ps_variables`` (variables on the ps, the worker loop), ``ps_chief``
(the chief), and here the launcher (``run_downpour``) and the local baseline (``local_steps_per_s``);
every public name is importable from this module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from study.ps_chief import run_chief  # noqa: F401
from study.ps_config import OPTIMIZERS, DownpourConfig, load_callable  # noqa: F401
from study.ps_variables import PsVariables, build_model, load_data, make_dataset, with_values, worker_function  # noqa: F401


# ----------------------------------------------------------------------------------------------------------
# The launcher: a LocalCluster, the chief, faults and restarts


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


_MNIST: dict[int, Any] = {}


def _mnist_npz(seed: int, path: Path) -> str:
    """Write this process's ``load_mnist(seed=seed)`` (loaded once) as the job's ``data`` file."""
    import numpy as np

    if seed not in _MNIST:
        from study.data import load_mnist

        _MNIST[seed] = load_mnist(seed=seed)
    d = _MNIST[seed]
    np.savez(path, x_train=d.x_train, y_train=d.y_train, x_test=d.x_test, y_test=d.y_test)
    return str(path)


def run_downpour(config: DownpourConfig, cluster: Any = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one job on a ``LocalCluster`` (a new one, or ``cluster`` with enough tasks) and return its measurements.

    The chief is ``python -m study.ps_roles`` with the chief's ``TF_CONFIG`` (the job's first ``ps`` and
    ``workers`` tasks). Faults: ``kill_worker_at`` kills worker 0; ``kill_ps_at`` kills a ps task (one that does
    not hold the version counter, when there are two), restarts it, and restarts the chief with ``--resume``;
    ``kill_chief_at`` kills the chief and restarts it with ``--resume``. Tasks found dead are restarted before a job.
    ``run_downpour(DownpourConfig(workers=2, steps=200))``
    """
    from study.cluster import LocalCluster

    if cluster is None:
        with LocalCluster(config.workers, config.ps, start_timeout=config.start_timeout) as own:
            result = _launch(config, own, timeout_s)
        result["pids"] = own.pids
        return result
    return _launch(config, cluster, timeout_s)


def _launch(config: DownpourConfig, cluster: Any, timeout_s: float) -> dict[str, Any]:
    from study import ps_roles
    from study.reporting import read_json

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
    with tempfile.TemporaryDirectory(prefix="freezing-downpour-") as tmp:
        data = config.data or _mnist_npz(config.seed, Path(tmp) / "data.npz")  # the chief skips loading MNIST
        job = asdict(dataclasses.replace(config, data=data,
                                         checkpoint_dir=config.checkpoint_dir or str(Path(tmp) / "checkpoints")))
        job_path, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        progress = Path(f"{out}.progress.json")
        job_path.write_text(json.dumps(job))
        cpu_before = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
        args = ("--job", str(job_path), "--out", str(out))
        chief = cluster.start_chief(args, spec=spec)
        started = time.monotonic()
        faults = [f for f in (("worker", 0, config.kill_worker_at), ("ps", None, config.kill_ps_at),
                              ("chief", 0, config.kill_chief_at)) if f[2] is not None]
        events: list[dict[str, Any]] = []
        ps_down: tuple[int, float] | None = None
        cpu_steady: dict[str, float | None] | None = None
        cpu_finished: dict[str, float | None] | None = None
        while True:
            code = chief.poll()
            state = read_json(progress, {})
            if cpu_steady is None and state.get("steady") and not events:
                cpu_steady = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
            if cpu_finished is None and state.get("finished") and not events:
                cpu_finished = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
            if code is None:
                for fault in list(faults):
                    job_name, index, at = fault
                    if state.get("version", 0) < at:
                        continue
                    faults.remove(fault)
                    if job_name == "ps":
                        holder = state.get("version_task") or "ps:0"
                        index = next((i for i in range(config.ps) if f"ps:{i}" != holder), 0)
                    event = {"killed": f"{job_name}:{index}", "version_seen": state.get("version"),
                             "checkpoint_version": state.get("checkpoint_version"),
                             "seconds": time.monotonic() - started}
                    if job_name == "chief":
                        cluster.kill("chief", 0)
                        event["restarted"] = "chief --resume"
                        events.append(event)
                        chief = cluster.start_chief(args + ("--resume",), spec=spec)
                    elif job_name == "worker":  # a supervisor starts it again; the coordinator reconnects to it
                        cluster.kill("worker", index)
                        cluster.restart("worker", index, wait=False)
                        event["restarted"] = "worker:0 (the coordinator reconnects when it listens)"
                        events.append(event)
                    else:
                        cluster.kill(job_name, index)
                        events.append(event)
                        ps_down = (index, time.monotonic())
                    break
                if ps_down is not None and time.monotonic() - ps_down[1] > 90:
                    cluster.kill("chief", 0)  # it did not notice the lost ps in time; treat it as lost anyway
                    continue
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"run_downpour: the job did not finish within {timeout_s:g} s; "
                                       f"chief log: {cluster.log_tail('chief', 0)}")
                time.sleep(0.1)
                continue
            if code == 0:
                break
            if ps_down is not None and code in (ps_roles.EXIT_PS_LOST, -9):
                index, _ = ps_down
                failure = state.get("failure", {})
                events[-1].update({"chief_exit": code, **{k: failure.get(k) for k in (
                    "version_at_failure", "last_polled_version", "checkpoint_version", "error")}})
                cluster.restart("ps", index)
                events[-1]["restarted"] = f"ps:{index}, then chief --resume"
                ps_down = None
                chief = cluster.start_chief(args + ("--resume",), spec=spec)
                continue
            raise RuntimeError(f"run_downpour: the chief failed (exit {code}): {cluster.log_tail('chief', 0, 1500)}")
        result = json.loads(out.read_text())
    result["faults"] = events
    cpu_after = {name: _cpu_seconds(pid) for name, pid in tasks.items()}

    def used(start: dict[str, float | None] | None, end: dict[str, float | None] | None) -> dict[str, float | None]:
        return {name: (None if not start or not end or start[name] is None or end[name] is None
                       else end[name] - start[name]) for name in tasks}

    result["task_cpu_s"] = used(cpu_before, cpu_after)  # CPU seconds of each server task during the job
    result["steady_task_cpu_s"] = used(cpu_steady, cpu_finished)  # ... during the timed (steady) window
    result["pids"] = cluster.pids
    result["worker_limits"] = (f"each worker: intra_op_parallelism_threads={cluster.worker_threads}"
                               + (", pinned to one core (os.sched_setaffinity)" if cluster.pin_workers
                                  and cluster.worker_threads == 1 and hasattr(os, "sched_setaffinity") else ""))
    return result


# ----------------------------------------------------------------------------------------------------------
# The same worker loop without a cluster: the baseline of the overhead measurement


def local_steps_per_s(config: DownpourConfig, functions: int = 8, repeats: int = 3, threads: int = 1,
                      core: int | None = 0) -> dict[str, Any]:
    """Run ``worker_function`` in this process on local variables (no ps, no network); steps/s per repeat.

    The process is limited like a worker: ``threads`` intra-op threads and, with ``core``, pinned to that core
    (call it in a fresh process: TensorFlow's thread pools are fixed once it has run an op).
    ``local_steps_per_s(DownpourConfig(n_fetch=4, n_push=4, steps_per_function=8))``
    """
    limits = f"intra_op_parallelism_threads={threads}"
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[core % len(os.sched_getaffinity(0))]})
        limits += f", pinned to core {core}"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(4)
    x_train, y_train, _, _ = load_data(config)
    model = build_model(config)
    ps = PsVariables(model, config)
    fn = worker_function(model, ps, config, lambda: tf.constant(0, tf.int64))
    iterator = iter(make_dataset(x_train, y_train, config, 1, 0))
    for _ in range(2):  # trace and warm up
        out = fn(iterator)
    int(out["versions"][-1])
    rates, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(functions):
            out = fn(iterator)
        int(out["versions"][-1])
        steps = functions * config.steps_per_function
        rates.append(steps / (time.perf_counter() - start))
        cpu.append((time.process_time() - start_cpu) / steps)
    return {"steps_per_s": rates, "cpu_s_per_step": cpu, "limits": limits, "final_version": int(ps.version.numpy())}
