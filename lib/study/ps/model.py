"""The job's Keras model and loss, built the same way in every process, and evaluation on values.

Workers never touch the model's own variables: they run ``keras.Model.stateless_call`` on values fetched from
the ps (``study.ps.variables``). The chief evaluates snapshots the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from study.ps.config import DownpourConfig, load_callable


def build_model(config: DownpourConfig, input_shape: Sequence[int | None] | None = None) -> Any:
    """The job's Keras model, seeded with ``config.seed``, built on ``input_shape`` (default: the data's).

    ``build_model(DownpourConfig())``
    """
    import keras

    from study.ps.data import input_spec

    keras.utils.set_random_seed(config.seed)
    model = load_callable(config.model, "model")(**config.model_kwargs)
    if not isinstance(model, keras.Model):
        raise ValueError(f"model: {config.model} returned {type(model).__name__}, not a keras.Model")
    if not model.built:
        shape = input_shape if input_shape is not None else input_spec(config)[0]
        model.build((None, *shape))
    return model


def make_loss(config: DownpourConfig) -> Callable[[Any, Any], Any]:
    """``loss(y_true, y_pred)`` -> a scalar (the mean over the batch) for the job's ``loss``."""
    import keras
    import tensorflow as tf

    if config.loss is None:
        fn = keras.losses.SparseCategoricalCrossentropy(from_logits=config.from_logits)
    elif isinstance(config.loss, str) and ":" in config.loss:
        fn = load_callable(config.loss, "loss")
    else:
        fn = keras.losses.get(config.loss)

    def loss(y_true: Any, y_pred: Any) -> Any:
        return tf.reduce_mean(fn(y_true, y_pred))

    return loss


def evaluate(model: Any, trainable: Sequence[np.ndarray], state: Sequence[np.ndarray], x: np.ndarray, y: np.ndarray,
             loss: Callable[[Any, Any], Any], from_logits: bool = True, batch: int = 500) -> dict[str, float | None]:
    """Mean loss and, for class labels, accuracy of ``model`` run on these values.

    ``state`` is the model's full non-trainable state (``PsVariables.full_state``). Accuracy: the arg-max of a
    ``(batch, classes)`` output against integer labels, or a single output against 0/1 labels, thresholded at 0
    (``from_logits``) or 0.5; None for anything else (a regression).
    """
    import tensorflow as tf

    weights = [tf.constant(w) for w in trainable]
    full = [tf.constant(s) for s in state]
    total, correct, classes = 0.0, 0, np.issubdtype(y.dtype, np.integer)
    for start in range(0, len(x), batch):
        xb, yb = x[start:start + batch], y[start:start + batch]
        out = model.stateless_call(weights, full, tf.constant(xb), training=False)[0]
        total += float(loss(tf.constant(yb), out)) * len(xb)
        scores, labels = out.numpy().reshape(len(xb), -1), yb.reshape(len(xb), -1)
        if scores.shape[1] > 1 and labels.shape[1] == 1:
            correct += int(np.sum(np.argmax(scores, axis=1) == labels[:, 0]))
        elif scores.shape[1] == 1 and labels.shape[1] == 1 and np.isin(labels, (0, 1)).all():
            correct += int(np.sum((scores[:, 0] > (0.0 if from_logits else 0.5)) == labels[:, 0].astype(bool)))
        else:
            classes = False
    return {"loss": total / max(1, len(x)), "accuracy": correct / len(x) if classes and len(x) else None}
