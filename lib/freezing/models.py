"""The models the studies train. Layers are named so that ``select_variables(model, scope=...)`` works.

``deep_mnist_cnn()`` is the Deep MNIST CNN of the TensorFlow tutorial that seed 3 uses:
conv 5x5x32, pool, conv 5x5x64, pool, fc 1024, dropout, fc 10 -- 3,274,634 parameters.
"""

from __future__ import annotations

import keras

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
