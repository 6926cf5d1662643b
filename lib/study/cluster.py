"""A TensorFlow gRPC cluster: ``TF_CONFIG`` checks, one server per task, and ``LocalCluster`` to run it here.

Every task of a parameter-server job (ps, worker, chief) starts with the same command, on this machine or
on several; only ``TF_CONFIG`` differs (see ``study.ps_roles`` and ``docs/parameter_server.md``)::

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "ps": ["host1:2222"], "worker": ["host2:2222"]},
                "task": {"type": "worker", "index": 0}}' python -m study.ps_roles

``LocalCluster`` starts exactly those processes on localhost, one per task, and always ends them (on
error and on interrupt too): ``tf.distribute.Server`` cannot be shut down from inside its process.

Each worker computes on one core: ``intra_op_parallelism_threads=1`` and, where the OS allows it,
``os.sched_setaffinity`` to core ``index % cores``. Without that limit every worker's runtime spreads its
ops over every core, so on a 2-core machine a second worker adds contention instead of compute.
``GRPC_FAIL_FAST=use_caller`` is set for every task, as the TensorFlow tutorial does.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

JOBS = ("chief", "ps", "worker", "evaluator")
ENTRY_POINT = ("-m", "study.ps_roles")
"""What ``LocalCluster`` runs for every task: ``python -m study.ps_roles`` with the task's ``TF_CONFIG``."""


def parse_tf_config(text: str | None = None) -> dict[str, Any]:
    """Parse and check a TF_CONFIG (default: the environment's). ``parse_tf_config('{"cluster": ..., "task": ...}')``"""
    text = os.environ.get("TF_CONFIG") if text is None else text
    if not text:
        raise ValueError("TF_CONFIG: not set; expected JSON like "
                         '{"cluster": {"worker": ["host:port"], "ps": ["host:port"]}, '
                         '"task": {"type": "worker", "index": 0}}')
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG: not valid JSON ({e})") from None
    cluster, task = (config.get("cluster"), config.get("task")) if isinstance(config, dict) else (None, None)
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError("TF_CONFIG: 'cluster' must map job names (worker, ps, ...) to lists of 'host:port'")
    for job, addresses in cluster.items():
        if job not in JOBS:
            raise ValueError(f"TF_CONFIG: unknown job {job!r}; allowed: {', '.join(JOBS)}")
        if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and a.rpartition(":")[2].isdigit() and a.rpartition(":")[0] for a in addresses):
            raise ValueError(f"TF_CONFIG: cluster[{job!r}] must be a non-empty list of 'host:port'; got {addresses!r}")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError(f"TF_CONFIG: a cluster has at most one chief; got {cluster['chief']!r}")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG: 'task.type' must be one of the cluster's jobs {sorted(cluster)}; got {task!r}")
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG: 'task.index' must be 0..{len(cluster[task['type']]) - 1}; got {index!r}")
    return {"cluster": cluster, "task": {"type": task["type"], "index": index}}


def check_parameter_server_cluster(cluster: dict[str, list[str]]) -> None:
    """A Downpour job needs a chief (the coordinator), a ps and a worker. ``check_parameter_server_cluster(spec)``"""
    missing = [job for job in ("chief", "ps", "worker") if not cluster.get(job)]
    if missing:
        raise ValueError(f"TF_CONFIG: a parameter-server job needs the jobs chief, ps and worker; missing {missing} "
                         f"in {sorted(cluster)}")


def task_names(cluster: dict[str, list[str]], jobs: tuple[str, ...] = ("ps", "worker")) -> dict[str, str]:
    """``{"ps:0": "host:port", ...}`` for the given jobs. ``task_names({"ps": ["h:1"]})``"""
    return {f"{job}:{i}": address for job in jobs for i, address in enumerate(cluster.get(job, []))}


def reachable(address: str, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds. ``reachable("localhost:22")``"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_tasks(cluster: dict[str, list[str]], timeout: float, jobs: tuple[str, ...] = ("ps", "worker")) -> None:
    """Wait until every task of ``jobs`` accepts connections; else raise ``TimeoutError`` naming the missing ones.

    TensorFlow itself would retry an unreachable task for a long time; this turns that into a clear error.
    ``wait_for_tasks(spec, timeout=30)``
    """
    waiting = task_names(cluster, jobs)
    deadline = time.monotonic() + timeout
    while True:
        waiting = {name: a for name, a in waiting.items() if not reachable(a)}
        if not waiting:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{name} ({a})" for name, a in waiting.items())
            raise TimeoutError(f"cluster: {names} not reachable after {timeout:g} s; start those tasks "
                               f"(python -m study.ps_roles with their TF_CONFIG) or fix the addresses")
        time.sleep(0.2)


def limit_to_one_core(index: int) -> str:
    """Pin this process to core ``index % cores`` where the OS allows it; says what it did. ``limit_to_one_core(0)``"""
    if not hasattr(os, "sched_setaffinity"):
        return "no CPU affinity on this OS (intra-op threads = 1 only)"
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core} of {len(cores)}"


def server_config(job: str, workers: int, worker_threads: int = 1) -> Any:
    """The ``ConfigProto`` of a task's server: workers compute on ``worker_threads`` threads. ``server_config("worker", 2)``

    ``inter_op_parallelism_threads`` stays above the number of workers: with fewer, two or more workers hang on a
    2-core machine (see the guide). It schedules independent ops; with one intra-op thread and one pinned core it
    adds no compute.
    """
    import tensorflow as tf

    inter = max(4, workers + 1)
    if job in ("worker", "ps"):
        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=worker_threads if job == "worker" else 1,
                                        inter_op_parallelism_threads=inter)
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter)


