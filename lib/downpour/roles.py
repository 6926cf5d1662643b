"""One entry point for every task of an asynchronous parameter-server job: ``python -m downpour``.

::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}'     python -m downpour [--bind ADDRESS]
    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' python -m downpour [--bind ADDRESS]
    TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}'  python -m downpour \\
        --job job.json --out result.json [--resume] [--bind ADDRESS]

A ps or worker task serves until it is ended (Ctrl-C, or a signal); it imports no job code (the chief sends
graphs). The chief is the coordinator: it reads the job (a JSON object of ``DownpourConfig`` fields, or a path to
one), waits for every task (a timeout names the missing ones), checks the data against the model on itself and
on every worker, puts the variables on the ps tasks, schedules the Downpour worker loop and writes its
measurements to ``--out``. A task listens on 127.0.0.1 only unless ``--bind`` names another address of this
machine (its private address, for several machines); ``--bind 0.0.0.0`` or ``::`` listens on every interface and
says so in a warning line (``downpour.bind``).
``LocalCluster`` runs exactly these commands; ``lib/downpour/README.md`` walks through running them by hand,
on one machine and on several.

Every task prints its own messages, one line each, to the terminal, and everything else (TensorFlow's log,
tracebacks) to its log file in ``--log-dir``, which every error message names (``downpour.console``).

Exit codes (``downpour.faults``): 0 done; 1 the chief failed (one line; the traceback is in the log file); 2 bad
``TF_CONFIG``, flag, job or data file; 3 tasks unreachable; 4 ``--resume`` refused (checkpoint and sidecar
disagree); 5 a ps or worker task's port is in use; 75 a ps task was lost and not back within ``--ps-wait``
(restart it, then the chief with ``--resume``); 130 stopped by Ctrl-C (SIGINT). Within ``--ps-wait`` (default
300 s) the chief waits for a lost ps task and, once it answers, starts itself again with ``--resume``: the last
checkpoint is restored onto the tasks and the job goes on, with no human step.

``python -m downpour local --job JOB --workers 2 --ps 2`` runs every task of a job on this machine and starts
again any that dies (``downpour.supervisor``).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import TYPE_CHECKING

from downpour import faults

if TYPE_CHECKING:
    from downpour.console import Console

PROG = "python -m downpour"
PS_WAIT_S = faults.PS_WAIT_S


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", help="chief only: DownpourConfig fields as JSON, or a path to a JSON file")
    parser.add_argument("--out", help="chief only: where to write the measurements (JSON)")
    parser.add_argument("--resume", action="store_true", help="chief only: restore the last checkpoint first")
    parser.add_argument("--ps-wait", type=float, default=PS_WAIT_S, metavar="SECONDS",
                        help=f"chief only: when a ps task is lost, wait this long for it to come back, then restore "
                             f"the last checkpoint onto it and continue (default {PS_WAIT_S:g}; 0: exit 75 at once)")
    parser.add_argument("--bind", help="listen on this address only (default 127.0.0.1: this machine only); on "
                                       "several machines, the machine's private address such as 10.0.0.5; 0.0.0.0 "
                                       "or :: listens on every interface (TensorFlow's own behaviour; warns)")
    parser.add_argument("--log-dir", help="where the task's log file goes (TensorFlow's output, tracebacks); "
                                          "default $TMPDIR/downpour-<uid>")
    parser.add_argument("--worker-threads", type=int, default=1, help="worker only: intra-op threads (default 1)")
    parser.add_argument("--ps-threads", type=int, default=1, help="ps only: intra-op threads (default 1)")
    parser.add_argument("--no-pin", action="store_true", help="worker only: do not pin a 1-thread worker to a core")
    parser.add_argument("--local", action="store_true", help=argparse.SUPPRESS)  # started by LocalCluster
    parser.add_argument("--after-lost-ps", action="store_true", help=argparse.SUPPRESS)  # started again by itself
    return parser


def _fail(message: str, code: int = faults.EXIT_BAD_INPUT) -> int:
    print(f"downpour: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the task ``TF_CONFIG`` describes; returns (for the chief: exits with) the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["local"]:  # every task of a job on this machine, supervised
        from downpour.supervisor import main as local

        return local(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and what is wrong
        return int(e.code or 0) and faults.EXIT_BAD_INPUT
    from downpour import bind
    from downpour.cluster import parse_tf_config, split_address

    for flag in ("worker_threads", "ps_threads"):
        if getattr(args, flag) < 1:
            return _fail(f"--{flag.replace('_', '-')}: expected an integer >= 1; got {getattr(args, flag)}")
    if not args.ps_wait >= 0:
        return _fail(f"--ps-wait: expected seconds >= 0; got {args.ps_wait}")
    try:
        config = parse_tf_config()
        address = bind.check_address(args.bind) if args.bind is not None else bind.DEFAULT
        if not bind.every_interface(address) and bind.active() != address:  # again, with the checked shim loaded
            env = bind.environment(address)
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable, "-m", "downpour", *argv], env)
    except (ValueError, bind.BindError) as e:
        return _fail(str(e))
    args.bind = None if bind.every_interface(address) else address  # the address to check once listening
    role, index = config["task"]["type"], config["task"]["index"]
    task = f"{role}:{index}"
    from downpour.console import Console

    port = split_address(config["cluster"][role][index])[1]
    try:
        console = Console.open(args.log_dir, role, index, port)
    except OSError as e:
        return _fail(f"--log-dir: cannot write the task's log there ({e})")
    if args.bind is None:
        console.say(bind.wide_warning(task, address, port))
    if role in ("ps", "worker"):
        console.stop_on_sigint(task)
        return _serve(args, config, console)
    if not args.job:
        console.say("the chief needs --job (DownpourConfig fields as JSON, or a path to a JSON file)")
        return faults.EXIT_BAD_INPUT
    console.stop_on_sigint(task, "; the ps and worker tasks keep serving: start the chief again with --resume to "
                                 "continue from its last checkpoint")
    if args.local:
        from downpour.cluster import exit_with_parent

        exit_with_parent()
    code = faults.EXIT_FAILED
    try:
        from downpour.chief import run_chief
        from downpour.config import job_from_dict, read_job

        failure: dict = {}
        code = run_chief(job_from_dict(read_job(args.job)), config["cluster"], out=args.out, resume=args.resume,
                         say=console.say, where=console.where(), ps_wait=args.ps_wait, after_lost_ps=args.after_lost_ps,
                         failure=failure)
        if code == faults.EXIT_PS_LOST and args.ps_wait > 0:
            # resume only from a checkpoint this job wrote or restored (never an older job's in the same folder)
            written = failure.get("checkpoint_version")
            _start_again_after_lost_ps(argv, resume=bool(written) if written is not None else args.resume)
    except ValueError as e:
        console.say(str(e))
        code = faults.EXIT_BAD_INPUT
    except BaseException as e:  # noqa: BLE001 - the chief always exits with a code, never hangs in teardown
        traceback.print_exc()  # into the log file, which the message names
        console.say(f"the chief failed: {faults.first_line(e)}{console.where()}")
        code = faults.EXIT_FAILED
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the distributed runtime's teardown would wait on tasks that may be gone


def _start_again_after_lost_ps(argv: list[str], resume: bool) -> None:
    """Start this chief again in this process (``exec``), with ``--resume`` when this job has a checkpoint (else from
    update 0): a new TensorFlow context on the tasks.
    The new chief waits up to ``--ps-wait`` for the lost ps task (starting TensorFlow meanwhile), restores the last
    checkpoint onto the tasks and goes on; a ps task not back by then ends it with exit 75."""
    print("chief: starting again, to continue from the last checkpoint once every ps task answers", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    again = [a for a in argv if a not in ("--resume", "--after-lost-ps")] + ["--resume"] * resume
    os.execv(sys.executable, [sys.executable, "-m", "downpour", *again, "--after-lost-ps"])


def _serve(args: argparse.Namespace, config: dict, console: Console) -> int:
    """A ps or worker task: serve until the process is ended (Ctrl-C: exit 130)."""
    from downpour import bind
    from downpour.cluster import PortInUse, ServeError, serve

    try:
        serve(config, orphan_guard=args.local, worker_threads=args.worker_threads, pin=not args.no_pin,
              bind=args.bind, ps_threads=args.ps_threads,
              say=console.say, log=console.log)
    except (bind.BindError, ServeError) as e:
        console.say(f"{e}{console.where()}")
        sys.stdout.flush()
        # the server's threads would keep a normal exit waiting
        os._exit(faults.EXIT_PORT_IN_USE if isinstance(e, PortInUse) else faults.EXIT_BAD_INPUT)
    return faults.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
