"""``LocalCluster``: every task of a parameter-server cluster as a child process on this machine.

``LocalCluster`` starts exactly the command a task runs on any machine (``python -m downpour`` with its
``TF_CONFIG``), one process per task, and always ends them, on error and on interrupt too: a
``tf.distribute.Server`` cannot be shut down from inside its process. ``GRPC_FAIL_FAST=use_caller`` is set for
every task, as the TensorFlow tutorial does. With ``bind="auto"`` (default) every task listens on 127.0.0.1 only
(``downpour.bind``, Linux with a C compiler); where that cannot be enforced ``LocalCluster`` refuses to start,
naming why, unless ``bind=None`` accepts TensorFlow's default of every interface (``--bind 0.0.0.0``). Each task's
terminal output (its one-line messages) goes to ``<logs>/<job><index>.log``, the rest of its output (TensorFlow's) to
``<logs>/<job>-<index>-<port>.log``.

``with LocalCluster(workers=2, ps=2) as cluster: run_downpour(DownpourConfig(workers=2, ps=2), cluster)``
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from downpour import bind as bind_address
from downpour.cluster import ENTRY_POINT


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on localhost. ``free_ports(3)``"""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_in_use(port: int) -> bool:
    """Whether something listens on ``localhost:port``. ``port_in_use(22)``"""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("localhost", port)) == 0


