"""One entry point for every task of an asynchronous parameter-server job: ``python -m study.ps``.

::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}'     python -m study.ps [--bind ADDRESS]
    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' python -m study.ps [--bind ADDRESS]
    TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}'  python -m study.ps \\
        --job job.json --out result.json [--resume] [--bind ADDRESS]

A ps or worker task serves until it is killed; it imports no job code (the chief sends graphs). The chief is
the coordinator: it reads the job (a JSON object of ``DownpourConfig`` fields, or a path to one), waits for
every task (a timeout names the missing ones), puts the variables on the ps tasks, schedules the Downpour worker
loop and writes its measurements to ``--out``. ``--bind`` makes the task listen on that address only
(``study.ps.bind``). ``LocalCluster`` runs exactly these commands; ``docs/parameter_server.md`` walks through
running them by hand, on one machine and on several.

Exit codes (``study.ps.faults``): 0 done; 1 the chief failed (message and traceback); 2 bad ``TF_CONFIG``, flag,
job or data file; 3 tasks unreachable; 4 ``--resume`` refused (checkpoint and sidecar disagree); 75 a ps task
was lost (restart it, then the chief with ``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys

from study.ps import faults

PROG = "python -m study.ps"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", help="chief only: DownpourConfig fields as JSON, or a path to a JSON file")
    parser.add_argument("--out", help="chief only: where to write the measurements (JSON)")
    parser.add_argument("--resume", action="store_true", help="chief only: restore the last checkpoint first")
    parser.add_argument("--bind", help="listen on this address only, e.g. 127.0.0.1 or a private 10.x address "
                                       "(TensorFlow alone listens on every interface)")
    parser.add_argument("--worker-threads", type=int, default=1, help="worker only: intra-op threads (default 1)")
    parser.add_argument("--no-pin", action="store_true", help="worker only: do not pin a 1-thread worker to a core")
    parser.add_argument("--local", action="store_true", help=argparse.SUPPRESS)  # started by LocalCluster
    return parser


def _fail(message: str, code: int = faults.EXIT_BAD_INPUT) -> int:
    print(f"study.ps: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the task ``TF_CONFIG`` describes; returns (for the chief: exits with) the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and what is wrong
        return int(e.code or 0) and faults.EXIT_BAD_INPUT
    from study.ps import bind
    from study.ps.cluster import parse_tf_config, serve

    try:
        config = parse_tf_config()
        if args.bind is not None:
            address = bind.check_address(args.bind)
            if bind.active() != address:  # start again with the bind() shim loaded
                env = bind.environment(address)
                sys.stdout.flush()
                os.execve(sys.executable, [sys.executable, "-m", "study.ps", *argv], env)
    except (ValueError, bind.BindError) as e:
        return _fail(str(e))
    role = config["task"]["type"]
    if role in ("ps", "worker"):
        if args.worker_threads < 1:
            return _fail(f"--worker-threads: expected an integer >= 1; got {args.worker_threads}")
        try:
            serve(config, orphan_guard=args.local, worker_threads=args.worker_threads, pin=not args.no_pin,
                  bind=args.bind and bind.check_address(args.bind))
        except bind.BindError as e:
            return _fail(str(e))
        return faults.EXIT_OK
    if role != "chief":
        return _fail(f"task type {role!r} has no role here; use chief, ps or worker")
    if not args.job:
        return _fail("the chief needs --job (DownpourConfig fields as JSON, or a path to a JSON file)")
    if args.local:
        from study.ps.cluster import exit_with_parent

        exit_with_parent()
    code = faults.EXIT_FAILED
    try:
        from study.ps.chief import run_chief
        from study.ps.config import job_from_dict, read_job

        code = run_chief(job_from_dict(read_job(args.job)), config["cluster"], out=args.out, resume=args.resume)
    except ValueError as e:
        code = _fail(str(e))
    except BaseException as e:  # noqa: BLE001 - the chief always exits with a code, never hangs in teardown
        code = _fail(f"the chief failed: {type(e).__name__}: {e}", faults.EXIT_FAILED)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the distributed runtime's teardown would wait on tasks that may be gone


if __name__ == "__main__":
    sys.exit(main())
