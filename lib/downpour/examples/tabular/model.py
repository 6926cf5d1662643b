"""The example's model: an MLP from 30 features to one logit (label 1 = benign)."""

from __future__ import annotations

import keras


def build(hidden: int = 32) -> keras.Model:
    """``encoder`` (30 -> hidden) -> ``hidden`` (hidden -> hidden) -> ``head`` (one logit). ``build(16)``"""
    inputs = keras.Input((30,), name="features")
    h = keras.layers.Dense(hidden, activation="relu", name="encoder")(inputs)
    h = keras.layers.Dense(hidden, activation="relu", name="hidden")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(h), name="tabular_mlp")
