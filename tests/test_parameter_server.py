"""Downpour SGD for any Keras model on a real local cluster: n_fetch/n_push, sharding over two ps tasks,
disjoint data shards, staleness, faults (worker, ps, chief) with update accounting, clear errors, no orphans.

The cluster tests share one LocalCluster (2 workers, 2 ps tasks) to keep the suite short; every job is a
chief process started through ``python -m study.ps``, like every server task.
"""

import contextlib
import io
import time

import numpy as np
import pytest
import tensorflow as tf

from study.ps.local import LocalCluster, free_ports
from study.models import DEEP_MNIST_PARAMETERS
from study.ps import DownpourConfig, PsVariables, build_model, run_chief, run_downpour
from study.ps.faults import EXIT_UNREACHABLE

MLP = "study.ps.examples:mnist_mlp"


@pytest.fixture(scope="module")
def cluster(alive_pids):
    with LocalCluster(workers=2, ps=2, start_timeout=180) as c:
        yield c
    alive_pids.extend(c.pids)


@pytest.fixture(scope="module")
def alive_pids():
    """Every pid the module's cluster started; checked dead after the cluster is stopped, even if a test failed."""
    import os

    pids: list[int] = []
    yield pids

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    assert pids and not any(alive(p) for p in pids)


@pytest.mark.cluster
def test_deep_mnist_cnn_on_two_workers_and_two_sharded_ps_tasks(cluster):
    config = DownpourConfig(workers=2, ps=2, steps=32, n_fetch=2, n_push=2, steps_per_function=4, batch=32,
                            learning_rate=0.05)
    r = run_downpour(config, cluster, timeout_s=500)
    assert r["parameters"] == DEEP_MNIST_PARAMETERS
    fc1 = next(row for row in r["placement"] if row["variable"].endswith("fc1/kernel"))
    assert [s["task"] for s in fc1["shards"]] == ["ps:0", "ps:1"]  # the 12.8 MB kernel is split over both
    assert set(r["bytes_per_task"]) == {"ps:0", "ps:1"} and min(r["bytes_per_task"].values()) > 4e6
    assert r["returned_functions"] == r["scheduled_functions"] == 8
    assert r["applied_updates"] == r["returned_updates"] == 32 // 2  # one update per n_push steps
    assert set(r["functions_per_worker"]) == {"0", "1"}
    assert r["samples_shared_between_workers"] == 0  # each worker reads its own shard
    assert len(r["staleness"]) == 16  # one per applied update
    assert max(r["staleness"]) < r["applied_updates"]  # only updates the other worker applied in between count
    assert r["loss_last"] < r["loss_first"]
    assert "intra_op_parallelism_threads=1" in r["worker_limits"]


@pytest.mark.cluster
def test_another_architecture_on_one_worker_is_plain_async_sgd_with_zero_staleness(cluster):
    config = DownpourConfig(model=MLP, model_kwargs={"hidden": 64}, workers=1, ps=2, steps=48, steps_per_function=4,
                            learning_rate=0.1, eval_every=16, transform="study.ps.examples:decay",
                            transform_kwargs={"factor": 1.0})
    r = run_downpour(config, cluster, timeout_s=400)
    assert set(r["staleness"]) == {0}  # one worker: nobody else updates between its fetch and its push
    assert r["applied_updates"] == r["scheduled_steps"] == 48  # n_fetch = n_push = 1
    seen = [p["applied_updates"] for p in r["curve"]]  # read while training runs: at or past each multiple of 16
    assert seen[0] == 0 and seen[-1] == 48 and seen == sorted(set(seen)) and all(v >= 16 * i for i, v in enumerate(seen))
    assert r["curve"][-1]["accuracy"] > 0.5 > r["curve"][0]["accuracy"]
    assert any(row["variable"].endswith("bn1/moving_mean") for row in r["placement"])  # non-trainable state on the ps


