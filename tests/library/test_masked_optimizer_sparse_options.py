"""state="sparse" has every base option dense state has, and an Embedding's sparse gradient stays sparse.

Each option is trained through ``fit`` twice, with dense and with sparse state, from the same start: the
trainable entries must end with the dense-state bits, the frozen ones with their own, and a combination whose
result would differ is refused when the optimizer is built.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer

RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 8)).astype("float32")
Y = RNG.normal(size=(48, 3)).astype("float32")
KEEP = RNG.random((8, 16)) < 0.1  # about 10% of fc1's kernel trains; fc1's bias is wholly frozen


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="fc1"), keras.layers.Dense(3, name="fc2")])


def _fit(state, options, callbacks=(), norms="trainable", exclude=False):
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05, **options), state=state, norms=norms)
    if exclude:  # fc1's kernel (sparse state: a K-entry scratch variable inside) out of weight decay, by the list
        opt.exclude_from_weight_decay(var_list=[model.get_layer("fc1").kernel])
    opt.set_mask(model.get_layer("fc1").kernel, KEEP)
    opt.set_mask(model.get_layer("fc1").bias, False)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X, Y, epochs=2, batch_size=16, verbose=0, shuffle=False, callbacks=[c() for c in callbacks])
    return model


def _swap():
    return keras.callbacks.SwapEMAWeights(swap_on_epoch=True)


OPTIONS = {  # every one of these is elementwise or sums zeros: bit for bit (measured), not only within rounding
    "ema": ({"use_ema": True}, ()),
    "ema_swap": ({"use_ema": True}, (_swap,)),
    "ema_overwrite": ({"use_ema": True, "ema_overwrite_frequency": 2}, ()),
    "accumulation": ({"gradient_accumulation_steps": 2}, ()),
    "accumulation_ema": ({"gradient_accumulation_steps": 2, "use_ema": True}, ()),
    "weight_decay": ({"weight_decay": 0.1}, ()),
    "weight_decay_excluded": ({"weight_decay": 0.1}, (), True),
    "clipnorm": ({"clipnorm": 0.01}, ()),
    "global_clipnorm": ({"global_clipnorm": 0.01}, ()),
    "clipvalue": ({"clipvalue": 0.001}, ()),
}
QUICK = {"ema_swap", "weight_decay_excluded"}  # each run is two fits (4-8 s here): the others in make test-slow


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in OPTIONS])
def test_sparse_state_ends_where_dense_state_ends_under_each_base_option(name):
    options, callbacks, *exclude = OPTIONS[name]
    initial = _model()
    dense, sparse = _fit("dense", options, callbacks, exclude=bool(exclude)), _fit("sparse", options, callbacks,
                                                                                exclude=bool(exclude))
    for a, b in zip(dense.weights, sparse.weights):
        assert a.numpy().tobytes() == b.numpy().tobytes(), (name, a.path)
    kernel, start = sparse.get_layer("fc1").kernel.numpy(), initial.get_layer("fc1").kernel.numpy()
    assert kernel[~KEEP].tobytes() == start[~KEEP].tobytes()
    assert (kernel[KEEP] != start[KEEP]).all()  # the selection trained
    assert sparse.get_layer("fc1").bias.numpy().tobytes() == initial.get_layer("fc1").bias.numpy().tobytes()


@pytest.mark.slow
def test_ema_final_overwrite_reaches_the_selection():
    """``fit`` ends with the averages: the selection holds them, not the last step's weights."""
    plain, ema = _fit("sparse", {}), _fit("sparse", {"use_ema": True})
    assert (ema.get_layer("fc1").kernel.numpy()[KEEP] != plain.get_layer("fc1").kernel.numpy()[KEEP]).all()


def test_swap_ema_weights_sees_full_size_averages_and_writes_through():
    model = _fit("sparse", {"use_ema": True}, (_swap,))
    opt, kernel = model.optimizer, model.get_layer("fc1").kernel
    averages = opt._model_variables_moving_average  # what keras.callbacks.SwapEMAWeights reads
    assert [tuple(a.shape) for a in averages] == [tuple(v.shape) for v in model.trainable_variables]
    view = averages[0]
    assert view.numpy()[~KEEP].tobytes() == kernel.numpy()[~KEEP].tobytes()  # a frozen entry's average: its weight
    view.assign(tf.fill(view.shape, 7.0))
    assert (opt._model_variables_moving_average[0].numpy()[KEEP] == 7.0).all()  # the K averages took the write
    assert opt._model_variables_moving_average[0].numpy()[~KEEP].tobytes() == kernel.numpy()[~KEEP].tobytes()


@pytest.mark.parametrize("options", [{"clipnorm": 1.0}, {"global_clipnorm": 1.0}])
def test_norm_clipping_that_must_see_frozen_gradients_is_refused_at_build(options):
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05, **options), state="sparse", norms="all")
    opt.set_mask(model.get_layer("fc1").kernel, KEEP)
    with pytest.raises(ValueError, match="norms='all' cannot clip by norm"):
        opt.build(model.trainable_variables)
    assert not opt.built and not opt.inner.built
    assert np.array_equal(opt.get_mask(model.get_layer("fc1").kernel.path), KEEP)  # still pending


def test_norm_clipping_set_after_build_is_refused_at_the_step():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05), state="sparse", norms="all")
    opt.set_mask(model.get_layer("fc1").kernel, KEEP)
    opt.build(model.trainable_variables)
    opt.clipnorm = 1.0
    before = [v.numpy() for v in model.weights]
    with pytest.raises(ValueError, match="norms='all' cannot clip by norm"):
        opt.apply([tf.ones(v.shape) for v in model.trainable_variables], model.trainable_variables)
    assert all(a.tobytes() == v.numpy().tobytes() for a, v in zip(before, model.weights))


