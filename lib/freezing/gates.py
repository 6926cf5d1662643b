"""The gradient gate ``keep*x + (1-keep)*stop_gradient(x)``: same value (every bit), gradient only where ``keep``.

One function serves both seeds: seed 1's ``do_gradient`` switch (a scalar ``keep`` drawn every
step picks which sub-network trains) and seed 2's ``masked_W = MW*W + stop_gradient(|1-MW|*W)``
(a per-element ``keep``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def gate(x: Any, keep: Any) -> tf.Tensor:
    """Return ``x`` with gradient flowing only where ``keep`` is 1: ``keep*x + (1-keep)*stop_gradient(x)``.

    The value is exactly ``x``, every bit (a subnormal, ``-0.0``, ``inf`` and NaN included), whatever
    ``keep`` holds: it is a copy, not the arithmetic above, which would turn a kept ``inf`` into NaN
    (``0*inf``) and flush subnormals on CPU. The gradient with respect to ``x`` is the incoming
    gradient where ``keep`` is 1 (its bits copied), exactly 0 where ``keep`` is 0 (even where the
    incoming gradient is ``inf`` or NaN), and the incoming gradient times ``keep`` where ``keep`` is a
    fraction. So a per-element 0/1 ``keep`` freezes entries (the optimizer sees a zero gradient there,
    though a stateful optimizer may still move them: see ``slots`` and ``MaskedOptimizer``), a scalar
    switches a whole tensor on or off, and a fraction scales its gradient.

    Args:
        x: a tensor or variable (anything ``tf.convert_to_tensor`` accepts).
        keep: 1 (or True) where the gradient flows, 0 (or False) where it is blocked; a scalar or
            anything that broadcasts against ``x``. It is cast to ``x.dtype``.

    Returns:
        A tensor with the value and shape of ``x`` (broadcast against ``keep``).

    Example:
        >>> import tensorflow as tf
        >>> w = tf.Variable([1.0, 2.0, float("inf")])
        >>> with tf.GradientTape() as tape:
        ...     y = gate(w, [0.0, 1.0, 1.0])
        ...     loss = tf.reduce_sum(y[:2] * 10.0)
        >>> y.numpy().tolist()
        [1.0, 2.0, inf]
        >>> tape.gradient(loss, w).numpy().tolist()
        [0.0, 10.0, 0.0]
    """
    x = tf.convert_to_tensor(x)
    return _gate(x, tf.cast(keep, x.dtype))


@tf.custom_gradient
def _gate(x: tf.Tensor, keep: tf.Tensor) -> tuple[tf.Tensor, Any]:
    shape = tf.broadcast_dynamic_shape(tf.shape(x), tf.shape(keep))
    same = x.shape.is_fully_defined() and x.shape == tf.broadcast_static_shape(x.shape, keep.shape)
    value = tf.identity(x) if same else tf.broadcast_to(x, shape)  # a copy: every bit of x

    def grad(upstream: tf.Tensor) -> tuple[tf.Tensor, None]:
        scaled = tf.where(tf.equal(keep, 0), tf.zeros_like(upstream), upstream * keep)
        g = tf.where(tf.equal(keep, 1), upstream, scaled)  # a select: the incoming bits where keep is 1
        if not same:  # x was broadcast: its gradient sums over the broadcast axes
            axes, _ = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x), s1=shape)
            g = tf.reshape(tf.reduce_sum(g, axes), tf.shape(x))
        return g, None

    return value, grad
