"""Downpour SGD for Keras models on a real local cluster: an Embedding and two inputs with Adam and a masked layer
on two ps tasks, data checked against the model on every worker, n_fetch/n_push, sharding, disjoint data shards,
staleness, faults (worker, ps, chief) with update accounting and one message each, a refused --resume, clear
errors and exit codes, no orphans.

The cluster tests share one LocalCluster (2 workers, 2 ps tasks); every job is a chief process started through
``python -m downpour``, like every server task. ``make test`` runs the first two cluster tests (the issue-22
"done when" job and the data checks); the others are marked ``slow`` (``pytest -m slow``).
"""

import contextlib
import dataclasses
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from downpour import DownpourConfig, Faults, PsVariables, build_model, faults, run_chief, run_downpour
from downpour.examples import tabular as tabular_example
from downpour.examples import tokens as tokens_example
from downpour.faults import EXIT_UNREACHABLE
from downpour.local import LocalCluster, free_ports
from study.gradients.ps_data import write_study_mnist
from study.models import DEEP_MNIST_PARAMETERS

MLP = "downpour.examples:mnist_mlp"


@pytest.fixture(scope="module")
def cluster(alive_pids, request):
    failed = request.session.testsfailed
    with LocalCluster(workers=2, ps=2, start_timeout=180) as c:
        yield c
        c.keep_logs = request.session.testsfailed > failed  # the failures' messages name files in c.logs
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


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """lib/downpour/examples/tokens' data: one TFRecord file per worker and a test file; and the same with 16 tokens."""
    from downpour.examples.tokens.data import write

    folder = tmp_path_factory.mktemp("tokens")
    return str(write(folder / "ok", workers=2)), str(write(folder / "short", workers=2, length=16))


def _tokens_job(folder: str, **changes) -> dict:
    job = json.loads(tokens_example.JOB.read_text())
    job.update(data_kwargs={"folder": folder}, **changes)
    return job


@pytest.fixture
def section(cluster):
    """Where every task's log of the module's cluster ends as the test starts: the test reads only its own part.
    The last test's chief is gone, and each task had time to say so (it looks once a second), before the mark."""
    if ("chief", 0) in cluster.processes:
        cluster.kill("chief", 0)
    time.sleep(3)
    return cluster.mark()


def _mnist(folder: str) -> dict:
    """The job fields that read the study's MNIST from ``folder`` (the ``mnist_files`` fixture)."""
    return {"data": "downpour.data:idx", "data_kwargs": {"folder": folder}}


def _said(log: str) -> list[str]:
    """The task's own one-line messages in what it wrote to its terminal."""
    return [line for line in log.splitlines() if line.startswith("downpour:")]


@pytest.mark.slow  # over 4 s: make test-slow (CI)
@pytest.mark.cluster
def test_an_embedding_and_two_inputs_train_with_adam_on_the_ps_and_no_frozen_bit_moves_on_either_task(
        cluster, tokens, monkeypatch):
    """Issue 22's "done when": Embedding + two inputs, Adam on the ps, a masked layer, 0 frozen bits on both tasks."""
    r = run_downpour(DownpourConfig(**_tokens_job(tokens[0], steps=96, eval_every=48, workers=2, ps=2)), cluster,
                     timeout_s=400)
    assert r.sparse_variables == ["embedding/embeddings"]  # the Embedding's gradient stayed IndexedSlices
    table = next(row for row in r.placement if row["variable"] == "embedding/embeddings")
    assert [s["task"] for s in table["shards"]] == ["ps:0", "ps:1"]  # the table is split over both ps tasks
    frozen = r.frozen
    assert set(frozen.per_task) == {"ps:0", "ps:1"}
    for task, counts in frozen.per_task.items():  # read back from each task: its frozen entries, bit for bit
        assert counts["frozen_entries"] > 0 and counts["frozen_changed"] == 0, task
    assert frozen.frozen_entries == 800 * 16 and frozen.frozen_changed_bits == 0
    assert frozen.masked_trainable_changed == frozen.masked_trainable_entries == 200 * 16  # the new tokens' rows
    assert "one MaskedOptimizer per ps task" in frozen.mask_placement
    assert all(r.optimizer_bytes_per_task[t] > 0 for t in ("ps:0", "ps:1"))  # Adam's state and masks on each task
    assert r.optimizer == "adam" and r.applied_updates == r.returned_updates == 48 and r.distinct_versions
    assert 0 < r.pushed_bytes < r.dense_push_bytes  # only the rows a push touched went over the network
    assert r.curve[-1]["loss"] < r.curve[0]["loss"] and r.final_accuracy > r.curve[0]["accuracy"] + 0.2
    assert r["applied_updates"] == r.applied_updates and dict(r.frozen)["frozen_changed_bits"] == 0  # as a mapping


