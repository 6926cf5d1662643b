"""MaskedOptimizer on a GPU (``make test-gpu``): what only a GPU machine runs.

On a GPU Keras compiles ``fit`` with XLA by default, so every masked write there takes the select path; mixed
precision runs in half-precision kernels; boolean mask variables have to live somewhere. But Keras turns
``jit_compile="auto"`` off under any ``tf.distribute`` strategy and whenever op determinism is on, so a test that
means XLA says ``jit_compile=True`` and checks that the model compiled with it; with determinism on Keras refuses
even that (``model_supports_jit``), so those tests run their steps in a ``tf.function(jit_compile=True)``.
Covered: ``fit`` under XLA (and ``"auto"`` resolving to it on a GPU), under ``MirroredStrategy`` and with op
determinism on; ``mixed_float16`` and ``mixed_bfloat16``; an ``Embedding`` whose gradient repeats indices (a scatter
with duplicates, nondeterministic on GPUs unless determinism is on); Muon with TensorFloat-32 on; subnormal and
``-0.0`` frozen entries under XLA; where the mask variables are placed, and which ops of a step run on another device
than the variables they read.

Without a GPU the module is skipped. ``FREEZING_GPU_TESTS_ON_CPU=1`` runs the same tests on the CPU (a check that
the code runs; what they say about placement is then trivial).
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, slots, variable_path
from freezing.audit import changed_bits

ON_CPU = os.environ.get("FREEZING_GPU_TESTS_ON_CPU") == "1"
GPUS = tf.config.list_physical_devices("GPU")
if not GPUS and not ON_CPU:
    pytest.skip("no GPU: TensorFlow lists none (tf.config.list_physical_devices('GPU') is empty); "
                "FREEZING_GPU_TESTS_ON_CPU=1 runs these tests on the CPU", allow_module_level=True)
DEVICE = "CPU:0" if ON_CPU else "GPU:0"

pytestmark = pytest.mark.gpu


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(256, activation="relu", name="fc1"),  # 4,096 entries
        keras.layers.Dense(256, activation="relu", name="fc2"),  # 65,536 entries: above every size threshold
        keras.layers.Dense(4, name="out"),
    ])


def _data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(64, 16)).astype("float32"), rng.normal(size=(64, 4)).astype("float32")


def _masks(opt, model, seed=2):
    rng = np.random.default_rng(seed)
    masks = {v.path: rng.random(tuple(v.shape)) < 0.5 for v in model.trainable_variables}
    for v in model.trainable_variables:
        opt.set_mask(v, masks[v.path])
    return masks


def _snapshot(opt, model):
    """(path, variable or slot, its value now, whether it is the variable itself)."""
    out = []
    for v in model.trainable_variables:
        out.append((v.path, v, np.array(v.numpy()), True))
        out += [(v.path, s, np.array(s.numpy()), False) for s in slots(opt.inner, v).values()]
    return out


def _frozen_moved(snapshot, masks):
    return sum(int((changed_bits(before, var.numpy()) & ~masks[path]).sum()) for path, var, before, _ in snapshot)


def _xla_fit(model, opt, x, y, epochs=2, batch_size=16, loss=lambda y, p: tf.reduce_mean(tf.square(p - y))):
    """``fit``'s loop as a custom loop whose step XLA compiles, whatever Keras would decide (determinism on)."""
    @tf.function(jit_compile=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    for _ in range(epochs):
        for i in range(0, len(x), batch_size):
            step(x[i:i + batch_size], y[i:i + batch_size])
    return step


def _fit_masked(model, opt, epochs=2, **compile_kwargs):
    """Compile, one unmasked epoch (non-zero moments), masks on a random half of every variable, train on."""
    model.compile(optimizer=opt, loss="mse", **compile_kwargs)
    x, y = _data()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    masks = _masks(opt, model)
    snapshot = _snapshot(opt, model)
    model.fit(x, y, epochs=epochs, batch_size=16, verbose=0, shuffle=False)
    assert _frozen_moved(snapshot, masks) == 0
    trained = sum(int((changed_bits(b, v.numpy()) & masks[p]).sum()) for p, v, b, value in snapshot if value)
    assert trained > 0
    return masks


def test_fit_under_xla_the_default_on_a_gpu():
    model, opt = _model(), MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1))
    with tf.device(DEVICE):
        _fit_masked(model, opt, jit_compile=True if ON_CPU else "auto")
    assert model.jit_compile is True  # on a GPU, "auto" resolves to XLA


def test_xla_steps_with_op_determinism_on():
    """Determinism on: Keras refuses XLA for ``fit`` (even ``jit_compile=True``), so the steps are compiled by
    ``tf.function(jit_compile=True)``; frozen bits hold, and two runs give the same bits."""
    from freezing import _keras_api, enable_determinism

    x, y = _data()
    runs = []
    try:
        for _ in range(2):
            enable_determinism(0)
            model, opt = _model(), MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1))
            with tf.device(DEVICE):
                model(x[:1])
                opt.build(model.trainable_variables)
                masks = _masks(opt, model)
                snapshot = _snapshot(opt, model)
                step = _xla_fit(model, opt, x, y)
            assert step.experimental_get_compiler_ir(x[:16], y[:16])()  # XLA compiled it
            assert _frozen_moved(snapshot, masks) == 0
            runs.append([v.numpy().tobytes() for v in model.trainable_variables])
    finally:
        _keras_api.disable_op_determinism()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    keras.config.set_dtype_policy(policy)
    try:
        model, opt = _model(), MaskedOptimizer(keras.optimizers.Adam(1e-2))
        with tf.device(DEVICE):
            _fit_masked(model, opt, jit_compile=True if ON_CPU else "auto")
        wrapped = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert wrapped == (policy == "mixed_float16")  # compile wraps float16 in a LossScaleOptimizer only
        assert all(v.dtype == "float32" for v in model.trainable_variables)
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "XLA"])
def test_mirrored_strategy_on_one_gpu(jit):
    """Under a strategy ``"auto"`` is no XLA: the XLA case forces it."""
    strategy = tf.distribute.MirroredStrategy([f"/{DEVICE}"])
    with strategy.scope():
        model, opt = _model(), MaskedOptimizer(keras.optimizers.Adam(1e-2))
    _fit_masked(model, opt, jit_compile=jit)
    assert strategy.num_replicas_in_sync == 1
    assert model.jit_compile is jit