def serve(config: dict[str, Any] | None = None, orphan_guard: bool = False, worker_threads: int = 1,
          pin: bool = True) -> None:
    """Run one ps or worker task's ``tf.distribute.Server`` until killed. ``serve(parse_tf_config())``

    A worker computes on ``worker_threads`` intra-op threads and, with ``pin`` and one thread, on one core.
    ``orphan_guard`` (set by ``LocalCluster``) ends the task when its launcher dies.
    """
    config = config or parse_tf_config()
    job, index = config["task"]["type"], config["task"]["index"]
    limits = ""
    if job == "worker":
        limits = f"; intra-op threads {worker_threads}"
        if pin and worker_threads == 1:
            limits += "; " + limit_to_one_core(index)
    import tensorflow as tf

    workers = len(config["cluster"].get("worker", []))
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=job, task_index=index,
                                  protocol="grpc", config=server_config(job, workers, worker_threads), start=True)
    print(f"serving {job}:{index} at {server.target}{limits}", flush=True)
    if orphan_guard:
        exit_with_parent()
    server.join()


def exit_with_parent() -> None:
    """End this process when the process that started it is gone, so a killed launcher leaves no orphan."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


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

    On enter it starts every ps and worker task (``python -m study.ps_roles`` with its ``TF_CONFIG``) and waits
    until they listen. The chief's address is reserved in the spec; ``start_chief(args)`` runs the coordinator
    through the same entry point. ``kill`` and ``restart`` are for fault experiments.
    """

    def __init__(self, workers: int = 1, ps: int = 1, ports: list[int] | None = None, start_timeout: float = 60.0,
                 worker_threads: int = 1, pin_workers: bool = True):
        from freezing.validation import check_positive_int

        check_positive_int("workers", workers)
        check_positive_int("ps", ps)
        check_positive_int("worker_threads", worker_threads)
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
        self.pin_workers = pin_workers
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="freezing-cluster-"))
        self._all_pids: list[int] = []

    def start(self) -> LocalCluster:
        """Start the ps and worker tasks (what ``with`` does); ``stop()`` ends them. ``LocalCluster().start()``"""
        return self.__enter__()

    def __enter__(self) -> LocalCluster:
        atexit.register(self.stop)
        try:
            for job in ("ps", "worker"):
                for index in range(len(self.spec[job])):
                    self._start(job, index)
            self._wait_until_listening([(job, i) for job in ("ps", "worker") for i in range(len(self.spec[job]))])
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def tf_config(self, job: str, index: int, spec: dict[str, list[str]] | None = None) -> str:
        """The ``TF_CONFIG`` of one task (of ``spec``, default the whole cluster). ``cluster.tf_config("worker", 0)``"""
        return json.dumps({"cluster": spec or self.spec, "task": {"type": job, "index": index}})

    def command(self, job: str, index: int, args: tuple[str, ...] = ()) -> list[str]:
        """The command line of one task (its environment adds ``TF_CONFIG``). ``cluster.command("ps", 0)``"""
        flags = ["--local"]
        if job == "worker":
            flags += ["--worker-threads", str(self.worker_threads)] + ([] if self.pin_workers else ["--no-pin"])
        return [sys.executable, *ENTRY_POINT, *flags, *args]

    def _start(self, job: str, index: int, args: tuple[str, ...] = (),
               spec: dict[str, list[str]] | None = None) -> subprocess.Popen:
        env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=self.tf_config(job, index, spec))
        # freezing.enable_determinism in the caller sets this; it would make tf.timestamp raise in the tasks, and
        # asynchronous training is not reproducible anyway (the order of the pushes is set by timing)
        env.pop("TF_DETERMINISTIC_OPS", None)
        with open(self.logs / f"{job}{index}.log", "a") as log:
            process = subprocess.Popen(self.command(job, index, args), env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes[(job, index)] = process
        self._all_pids.append(process.pid)
        return process

    def _wait_until_listening(self, keys: list[tuple[str, int]]) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = {key: int(self.spec[key[0]][key[1]].rpartition(":")[2]) for key in keys}
        while waiting:
            for key, port in list(waiting.items()):
                if self.processes[key].poll() is not None:
                    raise RuntimeError(f"cluster: {key[0]}:{key[1]} exited with code {self.processes[key].returncode}; "
                                       f"log: {self.log_tail(*key)}")
                if port_in_use(port):
                    del waiting[key]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(f"{job}:{i}" for job, i in waiting)
                raise TimeoutError(f"cluster: {names} not listening after {self.start_timeout:g} s; "
                                   f"logs in {self.logs}")
            time.sleep(0.1)

    def start_chief(self, args: tuple[str, ...], spec: dict[str, list[str]] | None = None) -> subprocess.Popen:
        """Start the coordinator: ``python -m study.ps_roles ARGS`` with the chief's ``TF_CONFIG``.

        ``spec`` may name a subset of the ps and worker tasks (a job on fewer tasks).
        ``cluster.start_chief(("--job", path))``
        """
        previous = self.processes.get(("chief", 0))
        if previous is not None and previous.poll() is None:
            raise RuntimeError("cluster: the chief is still running; kill it first")
        return self._start("chief", 0, tuple(args), spec)

    def log_tail(self, job: str, index: int, chars: int = 400) -> str:
        """The end of one task's log. ``cluster.log_tail("worker", 0)``"""
        path = self.logs / f"{job}{index}.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

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
            self._wait_until_listening([(job, index)])

    def stop(self) -> None:
        """End every task: SIGTERM, then SIGKILL after 5 s. Safe to call twice. ``cluster.stop()``"""
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

    @property
    def pids(self) -> list[int]:
        """Process ids of every task this cluster ever started (restarts included). ``cluster.pids``"""
        return list(self._all_pids)
