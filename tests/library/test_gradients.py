"""compute -> transform -> apply: exact in TF2 with assign_sub, and the same split in TF1 graph mode."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, gradients


def test_exact_update_on_the_seed_quadratic():
    b = tf.constant([1.0, -2.0, 3.5])
    x = tf.Variable([0.3, 0.1, -4.0])
    lr, decay = 0.1, 0.9
    before = x.numpy().copy()
    _, grads = gradients.compute(lambda: tf.reduce_sum(0.5 * (x - b) ** 2), [x])
    transformed = gradients.transform(grads, lambda g: decay * g)
    gradients.apply(transformed, [x], learning_rate=lr)
    expected = before - np.float32(lr) * transformed[0].numpy()
    np.testing.assert_array_equal(x.numpy(), expected)  # bit for bit, not approximately
    np.testing.assert_allclose(grads[0].numpy(), before - b.numpy())  # dy/dx = x - b


def test_one_pass_gives_every_gradient_and_optimizers_apply_them():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    x = tf.random.normal((4, 3))
    loss, grads = gradients.compute(lambda: tf.reduce_mean(model(x) ** 2), model.trainable_variables)
    assert len(grads) == 4 and all(g.shape == v.shape for g, v in zip(grads, model.trainable_variables))
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1), "hold")
    kernel = model.trainable_variables[0].numpy().copy()
    gradients.apply(grads, model.trainable_variables, opt, trainable_masks=[False, None, None, None])
    np.testing.assert_array_equal(model.trainable_variables[0].numpy(), kernel)


def test_bad_calls_are_clear_errors():
    x, unused = tf.Variable(1.0), tf.Variable(2.0, name="unused")
    with pytest.raises(ValueError, match=r"does not depend on \['unused'\]"):
        gradients.compute(lambda: x * 2.0, [x, unused])
    with pytest.raises(ValueError, match="exactly one of optimizer= or learning_rate="):
        gradients.apply([tf.constant(1.0)], [x])
    with pytest.raises(ValueError, match="1 gradients for 2 variables"):
        gradients.apply([tf.constant(1.0)], [x, unused], learning_rate=0.1)


def test_tf1_graph_mode_split_one_run_placeholders_apply():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.get_variable("x", initializer=tf.constant([0.3, 0.1, -4.0]), use_resource=True)
        b = tf.constant([1.0, -2.0, 3.5])
        loss = tf.reduce_sum(0.5 * (x - b) ** 2)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        grads, placeholders, apply_op = gradients.compute_tf1(opt, loss, [x])
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            before = sess.run(x)
            fed = gradients.apply_tf1(sess, grads, placeholders, apply_op, fn=lambda g: 0.9 * g)
            after = sess.run(x)
    np.testing.assert_allclose(fed[0], 0.9 * (before - np.array([1.0, -2.0, 3.5], np.float32)), rtol=1e-6)
    np.testing.assert_allclose(after, before - np.float32(0.1) * fed[0], rtol=0, atol=1e-6)
