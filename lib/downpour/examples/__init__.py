"""Examples of the ``"module:function"`` hooks a Downpour job takes: model builders and gradient transforms.

A job names them as text; the chief imports them and traces them into the graphs it sends::

    DownpourConfig(model="downpour.examples:mnist_mlp", model_kwargs={"hidden": 64},
                   transform="downpour.examples:decay", transform_kwargs={"factor": 0.5})

A model builder returns a Keras model (here from 28x28x1 images to 10 logits). A transform takes one gradient
tensor (the sum of ``n_push`` steps' gradients of one variable) and returns ``T(g)``; it runs on the worker,
inside the scheduled ``tf.function``, just before the push.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: ``python -m downpour.examples.tabular.data`` loads no TensorFlow
    import keras
    import tensorflow as tf


def mnist_mlp(hidden: int = 128, batch_norm: bool = True) -> keras.Model:
    """A functional MLP 784 -> hidden -> 10 with BatchNorm (non-trainable statistics). ``mnist_mlp(64)``"""
    import keras

    inputs = keras.Input((28, 28, 1))
    h = keras.layers.Flatten(name="flatten")(inputs)
    h = keras.layers.Dense(hidden, name="fc1")(h)
    if batch_norm:
        h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.Activation("relu", name="relu1")(h)
    return keras.Model(inputs, keras.layers.Dense(10, name="fc2")(h), name="mnist_mlp")


def decay(g: tf.Tensor, factor: float = 0.5) -> tf.Tensor:
    """The seed's transform ``T(g) = factor * g``. ``decay(tf.ones(2), 0.5)``"""
    return factor * g



def random_mask(model: keras.Model, layer: str = "fc1", keep: float = 0.5, seed: int = 0) -> dict:
    """A job's ``masks`` hook: train a random share ``keep`` of ``layer``'s kernel entries, freeze the rest.

    ``DownpourConfig(optimizer="adam", masks="downpour.examples:random_mask", masks_kwargs={"keep": 0.3})``
    """
    import numpy as np

    kernel = model.get_layer(layer).kernel
    return {kernel.path: np.random.default_rng(seed).random(tuple(kernel.shape)) < keep}