@pytest.mark.slow  # over 15 s: make test-slow (CI)
@pytest.mark.cluster
def test_data_that_does_not_fit_the_model_or_a_missing_worker_file_ends_the_chief_with_one_line(
        cluster, tokens, tmp_path, monkeypatch):
    short = tokens[1]
    code, log = _chief(cluster, _tokens_job(short, steps=8), tmp_path)  # 16 tokens where the model declares 20
    assert code == faults.EXIT_BAD_INPUT, log
    assert _said(log) == [f"downpour: data: worker:0 reads {short}/train-0.tfrecord, which gives x['tokens'] of "
                          "shape (16,) per sample; the model's input 'tokens' expects (20,)"], log
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("train-0.tfrecord", "test.tfrecord"):  # worker 1's file is missing
        (broken / name).write_bytes((Path(tokens[0]) / name).read_bytes())
    code, log = _chief(cluster, _tokens_job(str(broken), steps=8), tmp_path)
    assert code == faults.EXIT_BAD_INPUT, log
    [line] = _said(log)
    assert line.startswith(f"downpour: data: worker:1 cannot read its training data ({broken}/train-1.tfrecord): "
                           f"NotFoundError: {broken}/train-1.tfrecord; No such file or directory"), line
    assert "Traceback" not in log and "E0000" not in log  # TensorFlow's and Python's text went to the log file
    # a record far into a file that does not parse: found before training, named with its file and its index
    from downpour.examples.tabular.data import write

    tabular = write(tmp_path / "tabular")
    lines = (tabular / "train.csv").read_text().splitlines()
    lines[1 + 300] = "x" + lines[1 + 300][lines[1 + 300].index(","):]  # after the header: record 300's first field
    (tabular / "train.csv").write_text("\n".join(lines) + "\n")
    job = json.loads(tabular_example.JOB.read_text())
    job.update(data_kwargs={"folder": str(tabular)}, checkpoint_dir=str(tmp_path / "ckpt"), steps=16)
    code, log = _chief(cluster, job, tmp_path)
    assert code == faults.EXIT_BAD_INPUT, log
    [line] = _said(log)
    assert line.startswith(f"downpour: data: worker:0 reads {tabular}/train.csv, whose record 300 (counting from 0) "
                           "cannot be read: InvalidArgumentError: ") and "not a valid float: x" in line, line


@pytest.mark.slow
@pytest.mark.cluster
def test_a_model_with_two_outputs_trains_on_the_cluster(cluster, monkeypatch):
    job = DownpourConfig(model="downpour.tests.ps_hooks:two_outputs", data="downpour.tests.ps_hooks:two_targets",
                         loss="mse", optimizer="adam",
                         learning_rate=0.01, batch=16, steps=64, steps_per_function=4, eval_every=32, eval_samples=64,
                         workers=2, ps=2)
    r = run_downpour(job, cluster, timeout_s=400)
    assert r.applied_updates == 64 and r.samples_shared_between_workers == 0
    assert r.curve[-1]["loss"] < 0.7 * r.curve[0]["loss"] and r.final_accuracy is None  # both outputs' losses


@pytest.mark.slow
@pytest.mark.cluster
def test_deep_mnist_cnn_on_two_workers_and_two_sharded_ps_tasks(cluster, mnist_files):
    config = DownpourConfig(model="study.models:deep_mnist_cnn", **_mnist(mnist_files), workers=2, ps=2, steps=32,
                            n_fetch=2, n_push=2, steps_per_function=4, batch=32, learning_rate=0.05)
    r = run_downpour(config, cluster, timeout_s=500)
    assert r["parameters"] == DEEP_MNIST_PARAMETERS
    fc1 = next(row for row in r["placement"] if row["variable"].endswith("fc1/kernel"))
    assert [s["task"] for s in fc1["shards"]] == ["ps:0", "ps:1"]  # the 12.8 MB kernel is split over both
    assert set(r["bytes_per_task"]) == {"ps:0", "ps:1"} and min(r["bytes_per_task"].values()) > 4e6
    assert r["returned_functions"] == r["scheduled_functions"] == 8
    assert r["applied_updates"] == r["returned_updates"] == 32 // 2  # one update per n_push steps
    assert r["distinct_versions"]  # every push got its own version
    assert r["dataset_graph_bytes"] < 100_000  # file readers, not the 2.7 MB of training images
    assert set(r["functions_per_worker"]) == {"0", "1"}
    assert r["samples_shared_between_workers"] == 0  # each worker reads its own shard
    assert len(r["staleness"]) == 16  # one per applied update
    assert max(r["staleness"]) < r["applied_updates"]  # only updates the other worker applied in between count
    assert r["loss_last"] < r["loss_first"]
    assert "intra_op_parallelism_threads=1" in r["worker_limits"]


