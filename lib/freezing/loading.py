"""``load_model``: ``keras.saving.load_model`` that also brings back the optimizer of a model with its own ``compile``.

Keras recompiles a loaded model from the ``compile_config`` in its ``.keras`` file only when the model's class
does not override ``compile``. keras-hub tasks (``BertTextClassifier``, ``GPT2CausalLM``, ``ViTImageClassifier``,
...) override it to supply defaults, so ``keras.saving.load_model`` gives them back with the task's default
optimizer, warns, and skips the saved optimizer variables: a ``MaskedOptimizer``, its masks and its state are
lost, and the next ``fit`` trains every entry. ``load_model`` loads the file as Keras does, then, for such a
model, compiles it with the saved arguments (the saved ``MaskedOptimizer`` among them), builds the optimizer and
reads its saved variables back (``model.load_weights``): the job goes on as if it had never stopped.

Only public Keras API and the ``.keras`` format's documented ``config.json`` are used.
"""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from typing import Any

import keras

# The two warnings Keras gives for a model whose compile it skipped; load_model answers both.
_HANDLED = ("`compile()` was not called as part of model loading", "Skipping variable loading for optimizer")


def _compile_config(filepath: str) -> dict[str, Any]:
    """The ``compile_config`` a ``.keras`` file (a zip, or a folder Keras wrote) holds, or ``{}``."""
    if os.path.isdir(filepath):
        with open(os.path.join(filepath, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    else:
        with zipfile.ZipFile(filepath) as archive:
            config = json.loads(archive.read("config.json"))
    return config.get("compile_config") or {}


def _compile_skipped(model: Any) -> bool:
    """Keras' own test: it recompiles a loaded model unless its class overrides ``compile`` but not
    ``compile_from_config``."""
    cls = type(model)
    return cls.compile is not keras.Model.compile and cls.compile_from_config is keras.Model.compile_from_config


def load_model(filepath: str | os.PathLike, custom_objects: dict[str, Any] | None = None,
               safe_mode: bool = True) -> Any:
    """Load a ``.keras`` file like ``keras.saving.load_model``, with the saved optimizer and its state restored.

    For a model whose class overrides ``compile`` (every keras-hub task), Keras skips the saved compile
    arguments and the optimizer's variables; this compiles the model with the saved arguments, builds the
    optimizer on ``model.trainable_variables`` and loads its variables from the file (a ``MaskedOptimizer``:
    its inner optimizer's state and the masks, each mask's mode read off the mask). Any other model is returned as Keras
    loads it.

    Args:
        filepath: a ``.keras`` file written by ``model.save``.
        custom_objects: passed to Keras' loading and to the deserialisation of the compile arguments.
        safe_mode: passed to Keras' loading and deserialisation (``False`` allows saved lambdas).

    Returns:
        The model, compiled with its saved optimizer, loss and metrics, the optimizer's state restored.

    Raises:
        ValueError: the saved optimizer state does not fit the loaded model (for example a model saved after
            ``enable_lora``: ``.keras`` saving merges LoRA factors into the kernels, so the variables the
            optimizer was built on no longer exist; save such a job with ``tf.train.Checkpoint``). Nothing is
            returned half-restored.

    >>> import keras, numpy as np, tempfile, freezing
    >>> class Task(keras.Model):  # like a keras-hub task: compile supplies defaults
    ...     def compile(self, optimizer="adam", **kwargs):
    ...         super().compile(optimizer=optimizer, loss="mse", **{k: v for k, v in kwargs.items() if k != "loss"})
    >>> inputs = keras.Input((2,)); model = Task(inputs, keras.layers.Dense(1, name="fc")(inputs))
    >>> opt = freezing.MaskedOptimizer(keras.optimizers.Adam(0.1)); model.compile(optimizer=opt)
    >>> opt.build(model.trainable_variables); opt.set_mask(model.get_layer("fc").kernel, [[True], [False]])
    >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    >>> path = tempfile.mkdtemp() + "/task.keras"; model.save(path)
    >>> loaded = freezing.load_model(path, custom_objects={"Task": Task})
    >>> type(loaded.optimizer).__name__, loaded.optimizer.get_mask(loaded.get_layer("fc").kernel).ravel().tolist()
    ('MaskedOptimizer', [True, False])
    >>> int(loaded.optimizer.iterations.numpy())
    1
    """
    filepath = os.fspath(filepath)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=True, safe_mode=safe_mode)
    config = _compile_config(filepath) if _compile_skipped(model) else {}
    for w in caught:
        if not (config and any(text in str(w.message) for text in _HANDLED)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not config:
        return model
    arguments = keras.saving.deserialize_keras_object(config, custom_objects=custom_objects, safe_mode=safe_mode)
    model.compile(**arguments)
    model.optimizer.build(model.trainable_variables)
    try:
        model.load_weights(filepath)
    except ValueError as e:
        raise ValueError(
            f"freezing.load_model: the optimizer state saved in {filepath!r} does not fit the loaded "
            f"{type(model).__name__} ({len(model.trainable_variables)} trainable variables). A model saved after "
            "enable_lora is one such case: .keras saving merges the LoRA factors into the kernels, so save and "
            f"resume that job with tf.train.Checkpoint(model=model, optimizer=model.optimizer). Keras said: {e}"
        ) from None
    return model
