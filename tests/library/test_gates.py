"""gate(x, keep): same value, gradient only where keep is 1."""

import numpy as np
import pytest
import tensorflow as tf

from freezing import gate


def _grad(x, keep):
    x = tf.Variable(x)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(gate(x, keep) * tf.constant([1.0, 2.0, 3.0, 4.0]))
    return y, tape.gradient(y, x)


def test_value_is_unchanged_and_gradient_is_masked():
    y, g = _grad([1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0])
    assert float(y) == 10.0
    np.testing.assert_array_equal(g.numpy(), [0.0, 2.0, 3.0, 0.0])


def test_bool_and_scalar_keep():
    _, g = _grad([1.0] * 4, np.array([True, False, True, False]))
    np.testing.assert_array_equal(g.numpy(), [1.0, 0.0, 3.0, 0.0])
    _, g = _grad([1.0] * 4, 0.0)  # seed 1's do_gradient switch, off
    np.testing.assert_array_equal(g.numpy(), [0.0] * 4)
    _, g = _grad([1.0] * 4, tf.constant(1.0))
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_fractional_keep_scales_the_gradient():
    _, g = _grad([1.0] * 4, 0.5)
    np.testing.assert_allclose(g.numpy(), [0.5, 1.0, 1.5, 2.0])


def test_keep_broadcasts_over_rows():
    w = tf.Variable(tf.ones((3, 2)))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(gate(w, [[1.0], [0.0], [1.0]]))
    np.testing.assert_array_equal(tape.gradient(y, w).numpy(), [[1, 1], [0, 0], [1, 1]])


# -- exact at the edges of the number format --------------------------------------------------------
EDGES = np.array([1e-40, -1e-39, -0.0, 0.0, np.inf, -np.inf, np.nan, 3.0], np.float32)


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("keep", [np.ones(8), np.zeros(8), np.array([1, 0] * 4, np.float32), 1.0, True, 0.5],
                         ids=["all-kept", "all-blocked", "mixed", "scalar-1", "bool", "fraction"])
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_the_value_is_every_bit_of_x(keep, mode):
    """keep*x + (1-keep)*x turned a kept inf into NaN (0*inf) and flushed subnormals on CPU."""
    fn = lambda x: gate(x, keep)  # noqa: E731
    if mode != "eager":
        fn = tf.function(fn, jit_compile=mode == "xla")
    assert (_bits(fn(tf.constant(EDGES))) == _bits(EDGES)).all()


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_the_gradient_is_copied_where_kept_and_exactly_zero_where_blocked(mode):
    keep = np.array([1, 0, 1, 0, 1, 0, 1, 0.5], np.float32)
    upstream = tf.constant([1e-40, np.inf, -0.0, np.nan, np.inf, 1e-40, np.nan, 4.0], tf.float32)
    x = tf.Variable(EDGES)

    def grad():
        with tf.GradientTape() as tape:
            y = gate(x, keep)
        return tape.gradient(y, x, output_gradients=upstream)

    if mode != "eager":
        grad = tf.function(grad, jit_compile=mode == "xla")
    g = grad().numpy()
    kept = keep == 1
    assert (_bits(g[kept]) == _bits(upstream.numpy()[kept])).all()  # a subnormal, -0.0, inf, NaN: copied
    assert (_bits(g[keep == 0]) == 0).all()  # +0.0, even where the incoming gradient is inf or NaN
    assert g[-1] == 2.0


def test_a_broadcast_gate_sums_the_gradient_over_the_broadcast_axes():
    x = tf.Variable([1.0, np.inf])
    with tf.GradientTape() as tape:
        y = gate(x, [[1.0], [0.0], [1.0]])  # (3, 1) against (2,): a (3, 2) result
    assert y.shape == (3, 2) and (y.numpy() == [[1.0, np.inf]] * 3).all()
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 2.0])
