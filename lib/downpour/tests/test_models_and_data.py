"""downpour without a cluster: sparse gradients pushed and fetched as rows, models with several inputs and outputs,
data checked against the model, the result's types, error lines, thread counts."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from downpour import KERAS_OPTIMIZERS, DownpourConfig, PsVariables, build_model, faults

# -- sparse gradients, several inputs, data against the model --------------------------------------------------

EMBED = "downpour.tests.ps_hooks:embedding_model"


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", *KERAS_OPTIMIZERS, {"class_name": "SGD", "config": {
    "momentum": 0.9}}], ids=str)
def test_every_optimizer_applies_an_embedding_s_indexed_slices_on_the_ps_as_keras_does_and_masks_hold(optimizer):
    """The Embedding's gradient reaches the ps as IndexedSlices of the touched rows, for every optimizer a job
    allows; a Keras optimizer's update equals Keras' own on the same IndexedSlices, and masked rows keep their bits."""
    job = DownpourConfig(model=EMBED, optimizer=optimizer, learning_rate=0.01)
    model = build_model(job)
    ps = PsVariables(model, job)
    rows = tf.IndexedSlices(tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4) / 10),
                            tf.constant([1, 5, 1], tf.int64), tf.constant([10, 4], tf.int64))
    grads = [rows] + [tf.ones(v.shape) for v in model.trainable_variables[1:]]
    before = ps.values()
    version, sent = ps.push(grads, [])
    assert int(version) == 1 and int(sent) < 10 * 4 * 4  # two rows (row 1 twice, summed) went, not the table
    after = ps.values()
    moved = before[0].view(np.uint32) != after[0].view(np.uint32)
    assert moved[[1, 5]].all()
    if optimizer not in ("sgd", "adagrad"):  # Keras' own update, on the same gradient, in a graph as on the ps
        from downpour.optimizer import keras_optimizer
        from downpour.sparse import dedupe

        reference = [tf.Variable(b, name=f"reference_{i}") for i, b in enumerate(before)]
        keras_step = keras_optimizer(job)  # given the gradient as the ps gets it: each row once
        keras_step.build(reference)
        tf.function(lambda: keras_step.apply_gradients(zip([dedupe(rows), *grads[1:]], reference)))()
        for mine, theirs in zip(after, reference):
            np.testing.assert_array_equal(mine, theirs.numpy())
    else:  # Downpour's own rules touch only the pushed rows
        assert not moved[[0, 2, 3, 4, 6, 7, 8, 9]].any()
        if optimizer == "sgd":
            row = rows.values.numpy()[0] + rows.values.numpy()[2]  # row 1's two gradients, summed once
            np.testing.assert_array_equal(after[0][1], before[0][1] - np.float32(0.01) * row)
    if isinstance(optimizer, str) and optimizer in ("sgd", "adagrad"):
        return
    masked = DownpourConfig(model=EMBED, optimizer=optimizer, learning_rate=0.01,
                            masks="downpour.tests.ps_hooks:freeze_rows")
    ps = PsVariables(build_model(masked), masked)
    before = ps.values()
    for _ in range(2):
        ps.push(grads, [])
    moved = before[0].view(np.uint32) != ps.values()[0].view(np.uint32)
    assert not moved[:5].any() and moved[5].all()  # rows 0-4 frozen (row 1 had a gradient), row 5 trains


def test_sparse_pieces_split_over_shards_give_what_the_dense_gradient_gives():
    from downpour import sparse

    g = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), tf.constant([7, 0, 7], tf.int64),
                         tf.constant([9, 2], tf.int64))
    once = sparse.dedupe(g)
    assert sorted(once.indices.numpy().tolist()) == [0, 7]
    np.testing.assert_array_equal(sparse.dense(once).numpy(), sparse.dense(g).numpy())
    pieces = sparse.split_rows(once, [5, 4])
    dense = [sparse.dense(p).numpy() for p in pieces]
    np.testing.assert_array_equal(np.concatenate(dense), sparse.dense(g).numpy())
    assert [p.dense_shape.numpy().tolist() for p in pieces] == [[5, 2], [4, 2]]
    assert int(sparse.payload_bytes(pieces)) == 2 * (2 * 4 + 8)  # two rows: values and an int64 index each
    w = tf.zeros((9, 2))
    np.testing.assert_array_equal(sparse.local_step(w, g, 0.5).numpy(), -0.5 * sparse.dense(g).numpy())
    kept = sparse.local_step(w, g, 0.5, keep=np.arange(9)[:, None] > 3)
    assert kept.numpy()[0].tolist() == [0.0, 0.0] and kept.numpy()[7].tolist() == [-3.0, -4.0]
    total = sparse.add(g, g)
    assert isinstance(total, tf.IndexedSlices) and total.values.shape[0] == 6


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_a_two_input_model_with_an_embedding_trains_in_the_local_loop_with_sparse_pushes(tmp_path, monkeypatch):
    from downpour.data import element_spec, train_dataset
    from downpour.examples.tokens.data import write
    from downpour.worker import gradient_kinds, worker_function

    folder = write(tmp_path, workers=1, per_worker=200, test=40)
    for sparse_push in (True, False):
        job = DownpourConfig(model="downpour.examples.tokens.model:build", data="downpour.examples.tokens.data:dataset",
                             data_kwargs={"folder": str(folder)}, loss={"class_name": "BinaryCrossentropy",
                                                                        "config": {"from_logits": True}},
                             optimizer="adam", learning_rate=0.01,
                             masks="downpour.examples.tokens.model:new_tokens_only",
                             batch=16, n_fetch=2, n_push=2, steps_per_function=4, sparse_push=sparse_push)
        model = build_model(job)
        ps = PsVariables(model, job)
        assert gradient_kinds(model, ps, job, element_spec(job)) == [True] + [False] * 6
        ps.prepare(gradient_kinds(model, ps, job, element_spec(job)))
        fn = worker_function(model, ps, job, lambda: tf.constant(0, tf.int32), timestamps=False)
        before = ps.values()
        out = fn(iter(train_dataset(job)(0, 1)))
        table = before[0].nbytes
        sent = out["pushed_bytes"].numpy()
        assert (sent < table).all() if sparse_push else (sent > table).all(), sent
        moved = before[0].view(np.uint32) != ps.values()[0].view(np.uint32)
        assert not moved[:800].any() and moved[800:].any()  # pre-trained rows frozen, new tokens' rows train


def test_a_table_whose_ids_the_model_computes_or_that_two_lookups_share_is_fetched_whole_and_says_why():
    import keras

    from downpour.model import row_inputs

    ids = keras.Input((3,), dtype="int32", name="ids")
    direct = keras.layers.Embedding(10, 4, name="direct")
    computed = keras.layers.Embedding(10, 4, name="computed")
    shared = keras.layers.Embedding(10, 4, name="shared")
    parts = [direct(ids), computed(keras.ops.minimum(ids + 1, 9)), shared(ids), shared(ids)]
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Concatenate()(parts))))
    paths = [v.path for v in model.trainable_variables]
    found, whole = row_inputs(model, paths, [path.endswith("embeddings") for path in paths])
    assert found == {paths.index("direct/embeddings"): 0}
    assert set(whole) == {"computed/embeddings", "shared/embeddings"}
    assert "looks up ids computed inside the model" in whole["computed/embeddings"]
    assert "is called 2 times in the model" in whole["shared/embeddings"]


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_an_embedding_is_fetched_as_the_rows_the_next_batches_look_up_and_trains_bit_for_bit_as_fetched_whole(
        tmp_path, monkeypatch):
    from downpour.data import element_spec, train_dataset
    from downpour.examples.tokens.data import write
    from downpour.model import row_inputs
    from downpour.worker import gradient_kinds, worker_function

    folder = write(tmp_path, workers=1, per_worker=200, test=40)
    runs = {}
    for sparse_fetch in (True, False):
        job = DownpourConfig(model="downpour.examples.tokens.model:build", data="downpour.examples.tokens.data:dataset",
                             data_kwargs={"folder": str(folder)}, loss={"class_name": "BinaryCrossentropy",
                                                                        "config": {"from_logits": True}},
                             optimizer="adam", learning_rate=0.01,
                             masks="downpour.examples.tokens.model:new_tokens_only",
                             batch=16, n_fetch=4, n_push=2, steps_per_function=8, shuffle_buffer=1,
                             sparse_fetch=sparse_fetch)
        model = build_model(job)
        ps = PsVariables(model, job)
        ps.prepare(gradient_kinds(model, ps, job, element_spec(job)))
        assert row_inputs(model, ps.paths, ps.sparse) == ({0: 1}, {})  # x's second input, "tokens", feeds the table
        fn = worker_function(model, ps, job, lambda: tf.constant(0, tf.int32), timestamps=False)
        iterator = iter(train_dataset(job)(0, 1))
        fetched = [fn(iterator)["fetched_bytes"].numpy() for _ in range(3)]
        runs[sparse_fetch] = (np.concatenate(fetched), ps.values())
    (sparse, trained), (dense, reference) = runs[True], runs[False]
    table = reference[0].nbytes
    # per fetch: the other variables whole, and of the table the rows 4 batches of 16 x 20 ids look up (about 700 of
    # 1,000 here), each 16 float32 values and its int64 id
    rows, rest = np.divmod(sparse - (dense - table), 16 * 4 + 8)
    assert (rest == 0).all() and (rows > 0).all() and (rows < 1000).all() and (sparse < dense).all(), (sparse, dense)
    for mine, theirs in zip(trained, reference):  # the rows nobody looked up were never read: the same training
        np.testing.assert_array_equal(mine.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("data, message", [
    ("downpour.tests.ps_hooks:features_29", "data: the train split (the files of data_kwargs {}) gives x of shape "
                                            "(29,) per sample; the model's input 'features' expects (30,)"),
    ("downpour.tests.ps_hooks:features_as_text", "gives x as string; the model's input 'features' expects float32"),
    ("downpour.tests.ps_hooks:two_inputs_misnamed", "gives the inputs ['numbers', 'tokens']; the model expects "
                                                    "['numeric', 'tokens']"),
])
def test_data_that_does_not_fit_the_model_is_one_line_naming_what_was_expected_and_found(data, message, monkeypatch):
    from downpour.data import check_split

    model = "downpour.examples.tabular.model:build" if "features" in data else "downpour.examples.tokens.model:build"
    job = DownpourConfig(model=model, data=data)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_split(build_model(job), job, "train")


def test_the_files_a_dataset_reads_are_named_from_its_graph_without_reading_them(tmp_path, monkeypatch):
    from downpour.data import split_files

    tokens = DownpourConfig(data="downpour.examples.tokens.data:dataset", data_kwargs={"folder": "/nowhere"})
    assert split_files(tokens, "train", 1, 2) == ["/nowhere/train-1.tfrecord"]
    tabular = DownpourConfig(data="downpour.examples.tabular.data:dataset", data_kwargs={"folder": "/nowhere"})
    assert split_files(tabular, "test") == ["/nowhere/test.csv"]
    mnist = DownpourConfig(data="downpour.data:idx", data_kwargs={"folder": "/nowhere"})
    assert split_files(mnist, "train") == ["/nowhere/train-images-idx3-ubyte", "/nowhere/train-labels-idx1-ubyte"]


def test_the_result_is_typed_round_trips_through_json_and_reads_as_a_mapping():
    from downpour.result import DownpourResult, FrozenReport, frozen_report

    keep = np.array([[True, False], [False, False], [True, True]])
    start = np.zeros((3, 2), np.float32)
    end = start.copy()
    end[0, 0], end[2] = 1.0, -0.0  # -0.0 has other bits than 0.0: it counts as changed (it is trainable here)
    placement = [{"shards": [{"task": "ps:0", "shape": [2, 2]}, {"task": "ps:1", "shape": [1, 2]}]}]
    report = frozen_report([start], [end], {0: keep}, ["t"], placement, "here", "hold")
    assert isinstance(report, FrozenReport) and report.frozen_changed_bits == 0
    assert report.per_task == {"ps:0": {"frozen_entries": 3, "frozen_changed": 0, "trainable_entries": 1,
                                        "trainable_changed": 1},
                               "ps:1": {"frozen_entries": 0, "frozen_changed": 0, "trainable_entries": 2,
                                        "trainable_changed": 2}}
    fields = {f: None for f in DownpourResult.__dataclass_fields__}
    fields.update(frozen=dataclasses.asdict(report), faults=[], task_cpu_s={}, steady_task_cpu_s={}, pids=[],
                  worker_limits="", applied_updates=7)
    result = DownpourResult.from_dict(json.loads(json.dumps(fields)))
    assert result.applied_updates == result["applied_updates"] == 7 and result.frozen.per_task == report.per_task
    assert result["frozen"]["policy"] == "hold" and result.get("no_such_field") is None and len(result) == len(fields)
    with pytest.raises(ValueError, match=r"result: missing fields \[\], unknown fields \['extra'\]"):
        DownpourResult.from_dict({**fields, "extra": 1})


def test_an_error_s_first_line_is_the_line_that_says_what_went_wrong():
    remote = tf.errors.NotFoundError(None, None, ':UNKNOWN:Error received from peer  {grpc_status:5, grpc_message:" '
                                                 '/d/train-1.tfrecord; No such file or directory\\n\\t [[{{node '
                                                 'IteratorGetNext}}]]"}')
    assert faults.first_line(remote) == "NotFoundError: /d/train-1.tfrecord; No such file or directory"
    graph = tf.errors.NotFoundError(None, None, "Graph execution error:\n\nDetected at node X defined at (most recent "
                                                "call last):\n  File \"a.py\", line 1\n\n/d/a; No such file\n\t "
                                                "[[{{node X}}]] [Op:__inference_f_17]")
    assert faults.first_line(graph) == "NotFoundError: /d/a; No such file"
    autograph = NotImplementedError("in user code:\n\n    File \"w.py\", line 41\n\n    NotImplementedError: "
                                    "numpy() is only available when eager execution is enabled.")
    assert faults.first_line(autograph) == ("NotImplementedError: numpy() is only available when eager execution is "
                                            "enabled.")


def test_ps_tasks_take_their_thread_count_from_the_command_line():
    from downpour.cluster import server_config

    assert server_config("ps", 2, ps_threads=3).intra_op_parallelism_threads == 3
    assert server_config("ps", 2).intra_op_parallelism_threads == 1
    assert server_config("worker", 2, worker_threads=2, ps_threads=3).intra_op_parallelism_threads == 2
    spec = json.dumps({"cluster": {"ps": ["localhost:1"], "worker": ["localhost:2"]}, "task": {"type": "ps"}})
    run = subprocess.run([sys.executable, "-m", "downpour", "--ps-threads", "0"], capture_output=True, text=True,
                         env=dict(os.environ, TF_CONFIG=spec), timeout=120)
    assert run.returncode == 2 and run.stderr.strip() == "downpour: --ps-threads: expected an integer >= 1; got 0"


def test_a_model_with_two_outputs_trains_in_the_local_loop_and_evaluates_on_both(monkeypatch):
    from downpour.data import element_spec, eval_arrays, train_dataset
    from downpour.model import evaluate, make_loss
    from downpour.worker import gradient_kinds, worker_function

    job = DownpourConfig(model="downpour.tests.ps_hooks:two_outputs", data="downpour.tests.ps_hooks:two_targets",
                         loss="mse", optimizer="adam", learning_rate=0.01, batch=16, steps_per_function=4,
                         eval_samples=64)
    model = build_model(job)
    ps = PsVariables(model, job)
    ps.prepare(gradient_kinds(model, ps, job, element_spec(job)))
    fn = worker_function(model, ps, job, lambda: tf.constant(0, tf.int32), timestamps=False)
    x, y = eval_arrays(job)
    assert set(y) == {"label", "score"}
    before = evaluate(model, ps.values(), [], x, y, make_loss(job))
    iterator = iter(train_dataset(job)(0, 1))
    for _ in range(10):
        fn(iterator)
    after = evaluate(model, ps.values(), [], x, y, make_loss(job))
    assert after["accuracy"] is None and after["loss"] < 0.7 * before["loss"]  # the sum of both outputs' losses
