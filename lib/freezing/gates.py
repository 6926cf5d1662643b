"""The gradient gate ``keep*x + (1-keep)*stop_gradient(x)``: same value, gradient only where ``keep``.

One function serves both seeds: seed 1's ``do_gradient`` switch (a scalar ``keep`` drawn every
step picks which sub-network trains) and seed 2's ``masked_W = MW*W + stop_gradient(|1-MW|*W)``
(a per-element ``keep``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def gate(x: Any, keep: Any) -> tf.Tensor:
    """Return ``x`` with gradient flowing only where ``keep`` is 1. ``gate(w, [0., 1.])`` blocks dL/dw[0]."""
    x = tf.convert_to_tensor(x)
    keep = tf.cast(keep, x.dtype)
    return keep * x + (1 - keep) * tf.stop_gradient(x)
