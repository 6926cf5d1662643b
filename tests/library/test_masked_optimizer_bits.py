"""A frozen bit is only ever copied: special values, every path, the trace-time check, refused masks.

TensorFlow's CPU kernels flush subnormals (``x + -0.0`` turns ``1e-40`` into ``+0.0``), so a frozen
entry is exact only if it is copied. These tests put subnormals, ``-0.0``, ``inf`` and NaN into frozen
entries of variables and of optimizer slots, and compare bit patterns (``view(uint32)``), never values.
"""

from __future__ import annotations

import keras
import keras_features
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, _keras_api, _write_path, slots
from freezing._tuning import WriteTuning
from freezing._write_path import ELEMENTWISE

SPECIAL = np.array([1e-40, -1e-39, -0.0, np.inf, -np.inf, np.nan, 3.0, -2.0], np.float32)
KEEP = np.array([0, 0, 0, 0, 0, 0, 1, 1], bool)  # the special values frozen, two normal entries trainable

INNERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.1),
    "adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.1, momentum=0.5),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "lion": lambda: keras.optimizers.Lion(0.1),
    "lamb": lambda: keras.optimizers.Lamb(0.1),
    "adafactor": lambda: keras.optimizers.Adafactor(0.1),
    "ema": lambda: keras.optimizers.Adam(0.1, use_ema=True, ema_overwrite_frequency=2),
    "accumulate": lambda: keras.optimizers.Adam(0.1, gradient_accumulation_steps=2),
}
if keras_features.has("Muon"):
    INNERS["muon"] = lambda: keras.optimizers.Muon(0.1)


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _setup(name):
    w = keras.Variable(SPECIAL.copy(), name="w")
    opt = MaskedOptimizer(INNERS[name]())
    opt.build([w])
    for slot in slots(opt, w).values():  # special values in the frozen entries of every slot too
        if tuple(slot.shape) == SPECIAL.shape:
            slot.assign(np.where(KEEP, np.abs(slot.numpy()), SPECIAL))
    opt.set_mask(w, KEEP)
    return w, opt


@pytest.mark.parametrize("how", ["eager", "function", "xla"])
@pytest.mark.parametrize("name", sorted(INNERS))
def test_special_values_in_frozen_entries_keep_their_bits(name, how):
    w, opt = _setup(name)
    tensors = [w] + [s for s in slots(opt, w).values() if tuple(s.shape) == SPECIAL.shape]
    before = [bits(t.numpy()) for t in tensors]
    grad = tf.constant([1e-40, 2.0, -3.0, 1.0, 0.5, 0.25, 1.0, -1.0])

    def step():
        opt.apply_gradients([(grad, w)])

    run = step if how == "eager" else tf.function(step, jit_compile=how == "xla")
    for _ in range(3):
        run()
    for t, b in zip(tensors, before):
        assert (bits(t.numpy())[~KEEP] == b[~KEEP]).all(), (name, how, t.path, t.numpy())
    if isinstance(opt.inner, ELEMENTWISE):  # Adafactor, Lamb, Muon read the whole weight: a frozen NaN reaches them
        assert np.isfinite(w.numpy()[KEEP]).all()
        assert (w.numpy()[KEEP] != SPECIAL[KEEP]).any()


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_fit_keeps_special_frozen_bits(jit):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="fc")])
    kernel = model.get_layer("fc").kernel
    value = np.tile(SPECIAL, (8, 1))
    kernel.assign(np.where(np.isfinite(value), value, 0.0))  # finite specials: the loss stays finite
    opt = MaskedOptimizer(keras.optimizers.AdamW(0.01, weight_decay=0.1))
    model.compile(optimizer=opt, loss="mse", jit_compile=jit)
    keep = np.tile(KEEP, (8, 1))
    opt.set_mask(kernel, keep)
    before = bits(kernel.numpy())
    model.fit(np.ones((16, 8)), np.zeros((16, 8)), epochs=2, batch_size=8, verbose=0)
    assert (bits(kernel.numpy())[~keep] == before[~keep]).all()
    assert (bits(kernel.numpy())[keep] != before[keep]).all()



