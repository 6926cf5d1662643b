"""Weight decay held and folded into the update's write, in a graph (``freezing._write_path``, ``FOLDS``).

Keras' weight decay is a write of its own (``assign_sub(variable * wd * lr)``, before ``update_step``). In a graph,
for the optimizers in ``FOLDS``, the guard holds it and the update's write of the variable subtracts it first, in
the same select: one masked pass instead of two (``make bench``'s ``hold_adamw`` row). These tests pin down that
the fold happens, that it gives plain Keras' bits where trainable and the old bits where frozen (subnormal, -0.0,
inf and NaN included) on every path, and that an update reading the variable in between fails loudly.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer
from freezing._tuning import tune

SPECIAL = np.array([1e-40, -0.0, np.inf, np.nan, -1e-41, 0.0, -np.inf, 1e-38], "float32")


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _start(shape, seed=0) -> np.ndarray:
    init = np.random.default_rng(seed).normal(size=shape).astype("float32")
    init.flat[: SPECIAL.size] = SPECIAL
    return init


def _twins(inner, shape, **tuning):
    init = _start(shape)
    v, p = keras.Variable(init, name="w"), keras.Variable(init, name="w")
    masked, plain = MaskedOptimizer(inner()), inner()
    masked.build([v])
    plain.build([p])
    if tuning:
        tune(masked, **tuning)
    return masked, v, plain, p


def _fused(variable) -> list[str]:
    """The XLA-compiled writes the guard made for ``variable`` (by write method, and whether a decay was folded)."""
    return sorted(variable.value.__dict__["assign"].fused)


KEEPS = {"elements": lambda shape: np.random.default_rng(1).random(shape) < 0.5,
         "unmasked": lambda shape: None, "frozen": lambda shape: np.zeros(shape, bool)}


def _fold_against_plain(mask: str, jit: bool = False, **tuning) -> keras.Variable:
    """Masked and plain AdamW, two graph steps after a mask is set: trainable bits are plain Keras', frozen the old."""
    shape = (40, 10)
    inner = lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)  # noqa: E731
    masked, v, plain, p = _twins(inner, shape, **tuning)
    g = tf.constant(np.random.default_rng(2).normal(size=shape).astype("float32"))
    masked_step = tf.function(lambda: masked.apply_gradients([(g, v)]), jit_compile=jit)
    plain_step = tf.function(lambda: plain.apply_gradients([(g, p)]), jit_compile=jit)
    masked_step(), plain_step()  # state to drift with
    keep = KEEPS[mask](shape)
    masked.set_mask(v, keep)
    before = v.numpy().copy()
    for _ in range(2):
        masked_step(), plain_step()
    after, trainable = v.numpy(), np.ones(shape, bool) if keep is None else keep
    assert _bits(after[trainable]) == _bits(p.numpy()[trainable])
    assert _bits(after[~trainable]) == _bits(before[~trainable])
    return v


@pytest.mark.parametrize("mask", sorted(KEEPS))
@pytest.mark.parametrize("dispatch_above", [1, 2**40])  # per-step switch_case on the mode, or the select path
@pytest.mark.parametrize("fuse_above", [1, 2**40])  # one XLA-compiled write, or TensorFlow's kernels
def test_a_folded_decay_gives_keras_bits_where_trainable_and_keeps_frozen_bits(mask, dispatch_above, fuse_above):
    v = _fold_against_plain(mask, dispatch_above=dispatch_above, fuse_above=fuse_above)
    if fuse_above == 1:  # the decay went into the update's write: no XLA-compiled write of its own
        assert _fused(v) == ["decay_then_assign_sub"]


@pytest.mark.parametrize("mask", sorted(KEEPS))
def test_under_xla_a_folded_decay_gives_the_bits_of_plain_keras_under_xla(mask):
    _fold_against_plain(mask, jit=True)


def test_in_fit_each_masked_variable_gets_one_write_for_decay_and_update():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
    opt = MaskedOptimizer(keras.optimizers.AdamW(0.01, weight_decay=0.1))
    tune(opt, fuse_above=1)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    opt.build(model.trainable_variables)
    for w in model.trainable_variables:
        opt.set_mask(w, np.random.default_rng(3).random(tuple(w.shape)) < 0.5)
    x, y = np.ones((8, 6), "float32"), np.zeros((8, 4), "float32")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert [_fused(w) for w in model.trainable_variables] == [["decay_then_assign_sub"]] * 2


