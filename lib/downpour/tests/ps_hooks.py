"""Job hooks for the parameter-server tests: ``"downpour.tests.ps_hooks:<name>"`` (imported by the chief process)."""

import numpy as np
import tensorflow as tf


def nan_on_ps(g: tf.Tensor) -> tf.Tensor:
    """A transform that fails at run time on ps:0 with InvalidArgumentError: a bad push, not a lost ps."""
    with tf.device("/job:ps/replica:0/task:0"):
        return tf.debugging.check_numerics(g * np.float32(np.nan), "poisoned gradient")


def broken_model() -> None:
    """A model builder that fails: the chief must exit with a message, not hang."""
    raise RuntimeError("this builder is broken on purpose")


def bad_shape(model) -> dict:
    """A mask function whose mask does not fit its variable."""
    return {"fc1/kernel": [True, False, True]}


def per_worker(split: str, worker, workers: int):
    """A dataset function that shards itself: worker w reads rows 100 w, 100 w + 1, 100 w + 2."""
    rows = tf.data.Dataset.range(3).map(lambda i: tf.cast(i + 100 * tf.cast(worker, tf.int64), tf.float32))
    return rows.map(lambda x: (tf.reshape(x, (1,)), tf.cast(x, tf.int32)))


def embedding_model():
    """An Embedding (10 x 4) and a Dense head: the Embedding's gradient is IndexedSlices."""
    import keras

    tokens = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4, name="embedding")(tokens)
    return keras.Model(tokens, keras.layers.Dense(2, name="head")(keras.layers.Flatten()(h)))


def freeze_rows(model) -> dict:
    """Rows 0-4 of the embedding table frozen."""
    keep = np.ones((10, 4), bool)
    keep[:5] = False
    return {"embedding/embeddings": keep}


def features_29(split: str):
    """29 features where the tabular model declares 30."""
    return tf.data.Dataset.from_tensors((tf.zeros(29), 0))


def features_as_text(split: str):
    """Features as text where the tabular model takes floats."""
    return tf.data.Dataset.from_tensors((tf.fill([30], "x"), 0))


def two_inputs_misnamed(split: str):
    """The tokens model's two inputs under a wrong name."""
    return tf.data.Dataset.from_tensors(({"tokens": tf.zeros(20, tf.int64), "numbers": tf.zeros(3)}, 0))


def two_outputs():
    """A model with two outputs, a dict {"label", "score"}, on 4 features."""
    import keras

    features = keras.Input((4,), name="features")
    h = keras.layers.Dense(8, activation="relu", name="shared")(features)
    return keras.Model(features, {"label": keras.layers.Dense(1, name="label")(h),
                                  "score": keras.layers.Dense(1, name="score")(h)})


def two_targets(split: str):
    """4 features, and y as a dict of two targets: their sum's sign and their mean (read from graph constants)."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = {"label": (x.sum(axis=1) > 0).astype(np.float32), "score": x.mean(axis=1)}
    return tf.data.Dataset.from_tensor_slices((x, y))