@pytest.mark.cluster
def test_a_killed_worker_chief_and_ps_task_and_every_update_accounted_for(cluster):
    """One job, three faults: worker 0 killed (and started again), the chief killed, a ps task killed."""
    config = DownpourConfig(model=MLP, workers=2, ps=2, steps=112, n_fetch=2, n_push=2, steps_per_function=4,
                            optimizer="adagrad", learning_rate=0.1, checkpoint_every=8, kill_worker_at=6,
                            kill_chief_at=16, kill_ps_at=36, shard_min_bytes=65536)
    r = run_downpour(config, cluster, timeout_s=900)
    worker, chief, ps = r["faults"]
    assert (worker["killed"], chief["killed"]) == ("worker:0", "chief:0") and ps["killed"].startswith("ps:")
    # a killed chief or ps: the job restarts the chief, which restores the last checkpoint
    resumed = [a for a in r["attempts"] if a["resumed"]]
    assert [a["restored_version"] for a in resumed] == [chief["checkpoint_version"], ps["checkpoint_version"]]
    # the version counter lives on the other ps task, so the updates lost with the ps are counted exactly
    assert ps["version_at_failure"] is not None
    lost = ps["version_at_failure"] - ps["checkpoint_version"]
    assert lost >= 1
    # every scheduled function returned once; every update in the final model was applied before the checkpoint
    # it was restored from, or after the last restart -- except those of a worker attempt killed midway
    assert r["returned_functions"] == r["scheduled_functions"] == 28
    killed_attempt = r["applied_updates"] - r["returned_updates"]
    assert r["returned_updates"] == 112 // 2 and 0 <= killed_attempt < config.pushes_per_function
    assert r["loss_last"] < r["loss_first"]


def test_push_applies_exactly_v_minus_lr_times_t_of_g_and_adagrad_next_to_the_variable():
    config = DownpourConfig(model=MLP, model_kwargs={"hidden": 8}, learning_rate=0.25)
    ps = PsVariables(build_model(config), config)
    before = [v.numpy() for v in ps.trainable]
    grads = [tf.fill(v.shape, 0.5) for v in ps.trainable]
    _, _, state, _ = ps.fetch()
    assert int(ps.push(grads, state)) == 1
    for b, v in zip(before, ps.trainable):
        np.testing.assert_array_equal(v.numpy(), b - np.float32(0.25) * np.float32(0.5))
    ada = DownpourConfig(model=MLP, model_kwargs={"hidden": 8}, learning_rate=0.25, optimizer="adagrad",
                         adagrad_initial=0.0 + 0.75)
    ps = PsVariables(build_model(ada), ada)
    before = [v.numpy() for v in ps.trainable]
    ps.push(grads, ps.fetch()[2])  # sum g^2 = 0.75 + 0.25 = 1: the step is lr * g
    for b, v in zip(before, ps.trainable):
        np.testing.assert_allclose(v.numpy(), b - 0.25 * 0.5, rtol=1e-6)


@pytest.mark.parametrize("bad, match", [
    ({"n_fetch": 0}, "n_fetch: expected an integer >= 1; got 0"),
    ({"n_push": 0}, "n_push: expected an integer >= 1; got 0"),
    ({"n_push": 3}, "steps_per_function: must be a multiple of n_fetch=1 and n_push=3"),
    ({"workers": 0}, "workers: expected an integer >= 1"),
    ({"model": "study.models.deep_mnist_cnn"}, "model: expected 'module:function'"),
    ({"model": "study.models:no_such_model"}, "model: 'study.models' has no callable 'no_such_model'"),
    ({"transform": "no_such_module:f"}, "transform: cannot import 'no_such_module'"),
    ({"optimizer": "adamx"}, "optimizer: got 'adamx'; allowed: 'sgd', 'adagrad' \\(Downpour's\\), a Keras optimizer name"),
    ({"kill_worker_after": 3}, "unexpected keyword argument 'kill_worker_after'"),
    ({"kill_worker_at": 3}, "kill_worker_at: needs workers >= 2"),
    ({"kill_ps_at": 3}, "kill_ps_at: needs checkpoint_every > 0"),
    ({"learning_rate": 0.0}, "learning_rate: expected a number in"),
])
def test_bad_configuration(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        DownpourConfig(**bad)


def test_a_chief_whose_tasks_are_unreachable_stops_with_their_names_not_a_hang():
    ports = free_ports(3)
    spec = {"chief": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"], "worker": [f"localhost:{ports[2]}"]}
    err = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(err):
        code = run_chief(DownpourConfig(start_timeout=1.0, data="study.ps.data:idx", data_kwargs={"folder": "x"}), spec)
    assert code == EXIT_UNREACHABLE and time.monotonic() - started < 10
    assert f"ps:0 (localhost:{ports[1]}), worker:0 (localhost:{ports[2]}) not reachable after 1 s" in err.getvalue()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert run_chief(DownpourConfig(), {"ps": spec["ps"], "worker": spec["worker"]}) == 2
    assert "needs the jobs chief, ps and worker; missing ['chief']" in err.getvalue()
