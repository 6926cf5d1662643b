"""``python -m downpour local``: every task of a job on this machine, and each started again when it dies.

::

    python -m downpour local --job job.json --workers 2 --ps 2 [--out result.json] [--max-restarts 3]

One command runs the ps tasks, the workers and the chief (each ``python -m downpour`` with its ``TF_CONFIG``, on
127.0.0.1, through ``LocalCluster``) and supervises them, as ``torchrun --max-restarts`` does: a ps or worker task
that exits is started again on its port; a chief that fails is started again with ``--resume``; after
``--max-restarts`` restarts in all, the next death ends the job (exit 1, one line). A lost ps task needs nothing
more: the chief waits for it (``--ps-wait``), restores the last checkpoint onto it and goes on by itself.

The terminal shows each task's one-line messages (``downpour: ...``) and the chief's progress; this command's own
lines start with ``local:``. For each ps task started again it measures the seconds from that restart to the next
update applied, and the updates redone (applied after the restored checkpoint, before the fault); they are printed
and added to ``--out`` as ``recoveries``. Exit code: the chief's (0 when the job is done); 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROG = "python -m downpour local"
POLL_S = 0.2


def _parser() -> argparse.ArgumentParser:
    from downpour.faults import PS_WAIT_S

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", required=True, help="DownpourConfig fields as JSON, or a path to a JSON file")
    parser.add_argument("--workers", type=int, help="worker tasks (default: the job's workers)")
    parser.add_argument("--ps", type=int, help="ps tasks (default: the job's ps)")
    parser.add_argument("--out", help="where the chief writes the measurements (JSON)")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="restarts of any task, in all, before the next death ends the job (default 3)")
    parser.add_argument("--ps-wait", type=float, default=PS_WAIT_S, metavar="SECONDS",
                        help=f"how long the chief waits for a lost ps task (default {PS_WAIT_S:g})")
    parser.add_argument("--worker-threads", type=int, default=1, help="intra-op threads per worker (default 1)")
    parser.add_argument("--ps-threads", type=int, default=1, help="intra-op threads per ps task (default 1)")
    return parser


def _say(message: str) -> None:
    print(f"local: {message}", flush=True)


class _Follow:
    """New lines of each task's terminal log, printed here: every task's ``downpour:`` lines, the chief's all."""

    def __init__(self, logs: Path):
        self.logs, self.offsets = logs, {}

    def __call__(self) -> None:
        for path in sorted(self.logs.glob("*.log")):
            task = path.stem
            if "-" in task:  # <job>-<index>-<port>.log: TensorFlow's own output, not the task's terminal
                continue
            with open(path, errors="replace") as log:
                log.seek(self.offsets.get(task, 0))
                text = log.read()
            complete = text[:text.rfind("\n") + 1]
            self.offsets[task] = self.offsets.get(task, 0) + len(complete.encode())
            for line in complete.splitlines():
                # a task's lines about the chief are this command's business (it restarts the chief), not news
                if task.startswith("chief") or (line.startswith("downpour:") and ": the chief (" not in line):
                    print(line, flush=True)


def _progress(out: Path) -> dict[str, Any]:
    from downpour.jsonio import read_json

    return read_json(f"{out}.progress.json", {})


def main(argv: list[str] | None = None) -> int:
    """Run the job on this machine under supervision; returns the exit code."""
    from downpour import faults
    from downpour.checks import check_positive_int
    from downpour.config import DownpourConfig, read_job

    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and faults.EXIT_BAD_INPUT
    try:
        job = read_job(args.job)  # checked by the chief (exit 2, not restarted): this process loads no TensorFlow
        job.update({k: v for k, v in (("workers", args.workers), ("ps", args.ps)) if v is not None})
        sizes = {name: job.get(name, getattr(DownpourConfig, name)) for name in ("workers", "ps", "start_timeout")}
        for name in ("workers", "ps"):
            check_positive_int(name, sizes[name])
        for name in ("worker_threads", "ps_threads"):
            check_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
        if args.max_restarts < 0 or not args.ps_wait >= 0:
            raise ValueError("--max-restarts and --ps-wait: expected numbers >= 0")
    except ValueError as e:
        print(f"downpour: {e}", file=sys.stderr, flush=True)
        return faults.EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(prefix="downpour-local-") as tmp:
        out = Path(args.out).resolve() if args.out else Path(tmp) / "result.json"
        for stale in (f"{out}.progress.json", f"{out}.faults.json"):
            Path(stale).unlink(missing_ok=True)
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        from downpour.bind import BindError

        try:
            return _supervise(sizes, job_path, out, args)
        except BindError as e:  # no C compiler: the tasks cannot be kept on 127.0.0.1
            print(f"downpour: local: {e}", file=sys.stderr, flush=True)
            return faults.EXIT_BAD_INPUT
        except KeyboardInterrupt:
            print("downpour: local: stopped by Ctrl-C (SIGINT), every task ended, exit code 130", flush=True)
            return 130


