"""A TensorFlow gRPC cluster: ``TF_CONFIG`` checks, reachability, and one server per ps or worker task.

Every task of a parameter-server job (ps, worker, chief) starts with the same command, on this machine or on
several; only ``TF_CONFIG`` differs (``python -m downpour``, see ``downpour.roles``)::

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "ps": ["host1:2222"], "worker": ["host2:2222"]},
                "task": {"type": "worker", "index": 0}}' python -m downpour

Each worker computes on one core by default: ``intra_op_parallelism_threads=1`` and, where the OS allows it,
``os.sched_setaffinity`` to core ``index % cores``. Without that limit every worker's runtime spreads its
ops over every core, so on a 2-core machine a second worker adds contention instead of compute. A ps task
applies updates on ``ps_threads`` intra-op threads (default 1).

**Security.** A TensorFlow server speaks unauthenticated gRPC and runs any graph it is sent (TensorFlow's
SECURITY.md): whoever reaches its port can read and write every variable and run code in the task. TensorFlow
2.21's server listens on every interface of its port, IPv4 and IPv6 (``grpc_server_lib.cc`` binds ``[::]``);
``downpour.bind`` restricts it to one address. Run a cluster on a private network only.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOBS = ("chief", "ps", "worker")
"""The jobs of a parameter-server cluster. TensorFlow also knows ``evaluator``; here the chief evaluates
snapshots itself (``eval_every``), so a ``TF_CONFIG`` that names an evaluator is refused."""
ENTRY_POINT = ("-m", "downpour")
"""What ``LocalCluster`` runs for every task: ``python -m downpour`` with the task's ``TF_CONFIG``."""


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
        if job == "evaluator":
            raise ValueError("TF_CONFIG: downpour has no evaluator task (the chief evaluates snapshots of the ps "
                             "itself, every eval_every updates); remove 'evaluator' from the cluster")
        if job not in JOBS:
            raise ValueError(f"TF_CONFIG: unknown job {job!r}; allowed: {', '.join(JOBS)}")
        if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and _valid_address(a) for a in addresses):
            raise ValueError(f"TF_CONFIG: cluster[{job!r}] must be a non-empty list of 'host:port'; got {addresses!r}")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError(f"TF_CONFIG: a cluster has at most one chief; got {cluster['chief']!r}")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG: 'task.type' must be one of the cluster's jobs {sorted(cluster)}; got {task!r}")
    index = task.get("index", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG: 'task.index' must be 0..{len(cluster[task['type']]) - 1}; got {index!r}")
    return {"cluster": cluster, "task": {"type": task["type"], "index": index}}


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6 address]:port"`` -> ``(host, port)``, brackets removed.

    ``split_address("[::1]:2222") == ("::1", 2222)``
    """
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _valid_address(address: str) -> bool:
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not host or not 0 < int(port) < 65536:
        return False
    bracketed = host.startswith("[") and host.endswith("]")
    return bracketed or ":" not in host  # an IPv6 address needs its brackets, as in TensorFlow's own addresses


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
    """Whether a TCP connection to ``host:port`` (or ``[v6]:port``) succeeds. ``reachable("[::1]:22")``"""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
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
                               f"(python -m downpour with their TF_CONFIG) or fix the addresses")
        time.sleep(0.2)


def limit_to_one_core(index: int) -> str:
    """Pin this process to core ``index % cores`` where the OS allows it; says what it did. ``limit_to_one_core(0)``"""
    if not hasattr(os, "sched_setaffinity"):
        return "no CPU affinity on this OS (intra-op threads = 1 only)"
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core} of {len(cores)}"


def server_config(job: str, workers: int, worker_threads: int = 1, ps_threads: int = 1) -> Any:
    """The ``ConfigProto`` of a task's server: workers compute on ``worker_threads`` intra-op threads, ps tasks
    apply updates on ``ps_threads``. ``server_config("worker", 2)``

    ``inter_op_parallelism_threads`` stays above the number of workers: with fewer, two or more workers hang on a
    2-core machine (see the guide). It schedules independent ops; with one intra-op thread and one pinned core it
    adds no compute.
    """
    import tensorflow as tf

    inter = max(4, workers + 1)
    if job in ("worker", "ps"):
        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=worker_threads if job == "worker" else ps_threads,
                                        inter_op_parallelism_threads=inter)
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter)


class ServeError(RuntimeError):
    """A ps or worker task cannot serve (its server does not start); the message says why."""


class PortInUse(ServeError):
    """A ps or worker task cannot listen: another process holds its port (exit code 5, ``faults.EXIT_PORT_IN_USE``)."""


CHIEF_FINISHED = "==== downpour: the chief finished its job ===="
"""What a chief that finished its job writes into every ps and worker task's log (a ``tf.print`` placed on the
task) before it exits, so that the task tells a finished chief from a lost one."""


def serve(config: dict[str, Any] | None = None, orphan_guard: bool = False, worker_threads: int = 1,
          pin: bool = True, bind: str | None = None, ps_threads: int = 1,
          say: Callable[[str], None] = print, chief_poll_s: float = 1.0, log: Path | None = None) -> None:
    """Run one ps or worker task's ``tf.distribute.Server`` until the process is ended. ``serve(parse_tf_config())``

    A worker computes on ``worker_threads`` intra-op threads and, with ``pin`` and one thread, on one core; a ps
    task on ``ps_threads``. ``bind``: the address the task must listen on, checked once it listens
    (``downpour.bind``; the process must have been started with ``downpour.bind.environment``).
    ``orphan_guard`` (set by ``LocalCluster``) ends the task when its launcher dies. Prints ``serving <job>:<i>
    at grpc://...; listening on ...``; then ``say`` s one line each time the chief's address stops answering: the
    chief finished its job (it wrote ``CHIEF_FINISHED`` into ``log``, this task's log file, since it came up), or
    it has gone before the end (lost, or stopped). Raises ``PortInUse`` when another process holds the port,
    ``ServeError`` when the server cannot start for another reason.
    """
    from downpour import bind as bind_address

    config = config or parse_tf_config()
    job, index = config["task"]["type"], config["task"]["index"]
    address = config["cluster"][job][index]
    port = split_address(address)[1]
    limits = ""
    if job == "worker":
        limits = f"; intra-op threads {worker_threads}"
        if pin and worker_threads == 1:
            limits += "; " + limit_to_one_core(index)
    elif job == "ps":
        limits = f"; intra-op threads {ps_threads}"
    import tensorflow as tf

    workers = len(config["cluster"].get("worker", []))
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=job, task_index=index,
                                      protocol="grpc", start=True,
                                      config=server_config(job, workers, worker_threads, ps_threads))
    except (tf.errors.OpError, RuntimeError, ValueError) as e:
        if listening_elsewhere(port):
            raise PortInUse(f"{job}:{index} cannot listen on port {port} ({address}): the port is in use by another "
                             "process; stop it or give this task another port in TF_CONFIG") from None
        raise ServeError(f"{job}:{index} cannot start its server on {address}: "
                         f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    if bind is not None:
        bind_address.check_listening(port, bind)
    print(f"serving {job}:{index} at {server.target}; listening on "
          f"{bind_address.describe(bind_address.listening(port, own=True))}{limits}", flush=True)
    if orphan_guard:
        exit_with_parent()
    chief = (config["cluster"].get("chief") or [None])[0]
    seen, since = False, 0
    while True:  # instead of server.join(), which never returns to Python: the chief is watched from here
        time.sleep(chief_poll_s)
        if chief is None:
            continue
        up = reachable(chief, timeout=min(0.5, chief_poll_s))
        if up and not seen:  # a chief (a new one, maybe): what it writes into this task's log starts here
            since = _size(log)
        if seen and not up:
            if CHIEF_FINISHED in _read_from(log, since):
                say(f"{job}:{index}: the chief ({chief}) finished its job; this task keeps serving, for the next "
                    "job's chief")
            else:
                say(f"{job}:{index}: the chief ({chief}) has gone before the end of its job (lost, or stopped); this "
                    "task keeps serving: start the chief again, with --resume to continue from its last checkpoint")
        seen = up
    del server  # pragma: no cover - the loop ends only with the process


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _read_from(path: Path | None, offset: int) -> str:
    """What was written to ``path`` after its first ``offset`` bytes ("" without a log)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def listening_elsewhere(port: int) -> bool:
    """Whether another process listens on TCP ``port`` here (any address). ``listening_elsewhere(22)``"""
    from downpour import bind as bind_address

    return bool(bind_address.listening(port)) or reachable(f"localhost:{port}", timeout=0.2)


def exit_with_parent() -> None:
    """End this process when the process that started it is gone, so a killed launcher leaves no orphan."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


