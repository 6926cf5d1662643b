"""The example's model: token sequences and numeric features in, one logit out (label 1 = positive).

``build()``: ``tokens`` -> ``Embedding`` (``VOCAB`` x 16, named ``embedding``) -> mean over the sequence;
``numeric`` -> ``Dense(8)``; both joined -> ``Dense(16)`` -> one logit. ``new_tokens_only`` is the job's ``masks``
hook: the embedding rows of the pre-trained vocabulary stay frozen, the new tokens' rows train.
"""

from __future__ import annotations

import keras
import numpy as np

from downpour.examples.tokens.data import FEATURES, LENGTH, PRETRAINED, VOCAB


def build(width: int = 16, vocab: int = VOCAB) -> keras.Model:
    """The two-input model (``vocab`` rows in the embedding table). ``build(8)``"""
    tokens = keras.Input((LENGTH,), dtype="int64", name="tokens")
    numeric = keras.Input((FEATURES,), name="numeric")
    words = keras.layers.Embedding(vocab, width, name="embedding")(tokens)
    words = keras.layers.GlobalAveragePooling1D(name="mean")(words)
    numbers = keras.layers.Dense(8, activation="relu", name="numeric_encoder")(numeric)
    h = keras.layers.Concatenate(name="join")([words, numbers])
    h = keras.layers.Dense(16, activation="relu", name="hidden")(h)
    return keras.Model({"tokens": tokens, "numeric": numeric}, keras.layers.Dense(1, name="head")(h),
                       name="tokens_and_numbers")


def new_tokens_only(model: keras.Model, pretrained: int = PRETRAINED) -> dict:
    """A job's ``masks`` hook: only the embedding rows of tokens ``>= pretrained`` train; the others are frozen.

    ``DownpourConfig(masks="downpour.examples.tokens.model:new_tokens_only")``
    """
    table = model.get_layer("embedding").embeddings
    keep = np.zeros(tuple(table.shape), bool)
    keep[pretrained:] = True
    return {table.path: keep}
