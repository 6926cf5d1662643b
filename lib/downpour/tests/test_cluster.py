"""LocalCluster: starts real tf.distribute.Server processes, always ends them; TF_CONFIG checks; clear errors; the
address every task listens on."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from downpour import bind, faults
from downpour.cluster import parse_tf_config, wait_for_tasks
from downpour.local import LocalCluster, free_ports, port_in_use

pytestmark = pytest.mark.cluster


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_cluster_starts_listens_limits_workers_and_leaves_no_process_even_when_the_body_fails(alive):
    with pytest.raises(RuntimeError, match="midway") as failed:
        with LocalCluster(workers=2, ps=1, start_timeout=120) as cluster:
            pids = cluster.pids
            assert len(pids) == 3 and all(alive(p) for p in pids)
            assert set(cluster.spec) == {"chief", "ps", "worker"}  # the chief's address is reserved, not started
            ports = [int(a.rpartition(":")[2]) for job in ("worker", "ps") for a in cluster.spec[job]]
            assert all(port_in_use(p) for p in ports)
            if hasattr(os, "sched_getaffinity"):  # each worker computes on one core
                assert all(len(os.sched_getaffinity(cluster.processes[("worker", i)].pid)) == 1 for i in (0, 1))
            assert "intra-op threads 1" in cluster.log_tail("worker", 0)
            if bind.available():  # loopback only, not TensorFlow's every interface
                assert cluster.bind == "127.0.0.1" and "listening on 127.0.0.1" in cluster.log_tail("ps", 0)
                assert all({bind.plain(a) for a in bind.listening(p)} == {"127.0.0.1"} for p in ports)
            raise RuntimeError("midway")
    assert not any(alive(p) for p in pids)
    assert not any(port_in_use(p) for p in ports)
    # the body failed: the tasks' logs are kept, and the error says where
    assert failed.value.__notes__ == [f"LocalCluster: the tasks' logs are kept in {cluster.logs}"]
    assert (cluster.logs / "worker0.log").is_file()
    shutil.rmtree(cluster.logs)


def test_bad_counts_and_busy_ports_are_clear_errors():
    with pytest.raises(ValueError, match="workers: expected an integer >= 1; got 0"):
        LocalCluster(workers=0)
    with pytest.raises(ValueError, match="ps: expected an integer >= 1"):
        LocalCluster(ps=-1)
    with pytest.raises(ValueError, match=r"ports: need 3 \(one per task: 1 worker, 1 ps, 1 chief\); got 2"):
        LocalCluster(workers=1, ps=1, ports=free_ports(2))
    with socket.socket() as busy:
        busy.bind(("localhost", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"ports: \[{port}\] already in use"):
            LocalCluster(workers=1, ps=1, ports=[port, *free_ports(2)])


def test_a_cluster_that_cannot_start_times_out_with_a_message_naming_its_logs_which_it_keeps():
    cluster = LocalCluster(workers=1, ps=1, start_timeout=0.5)
    with pytest.raises(TimeoutError, match=rf"not listening after 0.5 s; logs in {cluster.logs}"):
        with cluster:
            pass
    assert cluster.logs.is_dir() and {p.name for p in cluster.logs.glob("*.log")} >= {"ps0.log", "worker0.log"}
    shutil.rmtree(cluster.logs)


def test_the_logs_folder_is_removed_after_a_clean_stop_and_kept_after_a_failure_named_in_its_message():
    clean = LocalCluster(workers=1, ps=1)
    assert clean.logs.is_dir()
    clean.stop()
    assert not clean.logs.exists()
    failed = LocalCluster(workers=1, ps=1)
    error = RuntimeError("the body failed")
    failed.__exit__(RuntimeError, error, None)  # what `with` does when its body raises
    assert failed.logs.is_dir() and error.__notes__ == [f"LocalCluster: the tasks' logs are kept in {failed.logs}"]
    kept = LocalCluster(workers=1, ps=1, keep_logs=True)
    kept.stop()
    assert kept.logs.is_dir()
    shutil.rmtree(failed.logs), shutil.rmtree(kept.logs)


def test_unreachable_tasks_time_out_naming_each_one():
    ports = free_ports(2)
    spec = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"ps:0 \(localhost:{ports[0]}\), worker:0 \(localhost:{ports[1]}\) "
                                           r"not reachable after 0.5 s"):
        wait_for_tasks(spec, timeout=0.5)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("text, match", [
    ("{not json", "TF_CONFIG: not valid JSON"),
    ('{"task": {"type": "worker"}}', "'cluster' must map job names"),
    ('{"cluster": {"workers": ["a:1"]}, "task": {"type": "workers"}}', "unknown job 'workers'"),
    ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker"}}', r"must be a non-empty list of 'host:port'"),
    ('{"cluster": {"worker": [":1"]}, "task": {"type": "worker"}}', r"must be a non-empty list of 'host:port'"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps"}}', "'task.type' must be one of"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', r"'task.index' must be 0..0"),
    ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}}', "at most one chief"),
])
def test_tf_config_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_tf_config(text)


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_entry_point_rejects_a_bad_tf_config_and_a_chief_without_a_job_with_exit_2():
    run = subprocess.run([sys.executable, "-m", "downpour"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG="{oops"), timeout=120)
    assert run.returncode == 2
    assert "downpour: TF_CONFIG: not valid JSON" in run.stderr
    chief = json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
                        "task": {"type": "chief"}})
    run = subprocess.run([sys.executable, "-m", "downpour"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG=chief), timeout=120)
    assert run.returncode == 2 and "the chief needs --job" in run.stderr
    for job, message in (('{"stepz": 3}', "--job: unknown field 'stepz'; allowed: model, model_kwargs, data"),
                         ('{"optimizer": "adamz"}', "optimizer: got 'adamz'; allowed: 'sgd', 'adagrad'"),
                         ("no-such-job.json", "--job: 'no-such-job.json' is neither a JSON object nor a file")):
        run = subprocess.run([sys.executable, "-m", "downpour", "--job", job], capture_output=True, text=True,
                             env=dict(os.environ, TF_CONFIG=chief), timeout=120)
        assert run.returncode == 2 and f"downpour: {message}" in run.stderr, run.stderr[-500:]
    ok = parse_tf_config(json.dumps({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "ps"}}))
    assert ok["task"] == {"type": "ps", "index": 0}


@pytest.mark.slow  # over 4 s: make test-slow (CI)
@pytest.mark.skipif(not bind.available(), reason="--bind needs Linux and a C compiler")
def test_a_task_started_by_hand_listens_on_loopback_only_unless_bind_0_0_0_0_asks_for_every_interface(alive, tmp_path):
    """The audit's method: the listening sockets of each task's port, read from /proc/net/tcp and tcp6."""
    ports = free_ports(2)
    spec = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    started = []
    try:
        for job, flags in (("ps", []), ("worker", ["--bind", "0.0.0.0"])):
            config = json.dumps({"cluster": spec, "task": {"type": job, "index": 0}})
            with open(tmp_path / f"{job}.log", "w") as log:
                started.append(subprocess.Popen([sys.executable, "-m", "downpour", *flags], start_new_session=True,
                                                env=dict(os.environ, TF_CONFIG=config), stdout=log,
                                                stderr=subprocess.STDOUT))
        wait_for_tasks(spec, timeout=120)
        deadline = time.monotonic() + 60  # the task prints its line once it has checked where it listens
        while "serving ps:0" not in (tmp_path / "ps.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert {bind.plain(a) for a in bind.listening(ports[0])} == {"127.0.0.1"}  # no --bind: loopback only
        assert bind.describe(bind.listening(ports[1])).startswith("every interface")  # asked for, explicitly
    finally:
        for process in started:
            os.killpg(process.pid, 9)
            process.wait()
    assert "listening on 127.0.0.1;" in (tmp_path / "ps.log").read_text()
    assert "warning" not in (tmp_path / "ps.log").read_text()
    warned = [line for line in (tmp_path / "worker.log").read_text().splitlines() if "warning" in line]
    assert warned == [bind.wide_warning("worker:0", "0.0.0.0", ports[1]).join(["downpour: ", ""])], warned
    assert not any(alive(p.pid) for p in started)
    run = subprocess.run([sys.executable, "-m", "downpour", "--bind", "somewhere"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "ps"}})),
                         timeout=120)
    assert run.returncode == 2 and "--bind: expected an IP address of this machine" in run.stderr


# -- one task by hand: Ctrl-C, a port in use, the bind shim -----------------------------------------------------


def _task(job: str, spec: dict, log_dir, *flags: str, index: int = 0, env: dict | None = None) -> subprocess.Popen:
    """``python -m downpour`` for one task, its terminal output in a pipe (not a new session: it gets Ctrl-C)."""
    config = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
    return subprocess.Popen([sys.executable, "-m", "downpour", "--log-dir", str(log_dir), *flags],
                            env={**os.environ, "TF_CONFIG": config, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_line(process: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line.rstrip("\n"))
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} in {lines}")


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_ctrl_c_ends_a_ps_task_a_worker_and_a_chief_within_seconds_with_exit_code_130(tmp_path):
    ports = free_ports(3)
    spec = {"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"], "worker": [f"localhost:{ports[2]}"]}
    tasks = {"ps": _task("ps", spec, tmp_path), "worker": _task("worker", spec, tmp_path)}
    try:
        for job, process in tasks.items():
            _wait_for_line(process, f"serving {job}:0 ")
        # a chief waiting for tasks that never come (its start_timeout is long)
        other = {"chief": spec["chief"], "ps": [f"localhost:{free_ports(1)[0]}"], "worker": spec["worker"]}
        tasks["chief"] = _task("chief", other, tmp_path, "--job", '{"start_timeout": 600, "data": "downpour.data:idx"}')
        deadline, log = time.monotonic() + 120, tmp_path / f"chief-0-{ports[0]}.log"
        while not (log.exists() and "==== Ctrl-C (SIGINT) ends chief:0" in log.read_text()):  # its handler is set
            assert time.monotonic() < deadline and tasks["chief"].poll() is None, "the chief never set its handler"
            time.sleep(0.1)
        time.sleep(5)  # most likely past its imports, into its wait (the handler works wherever it is)
        for job, process in tasks.items():
            assert process.poll() is None, job
            started = time.monotonic()
            process.send_signal(signal.SIGINT)  # what Ctrl-C sends
            assert process.wait(timeout=10) == 130, job
            assert time.monotonic() - started < 5, job
            rest = [line for line in process.stdout.read().splitlines() if line.strip()]
            assert rest[-1].startswith(f"downpour: {job}:0: stopped by Ctrl-C (SIGINT), exit code 130"), rest
            assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in rest), rest
    finally:
        for process in tasks.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_a_port_in_use_gives_one_line_naming_the_port_and_the_task_and_the_log_file(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = {"chief": [f"localhost:{free_ports(1)[0]}"], "ps": [f"localhost:{port}"],
                "worker": [f"localhost:{free_ports(1)[0]}"]}
        process = _task("ps", spec, tmp_path)
        out, _ = process.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert process.returncode == faults.EXIT_PORT_IN_USE == 5  # its own code, not a bad argument's 2
    assert lines == [f"downpour: ps:0 cannot listen on port {port} (localhost:{port}): the port is in use by another "
                     f"process; stop it or give this task another port in TF_CONFIG (full log: "
                     f"{tmp_path}/ps-0-{port}.log)"], out
    assert (tmp_path / f"ps-0-{port}.log").read_text().count("\n") > 1  # TensorFlow's own text went there


def test_without_a_compiler_bind_gives_one_line_and_local_cluster_refuses(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = {"PATH": str(empty), "CC": "", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    spec = {"ps": ["localhost:1"], "worker": ["localhost:2"]}
    run = subprocess.run([sys.executable, "-m", "downpour"], capture_output=True, text=True,  # loopback, by default
                         env={**os.environ, **bare, "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "ps"}})},
                         timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == ["downpour: --bind: listening on one address (127.0.0.1 unless --bind names "
                                       "another) needs a C compiler (cc, gcc or clang, or $CC) to build a 60-line "
                                       "bind() shim once, because TensorFlow's server always listens on every "
                                       "interface ([::]); install one, or give --bind 0.0.0.0 to listen on every "
                                       "interface, on a private network or behind a firewall"], run.stderr
    for name, value in bare.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(bind.BindError, match=r"LocalCluster: cannot keep the tasks on loopback \(--bind: listening "
                                             r"on one address.*needs a C compiler.*pass bind=None to let them listen "
                                             r"on every interface"):
        LocalCluster(workers=1, ps=1)


@pytest.mark.skipif(not bind.available(), reason="--bind needs Linux and a C compiler")
def test_the_cached_shim_is_checked_before_it_is_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = bind.build_shim()
    assert built == bind.cached_shim() and built.name == f"libdownpour_bind-{bind.shim_key()[:16]}.so"
    stamp = built.stat().st_mtime_ns
    built.write_bytes(built.read_bytes() + b"tampered")  # its bytes no longer match the manifest
    assert bind.cached_shim() is None
    rebuilt = bind.build_shim()
    assert rebuilt == built and bind.cached_shim() == built and built.stat().st_mtime_ns != stamp
    assert b"tampered" not in built.read_bytes()
    manifest = json.loads(built.with_suffix(".json").read_text())
    assert manifest["key"] == bind.shim_key() and manifest["flags"] == [*bind.FLAGS, *bind.LIBS]
    built.parent.chmod(0o777)  # a folder others can write: refused, not loaded
    try:
        with pytest.raises(bind.BindError, match="refusing to load the bind\\(\\) shim from .*others can write"):
            bind.environment("127.0.0.1")
    finally:
        built.parent.chmod(0o700)


def test_ipv6_addresses_are_understood_and_an_evaluator_is_refused():
    from downpour.cluster import reachable, split_address

    assert split_address("[::1]:2222") == ("::1", 2222) and split_address("host:22") == ("host", 22)
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6) as listening:
            try:
                listening.bind(("::1", 0))
            except OSError:
                pytest.skip("no IPv6 loopback here")
            listening.listen()
            assert reachable(f"[::1]:{listening.getsockname()[1]}")
    assert parse_tf_config(json.dumps({"cluster": {"worker": ["[::1]:1"], "ps": ["[fe80::1]:2"]},
                                       "task": {"type": "ps"}}))["cluster"]["ps"] == ["[fe80::1]:2"]
    with pytest.raises(ValueError, match="must be a non-empty list of 'host:port'"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["::1:1"]}, "task": {"type": "worker"}}))
    with pytest.raises(ValueError, match="TF_CONFIG: downpour has no evaluator task"):
        parse_tf_config(json.dumps({"cluster": {"worker": ["a:1"], "evaluator": ["a:2"]}, "task": {"type": "worker"}}))
