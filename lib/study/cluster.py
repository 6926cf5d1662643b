"""A TensorFlow gRPC cluster on this machine: N workers and M parameter servers as child processes.

``tf.distribute.Server`` cannot be shut down from inside its process, so every task runs in a child
process that ``LocalCluster`` always ends (on error and on interrupt too), leaving no orphans. Each task
is the same entry point a real multi-machine cluster uses::

    TF_CONFIG='{"cluster": {"worker": ["host1:2222"], "ps": ["host2:2222"]},
                "task": {"type": "worker", "index": 0}}' python -m study.cluster serve

Workers get ``inter_op_parallelism_threads = workers + 1``: with fewer, two or more workers hang on a
2-core machine (see the guide). ``GRPC_FAIL_FAST=use_caller`` is set for every task, as the TF tutorial does.
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

from freezing.validation import check_positive_int

JOBS = ("worker", "ps", "chief", "evaluator")


def parse_tf_config(text: str | None = None) -> dict[str, Any]:
    """Parse and check a TF_CONFIG (default: the environment's). ``parse_tf_config('{"cluster": ..., "task": ...}')``"""
    text = os.environ.get("TF_CONFIG") if text is None else text
    if not text:
        raise ValueError("TF_CONFIG: not set; expected JSON like "
                         '{"cluster": {"worker": ["host:port"], "ps": ["host:port"]}, "task": {"type": "worker", "index": 0}}')
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
                isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses):
            raise ValueError(f"TF_CONFIG: cluster[{job!r}] must be a non-empty list of 'host:port'; got {addresses!r}")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ValueError(f"TF_CONFIG: 'task.type' must be one of the cluster's jobs {sorted(cluster)}; got {task!r}")
    index = task.get("index", 0)
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise ValueError(f"TF_CONFIG: 'task.index' must be 0..{len(cluster[task['type']]) - 1}; got {index!r}")
    return {"cluster": cluster, "task": {"type": task["type"], "index": index}}


def serve(config: dict[str, Any] | None = None, orphan_guard: bool = False) -> None:
    """Run one task's ``tf.distribute.Server`` until killed. ``serve(parse_tf_config())``

    ``orphan_guard`` (set by ``LocalCluster``) ends the task when its launcher dies.
    """
    import tensorflow as tf

    config = config or parse_tf_config()
    workers = len(config["cluster"].get("worker", []))
    proto = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=config["task"]["type"],
                                  task_index=config["task"]["index"], protocol="grpc", config=proto, start=True)
    print(f"serving {config['task']['type']}:{config['task']['index']} at {server.target}", flush=True)
    if orphan_guard:
        _exit_with_parent()
    server.join()


def _exit_with_parent() -> None:
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
    """``with LocalCluster(workers=2, ps=1) as cluster: cluster.spec`` -> {"worker": [...], "ps": [...]}."""

    def __init__(self, workers: int = 1, ps: int = 1, ports: list[int] | None = None, start_timeout: float = 60.0):
        check_positive_int("workers", workers)
        check_positive_int("ps", ps)
        ports = list(ports) if ports is not None else free_ports(workers + ps)
        if len(ports) != workers + ps:
            raise ValueError(f"ports: need {workers + ps} (one per task); got {len(ports)}")
        busy = [p for p in ports if port_in_use(p)]
        if busy:
            raise ValueError(f"ports: {busy} already in use; pass free ports or leave ports=None")
        self.spec = {"worker": [f"localhost:{p}" for p in ports[:workers]],
                     "ps": [f"localhost:{p}" for p in ports[workers:]]}
        self.start_timeout = start_timeout
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="freezing-cluster-"))

    def __enter__(self) -> LocalCluster:
        atexit.register(self.stop)
        try:
            for job, addresses in self.spec.items():
                for index in range(len(addresses)):
                    self._start(job, index)
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self, job: str, index: int) -> None:
        env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=json.dumps({"cluster": self.spec, "task": {"type": job, "index": index}}))
        log = open(self.logs / f"{job}{index}.log", "w")
        self.processes[(job, index)] = subprocess.Popen(
            [sys.executable, "-m", "study.cluster", "serve", "--local"], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = {key: int(self.spec[key[0]][key[1]].rpartition(":")[2]) for key in self.processes}
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

    def log_tail(self, job: str, index: int, chars: int = 400) -> str:
        """The end of one task's log. ``cluster.log_tail("worker", 0)``"""
        path = self.logs / f"{job}{index}.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

    def kill(self, job: str, index: int) -> None:
        """Kill one task now (a fault-tolerance experiment). ``cluster.kill("worker", 1)``"""
        process = self.processes[(job, index)]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

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
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        atexit.unregister(self.stop)

    @property
    def pids(self) -> list[int]:
        """Process ids of every task. ``cluster.pids``"""
        return [p.pid for p in self.processes.values()]


def main(argv: list[str] | None = None) -> int:
    """``python -m study.cluster serve``: run the task TF_CONFIG describes."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["serve"], ["serve", "--local"]):
        print("usage: TF_CONFIG='{...}' python -m study.cluster serve", file=sys.stderr)
        return 2
    try:
        config = parse_tf_config()
    except ValueError as e:
        print(f"study.cluster: {e}", file=sys.stderr)
        return 2
    serve(config, orphan_guard=argv[-1] == "--local")
    return 0


if __name__ == "__main__":
    sys.exit(main())