@pytest.mark.slow
@pytest.mark.cluster
def test_another_architecture_on_one_worker_is_plain_async_sgd_with_zero_staleness(cluster, mnist_files, section):
    config = DownpourConfig(model=MLP, **_mnist(mnist_files), model_kwargs={"hidden": 64}, workers=1, ps=2, steps=48,
                            steps_per_function=4, learning_rate=0.1, eval_every=16, transform="downpour.examples:decay",
                            transform_kwargs={"factor": 1.0})
    r = run_downpour(config, cluster, timeout_s=400)
    assert set(r["staleness"]) == {0}  # one worker: nobody else updates between its fetch and its push
    assert r["applied_updates"] == r["scheduled_steps"] == 48  # n_fetch = n_push = 1
    seen = [p["applied_updates"] for p in r["curve"]]  # read while training runs: at or past each multiple of 16
    assert (seen[0] == 0 and seen[-1] == 48 and seen == sorted(set(seen))
            and all(v >= 16 * i for i, v in enumerate(seen)))
    assert r["curve"][-1]["accuracy"] > 0.5 > r["curve"][0]["accuracy"]
    assert any(row["variable"].endswith("bn1/moving_mean") for row in r["placement"])  # non-trainable state on the ps
    # the chief finished its job: each ps task says so (it looks once a second), not that the chief has gone
    deadline, last = time.monotonic() + 60, {}
    while time.monotonic() < deadline and len(last) < 2:
        for i in (0, 1):
            said = [line for line in _said(cluster.said("ps", i, since=section)) if "the chief" in line]
            if said:
                last[i] = said[-1]
        time.sleep(0.5)
    assert set(last) == {0, 1} and all(line.startswith(f"downpour: ps:{i}: the chief (") and line.endswith(
        "finished its job; this task keeps serving, for the next job's chief") for i, line in last.items()), last


@pytest.mark.slow
@pytest.mark.cluster
def test_a_killed_worker_chief_and_ps_task_each_say_one_line_and_every_update_is_accounted_for(cluster, section,
                                                                                                mnist_files):
    """One job, three faults: worker 0 killed (and started again), the chief killed, a ps task killed; one at a time,
    each once the job has seen the one before (the launcher waits for that), so the test holds in any timing."""
    config = DownpourConfig(model=MLP, **_mnist(mnist_files), workers=2, ps=2, steps=112, n_fetch=2, n_push=2,
                            steps_per_function=4, optimizer="adagrad", learning_rate=0.1, checkpoint_every=8,
                            shard_min_bytes=65536)
    r = run_downpour(config, cluster, timeout_s=900, faults=Faults(worker_at=6, chief_at=16, ps_at=36))
    worker, chief, ps = r["faults"]
    assert (worker["killed"], chief["killed"]) == ("worker:0", "chief:0") and ps["killed"].startswith("ps:")
    assert [e["acknowledged"] for e in r["faults"]] == [True, True, True], r["faults"]
    # the chief saw two faults, the worker's and the ps task's: one line each, and nothing else
    log = cluster.said("chief", 0, since=section)
    said = _said(log)
    assert len(said) == 2, said
    assert said[0].startswith("downpour: worker:0 (") and "lost; its functions go to the other workers" in said[0]
    assert said[1].startswith(f"downpour: {ps['killed']} lost (") and "restart it, then the chief with --resume" in \
        said[1] and said[1].endswith(f"(full log: {cluster.full_log('chief', 0)})"), said
    assert "E0000" not in log and "Traceback" not in log  # TensorFlow's error text is in the log file only
    gone = [line for line in _said(cluster.said("ps", 0, since=section)) if "the chief" in line]
    assert any("has gone before the end of its job (lost, or stopped); this task keeps serving" in line
               for line in gone), gone  # the killed chief (the launcher waited for this line)
    # a killed chief or ps: the job restarts the chief, which restores the last checkpoint
    resumed = [a for a in r["attempts"] if a["resumed"]]
    assert [a["restored_version"] for a in resumed] == [chief["checkpoint_version"], ps["checkpoint_version"]]
    # the version counter lives on the other ps task, so the updates lost with the ps are counted exactly (none,
    # when the chief wrote a checkpoint between the launcher's last look and the kill)
    assert ps["version_at_failure"] is not None and ps["version_at_failure"] >= ps["checkpoint_version"]
    # every scheduled function returned once; every update in the final model was applied before the checkpoint
    # it was restored from, or after the last restart -- except those of the killed worker's attempt, which may have
    # pushed none, some or all of its updates before the kill (all: killed after its last push, before it returned)
    assert r["returned_functions"] == r["scheduled_functions"] == 28
    killed_attempt = r["applied_updates"] - r["returned_updates"]
    assert r["returned_updates"] == 112 // 2 and 0 <= killed_attempt <= config.pushes_per_function
    assert r["loss_last"] < r["loss_first"]


