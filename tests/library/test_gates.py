"""gate(x, keep): same value, gradient only where keep is 1."""

import numpy as np
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
