"""One entry point for every task of an asynchronous parameter-server job: ps, worker and chief.

::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}'     python -m study.ps_roles
    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' python -m study.ps_roles
    TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}'  python -m study.ps_roles \\
        --job '{"model": "study.models:deep_mnist_cnn", "steps": 400}' --out result.json

A ps or worker task serves until it is killed. The chief is the coordinator: it reads the job (a JSON
object of ``DownpourConfig`` fields, or a path to one), waits for every task (a timeout names the missing
ones), builds the variables on the ps tasks, schedules the Downpour worker loop and writes its measurements
to ``--out``. ``LocalCluster`` runs exactly these commands; ``docs/parameter_server.md`` walks through
running them by hand in several terminals, then on several machines.

Exit codes: 0 done; 2 bad ``TF_CONFIG`` or job; 3 tasks unreachable; 75 a ps task was lost (restart it and
the chief with ``--resume``: the chief restores the last checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_PS_LOST = 75


def read_job(text: str) -> dict:
    """The job as a dict, from JSON text or a path to a JSON file. ``read_job('{"steps": 80}')``"""
    candidate = Path(text)
    if not text.lstrip().startswith("{") and candidate.is_file():
        text = candidate.read_text()
    try:
        job = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--job: not a JSON object or a path to one ({e})") from None
    if not isinstance(job, dict):
        raise ValueError(f"--job: expected a JSON object of DownpourConfig fields; got {type(job).__name__}")
    return job


def main(argv: list[str] | None = None) -> int:
    """``python -m study.ps_roles [--job JOB --out OUT [--resume]]``: run the task ``TF_CONFIG`` describes."""
    parser = argparse.ArgumentParser(prog="python -m study.ps_roles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", help="chief only: DownpourConfig fields as JSON, or a path to a JSON file")
    parser.add_argument("--out", help="chief only: where to write the measurements (JSON)")
    parser.add_argument("--resume", action="store_true", help="chief only: restore the last checkpoint first")
    parser.add_argument("--worker-threads", type=int, default=1, help="worker only: intra-op threads (default 1)")
    parser.add_argument("--no-pin", action="store_true", help="worker only: do not pin a 1-thread worker to a core")
    parser.add_argument("--local", action="store_true", help=argparse.SUPPRESS)  # started by LocalCluster
    args = parser.parse_args(argv)
    from study.cluster import parse_tf_config, serve

    try:
        config = parse_tf_config()
    except ValueError as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    role = config["task"]["type"]
    if role in ("ps", "worker"):
        if args.worker_threads < 1:
            print(f"study.ps_roles: --worker-threads: expected an integer >= 1; got {args.worker_threads}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        serve(config, orphan_guard=args.local, worker_threads=args.worker_threads, pin=not args.no_pin)
        return 0
    if role != "chief":
        print(f"study.ps_roles: task type {role!r} has no role here; use chief, ps or worker", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.job:
        print("study.ps_roles: the chief needs --job (DownpourConfig fields as JSON, or a path to a JSON file)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    from study import parameter_server

    if args.local:
        from study.cluster import exit_with_parent

        exit_with_parent()
    try:
        job = parameter_server.DownpourConfig(**read_job(args.job))
    except (TypeError, ValueError) as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    code = parameter_server.run_chief(job, config["cluster"], out=args.out, resume=args.resume)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the distributed runtime's teardown would wait on tasks that may be gone


if __name__ == "__main__":
    sys.exit(main())