def test_push_applies_exactly_v_minus_lr_times_t_of_g_and_adagrad_next_to_the_variable():
    config = DownpourConfig(model=MLP, model_kwargs={"hidden": 8}, learning_rate=0.25)
    ps = PsVariables(build_model(config), config)
    before = ps.values()
    grads = [tf.fill(v.shape, 0.5) for v in before]
    _, _, state = ps.fetch()
    assert int(ps.push(grads, state)[0]) == 1
    for b, v in zip(before, ps.values()):
        np.testing.assert_array_equal(v, b - np.float32(0.25) * np.float32(0.5))
    ada = DownpourConfig(model=MLP, model_kwargs={"hidden": 8}, learning_rate=0.25, optimizer="adagrad",
                         adagrad_initial=0.0 + 0.75)
    ps = PsVariables(build_model(ada), ada)
    before = ps.values()
    ps.push(grads, ps.fetch()[2])  # sum g^2 = 0.75 + 0.25 = 1: the step is lr * g
    # Eigen's vectorised rsqrt(1.0) is 1 - 2^-23 here (2 ulps), so the step is 0.125 to that relative error, and
    # W - step rounds to an ulp of |W| + 0.125 (a relative tolerance on the result fails where it cancels towards 0)
    for b, v in zip(before, ps.values()):
        error = np.abs(v - (b - np.float32(0.25) * np.float32(0.5)))
        assert (error <= 0.125 * 2.0**-22 + np.spacing(np.abs(b) + np.float32(0.125))).all(), error.max()


def test_faults_are_not_job_fields_and_are_checked_against_the_job():
    with pytest.raises(ValueError, match="faults.worker_at: needs workers >= 2"):
        run_downpour(DownpourConfig(), faults=Faults(worker_at=3))
    with pytest.raises(ValueError, match="faults.ps_at: needs checkpoint_every > 0"):
        run_downpour(DownpourConfig(workers=2), faults=Faults(ps_at=3))
    from downpour.config import FAULT_FIELDS, job_from_dict

    fields = {f.name for f in dataclasses.fields(DownpourConfig)}
    for name in FAULT_FIELDS:
        assert name not in fields
        with pytest.raises(ValueError, match=f"--job: {name} injects faults for experiments and is not a job field"):
            job_from_dict({name: 3})
    with pytest.raises(TypeError, match="kill_worker_at"):  # not a job field from Python either
        DownpourConfig(workers=2, kill_worker_at=3)