@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_fused_write_copies_special_frozen_bits_of_every_float_width(dtype, monkeypatch):
    """The fused write selects the bit patterns (as integers of the value's width): frozen subnormals, -0.0, inf and
    NaN keep their bits in the variable and its slots, and every entry has the bits TensorFlow's own ops give."""
    width = np.dtype(tf.as_dtype(dtype).as_numpy_dtype)
    tiny = {"float16": 2e-7, "bfloat16": 1e-40, "float32": 1e-40, "float64": 1e-310}[dtype]  # a subnormal of each
    start = np.array([tiny, -tiny, -0.0, np.inf, -np.inf, np.nan, 3.0, -2.0]).astype(width)
    grad = tf.constant([tiny, 2.0, -3.0, 1.0, 0.5, 0.25, 1.0, -1.0], dtype)
    out = {}
    for fuse_above in (1 << 40, 1):
        monkeypatch.setattr(_write_path, "DEFAULT_TUNING", WriteTuning(fuse_above=fuse_above))
        w = keras.Variable(start, dtype=dtype, name="w")
        opt = MaskedOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.1))
        opt.build([w])
        state = [w] + list(slots(opt, w).values())
        for slot in state[1:]:
            slot.assign(np.where(KEEP, np.abs(slot.numpy()), start))
        opt.set_mask(w, KEEP)
        before = [np.asarray(t.numpy()).view(f"u{width.itemsize}") for t in state]
        step = tf.function(lambda: opt.apply_gradients([(grad, w)]))
        for _ in range(3):
            step()
        assert bool(w.value.assign.fused) == (fuse_above == 1)  # the XLA-compiled writes the guard made
        after = [np.asarray(t.numpy()).view(f"u{width.itemsize}") for t in state]
        for b, a in zip(before, after):
            assert (a[~KEEP] == b[~KEEP]).all(), (dtype, fuse_above, a, b)
        assert (after[0][KEEP] != before[0][KEEP]).all()
        out[fuse_above] = after
    assert all((a == b).all() for a, b in zip(out[1 << 40], out[1])), dtype