def test_an_update_that_reads_the_variable_after_its_held_decay_fails_at_trace_time_and_moves_nothing():
    """Were a Keras release's update to read the variable, it would read it undecayed: a loud error, not other bits."""
    inner = lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)  # noqa: E731
    masked, v, _, _ = _twins(inner, (5, 4))
    path = masked._paths[0]
    update = path.plain

    def reading(gradient, variable, learning_rate):
        tf.reduce_sum(tf.convert_to_tensor(variable))  # a read of the variable between decay and update
        return update(gradient, variable, learning_rate)

    path.plain = reading
    masked.set_mask(v, np.random.default_rng(4).random((5, 4)) < 0.5)
    before = [_bits(t.numpy()) for t in masked.variables]
    g = tf.ones((5, 4))
    with pytest.raises(RuntimeError, match=r"read 'w'.*between its weight decay and its update"):
        tf.function(lambda: masked.apply_gradients([(g, v)]))()
    assert [_bits(t.numpy()) for t in masked.variables] == before and _bits(v.numpy()) == _bits(_start((5, 4)))


@pytest.mark.parametrize("name, inner", [
    ("ftrl", lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, weight_decay=0.1)),  # reads w
    ("accumulation", lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, gradient_accumulation_steps=2)),
    ("sgd_momentum", lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1)),  # assign_add update
])
def test_decay_with_every_other_update_shape_gives_keras_bits(name, inner):
    """Ftrl reads the variable in its update, so its decay is not held (not in FOLDS); under gradient accumulation
    the decay and the update sit in a ``cond`` branch; SGD's momentum update is an ``assign_add``."""
    shape = (40, 10)
    masked, v, plain, p = _twins(inner, shape, fuse_above=1)
    keep = np.random.default_rng(5).random(shape) < 0.5
    masked.set_mask(v, keep)
    before = v.numpy().copy()
    grads = [tf.constant(np.random.default_rng(6 + i).normal(size=shape).astype("float32")) for i in range(4)]
    masked_step = tf.function(lambda g: masked.apply_gradients([(g, v)]))
    plain_step = tf.function(lambda g: plain.apply_gradients([(g, p)]))
    for g in grads:
        masked_step(g), plain_step(g)
    after = v.numpy()
    assert _bits(after[~keep]) == _bits(before[~keep]), name
    assert _bits(after[keep]) == _bits(p.numpy()[keep]), name


@pytest.mark.parametrize("name, inner", [
    ("sgd", lambda: keras.optimizers.SGD(0.37, weight_decay=0.113)),  # its update of given rows: a scatter
    ("adagrad", lambda: keras.optimizers.Adagrad(0.37, weight_decay=0.113)),
    ("adamw", lambda: keras.optimizers.AdamW(0.037, weight_decay=0.113)),
])
def test_with_a_sparse_gradient_the_decay_is_written_before_the_scatter_as_keras_does(name, inner):
    """A scatter takes no held decay: it is written on its own first, so the touched rows get (old - decay) - g,
    Keras' order, not (old - g) - decay (found by a fresh auditor; 118 of 518 SGD entries differed)."""
    shape = (64, 16)
    masked, v, plain, p = _twins(inner, shape)
    keep = np.random.default_rng(1).random(shape) < 0.5
    masked.set_mask(v, keep)
    before = v.numpy().copy()
    rows = tf.constant(np.arange(0, 64, 2), tf.int64)
    values = tf.constant(np.random.default_rng(2).normal(size=(32, 16)).astype("float32"))
    gradient = lambda: tf.IndexedSlices(values, rows, tf.constant(shape, tf.int64))  # noqa: E731
    masked_step = tf.function(lambda: masked.apply_gradients([(gradient(), v)]))
    plain_step = tf.function(lambda: plain.apply_gradients([(gradient(), p)]))
    for _ in range(3):
        masked_step(), plain_step()
    after = v.numpy()
    assert _bits(after[~keep]) == _bits(before[~keep]), name
    assert _bits(after[keep]) == _bits(p.numpy()[keep]), name


def test_a_read_by_the_guard_itself_between_decay_and_update_is_caught_too():
    """check_unread does not excuse the owner's own ops: a guarded write that read the variable undecayed (as a
    scatter's gather of the touched rows did) fails at trace time instead of giving other bits."""
    inner = lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)  # noqa: E731
    masked, v, _, _ = _twins(inner, (5, 4))
    masked.set_mask(v, np.random.default_rng(4).random((5, 4)) < 0.5)
    guards = masked._guards
    path = masked._paths[0]
    update = path.plain

    def reading_in_the_guards_scope(gradient, variable, learning_rate):
        with tf.name_scope(guards.token):  # named as the guard's own ops are
            tf.reduce_sum(tf.convert_to_tensor(variable))
        return update(gradient, variable, learning_rate)

    path.plain = reading_in_the_guards_scope
    with pytest.raises(RuntimeError, match=r"read 'w'.*between its weight decay and its update"):
        tf.function(lambda: masked.apply_gradients([(tf.ones((5, 4)), v)]))()