@pytest.mark.parametrize("bad, match", [
    ({"n_fetch": 0}, "n_fetch: expected an integer >= 1; got 0"),
    ({"n_push": 0}, "n_push: expected an integer >= 1; got 0"),
    ({"n_push": 3}, "steps_per_function: must be a multiple of n_fetch=1 and n_push=3"),
    ({"workers": 0}, "workers: expected an integer >= 1"),
    ({"model": "study.models.deep_mnist_cnn"}, "model: expected 'module:function'"),
    ({"model": "study.models:no_such_model"}, "model: 'study.models' has no callable 'no_such_model'"),
    ({"transform": "no_such_module:f"}, "transform: cannot import 'no_such_module'"),
    ({"optimizer": "adamx"},
     "optimizer: got 'adamx'; allowed: 'sgd', 'adagrad' \\(Downpour's\\), a Keras optimizer name"),
    ({"kill_worker_after": 3}, "unexpected keyword argument 'kill_worker_after'"),
    ({"sparse_push": "yes"}, "sparse_push: expected true or false"),
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
        code = run_chief(DownpourConfig(start_timeout=1.0, data="downpour.data:idx", data_kwargs={"folder": "x"}), spec)
    assert code == EXIT_UNREACHABLE and time.monotonic() - started < 10
    assert f"ps:0 (localhost:{ports[1]}), worker:0 (localhost:{ports[2]}) not reachable after 1 s" in err.getvalue()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert run_chief(DownpourConfig(), {"ps": spec["ps"], "worker": spec["worker"]}) == 2
    assert "needs the jobs chief, ps and worker; missing ['chief']" in err.getvalue()


def _chief(cluster, job: dict, tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """Run one chief process (``python -m downpour``) on the cluster; its exit code and the end of its log."""
    path = tmp_path / f"job{time.monotonic_ns()}.json"
    path.write_text(json.dumps(job))
    chief = cluster.start_chief(("--job", str(path), "--out", str(tmp_path / "result.json"), *args))
    try:
        code = chief.wait(timeout=timeout)
    finally:
        cluster.kill("chief", 0)
    return code, cluster.said("chief", 0)


def _since(path: Path, offset: int) -> str:
    """What was written to ``path`` after its first ``offset`` bytes."""
    return path.read_bytes()[offset:].decode(errors="replace")


@pytest.fixture(scope="module")
def mnist_files(tmp_path_factory):
    """The study's MNIST as IDX files: what a job's dataset function reads on each worker."""
    return str(write_study_mnist(tmp_path_factory.mktemp("mnist")))


@pytest.mark.slow
@pytest.mark.cluster
def test_adam_on_the_ps_with_frozen_entries_that_no_push_moves_then_a_refused_resume(cluster, mnist_files, tmp_path):
    # hidden 384: each shard of fc1/kernel holds 150,528 entries, over the 2^17 where MaskedOptimizer fuses its write
    job = DownpourConfig(model=MLP, model_kwargs={"hidden": 384}, data="downpour.data:idx",
                         data_kwargs={"folder": mnist_files}, workers=2, ps=2, steps=48, n_fetch=2, n_push=2,
                         steps_per_function=4, optimizer="adam", learning_rate=0.003, shard_min_bytes=16 * 1024,
                         freeze=["fc2/bias"], masks="downpour.examples:random_mask", masks_kwargs={"keep": 0.5},
                         checkpoint_every=8, checkpoint_dir=str(tmp_path / "ckpt"), eval_every=24)
    r = run_downpour(job, cluster, timeout_s=500)
    frozen = r["frozen"]
    assert frozen["frozen_entries"] > 10_000 and frozen["frozen_changed_bits"] == 0  # across both workers' pushes
    # most trainable entries of the masked kernel moved (not all: some input pixels are 0 in every image)
    assert frozen["masked_trainable_entries"] > 10_000
    assert frozen["masked_trainable_changed"] > 0.5 * frozen["masked_trainable_entries"]
    fc1 = next(row for row in r["placement"] if row["variable"] == "fc1/kernel")
    assert [s["task"] for s in fc1["shards"]] == ["ps:0", "ps:1"]
    # Adam's moments live next to their shard: the slots of fc1/kernel's second shard are on ps:1
    assert r["optimizer"] == "adam" and r["optimizer_bytes_per_task"]["ps:1"] >= 2 * fc1["shards"][1]["bytes"]
    assert r["applied_updates"] == r["returned_updates"] == 24 and r["distinct_versions"]
    assert r["curve"][-1]["loss"] < r["curve"][0]["loss"] and r["final_accuracy"] > 0.5
    assert r["samples_shared_between_workers"] == 0 and sum(r["samples_per_worker"].values()) == 48 * 50
    # the sidecar holds counts per function, not the samples read: its lists are bounded by the job's steps
    pointer = json.loads((tmp_path / "ckpt" / "latest.json").read_text())
    sidecar = json.loads((tmp_path / "ckpt" / pointer["folder"] / "state.json").read_text())

    def longest(x) -> int:
        if isinstance(x, dict):
            return max([longest(v) for v in x.values()], default=0)
        if isinstance(x, list):
            return max([len(x)] + [longest(v) for v in x])
        return 0

    assert pointer["version"] == 24 and 0 < longest(sidecar) <= job.functions
    # two chiefs started again from the same checkpoint are two attempts: the job's history is not in the sidecar,
    # so a restore cannot roll it back
    assert "attempts" not in sidecar["state"] and len(r["attempts"]) == 1
    for _ in range(2):
        code, log = _chief(cluster, {**dataclasses.asdict(job), "checkpoint_dir": str(tmp_path / "ckpt")},
                           tmp_path, "--resume")
        assert code == 0, log
    attempts = json.loads((tmp_path / "result.json").read_text())["attempts"]
    assert [(a["resumed"], a["restored_version"]) for a in attempts] == [(False, None), (True, 24), (True, 24)]
    # a sidecar that no longer matches its checkpoint: --resume is refused with the reason, exit 4
    sidecar_path = tmp_path / "ckpt" / pointer["folder"] / "state.json"
    sidecar_path.write_text(sidecar_path.read_text().replace('"version": 24', '"version": 23'))
    code, log = _chief(cluster, {**dataclasses.asdict(job), "checkpoint_dir": str(tmp_path / "ckpt")},
                       tmp_path, "--resume")
    assert code == faults.EXIT_RESUME_REFUSED, log
    assert "the sidecar of ckpt-000000000024-3 changed after it was written" in log


@pytest.mark.slow
@pytest.mark.cluster
def test_a_failing_push_is_not_a_lost_ps_and_every_chief_error_ends_with_a_message_and_a_code(
        cluster, mnist_files, tmp_path, monkeypatch):
    base = {"model": MLP, "model_kwargs": {"hidden": 8}, "data": "downpour.data:idx",
            "data_kwargs": {"folder": mnist_files}, "steps": 8, "steps_per_function": 4}
    # a push that fails on ps:0 with InvalidArgumentError (its text names /job:ps): exit 1, not 75
    full = cluster.full_log("chief", 0)
    start = full.stat().st_size if full.exists() else 0
    code, log = _chief(cluster, {**base, "transform": "downpour.tests.ps_hooks:nan_on_ps"}, tmp_path)
    assert code == faults.EXIT_FAILED, log
    [last] = _said(log)
    assert last.startswith("downpour: the chief failed: InvalidArgumentError") and "poisoned gradient" in last, log
    assert last.endswith(f"(full log: {full})") and "Traceback" in _since(full, start)  # kept, in the log
    start = full.stat().st_size
    code, log = _chief(cluster, {**base, "model": "downpour.tests.ps_hooks:broken_model", "model_kwargs": {}}, tmp_path)
    assert code == faults.EXIT_FAILED and "RuntimeError: this builder is broken on purpose" in log, log
    assert "broken_model" in _since(full, start)  # the catch-all kept the traceback
    missing = tmp_path / "no-such-folder"
    code, log = _chief(cluster, {**base, "data_kwargs": {"folder": str(missing)}}, tmp_path)
    assert code == faults.EXIT_BAD_INPUT, log
    assert _said(log) == [f"downpour: data: the chief cannot read the test split ({missing}/t10k-images-idx3-ubyte, "
                          f"{missing}/t10k-labels-idx1-ubyte): NotFoundError: {missing}/t10k-images-idx3-ubyte; "
                          "No such file or directory"], log
    code, log = _chief(cluster, {**base, "optimizer": "adamz"}, tmp_path)
    assert code == faults.EXIT_BAD_INPUT and "optimizer: got 'adamz'; allowed: 'sgd', 'adagrad'" in log, log


@pytest.mark.slow
@pytest.mark.cluster
def test_the_walk_through_s_second_model_trains_with_adam_and_a_frozen_layer(cluster, tmp_path, monkeypatch):
    """lib/downpour/README.md's job (lib/downpour/examples/tabular/job.json), shortened, on the module's cluster."""
    from downpour.examples.tabular.data import write

    job = json.loads(tabular_example.JOB.read_text())
    job.update(data_kwargs={"folder": str(write(tmp_path / "tabular"))}, checkpoint_dir=str(tmp_path / "ckpt"),
               steps=96, eval_every=24, checkpoint_every=24, workers=2, ps=2)
    r = run_downpour(DownpourConfig(**job), cluster, timeout_s=400)
    assert r["frozen"]["frozen_entries"] == 30 * 32 + 32 and r["frozen"]["frozen_changed_bits"] == 0
    assert r["curve"][-1]["loss"] < 0.6 * r["curve"][0]["loss"] and r["final_accuracy"] > 0.85
    assert r["optimizer"] == "adam" and r["applied_updates"] == 48 and r["samples_shared_between_workers"] == 0
