"""What ``set_mask``, ``get_mask`` and ``clear_mask`` accept as a target, resolved to variables.

A target is one of:

* a variable (``keras.Variable`` or ``tf.Variable``);
* a ``keras.layers.Layer`` (a model too): the layer's weights that the optimizer updates. Before ``build``
  these are ``layer.trainable_weights`` (what ``fit`` builds the optimizer with); after ``build``, those of
  ``layer.weights`` the optimizer was built with. A layer is never a mask of its own: it stands for plain
  variables, each with its own stored mask (a layer frozen whole is a scalar ``False`` per variable);
* a path string: ``variable.path`` (``"sequential/out/kernel"``), or a unique end of it (``"out/kernel"``).
  Keras names models ``sequential``, ``sequential_1``, ... in the order they are made, so a path is also
  looked up without its first part when it has three or more parts: ``"sequential_3/out/kernel"`` finds
  ``"sequential/out/kernel"``. A path that matches several variables raises and lists them.

Anything else is a ``TypeError`` naming what was given and what is allowed; a mask given as the target and a
target given as the mask are named as swapped.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing._keras_api import key
from freezing.selection import variable_path

ALLOWED_TARGETS = "a variable, a keras layer (its weights that the optimizer updates), or a variable path string"
ALLOWED_MASKS = "None (no mask), a bool, or an array of 0/1 or bools broadcastable to the variable"


def is_variable(value: Any) -> bool:
    """Whether ``value`` is a variable (Keras or TensorFlow), not a tensor or an array.

    >>> is_variable(keras.Variable([1.0])), is_variable(np.ones(2)), is_variable(tf.ones(2))
    (True, False, False)
    """
    return isinstance(value, (keras.Variable, tf.Variable))


def _is_target(value: Any) -> bool:
    return isinstance(value, (str, keras.layers.Layer)) or is_variable(value)


def _looks_like_mask(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.ndarray, np.generic, list, tuple, tf.Tensor))


def _given(value: Any) -> str:
    if isinstance(value, keras.layers.Layer):
        return f"layer {value.name!r}"
    if is_variable(value):
        return f"variable {variable_path(value)!r}"
    if isinstance(value, np.ndarray):
        return f"a NumPy array of shape {value.shape}"
    return f"{type(value).__name__} {value!r:.60}"


def check_call(method: str, target: Any, mask: Any = None, with_mask: bool = False) -> None:
    """Refuse a target (and mask) of the wrong kind with one ``TypeError``; name swapped arguments as such.

    >>> check_call("set_mask", [1, 0], keras.Variable([1.0, 2.0], name="w"), with_mask=True)
    Traceback (most recent call last):
    ...
    TypeError: MaskedOptimizer.set_mask(target, mask): the arguments are swapped: the target is list [1, 0] and the mask is variable 'w'; call set_mask(target, mask) with the target first
    >>> check_call("get_mask", 3)
    Traceback (most recent call last):
    ...
    TypeError: MaskedOptimizer.get_mask: the target is int 3; allowed: a variable, a keras layer (its weights that the optimizer updates), or a variable path string
    """
    signature = f"MaskedOptimizer.{method}(target, mask)" if with_mask else f"MaskedOptimizer.{method}"
    if with_mask and not _is_target(target) and _is_target(mask):
        raise TypeError(f"{signature}: the arguments are swapped: the target is {_given(target)} and the mask is "
                        f"{_given(mask)}; call {method}(target, mask) with the target first")
    if not _is_target(target):
        raise TypeError(f"{signature}: the target is {_given(target)}; allowed: {ALLOWED_TARGETS}")
    if with_mask and mask is not None and not _looks_like_mask(mask):
        raise TypeError(f"{signature}: the mask is {_given(mask)}; allowed: {ALLOWED_MASKS}")


def find_path(path: str, variables: Sequence[Any], where: str) -> Any:
    # ``where``: the method name ("get_mask": errors read "MaskedOptimizer.get_mask: ..."), or "diagnose"
    """The one variable of ``variables`` that ``path`` names: its path, a unique end of it, or (three or more parts)
    the same without the first part (an automatic model name). ``ValueError`` when none or several match.

    >>> a, b = keras.Variable([1.0], name="kernel"), keras.Variable([1.0], name="bias")
    >>> find_path("bias", [a, b], "get_mask") is b
    True
    >>> find_path("kernal", [a, b], "get_mask")
    Traceback (most recent call last):
    ...
    ValueError: MaskedOptimizer.get_mask: no variable with path 'kernal' among the 2 variables; close matches: ['kernel']
    """
    who = where if where == "diagnose" else f"MaskedOptimizer.{where}"
    by_path = {variable_path(v): v for v in variables}
    if path in by_path:
        return by_path[path]
    parts = path.strip("/").split("/")
    tries = ["/".join(parts)] + (["/".join(parts[1:])] if len(parts) >= 3 else [])
    for tail in tries:
        found = [v for p, v in by_path.items() if p.endswith("/" + tail) or p == tail]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"{who}: the path {path!r} matches {len(found)} variables: "
                             f"{[variable_path(v) for v in found]}; give more of the path, or the variable itself")
    close = difflib.get_close_matches(path, list(by_path), n=3, cutoff=0.5)
    ends = difflib.get_close_matches(parts[-2] + "/" + parts[-1] if len(parts) > 1 else path,
                                     ["/".join(p.split("/")[-2:]) for p in by_path], n=3, cutoff=0.5)
    hint = f"; close matches: {close or ends}" if close or ends else f"; paths: {sorted(by_path)[:8]}"
    raise ValueError(f"{who}: no variable with path {path!r} among the {len(by_path)} variables"
                     + hint)


def layer_variables(layer: Any, known: Sequence[Any] | None, where: str) -> list[Any]:
    """The weights of ``layer`` that an optimizer updates: of ``known`` (a built optimizer's variables) when given,
    else ``layer.trainable_weights``. ``ValueError`` when there are none.

    >>> layer = keras.layers.Dense(2, name="fc"); layer.build((None, 3))
    >>> [variable_path(v) for v in layer_variables(layer, None, "set_mask")]
    ['fc/kernel', 'fc/bias']
    """
    if known is None:
        variables = list(layer.trainable_weights)
        if not variables:
            why = ("it is not built yet: call the model on an input (or give it a keras.Input) first"
                   if not layer.weights else "none of its weights is trainable (layer.trainable is False)")
            raise ValueError(f"MaskedOptimizer.{where}: layer {layer.name!r} has no weights to mask: {why}")
        return variables
    keys = {key(v) for v in known}
    variables = [w for w in layer.weights if key(w) in keys]
    if not variables:
        raise ValueError(f"MaskedOptimizer.{where}: none of the {len(layer.weights)} weights of layer {layer.name!r} "
                         f"is among the {len(known)} variables this optimizer was built with")
    return variables