def test_embedding_gradient_with_repeated_indices_under_xla():
    """Every batch repeats token ids, so the embedding's gradient scatters duplicates; frozen rows and entries
    keep their bits, trained ones move, and with determinism on two runs agree bit for bit."""
    from freezing import _keras_api, enable_determinism

    vocab, dim = 32, 8
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, (64, 10)).astype("int32")  # six ids only: every batch repeats them
    y = rng.normal(size=(64, 1)).astype("float32")
    keep = rng.random((vocab, dim)) < 0.5
    runs = []
    try:
        for _ in range(2):
            enable_determinism(0)
            model = keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(vocab, dim, name="emb"),
                                      keras.layers.Flatten(), keras.layers.Dense(1, name="out")])
            opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
            with tf.device(DEVICE):
                model(ids[:1])
                opt.build(model.trainable_variables)
                table = model.get_layer("emb").embeddings
                opt.set_mask(table, keep)
                before = table.numpy().copy()
                _xla_fit(model, opt, ids, y)
            after = table.numpy()
            assert not (changed_bits(before, after) & ~keep).any()
            assert (changed_bits(before, after) & keep)[:6].any()
            runs.append(after.tobytes())
    finally:
        _keras_api.disable_op_determinism()
    assert runs[0] == runs[1]


@pytest.mark.skipif(not hasattr(keras.optimizers, "Muon"), reason="this Keras has no Muon")
def test_muon_with_tensor_float_32_on():
    """TF32 rounds matmul inputs (Muon's Newton-Schulz iterations): the frozen entries are still only copied."""
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        model, opt = _model(), MaskedOptimizer(keras.optimizers.Muon(1e-2))
        with tf.device(DEVICE):
            _fit_masked(model, opt, jit_compile=True)
        assert model.jit_compile is True
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def test_subnormal_and_negative_zero_frozen_entries_keep_their_bits_under_xla():
    model, opt = _model(), MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1))
    x, y = _data()
    with tf.device(DEVICE):
        model.compile(optimizer=opt, loss="mse", jit_compile=True)
        model.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)  # non-zero moments
        kernel = model.get_layer("fc2").kernel
        keep = np.random.default_rng(4).random(tuple(kernel.shape)) < 0.5
        values = kernel.numpy()
        special = np.array([1e-40, -1e-42, -0.0, 0.0], "float32")  # subnormals and both zeros
        values[~keep] = np.resize(special, int((~keep).sum()))
        kernel.assign(values)
        opt.set_mask(kernel, keep)
        before = kernel.numpy().copy()
        model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    assert model.jit_compile is True
    after = kernel.numpy()
    assert after[~keep].tobytes() == before[~keep].tobytes()  # -0.0 stays -0.0, 1e-40 stays 1e-40
    assert (changed_bits(before, after) & keep).any()


def _device(variable):
    """Where a Keras variable's or a tf.Variable's buffer lives."""
    handle = variable if isinstance(variable, tf.Variable) else variable.value
    return tf.DeviceSpec.from_string(handle.device)


def test_mask_variables_live_with_the_variables_they_mask():
    model, opt = _model(), MaskedOptimizer(keras.optimizers.Adam(1e-2))
    with tf.device(DEVICE):
        _fit_masked(model, opt, epochs=1, jit_compile=True if ON_CPU else "auto")
    where = {(d.device_type, d.device_index) for d in map(_device, model.trainable_variables)}
    masks = [v for v in opt.variables if tf.as_dtype(v.dtype) == tf.bool]
    assert len(masks) == len(model.trainable_variables)  # one per variable; a mask's mode is read off it
    placed = {variable_path(v): _device(v).to_string() for v in masks}
    print(f"\nmodel variables on {sorted(where)}; mask variables: {placed}")
    assert where == {(DEVICE.split(":")[0], 0)}
    assert {(d.device_type, d.device_index) for d in map(_device, masks)} == where


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "XLA"])
def test_every_op_of_a_masked_step_runs_on_the_device(jit):
    """Soft placement off, the whole custom-loop step pinned to the device: an op of the masked update that has no
    kernel there (a boolean or int32 op TensorFlow keeps on the host) raises instead of running elsewhere. The
    graph step is MirroredStrategy's fit path (no XLA under a strategy): the per-variable ``switch_case`` whose
    branch index TensorFlow reads in host memory is the one copy this cannot see."""
    model, opt = _model(), MaskedOptimizer(keras.optimizers.Adam(1e-2))
    x, y = _data()
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        with tf.device(DEVICE):
            model(x[:1])
            opt.build(model.trainable_variables)
            masks = _masks(opt, model)
            snapshot = _snapshot(opt, model)

            @tf.function(jit_compile=jit)
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - y))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))

            for _ in range(3):
                step(x, y)
    finally:
        tf.config.set_soft_device_placement(soft)
    assert _frozen_moved(snapshot, masks) == 0
