"""Gradients across a boundary: compute all of them in one pass, transform them, apply them.

``minimize`` is ``compute_gradients`` + ``apply_gradients``; a network boundary (a parameter server)
can go between the two. Evaluating each gradient on its own recomputes the graph every time, so
fetch them all at once, optionally transform them (``T(g) = decay*g``), and apply them through any
optimizer (``MaskedOptimizer`` included) or as a plain ``assign_sub``, which makes the exact check
``x_after == x_before - lr*T(g)`` possible. ``compute_tf1``/``apply_tf1`` are the same split in TF1
graph mode: ``compute_gradients``, one ``sess.run``, placeholders, ``apply_gradients``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from freezing.selection import variable_path


def compute(loss_fn: Callable[[], tf.Tensor], variables: Sequence[Any]) -> tuple[tf.Tensor, list[Any]]:
    """Return the loss and the gradient of every variable from one forward and one backward pass.

    Args:
        loss_fn: a function of no arguments that returns the scalar loss; it runs under a
            ``tf.GradientTape``.
        variables: the variables to differentiate with respect to.

    Returns:
        ``(loss, grads)``: the loss tensor and one gradient per variable, in the order of
        ``variables`` (a ``tf.IndexedSlices`` for a gathered variable, such as an embedding).

    Raises:
        ValueError: if the loss does not depend on some variables (their gradient is None); the
            message lists their paths.

    Example:
        >>> import tensorflow as tf
        >>> x = tf.Variable([1.0, 2.0])
        >>> loss, grads = compute(lambda: tf.reduce_sum(x ** 2), [x])
        >>> float(loss), grads[0].numpy().tolist()
        (5.0, [2.0, 4.0])
        >>> compute(lambda: 2.0 * x, [x, tf.Variable(0.0, name="unused")])
        Traceback (most recent call last):
        ...
        ValueError: compute: the loss does not depend on ['unused']; pass only variables it uses
    """
    variables = list(variables)
    with tf.GradientTape() as tape:
        loss = loss_fn()
    grads = tape.gradient(loss, variables)
    missing = [variable_path(v) for v, g in zip(variables, grads) if g is None]
    if missing:
        raise ValueError(f"compute: the loss does not depend on {missing}; pass only variables it uses")
    return loss, grads


def transform(grads: Sequence[Any], fn: Callable[[Any], Any] | None) -> list[Any]:
    """Return the transformed gradients ``[fn(g) for g in grads]``, or a copy of ``grads`` when ``fn`` is None.

    Works on tensors (TF2) and on NumPy arrays (the values ``apply_tf1`` fetched).

    Args:
        grads: the gradients.
        fn: the transformation of one gradient, such as ``lambda g: decay * g``, or None.

    Returns:
        A new list of gradients, in the same order.

    Example:
        >>> import numpy as np
        >>> transform([np.array([2.0, 4.0])], lambda g: 0.5 * g)[0].tolist()
        [1.0, 2.0]
        >>> transform([np.array([2.0])], None)[0].tolist()
        [2.0]
    """
    return list(grads) if fn is None else [fn(g) for g in grads]


def apply(grads: Sequence[Any], variables: Sequence[Any], optimizer: Any = None, *,
          learning_rate: float | None = None, trainable_masks: Sequence[Any] | None = None) -> None:
    """Apply gradients through ``optimizer``, or as the plain step ``v.assign_sub(learning_rate * g)``.

    The plain step is exact: afterwards ``v == v_before - learning_rate * g`` bit for bit (in the
    variable's dtype), which is what a test of a transformation ``T`` can compare against.

    Args:
        grads: one gradient per variable (tensors, arrays, or anything convertible).
        variables: the variables to update, in the order of ``grads``.
        optimizer: a Keras optimizer (``MaskedOptimizer`` included) whose ``apply_gradients``
            takes the pairs; give this or ``learning_rate``, not both.
        learning_rate: the step size of a plain gradient-descent step without optimizer state.
        trainable_masks: per-variable masks (True trains) passed on as ``apply_gradients(..., trainable_masks=...)``;
        only for an
            optimizer that accepts them (``MaskedOptimizer``).

    Returns:
        None; the variables are updated in place.

    Raises:
        ValueError: if ``grads`` and ``variables`` differ in length, if not exactly one of
            ``optimizer`` and ``learning_rate`` is given, or if ``trainable_masks`` come without an optimizer.

    Example:
        >>> import tensorflow as tf
        >>> x = tf.Variable([1.0, 2.0])
        >>> apply([tf.constant([10.0, 20.0])], [x], learning_rate=0.5)
        >>> x.numpy().tolist()
        [-4.0, -8.0]
        >>> apply([tf.constant([1.0, 1.0])], [x])
        Traceback (most recent call last):
        ...
        ValueError: apply: give exactly one of optimizer= or learning_rate=
    """
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"apply: {len(grads)} gradients for {len(variables)} variables")
    if (optimizer is None) == (learning_rate is None):
        raise ValueError("apply: give exactly one of optimizer= or learning_rate=")
    if optimizer is None:
        if trainable_masks is not None:
            raise ValueError("apply: trainable_masks need an optimizer (use MaskedOptimizer); "
                             "plain assign_sub takes none")
        for g, v in zip(grads, variables):
            v.assign_sub(tf.cast(learning_rate, v.dtype) * tf.convert_to_tensor(g, v.dtype))
    elif trainable_masks is not None:
        optimizer.apply_gradients(zip(grads, variables), trainable_masks=trainable_masks)
    else:
        optimizer.apply_gradients(zip(grads, variables))


def compute_tf1(optimizer: Any, loss: Any, variables: Sequence[Any]) -> tuple[list[Any], list[Any], Any]:
    """TF1 graph mode: build the gradient tensors, placeholders to feed them back, and the apply op.

    ``optimizer.minimize(loss)`` split in two, so that the gradients can be fetched in one
    ``sess.run``, changed outside the graph (or sent over a network), and fed back; see
    ``apply_tf1``. Call it inside the graph that holds ``loss`` (``with graph.as_default():``).

    Args:
        optimizer: a ``tf.compat.v1.train.Optimizer``.
        loss: the scalar loss tensor.
        variables: the variables to train.

    Returns:
        ``(grads, placeholders, apply_op)``: the gradient tensors, one placeholder per gradient
        (named ``grad_0``, ``grad_1``, ...) with its dtype and shape, and the op that applies the
        fed placeholders through ``optimizer``.

    Raises:
        ValueError: if the loss does not depend on some variables (their gradient is None).

    Example:
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default():
        ...     x = tf.compat.v1.get_variable("x", initializer=[1.0, 2.0], use_resource=True)
        ...     loss = tf.reduce_sum(x ** 2)
        ...     opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        ...     grads, placeholders, apply_op = compute_tf1(opt, loss, [x])
        >>> placeholders[0].shape.as_list(), placeholders[0].dtype.name
        ([2], 'float32')
        >>> with tf.Graph().as_default():
        ...     x = tf.compat.v1.get_variable("x", initializer=[1.0, 2.0], use_resource=True)
        ...     unused = tf.compat.v1.get_variable("unused", initializer=0.0, use_resource=True)
        ...     opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        ...     compute_tf1(opt, tf.reduce_sum(x ** 2), [x, unused])
        Traceback (most recent call last):
        ...
        ValueError: compute_tf1: the loss does not depend on ['unused']; pass only variables it uses
    """
    pairs = optimizer.compute_gradients(loss, var_list=list(variables))
    missing = [variable_path(v) for g, v in pairs if g is None]
    if missing:
        raise ValueError(f"compute_tf1: the loss does not depend on {missing}; pass only variables it uses")
    grads = [g for g, _ in pairs]
    placeholders = [tf.compat.v1.placeholder(g.dtype, g.shape, name=f"grad_{i}") for i, g in enumerate(grads)]
    apply_op = optimizer.apply_gradients(zip(placeholders, [v for _, v in pairs]))
    return grads, placeholders, apply_op


def apply_tf1(session: Any, grads: Sequence[Any], placeholders: Sequence[Any], apply_op: Any,
              fn: Callable[[np.ndarray], np.ndarray] | None = None, feed: dict | None = None) -> list[np.ndarray]:
    """Fetch every gradient in one ``sess.run``, transform them in NumPy, feed them back and apply them.

    The second half of ``compute_tf1``: one forward and backward pass for all gradients, instead of
    one graph evaluation per gradient.

    Args:
        session: the ``tf.compat.v1.Session`` of the graph.
        grads: the gradient tensors from ``compute_tf1``.
        placeholders: the matching placeholders from ``compute_tf1``.
        apply_op: the apply op from ``compute_tf1``.
        fn: the transformation of one gradient (a NumPy array), or None to apply them unchanged.
        feed: the ``feed_dict`` the loss needs (inputs, labels); it is fed to both runs.

    Returns:
        The gradients that were applied, ``T(g)``, as NumPy arrays.

    Example:
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default():
        ...     x = tf.compat.v1.get_variable("x", initializer=[1.0, 2.0], use_resource=True)
        ...     loss = tf.reduce_sum(x ** 2)
        ...     opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        ...     grads, placeholders, apply_op = compute_tf1(opt, loss, [x])
        ...     with tf.compat.v1.Session() as sess:
        ...         sess.run(tf.compat.v1.global_variables_initializer())
        ...         applied = apply_tf1(sess, grads, placeholders, apply_op, fn=lambda g: 0.5 * g)
        ...         after = sess.run(x)
        >>> applied[0].tolist(), after.tolist()
        ([1.0, 2.0], [0.5, 1.0])
    """
    values = session.run(list(grads), feed_dict=feed)
    values = transform(values, fn)
    session.run(apply_op, feed_dict={**(feed or {}), **dict(zip(placeholders, values))})
    return values
