"""The models the studies train. Layers are named so that ``select_variables(model, scope=...)`` works.

``deep_mnist_cnn()`` is the Deep MNIST CNN of the TensorFlow tutorial that seed 3 uses:
conv 5x5x32, pool, conv 5x5x64, pool, fc 1024, dropout, fc 10 -- 3,274,634 parameters.
"""

from __future__ import annotations

import keras
import numpy as np

DEEP_MNIST_PARAMETERS = 3_274_634


def deep_mnist_cnn(dropout: float = 0.5, name: str = "deep_mnist_cnn") -> keras.Model:
    """The Deep MNIST CNN with layers conv1, conv2, fc1, fc2. ``deep_mnist_cnn().count_params() == 3274634``"""
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 5, padding="same", activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2, name="pool1"),
            keras.layers.Conv2D(64, 5, padding="same", activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2, name="pool2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(1024, activation="relu", name="fc1"),
            keras.layers.Dropout(dropout, name="dropout"),
            keras.layers.Dense(10, name="fc2"),
        ],
        name=name,
    )


def _macs(layer: keras.layers.Layer) -> int:
    """Multiply-accumulates of one layer's forward pass for one sample (Conv2D and Dense; others ~free)."""
    if isinstance(layer, keras.layers.Conv2D):
        out = layer.output.shape[1:]  # (H, W, C_out)
        kh, kw = layer.kernel_size
        return int(np.prod(out) * kh * kw * layer.kernel.shape[2])
    if isinstance(layer, keras.layers.Dense):
        return int(layer.kernel.shape[0] * layer.kernel.shape[1])
    return 0


def training_flops_per_sample(model: keras.Model) -> int:
    """FLOPs of one training step per sample, counted from the layers. ``training_flops_per_sample(deep_mnist_cnn())``

    Forward 2*MACs; backward 2*MACs for the weight gradients plus 2*MACs for the input gradients of every
    layer but the first (its input needs no gradient). Element-wise work (ReLU, pooling, Adam) is left out.
    """
    macs = [_macs(layer) for layer in model.layers]
    first = next((m for m in macs if m), 0)
    return 6 * sum(macs) - 2 * first
