"""Adafactor's row and column factors are held by role, not by shape: square and 3-D kernels.

Keras' Adafactor keeps, per kernel, a row statistic ``_r`` (the mean of the squared gradient over the last
axis) and a column statistic ``_c`` (over the second last). A factor is held when every entry it averages
over is frozen. On a square kernel both factors have the same shape, so deciding by shape held a row
factor where the column factor should have been: all trainable entries then left Keras' path.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer

SHAPES = [(4, 4), (4, 5), (3, 3, 3), (2, 4, 4), (3, 4, 4)]


def _keep(shape, frozen):
    keep = np.ones(shape, bool)
    if frozen in ("row", "both"):
        keep[..., 1, :] = False  # row 1 of every matrix: every entry of its row statistic frozen
    if frozen in ("column", "both"):
        keep[..., 2] = False  # column 2: every entry of its column statistic frozen
    if frozen == "entries":
        keep[..., 0, 0] = keep[..., 1, 2] = keep[..., 2, 1] = False  # no row or column wholly frozen
    return keep


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _run(shape, keep, steps=4, graph=False, norms="trainable"):
    """The wrapper's kernel and plain Adafactor's on the same masked gradients, from the same start."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=shape).astype("float32")
    w, plain_w = keras.Variable(start, name="w"), keras.Variable(start, name="w")
    opt, plain = MaskedOptimizer(keras.optimizers.Adafactor(0.1), norms=norms), keras.optimizers.Adafactor(0.1)
    step = lambda g: opt.apply_gradients([(g, w)], trainable_masks=[keep])  # noqa: E731
    plain_step = lambda g: plain.apply_gradients([(g * keep, plain_w)])  # noqa: E731
    if graph:
        step, plain_step = tf.function(step), tf.function(plain_step)
    for _ in range(steps):
        g = tf.constant(rng.normal(size=shape).astype("float32"))
        step(g)
        plain_step(g)
    return start, w.numpy(), plain_w.numpy()


@pytest.mark.parametrize("frozen", ["row", "column", "entries"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("graph", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "graph"])
def test_trainable_entries_are_plain_adafactor_on_the_masked_gradients(shape, frozen, graph):
    keep = _keep(shape, frozen)
    start, masked, plain = _run(shape, keep, graph=graph)
    assert (_bits(masked[~keep]) == _bits(start[~keep])).all()
    assert (_bits(masked[keep]) == _bits(plain[keep])).all(), f"{int((masked[keep] != plain[keep]).sum())} differ"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_frozen_row_and_column_give_what_keras_gives_and_norms_all_stays_finite(shape):
    """Keras' own Adafactor on gradients with a zero row and a zero column turns every entry NaN: where both
    meet, r * c = 1e-30 * 1e-30 underflows to a zero velocity, 0 * rsqrt(0) is NaN, and its RMS clip spreads it.
    The wrapper gives Keras' bits (NaN included) and holds the frozen entries; norms="all" lets Keras see the
    frozen entries' gradients, so the statistics stay positive and the trainable entries finite."""
    keep = _keep(shape, "both")
    start, masked, plain = _run(shape, keep, steps=2)
    assert np.isnan(plain[keep]).all()
    assert (_bits(masked[~keep]) == _bits(start[~keep])).all()
    np.testing.assert_array_equal(masked[keep], plain[keep])
    start, masked, _ = _run(shape, keep, steps=2, norms="all")
    assert (_bits(masked[~keep]) == _bits(start[~keep])).all()
    assert np.isfinite(masked).all() and (masked[keep] != start[keep]).all()


@pytest.mark.parametrize("shape", [(4, 4), (3, 3, 3)], ids=["4x4", "3x3x3"])
def test_the_held_factor_is_the_frozen_rows_or_columns_own(shape):
    """Trained first, then a row (or a column) frozen: its own statistic keeps its bits, the other factor moves."""
    rng = np.random.default_rng(1)
    w = keras.Variable(rng.normal(size=shape).astype("float32"), name="w")
    opt = MaskedOptimizer(keras.optimizers.Adafactor(0.1))
    opt.build([w])
    for _ in range(2):
        opt.apply_gradients([(tf.constant(rng.normal(size=shape).astype("float32")), w)])
    inner = opt.inner
    r, c = inner._r[0], inner._c[0]  # the test reads Keras' lists by name, as _keras_api.FACTORS does
    for frozen, held, moving in (("row", r, c), ("column", c, r)):
        index = 1 if frozen == "row" else 2
        before_held, before_moving = held.numpy().copy(), moving.numpy().copy()
        opt.set_mask(w, _keep(shape, frozen))
        opt.apply_gradients([(tf.constant(rng.normal(size=shape).astype("float32")), w)])
        after = held.numpy()
        assert (_bits(after[..., index]) == _bits(before_held[..., index])).all(), frozen
        others = np.delete(after, index, axis=-1) != np.delete(before_held, index, axis=-1)
        assert others.all(), frozen
        assert (moving.numpy() != before_moving).all(), frozen
        opt.clear_mask(w)
