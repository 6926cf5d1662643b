"""MaskedOptimizer on a GPU (``make test-gpu``): what only a GPU machine runs.

On a GPU Keras compiles ``fit`` with XLA by default, so every masked write there takes the select path; mixed
precision runs in half-precision kernels; boolean mask variables have to live somewhere. Covered: ``fit`` with
``jit_compile="auto"``, ``mixed_float16`` and ``mixed_bfloat16``, ``MirroredStrategy`` on one GPU, where the mask
and mode variables are placed, and which ops of a step run on another device than the variables they read.

Without a GPU the module is skipped. ``FREEZING_GPU_TESTS_ON_CPU=1`` runs the same tests on the CPU (a check that
the code runs; what they say about placement is then trivial).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import keras
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


def test_mirrored_strategy_on_one_gpu():
    strategy = tf.distribute.MirroredStrategy([f"/{DEVICE}"])
    with strategy.scope():
        model, opt = _model(), MaskedOptimizer(keras.optimizers.Adam(1e-2))
    _fit_masked(model, opt)
    assert strategy.num_replicas_in_sync == 1


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
    modes = [v for v in opt.variables if variable_path(v).split("/")[-1].startswith("modes")]
    assert len(masks) == len(model.trainable_variables) and len(modes) == 1
    placed = {variable_path(v): _device(v).to_string() for v in masks + modes}
    print(f"\nmodel variables on {sorted(where)}; mask and mode variables: {placed}")
    assert where == {(DEVICE.split(":")[0], 0)}
    assert {(d.device_type, d.device_index) for d in map(_device, masks + modes)} == where


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