def test_trainable_entries_get_plain_keras_bits():
    """Where every entry trains, the masked update is Keras' own: the same bits, optimizer by optimizer."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(4, 6)).astype(np.float32)
    grads = [rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3)]
    for name, make in INNERS.items():
        plain_w, masked_w = keras.Variable(start, name="w"), keras.Variable(start, name="w")
        plain, masked = make(), MaskedOptimizer(make())
        masked.build([masked_w])
        masked.set_mask(masked_w, np.ones((4, 6), bool))  # stored all-True: the unmasked path
        step = tf.function(lambda g: masked.apply_gradients([(g, masked_w)], trainable_masks=[np.ones((4, 6))]))
        plain_step = tf.function(lambda g: plain.apply_gradients([(g, plain_w)]))  # Grappler rewrites both alike
        for g in grads:
            plain_step(tf.constant(g))
            step(tf.constant(g))  # an in-graph all-True mask: the masked update, its selects all True
        assert (bits(plain_w.numpy()) == bits(masked_w.numpy())).all(), name


def test_adafactor_with_a_per_element_mask_stays_finite_and_gives_keras_bits():
    """A held zero velocity used to make Adafactor's update 0 * inf = NaN, which its RMS clip spread to every entry."""
    w = keras.Variable([1.0, 2.0, 3.0, 4.0], name="w")
    plain_w = keras.Variable([1.0, 2.0, 3.0, 4.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.Adafactor(0.5))
    keep = np.array([True, False, True, False])
    grad = tf.constant([0.5, 1.0, -0.25, 2.0])
    opt.apply_gradients([(grad, w)], trainable_masks=[keep])
    keras.optimizers.Adafactor(0.5).apply_gradients([(grad * keep, plain_w)])  # what Keras gives the same gradient
    assert np.isfinite(w.numpy()).all()
    assert w.numpy().tolist()[1::2] == [2.0, 4.0]
    assert (bits(w.numpy())[keep] == bits(plain_w.numpy())[keep]).all()


def test_a_write_that_bypasses_the_guard_raises_when_the_step_is_traced():
    """If Keras rerouted its update past the guarded write methods, tracing the step must fail, not move entries."""

    class Rerouted(keras.optimizers.SGD):
        def update_step(self, gradient, variable, learning_rate):
            handle = _keras_api.components(variable)[0].handle
            tf.raw_ops.AssignSubVariableOp(resource=handle, value=tf.cast(gradient, tf.float32) * 0.1)

    w = keras.Variable(np.ones(1 << 15, np.float32), name="w")
    opt = MaskedOptimizer(Rerouted(0.1))
    opt.build([w])
    opt.set_mask(w, np.arange(1 << 15) % 2 == 0)
    with pytest.raises(RuntimeError, match=r"MaskedOptimizer: Rerouted.apply wrote .w. with AssignSubVariableOp "
                                           r".op .*. "
                                           r"outside the masked write; frozen entries would move"):
        tf.function(lambda: opt.apply_gradients([(tf.ones(1 << 15), w)]))()


def test_the_private_api_check_names_the_version_and_the_missing_name():
    opt = keras.optimizers.Adam()
    opt.build([keras.Variable([1.0])])
    object.__setattr__(opt, "_trainable_variables_indices", None)
    del opt.__dict__["_trainable_variables_indices"]
    with pytest.raises(RuntimeError,
                       match=rf"Keras {keras.__version__}, TensorFlow .*Adam has no '_trainable_variables_indices'"):
        _keras_api.check(opt)


# -- refused masks leave everything as it was ----------------------------------------------------
@pytest.mark.parametrize("bad, message", [
    ([np.nan, 1.0, 0.0], r"has 1 value\(s\) that are not 0 or 1 \(the first: nan\)"),
    ([0.5, 1.0, 0.0], r"the first: 0.5"),
    ([2, 1, 0], r"the first: 2"),
    ([1, 0], r"has shape \(2,\); expected a scalar or a shape broadcastable to the variable's \(3,\)"),
    (np.array(list("abc")), r"has dtype <U1"),
])
def test_a_refused_mask_names_the_problem_and_changes_nothing(bad, message):
    w = keras.Variable([1.0, 2.0, 3.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    opt.build([w])
    opt.set_mask(w, [1, 0, 1])
    opt.apply_gradients([(tf.ones(3), w)])
    state = [v.numpy().copy() for v in opt.variables]
    with pytest.raises(ValueError, match=message):
        opt.set_mask(w, bad)
    with pytest.raises(ValueError, match=message):
        opt.apply_gradients([(tf.ones(3), w)], trainable_masks=[bad])
    assert all((a == b.numpy()).all() for a, b in zip(state, opt.variables))
    opt.apply_gradients([(tf.ones(3), w)])  # and the optimizer goes on
    assert opt.get_mask(w).tolist() == [True, False, True]



@pytest.mark.parametrize("bad, message", [
    ([np.nan, 1.0, 0.0], r"^MaskedOptimizer: the mask \(set_mask\) for 'w' has 1 value\(s\) that are not 0 or 1 "
                         r"\(the first: nan\)"),
    ([0.5, 1.0, 0.0], r"^MaskedOptimizer: the mask \(set_mask\) for 'w' .* \(the first: 0.5\)"),
    (np.array(list("abc")), r"^MaskedOptimizer: the mask \(set_mask\) for 'w' has dtype <U1"),
    ([[1, 0], [1]], r"^MaskedOptimizer: the mask \(set_mask\) for 'w' is not array-like"),
])
def test_a_bad_mask_before_build_gets_the_same_message_and_changes_nothing(bad, message):
    """Before build a mask names its variable by path; formatting that path used to raise AttributeError."""
    w = keras.Variable([1.0, 2.0, 3.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    opt.set_mask("w", [1, 0, 1])
    with pytest.raises(ValueError, match=message):
        opt.set_mask("w", bad)
    assert opt.get_mask("w").tolist() == [True, False, True] and not opt.built
    opt.build([w])
    assert opt.get_mask(w).tolist() == [True, False, True]

def test_a_symbolic_float_mask_with_a_bad_value_fails_the_step():
    w = keras.Variable([1.0, 2.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.SGD(0.1))
    opt.build([w])
    step = tf.function(lambda m: opt.apply_gradients([(tf.ones(2), w)], trainable_masks=[m]))
    step(tf.constant([1.0, 0.0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="has a value that is not 0 or 1"):
        step(tf.constant([0.5, 0.0]))


def test_fit_refuses_a_bad_pending_mask_keeps_the_good_one_and_goes_on_after_the_fix():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="a"), keras.layers.Dense(1, name="b")])
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    model.compile(optimizer=opt, loss="mse")
    a, b = model.get_layer("a").kernel, model.get_layer("b").kernel
    opt.set_mask(a.path, [[1, 0]] * 3)  # good
    opt.set_mask(b.path, np.ones((3, 1)))  # a wrong shape: caught at build
    x, y = np.ones((8, 3)), np.ones((8, 1))
    with pytest.raises(ValueError, match=r"the mask \(set_mask\) for '.*b/kernel' has shape \(3, 1\)"):
        model.fit(x, y, epochs=1, verbose=0)
    assert not opt.built and opt.get_mask(a.path).tolist() == [[True, False]] * 3
    opt.set_mask(b.path, [[1], [0]])
    model.compile(optimizer=opt, loss="mse")  # a failed first trace leaves Keras' train function unusable
    before = a.numpy().copy()
    model.fit(x, y, epochs=1, verbose=0)
    assert (a.numpy()[:, 1] == before[:, 1]).all() and (a.numpy()[:, 0] != before[:, 0]).all()


def test_load_refuses_a_mask_that_does_not_fit_and_changes_nothing():
    w = keras.Variable([1.0, 2.0], name="w")
    opt = MaskedOptimizer("sgd")
    opt.build([w])
    opt.set_mask(w, [True, False])
    with pytest.raises(ValueError, match=r"load_own_variables\) for 'w' has shape \(3,\)"):
        opt.load_own_variables({"0": 5, "1": 0.5, "2": [True, False, True]})
    assert int(opt.iterations.numpy()) == 0 and opt.get_mask(w).tolist() == [True, False]
    with pytest.raises(ValueError, match=r"the modes \[7\] \(state from an earlier freezing\) are not one of 0, 1, 2"):
        opt.load_own_variables({"0": 5, "1": 0.5, "2": [True, False], "3": [7]})
    assert int(opt.iterations.numpy()) == 0
