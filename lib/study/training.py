"""Training-loop pieces shared by the CNN studies: a gated forward pass, batches, accuracy, state resets.

Loops stay short because these carry the weight; each study module composes them inside ``tf.function``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing.gates import gate

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def forward(model: keras.Sequential, x: Any, training: bool = False, feature_keep: Any = None,
            after: str = "flatten") -> tf.Tensor:
    """Run a Sequential model layer by layer, gating the output of layer ``after`` with ``feature_keep``.

    ``forward(cnn, x, True, feature_keep=0.0)`` gives the same logits with zero gradient for every layer
    up to ``flatten`` (the seed-1 ``do_gradient`` gate on the feature extractor).
    """
    for layer in model.layers:
        x = layer(x, training=training)
        if feature_keep is not None and layer.name == after:
            x = gate(x, feature_keep)
    return x


def batch_indices(n: int, batch: int, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Indices of ``steps`` minibatches, reshuffled every epoch.
    ``next(batch_indices(100, 10, 5, 0)).shape == (10,)``"""
    rng = np.random.default_rng(seed)
    order, pos = rng.permutation(n), 0
    for _ in range(steps):
        if pos + batch > n:
            order, pos = rng.permutation(n), 0
        yield order[pos: pos + batch]
        pos += batch


def reseed(model: keras.Model, seed: int) -> None:
    """Restart the random state of every random layer (dropout) at ``seed``.

    A Keras 3 ``Dropout`` draws its masks from a ``SeedGenerator`` whose state advances on every training
    call and whose start is drawn when the layer is built. Restarting it at ``seed`` makes a run's dropout
    masks depend on its seed only, not on what ran before in the same process. The i-th random layer gets the
    state ``(seed, i * 2**32)``, so layers never share a stream.

    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5)])
    >>> x = np.ones((1, 4), np.float32)
    >>> reseed(m, 3); a = m(x, training=True).numpy()
    >>> _ = m(x, training=True); reseed(m, 3)
    >>> bool((m(x, training=True).numpy() == a).all())
    True
    """
    states = [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]
    for i, state in enumerate(states):
        state.assign(np.array([seed, i << 32], dtype=state.dtype))


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``. ``accuracy(cnn, splits.x_test, splits.y_test)``"""
    correct = 0
    for i in range(0, len(y), batch):
        logits = model(x[i: i + batch], training=False)
        correct += int(np.sum(np.argmax(logits, axis=-1) == y[i: i + batch]))
    return correct / max(len(y), 1)


def snapshot(variables: Sequence[Any]) -> list[np.ndarray]:
    """Copies of the variables' values. ``state = snapshot(opt.variables)``"""
    return [np.array(v.numpy(), copy=True) for v in variables]


def restore(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
    """Assign saved values back, checking that they line up. ``restore(opt.variables, state)``"""
    if len(variables) != len(values):
        raise ValueError(f"restore: {len(values)} saved values for {len(variables)} variables")
    for v, value in zip(variables, values):
        known = getattr(v.shape, "rank", 0) is not None  # a mask variable of MaskedOptimizer takes any shape
        if known and tuple(v.shape) != tuple(np.shape(value)):
            raise ValueError(f"restore: shape {np.shape(value)} does not fit {getattr(v, 'path', v.name)} "
                             f"{tuple(v.shape)}")
        v.assign(value)


def digest(variables: Sequence[Any]) -> str:
    """A short fingerprint of the variables' bits (SHA-256 over each value's dtype, shape and bytes, in order): two
    runs with equal digests ended with bit-identical weights. ``digest(model.weights)``

    >>> a, b = [np.float32([0.0, 1.0])], [np.float32([-0.0, 1.0])]
    >>> digest(a) == digest([np.float32([0.0, 1.0])]), digest(a) == digest(b)  # -0.0 is not +0.0
    (True, False)
    """
    h = hashlib.sha256()
    for v in variables:
        value = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()[:16]


def median_ms(times: Sequence[float]) -> float:
    """Median of per-step wall times in ms, skipping the first (tracing) step. ``median_ms([1.0, .01, .02]) == 15.0``"""
    return 1e3 * float(np.median(times[1:] if len(times) > 1 else times))


class StepTimer(keras.callbacks.Callback):
    """Wall time of every training batch of ``fit``; ``median_ms(timer.times)`` skips the traced first one.

    ``timer = StepTimer(); model.fit(..., callbacks=[timer]); median_ms(timer.times)``
    """

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.times.append(time.perf_counter() - self._start)
