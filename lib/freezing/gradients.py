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
    """Loss and the gradients of every variable from one backward pass. ``loss, grads = compute(lambda: f(x), [x])``"""
    variables = list(variables)
    with tf.GradientTape() as tape:
        loss = loss_fn()
    grads = tape.gradient(loss, variables)
    missing = [variable_path(v) for v, g in zip(variables, grads) if g is None]
    if missing:
        raise ValueError(f"compute: the loss does not depend on {missing}; pass only variables it uses")
    return loss, grads


def transform(grads: Sequence[Any], fn: Callable[[Any], Any] | None) -> list[Any]:
    """Apply ``fn`` to each gradient (identity when None). ``transform(grads, lambda g: 0.5 * g)``"""
    return list(grads) if fn is None else [fn(g) for g in grads]


def apply(grads: Sequence[Any], variables: Sequence[Any], optimizer: Any = None, *,
          learning_rate: float | None = None, masks: Sequence[Any] | None = None) -> None:
    """Apply gradients through ``optimizer``, or as ``v.assign_sub(learning_rate * g)``. ``apply(grads, vs, learning_rate=.1)``"""
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
        raise ValueError(f"apply: {len(grads)} gradients for {len(variables)} variables")
    if (optimizer is None) == (learning_rate is None):
        raise ValueError("apply: give exactly one of optimizer= or learning_rate=")
    if optimizer is None:
        if masks is not None:
            raise ValueError("apply: masks need an optimizer (use MaskedOptimizer); plain assign_sub takes none")
        for g, v in zip(grads, variables):
            v.assign_sub(tf.cast(learning_rate, v.dtype) * tf.convert_to_tensor(g, v.dtype))
    elif masks is not None:
        optimizer.apply_gradients(zip(grads, variables), masks=masks)
    else:
        optimizer.apply_gradients(zip(grads, variables))


def compute_tf1(optimizer: Any, loss: Any, variables: Sequence[Any]) -> tuple[list[Any], list[Any], Any]:
    """TF1 graph mode: (gradient tensors, placeholders to feed them back, the apply op). ``grads, phs, op = compute_tf1(opt, loss, vs)``"""
    pairs = optimizer.compute_gradients(loss, var_list=list(variables))
    grads = [g for g, _ in pairs]
    placeholders = [tf.compat.v1.placeholder(g.dtype, g.shape, name=f"grad_{i}") for i, g in enumerate(grads)]
    apply_op = optimizer.apply_gradients(zip(placeholders, [v for _, v in pairs]))
    return grads, placeholders, apply_op


def apply_tf1(session: Any, grads: Sequence[Any], placeholders: Sequence[Any], apply_op: Any,
              fn: Callable[[np.ndarray], np.ndarray] | None = None, feed: dict | None = None) -> list[np.ndarray]:
    """One ``sess.run`` for every gradient, transform in numpy, feed back and apply; returns T(g). ``apply_tf1(sess, g, p, op)``"""
    values = session.run(list(grads), feed_dict=feed)
    values = transform(values, fn)
    session.run(apply_op, feed_dict={**(feed or {}), **dict(zip(placeholders, values))})
    return values
