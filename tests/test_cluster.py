"""LocalCluster: starts real tf.distribute.Server processes, always ends them; TF_CONFIG checks; clear errors; the
address every task listens on."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from study.ps import bind
from study.ps.cluster import parse_tf_config, wait_for_tasks
from study.ps.local import LocalCluster, free_ports, port_in_use

pytestmark = pytest.mark.cluster


def test_cluster_starts_listens_limits_workers_and_leaves_no_process_even_when_the_body_fails(alive):
    with pytest.raises(RuntimeError, match="midway"):
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


def test_a_cluster_that_cannot_start_times_out_with_a_message():
    with pytest.raises(TimeoutError, match=r"not listening after 0.5 s"):
        with LocalCluster(workers=1, ps=1, start_timeout=0.5):
            pass


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


def test_entry_point_rejects_a_bad_tf_config_and_a_chief_without_a_job_with_exit_2():
    run = subprocess.run([sys.executable, "-m", "study.ps"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG="{oops"), timeout=120)
    assert run.returncode == 2
    assert "study.ps: TF_CONFIG: not valid JSON" in run.stderr
    chief = json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
                        "task": {"type": "chief"}})
    run = subprocess.run([sys.executable, "-m", "study.ps"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG=chief), timeout=120)
    assert run.returncode == 2 and "the chief needs --job" in run.stderr
    for job, message in (('{"stepz": 3}', "--job: unknown field 'stepz'; allowed: model, model_kwargs, data"),
                         ('{"optimizer": "adamz"}', "optimizer: got 'adamz'; allowed: 'sgd', 'adagrad'"),
                         ("no-such-job.json", "--job: 'no-such-job.json' is neither a JSON object nor a file")):
        run = subprocess.run([sys.executable, "-m", "study.ps", "--job", job], capture_output=True, text=True,
                             env=dict(os.environ, TF_CONFIG=chief), timeout=120)
        assert run.returncode == 2 and f"study.ps: {message}" in run.stderr, run.stderr[-500:]
    ok = parse_tf_config(json.dumps({"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, "task": {"type": "ps"}}))
    assert ok["task"] == {"type": "ps", "index": 0}


@pytest.mark.skipif(not bind.available(), reason="--bind needs Linux and a C compiler")
def test_a_task_started_by_hand_with_bind_listens_there_only_and_without_it_on_every_interface(alive, tmp_path):
    ports = free_ports(2)
    spec = {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    started = []
    try:
        for job, flags in (("ps", ["--bind", "127.0.0.1"]), ("worker", [])):
            config = json.dumps({"cluster": spec, "task": {"type": job, "index": 0}})
            with open(tmp_path / f"{job}.log", "w") as log:
                started.append(subprocess.Popen([sys.executable, "-m", "study.ps", *flags], start_new_session=True,
                                                env=dict(os.environ, TF_CONFIG=config), stdout=log,
                                                stderr=subprocess.STDOUT))
        wait_for_tasks(spec, timeout=120)
        deadline = time.monotonic() + 60  # the task prints its line once it has checked where it listens
        while "serving ps:0" not in (tmp_path / "ps.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert {bind.plain(a) for a in bind.listening(ports[0])} == {"127.0.0.1"}
        assert bind.describe(bind.listening(ports[1])).startswith("every interface")  # TensorFlow's default
    finally:
        for process in started:
            os.killpg(process.pid, 9)
            process.wait()
    assert "listening on 127.0.0.1" in (tmp_path / "ps.log").read_text()
    assert not any(alive(p.pid) for p in started)
    run = subprocess.run([sys.executable, "-m", "study.ps", "--bind", "somewhere"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "ps"}})),
                         timeout=120)
    assert run.returncode == 2 and "--bind: expected an IP address of this machine" in run.stderr