def _supervise(sizes: dict[str, Any], job_path: Path, out: Path, args: argparse.Namespace) -> int:
    from downpour.jsonio import read_json, write_json_atomic
    from downpour.local import LocalCluster

    restarts: list[dict[str, Any]] = []
    recoveries: list[dict[str, Any]] = []
    with LocalCluster(sizes["workers"], sizes["ps"], start_timeout=sizes["start_timeout"],
                      worker_threads=args.worker_threads, ps_threads=args.ps_threads) as cluster:
        follow = _Follow(cluster.logs)
        for (job, index), process in sorted(cluster.processes.items()):
            _say(f"{job}:{index} at {cluster.spec[job][index]}, pid {process.pid}")
        chief_args = ("--job", str(job_path), "--out", str(out), "--ps-wait", f"{args.ps_wait:g}")
        chief = cluster.start_chief(chief_args)
        _say(f"chief at {cluster.spec['chief'][0]}, pid {chief.pid}; logs in {cluster.logs}")
        watching: list[dict[str, Any]] = []  # ps tasks started again, until the job's next applied update
        code = None
        while code is None:
            time.sleep(POLL_S)
            follow()
            state = _progress(out)
            for w in list(watching):
                restored = state.get("restored_version") or 0
                if state.get("chief_started", 0) > w["restarted_at"] and state.get("version", 0) > restored:
                    w["next_update_s"] = time.monotonic() - w["restarted"]
                    w["restored_version"] = restored
                    watching.remove(w)
                    recoveries.append(w)
                    _say(f"{w['task']} is back: the next update was applied {w['next_update_s']:.1f} s after its "
                         f"restart (from the checkpoint of update {restored})")
            for (job, index), process in sorted(cluster.processes.items()):
                if job == "chief" or process.poll() is None:
                    continue
                task = f"{job}:{index}"
                if len(restarts) >= args.max_restarts:
                    _say(f"{task} exited with code {process.returncode}; no restart left (--max-restarts "
                         f"{args.max_restarts}): ending the job (logs kept in {cluster.logs})")
                    cluster.keep_logs = True
                    follow()
                    return 1
                restarts.append({"task": task, "exit": process.returncode, "at": time.time()})
                _say(f"{task} exited with code {process.returncode}; starting it again (restart {len(restarts)} "
                     f"of {args.max_restarts})")
                cluster.restart(job, index, wait=False)
                if job == "ps":
                    watching.append({"task": task, "restarted": time.monotonic(), "restarted_at": time.time()})
            status = chief.poll()
            if status is None:
                continue
            follow()
            if status == 0:
                code = 0
            elif len(restarts) < args.max_restarts and status not in (2, 4):  # not a bad job, not a refused resume
                restarts.append({"task": "chief:0", "exit": status, "at": time.time()})
                _say(f"the chief exited with code {status}; starting it again with --resume (restart "
                     f"{len(restarts)} of {args.max_restarts})")
                chief = cluster.start_chief((*chief_args, "--resume"))
            else:
                cluster.keep_logs = True
                _say(f"the chief exited with code {status}; ending the job (logs kept in {cluster.logs})")
                return status
    lost = read_json(f"{out}.faults.json", [])
    for r in recoveries:  # the updates redone: applied after the restored checkpoint, before the fault
        failure = next((f for f in lost if f"{r['task']}" in f.get("lost", [])), None) or (lost[-1] if lost else {})
        seen = failure.get("version_at_failure")
        seen = seen if seen is not None else failure.get("last_polled_version")
        r.update(failure=failure, updates_redone=None if seen is None else max(0, seen - r["restored_version"]))
        del r["restarted"]
        _say(f"{r['task']}: updates redone {r['updates_redone']}, next update {r['next_update_s']:.1f} s after the "
             "restart")
    result = read_json(out, None)
    if result is not None:
        write_json_atomic(out, {**result, "restarts": restarts, "recoveries": recoveries})
    return 0
