"""The job's Keras model and loss, built the same way in every process, and evaluation on values.

Workers never touch the model's own variables: they run ``keras.Model.stateless_call`` on values fetched from
the ps (``downpour.variables``). The chief evaluates snapshots the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from downpour.config import DownpourConfig, load_callable


def build_model(config: DownpourConfig, input_shape: Sequence[int | None] | None = None) -> Any:
    """The job's Keras model, seeded with ``config.seed``, built on ``input_shape`` (default: the data's).

    ``build_model(DownpourConfig())``
    """
    import keras
    import tensorflow as tf

    from downpour.data import element_spec

    keras.utils.set_random_seed(config.seed)
    model = load_callable(config.model, "model")(**config.model_kwargs)
    if not isinstance(model, keras.Model):
        raise ValueError(f"model: {config.model} returned {type(model).__name__}, not a keras.Model")
    if not model.built:
        if input_shape is not None:
            model.build((None, *input_shape))
        else:
            model.build(tf.nest.map_structure(lambda s: (None, *s.shape), element_spec(config)[0]))
    return model


def make_loss(config: DownpourConfig) -> Callable[[Any, Any], Any]:
    """``loss(y_true, y_pred)`` -> a scalar (the mean over the batch) for the job's ``loss``.

    A ``"module:function"`` loss gets ``y_true`` and ``y_pred`` as they are (dicts or lists for a model with several
    outputs). A Keras loss (or the default) is applied to each output and its label, and the means are added:
    ``y`` must then have the structure of the model's output.
    """
    import keras
    import tensorflow as tf

    if isinstance(config.loss, str) and ":" in config.loss:
        hook = load_callable(config.loss, "loss")
        return lambda y_true, y_pred: tf.reduce_mean(hook(y_true, y_pred))
    fn = (keras.losses.SparseCategoricalCrossentropy(from_logits=config.from_logits) if config.loss is None
          else keras.losses.get(config.loss))

    def loss(y_true: Any, y_pred: Any) -> Any:
        if not tf.nest.is_nested(y_pred):
            return tf.reduce_mean(fn(y_true, y_pred))
        tf.nest.assert_same_structure(y_true, y_pred)
        return tf.add_n([tf.reduce_mean(fn(t, p)) for t, p in zip(tf.nest.flatten(y_true), tf.nest.flatten(y_pred))])

    return loss


def evaluate(model: Any, trainable: Sequence[np.ndarray], state: Sequence[np.ndarray], x: Any, y: Any,
             loss: Callable[[Any, Any], Any], from_logits: bool = True, batch: int = 500) -> dict[str, float | None]:
    """Mean loss and, for class labels and one output, accuracy of ``model`` run on these values.

    ``x`` and ``y``: arrays, or dicts / lists of arrays (several inputs or outputs). ``state`` is the model's full
    non-trainable state (``PsVariables.full_state``). Accuracy: the arg-max of a ``(batch, classes)`` output
    against integer labels, or a single output against 0/1 labels, thresholded at 0 (``from_logits``) or 0.5;
    None for anything else (a regression, several outputs).
    """
    import tensorflow as tf

    weights = [tf.constant(w) for w in trainable]
    full = [tf.constant(s) for s in state]
    n = len(tf.nest.flatten(x)[0])
    total, correct = 0.0, 0
    classes = not tf.nest.is_nested(y) and np.issubdtype(y.dtype, np.integer)
    for start in range(0, n, batch):
        xb = tf.nest.map_structure(lambda a: tf.constant(a[start:start + batch]), x)
        yb = tf.nest.map_structure(lambda a: a[start:start + batch], y)
        out = model.stateless_call(weights, full, xb, training=False)[0]
        size = len(tf.nest.flatten(yb)[0])
        total += float(loss(tf.nest.map_structure(tf.constant, yb), out)) * size
        if not classes or tf.nest.is_nested(out):
            classes = False
            continue
        scores, labels = out.numpy().reshape(size, -1), yb.reshape(size, -1)
        if scores.shape[1] > 1 and labels.shape[1] == 1:
            correct += int(np.sum(np.argmax(scores, axis=1) == labels[:, 0]))
        elif scores.shape[1] == 1 and labels.shape[1] == 1 and np.isin(labels, (0, 1)).all():
            correct += int(np.sum((scores[:, 0] > (0.0 if from_logits else 0.5)) == labels[:, 0].astype(bool)))
        else:
            classes = False
    return {"loss": total / max(1, n), "accuracy": correct / n if classes and n else None}


def row_inputs(model: Any, paths: Sequence[str], sparse: Sequence[bool]) -> tuple[dict[int, int], dict[str, str]]:
    """Which sparse variables a worker can fetch as rows: ``{variable index: position of the model input in
    tf.nest.flatten(x)}`` for an ``Embedding`` that looks up a model input directly (its rows for the next batches
    are those batches' ids), and ``{path: why it is fetched whole}`` for every other sparse variable.
    ``row_inputs(model, ps.paths, kinds)``"""
    import keras
    import tensorflow as tf

    flat = tf.nest.flatten(model.input) if _has_input(model) else []
    tables = {layer.embeddings.path: layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)}
    calls = _calls(model)
    found: dict[int, int] = {}
    whole: dict[str, str] = {}
    for i, (path, is_sparse) in enumerate(zip(paths, sparse)):
        if not is_sparse:
            continue
        layer = tables.get(path)
        if layer is None:
            whole[path] = "not an Embedding's table: the rows it uses are known only from its gradient"
            continue
        if calls.get(layer.name) != 1:
            whole[path] = (f"the Embedding '{layer.name}' is called {calls.get(layer.name, 'an unknown number of')} "
                           "times in the model: its rows are fetched whole")
            continue
        try:
            source = layer.input
        except (AttributeError, ValueError):  # not in a functional graph
            source = None
        position = next((k for k, t in enumerate(flat) if t is source), None)
        if position is None:
            whole[path] = (f"the Embedding '{layer.name}' looks up ids computed inside the model, not a model input: "
                           "the rows the next batches touch are not known before they run")
            continue
        found[i] = position
    return found, whole


def _calls(model: Any) -> dict[str, int]:
    """How many times each layer is called in a functional model (its config's ``inbound_nodes``); {} otherwise."""
    try:
        return {layer["name"]: len(layer.get("inbound_nodes") or []) for layer in model.get_config()["layers"]}
    except Exception:  # noqa: BLE001 - a subclassed model, or a layer that cannot be serialised
        return {}


def _has_input(model: Any) -> bool:
    try:
        model.input
    except (AttributeError, ValueError):
        return False
    return True