def test_ema_behind_a_loss_scale_optimizer_is_refused_at_build():
    model = _model()
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05, use_ema=True))
    opt = MaskedOptimizer(inner, state="sparse")
    opt.set_mask(model.get_layer("fc1").kernel, KEEP)
    with pytest.raises(ValueError, match="SwapEMAWeights looks past"):
        opt.build(model.trainable_variables)
    assert not opt.built


# -- IndexedSlices ----------------------------------------------------------------------------------
V, D = 50, 4
EMB_KEEP = np.zeros((V, D), bool)
EMB_KEEP[45:] = True  # new rows
EMB_KEEP[RNG.integers(0, V, 8), RNG.integers(0, D, 8)] = True  # and scattered entries
IDS = RNG.integers(0, V, (6, 5)).astype("int32")
IDS[0, :3] = 47  # the same row three times in one batch


def _embedding_run(state, densify=False, inner=lambda: keras.optimizers.Adam(0.05), steps=4, jit=False):
    """Four steps of a traced custom loop; the embedding's values before and after, the step's graph and what
    the inner optimizer's update_step received."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(V, D, name="emb"),
                              keras.layers.Flatten(), keras.layers.Dense(1, name="out")])
    opt = MaskedOptimizer(inner(), state=state)
    opt.set_mask(model.get_layer("emb").embeddings, EMB_KEEP)
    opt.build(model.trainable_variables)
    initial = model.get_layer("emb").embeddings.numpy()
    seen = []
    update_step = opt.inner.update_step

    def spy(gradient, variable, learning_rate):
        seen.append((type(gradient).__name__, tuple(variable.shape)))
        return update_step(gradient, variable, learning_rate)

    object.__setattr__(opt.inner, "update_step", spy)

    @tf.function(jit_compile=jit, autograph=False)  # autograph would transpile the library on first use (seconds)
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        if densify:
            grads = [tf.convert_to_tensor(g) for g in grads]
        opt.apply(grads, model.trainable_variables)

    for i in range(steps):
        step((IDS + i) % V)
    graph = step.get_concrete_function(tf.TensorSpec(IDS.shape, tf.int32)).graph
    return initial, model.get_layer("emb").embeddings.numpy(), graph, seen


def _full_size_tensors(graph):
    """Ops other than the forward pass's reads of the variable that output as many entries as the embedding."""
    return sorted({op.type for op in graph.get_operations() if op.type != "ReadVariableOp"
                   for t in op.outputs if t.shape.rank and t.shape.num_elements() == V * D})


def test_an_embedding_gradient_stays_sparse_under_sparse_state():
    _, _, graph, seen = _embedding_run("sparse", steps=0)  # traced, not run
    assert _full_size_tensors(graph) == []
    k = int(EMB_KEEP.sum())
    assert ("IndexedSlices", (k,)) in seen  # the inner optimizer updates the K entries from a sparse gradient
    _, _, densified, _ = _embedding_run("sparse", densify=True, steps=0)
    assert "UnsortedSegmentSum" in _full_size_tensors(densified)  # the check sees a densified gradient


EMBEDDING_OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.05), "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01), "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1), "ftrl": lambda: keras.optimizers.Ftrl(0.1),
    "nadam": lambda: keras.optimizers.Nadam(0.05), "lion": lambda: keras.optimizers.Lion(0.01),
}


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["graph", "xla"])
@pytest.mark.parametrize("name", [n if n == "adam" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in EMBEDDING_OPTIMIZERS])
def test_an_embedding_sparse_gradient_gives_the_dense_state_bits(name, jit):
    """Duplicate ids included: the inner optimizer gets, at each selected entry, the slices dense state gets
    (Keras' Adam squares each slice before summing duplicates, so a densified gradient would differ). Under XLA
    the comparison is with dense state under XLA."""
    inner = EMBEDDING_OPTIMIZERS[name]
    initial, sparse, _, _ = _embedding_run("sparse", inner=inner, jit=jit)
    _, dense, _, _ = _embedding_run("dense", inner=inner, jit=jit)
    assert sparse.tobytes() == dense.tobytes()
    assert sparse[~EMB_KEEP].tobytes() == initial[~EMB_KEEP].tobytes()
    assert (sparse[EMB_KEEP] != initial[EMB_KEEP]).any()


def test_without_duplicate_ids_the_sparse_gradient_equals_the_densified_one():
    """With each id once per batch there is nothing to sum: the sparse and the densified gradient agree bit for bit."""
    global IDS
    saved, IDS = IDS, RNG.permutation(V)[:30].reshape(6, 5).astype("int32")
    try:
        _, sparse, _, _ = _embedding_run("sparse")
        _, densified, _, _ = _embedding_run("sparse", densify=True)
    finally:
        IDS = saved
    assert sparse.tobytes() == densified.tobytes()


@pytest.mark.slow
def test_swap_ema_weights_under_mixed_precision_ends_where_dense_state_ends():
    """``compile`` wraps the MaskedOptimizer in a LossScaleOptimizer; SwapEMAWeights reaches it through that."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        dense, sparse = _fit("dense", {"use_ema": True}, (_swap,)), _fit("sparse", {"use_ema": True}, (_swap,))
    finally:
        keras.config.set_dtype_policy("float32")
    assert isinstance(sparse.optimizer, keras.optimizers.LossScaleOptimizer)
    for a, b in zip(dense.weights, sparse.weights):
        assert a.numpy().tobytes() == b.numpy().tobytes(), a.path
