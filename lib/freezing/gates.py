"""The gradient gate ``keep*x + (1-keep)*stop_gradient(x)``: same value, gradient only where ``keep``.

One function serves both seeds: seed 1's ``do_gradient`` switch (a scalar ``keep`` drawn every
step picks which sub-network trains) and seed 2's ``masked_W = MW*W + stop_gradient(|1-MW|*W)``
(a per-element ``keep``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def gate(x: Any, keep: Any) -> tf.Tensor:
    """Return ``x`` with gradient flowing only where ``keep`` is 1: ``keep*x + (1-keep)*stop_gradient(x)``.

    The value is ``x`` (up to rounding of ``keep*x + (1-keep)*x`` when ``keep`` is fractional);
    the gradient with respect to ``x`` is the incoming gradient times ``keep``. So a per-element 0/1
    ``keep`` freezes entries (the optimizer sees a zero gradient there, though a stateful optimizer
    may still move them: see ``slots`` and ``MaskedOptimizer``), a scalar switches a whole tensor
    on or off, and a fraction scales its gradient.

    Args:
        x: a tensor or variable (anything ``tf.convert_to_tensor`` accepts).
        keep: 1 (or True) where the gradient flows, 0 (or False) where it is blocked; a scalar or
            anything that broadcasts against ``x``. It is cast to ``x.dtype``.

    Returns:
        A tensor with the value and shape of ``x`` (broadcast against ``keep``).

    Example:
        >>> import tensorflow as tf
        >>> w = tf.Variable([1.0, 2.0, 3.0])
        >>> with tf.GradientTape() as tape:
        ...     y = tf.reduce_sum(gate(w, [0.0, 1.0, 1.0]) * 10.0)
        >>> float(y)
        60.0
        >>> tape.gradient(y, w).numpy().tolist()
        [0.0, 10.0, 10.0]
    """
    x = tf.convert_to_tensor(x)
    keep = tf.cast(keep, x.dtype)
    return keep * x + (1 - keep) * tf.stop_gradient(x)