class LocalCluster:
    """Every ps and worker task of a cluster as a child process of this one, and the chief's address.

    ``with LocalCluster(workers=2, ps=1) as cluster: cluster.spec`` -> ``{"chief": [..], "ps": [..], "worker": [..]}``.

    On enter it starts every ps and worker task (``python -m downpour`` with its ``TF_CONFIG``) and waits
    until they listen. The chief's address is reserved in the spec; ``start_chief(args)`` runs the coordinator
    through the same entry point. ``kill`` and ``restart`` are for fault experiments. ``bind``: ``"auto"``
    (127.0.0.1, else a ``BindError`` saying why it cannot be enforced), an address, or None (TensorFlow's
    default: every interface, IPv4 and IPv6). ``ps_threads``: intra-op threads of each ps task.

    The tasks' logs go to a temporary folder, ``logs``, removed by ``stop()`` unless something failed: an error in
    the ``with`` body or at start (its message then names the folder), a chief that failed under ``run_downpour``
    (which sets ``keep_logs``), or ``keep_logs=True``.
    """

    def __init__(self, workers: int = 1, ps: int = 1, ports: list[int] | None = None, start_timeout: float = 60.0,
                 worker_threads: int = 1, pin_workers: bool = True, bind: str | None = "auto", ps_threads: int = 1,
                 keep_logs: bool = False):
        from downpour.checks import check_positive_int

        check_positive_int("workers", workers)
        check_positive_int("ps", ps)
        check_positive_int("worker_threads", worker_threads)
        check_positive_int("ps_threads", ps_threads)
        if bind == "auto":
            try:
                bind_address.build_shim()
            except bind_address.BindError as e:
                raise bind_address.BindError(f"LocalCluster: cannot keep the tasks on loopback ({e}); pass bind=None "
                                             "to let them listen on every interface instead") from None
            bind = "127.0.0.1"
        self.bind = bind_address.check_address(bind) if bind is not None else None
        n = workers + ps + 1
        ports = list(ports) if ports is not None else free_ports(n)
        if len(ports) != n:
            raise ValueError(f"ports: need {n} (one per task: {workers} worker, {ps} ps, 1 chief); got {len(ports)}")
        busy = [p for p in ports if port_in_use(p)]
        if busy:
            raise ValueError(f"ports: {busy} already in use; pass free ports or leave ports=None")
        self.spec = {"chief": [f"localhost:{ports[-1]}"],
                     "ps": [f"localhost:{p}" for p in ports[workers:workers + ps]],
                     "worker": [f"localhost:{p}" for p in ports[:workers]]}
        self.start_timeout = start_timeout
        self.worker_threads = worker_threads
        self.ps_threads = ps_threads
        self.pin_workers = pin_workers
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="downpour-cluster-"))
        self.keep_logs = keep_logs
        self._all_pids: list[int] = []
        self._log_offsets: dict[tuple[str, int], int] = {}

    def start(self) -> LocalCluster:
        """Start the ps and worker tasks (what ``with`` does); ``stop()`` ends them. ``LocalCluster().start()``"""
        return self.__enter__()

    def __enter__(self) -> LocalCluster:
        atexit.register(self.stop)
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            for job in ("ps", "worker"):
                for index in range(len(self.spec[job])):
                    self._start(job, index)
            self.wait_until_listening([(job, i) for job in ("ps", "worker") for i in range(len(self.spec[job]))])
        except BaseException as e:
            self.__exit__(type(e), e, None)
            raise
        return self

    def __exit__(self, exc_type: Any = None, exc: BaseException | None = None, tb: Any = None) -> None:
        self.stop(failed=exc is not None)
        if exc is not None and self.logs.is_dir() and hasattr(exc, "add_note"):
            exc.add_note(f"LocalCluster: the tasks' logs are kept in {self.logs}")

    def tf_config(self, job: str, index: int, spec: dict[str, list[str]] | None = None) -> str:
        """The ``TF_CONFIG`` of one task (of ``spec``, default the whole cluster). ``cluster.tf_config("worker", 0)``"""
        return json.dumps({"cluster": spec or self.spec, "task": {"type": job, "index": index}})

    def command(self, job: str, index: int, args: tuple[str, ...] = ()) -> list[str]:
        """The command line of one task (its environment adds ``TF_CONFIG``). ``cluster.command("ps", 0)``"""
        flags = ["--local", "--log-dir", str(self.logs), "--bind", self.bind or "0.0.0.0"]
        if job == "worker":
            flags += ["--worker-threads", str(self.worker_threads)] + ([] if self.pin_workers else ["--no-pin"])
        if job == "ps":
            flags += ["--ps-threads", str(self.ps_threads)]
        return [sys.executable, *ENTRY_POINT, *flags, *args]

    def _start(self, job: str, index: int, args: tuple[str, ...] = (),
               spec: dict[str, list[str]] | None = None) -> subprocess.Popen:
        env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=self.tf_config(job, index, spec))
        if self.bind and not bind_address.every_interface(self.bind):
            env = bind_address.environment(self.bind, env)
        # freezing.enable_determinism in the caller sets this; it would make tf.timestamp raise in the tasks, and
        # asynchronous training is not reproducible anyway (the order of the pushes is set by timing)
        env.pop("TF_DETERMINISTIC_OPS", None)
        with open(self.logs / f"{job}{index}.log", "a") as log:
            self._log_offsets[(job, index)] = log.tell()
            process = subprocess.Popen(self.command(job, index, args), env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes[(job, index)] = process
        self._all_pids.append(process.pid)
        return process

    def wait_until_listening(self, keys: list[tuple[str, int]]) -> None:
        """Block until each task in ``keys`` (``("worker", 0)``, ...) accepts connections on its port, for a task
        started again by hand; raise ``RuntimeError`` naming the task (with its log's tail) if it exits first or
        ``start_timeout`` passes."""
        deadline = time.monotonic() + self.start_timeout
        waiting = {key: int(self.spec[key[0]][key[1]].rpartition(":")[2]) for key in keys}
        while waiting:
            for key, port in list(waiting.items()):
                if self.processes[key].poll() is not None:
                    raise RuntimeError(f"cluster: {key[0]}:{key[1]} exited with code {self.processes[key].returncode}; "
                                       f"log: {self.log_tail(*key)}")
                if port_in_use(port) and self._says_serving(*key):
                    del waiting[key]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(f"{job}:{i}" for job, i in waiting)
                raise TimeoutError(f"cluster: {names} not listening after {self.start_timeout:g} s; "
                                   f"logs in {self.logs}")
            time.sleep(0.1)

    def _says_serving(self, job: str, index: int) -> bool:
        """Whether the task's log, since its last start, has its ``serving ...`` line (printed once the server
        listens where it should)."""
        path = self.logs / f"{job}{index}.log"
        try:
            with open(path, errors="replace") as log:
                log.seek(self._log_offsets.get((job, index), 0))
                return f"serving {job}:{index} " in log.read()
        except OSError:
            return False

    def start_chief(self, args: tuple[str, ...], spec: dict[str, list[str]] | None = None) -> subprocess.Popen:
        """Start the coordinator: ``python -m downpour ARGS`` with the chief's ``TF_CONFIG``.

        ``spec`` may name a subset of the ps and worker tasks (a job on fewer tasks).
        ``cluster.start_chief(("--job", path))``
        """
        previous = self.processes.get(("chief", 0))
        if previous is not None and previous.poll() is None:
            raise RuntimeError("cluster: the chief is still running; kill it first")
        return self._start("chief", 0, tuple(args), spec)

    def log_tail(self, job: str, index: int, chars: int = 400) -> str:
        """The end of what one task wrote to its terminal (its messages). ``cluster.log_tail("worker", 0)``"""
        path = self.logs / f"{job}{index}.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

    def mark(self) -> dict[tuple[str, int], int]:
        """Where every task's terminal log ends now, for ``said(..., since=mark)``: one section of the logs per test
        or per job. ``mark = cluster.mark()``"""
        keys = [(job, i) for job in self.spec for i in range(len(self.spec[job]))]
        return {key: (self.logs / f"{key[0]}{key[1]}.log").stat().st_size
                if (self.logs / f"{key[0]}{key[1]}.log").is_file() else 0 for key in keys}

    def said(self, job: str, index: int, since: dict[tuple[str, int], int] | None = None) -> str:
        """What one task wrote to its terminal since it was last started, or since ``mark()`` gave ``since``
        (across its restarts). ``cluster.said("chief", 0)``"""
        path = self.logs / f"{job}{index}.log"
        if not path.is_file():
            return ""
        with open(path, errors="replace") as log:
            log.seek(since.get((job, index), 0) if since is not None else self._log_offsets.get((job, index), 0))
            return log.read()

    def full_log(self, job: str, index: int) -> Path:
        """The file with the rest of one task's output (TensorFlow's, tracebacks). ``cluster.full_log("ps", 0)``"""
        from downpour.console import log_name

        return self.logs / log_name(job, index, self.spec[job][index].rpartition(":")[2])

    def kill(self, job: str, index: int) -> None:
        """Kill one task now (a fault experiment). ``cluster.kill("worker", 1)``"""
        process = self.processes[(job, index)]
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()

    def restart(self, job: str, index: int, wait: bool = True) -> None:
        """Start a ps or worker task again on its address (and wait until it listens). ``cluster.restart("ps", 0)``"""
        self.kill(job, index)
        port = int(self.spec[job][index].rpartition(":")[2])
        deadline = time.monotonic() + 10
        while port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._start(job, index)
        if wait:
            self.wait_until_listening([(job, index)])

    def stop(self, failed: bool = False) -> None:
        """End every task: SIGTERM, then SIGKILL after 5 s; then remove the logs' folder, unless ``failed`` or
        ``keep_logs``. Safe to call twice. ``cluster.stop()``"""
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        atexit.unregister(self.stop)
        if failed:
            self.keep_logs = True
        if not self.keep_logs:
            shutil.rmtree(self.logs, ignore_errors=True)

    @property
    def pids(self) -> list[int]:
        """Process ids of every task this cluster ever started (restarts included). ``cluster.pids``"""
        return list(self._all_pids)
