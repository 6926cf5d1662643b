"""``set_mask``, ``get_mask``, ``clear_mask``: what they accept, resolved to variables, and the masks set before
``build``.

``MaskAccess`` is the part of ``MaskedOptimizer`` that takes masks in (the way of a mask: ``freezing._masks``).

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

from freezing import _foreign, _keras_api, _masks, _skip_flags
from freezing._keras_api import key
from freezing.selection import variable_path

ALLOWED_TARGETS = "a variable, a keras layer (its weights that the optimizer updates), or a variable path string"
ALLOWED_MASKS = "None (no mask), a bool, or an array of 0/1 or bools broadcastable to the variable"


def is_variable(value: Any) -> bool:
    """Whether ``value`` is a variable (Keras or TensorFlow), not a tensor or an array.

    >>> is_variable(keras.Variable([1.0])), is_variable(np.ones(2)), is_variable(tf.ones(2))
    (True, False, False)
    """
    return isinstance(value, tf.Variable) or _keras_api.is_keras_variable(value)


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
    TypeError: MaskedOptimizer.set_mask(target, mask): the arguments are swapped: the target is list [1, 0] and the
    mask is variable 'w'; call set_mask(target, mask) with the target first
    >>> check_call("get_mask", 3)
    Traceback (most recent call last):
    ...
    TypeError: MaskedOptimizer.get_mask: the target is int 3; allowed: a variable, a keras layer (its weights that the
    optimizer updates), or a variable path string
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
    ValueError: MaskedOptimizer.get_mask: no variable with path 'kernal' among the 2 variables;
    close matches: ['kernel']
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


class MaskAccess:
    """``set_mask``, ``get_mask``, ``clear_mask`` and the masks set before ``build``: a mixin of ``MaskedOptimizer``
    (its ``_pending``, ``_mask_index``, ``_masks``, ``_sparse`` and ``policy``)."""

    def _check_pending(self, var_list: list[Any]) -> dict[str, np.ndarray]:
        """The pending masks by the path of the variable each names, before anything is built.

        Their values were checked by ``set_mask``, and so was the shape of one set on a variable or a layer; a mask
        set on a path meets its variable here, so its shape is checked here (the one check it had not had).
        """
        by_key = {_keras_api.key(v): v for v in var_list}
        checked = {}
        for path, (keep, variable) in self._pending.items():
            try:
                if variable is None:
                    variable = find_path(path, var_list, "build")
                    _masks.check_shape(keep, variable, "set_mask")
                elif _keras_api.key(variable) not in by_key:
                    raise ValueError(f"MaskedOptimizer.build: a mask was set for {path!r}, which is not among the "
                                     f"{len(var_list)} variables being built")
            except ValueError as e:
                raise ValueError(f"{e}; clear it with opt.clear_mask({path!r}) or set it on the right "
                                 "variable") from None
            checked[variable_path(variable)] = keep
        return checked

    # -- masks as state: the way in (set_mask, get_mask, clear_mask) ---------------------------------
    def _targets(self, target: Any, where: str) -> list[Any]:
        """The variables a target stands for (``freezing._mask_api``); before ``build`` a path stays a string."""
        if isinstance(target, keras.layers.Layer):
            return layer_variables(
                target, _keras_api.trainable_variables(self) if self.built else None, where)
        if not self.built:
            return [target]
        return [self._resolve(target, where)]

    def _resolve(self, target: Any, where: str = "apply") -> Any:
        """A variable or a path string -> the built variable;
        ``ValueError`` for one the optimizer was not built with."""
        if isinstance(target, str):
            return find_path(target, _keras_api.trainable_variables(self), where)
        if _keras_api.key(target) not in self._mask_index:
            raise ValueError(
                f"MaskedOptimizer: variable {variable_path(target)!r} is not one this optimizer was built "
                f"with ({len(_keras_api.trainable_variables(self))} variables); build it with every variable it will "
                "update, e.g. opt.build(model.trainable_variables)"
            )
        return target

    def _pending_path(self, target: Any, where: str) -> str | None:
        """Before ``build``: the pending mask's key for ``target`` (a path given as a unique end of one included),
        None for a variable without one; ``ValueError`` for a path no mask was set on (as after ``build``)."""
        if not isinstance(target, str):
            return variable_path(target) if variable_path(target) in self._pending else None
        if target in self._pending:
            return target
        ends = [p for p in self._pending if p.endswith("/" + target.strip("/"))]
        if len(ends) == 1:
            return ends[0]
        raise ValueError(
            f"MaskedOptimizer.{where}: no variable with path {target!r}: this optimizer is not built yet, so a path "
            f"names only a mask set on it before; masks set so far: {sorted(self._pending)}"
        )

    def set_mask(self, target: Any, trainable: Any) -> None:
        """Store a mask: entries where ``trainable`` is 1/True train, the others stay frozen; None clears it.

        The mask is checked once, here, before anything changes (values and dtype always; the shape whenever the
        variable is known: a variable, a layer, or a path after ``build``): a refused mask leaves every mask and all
        state as it was. A layer stands for its weights the optimizer updates (``freezing._mask_api``), each
        stored as a mask of its own; ``set_mask(layer, False)`` freezes the layer whole. With ``policy="reset"`` the
        newly frozen entries' slots go back to their initial values now. With ``state="sparse"``, a mask set before
        ``build`` fixes the variable's trainable entries; after ``build`` only the same mask is accepted.

        A mask set before ``build`` waits in this optimizer until ``build``. If the model is compiled with another
        optimizer, nothing would apply it: that optimizer's first step then raises (``freezing._foreign``).

        Args:
            target: a variable, a ``keras.layers.Layer`` (its weights the optimizer updates), or a path string
                (``variable.path``, or a unique end of it such as ``"out/kernel"``).
            trainable: None (clears the mask), a bool, or numbers each 0 or 1; broadcastable to the variable
                (a scalar, a row, a full array).

        Raises:
            TypeError: a target that is not a variable, a layer or a string, a mask that is not array-like, or
                the two swapped (named as swapped).
            ValueError: an unknown or ambiguous path (matches listed), a variable the optimizer was not built
                for, a mask with a value other than 0/1 (NaN included) or that does not broadcast to the variable,
                or a changed sparse selection.

        >>> import keras; from freezing import MaskedOptimizer
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc"),
        ...                           keras.layers.Dense(1, name="out")])
        >>> opt = MaskedOptimizer("sgd"); opt.build(model.trainable_variables)
        >>> opt.set_mask(model.get_layer("fc"), False)            # a layer: frozen whole
        >>> opt.set_mask("out/kernel", [[True], [False]]); opt.get_mask("out/kernel").tolist()
        [[True], [False]]
        >>> opt.set_mask("out/kernel", None); opt.get_mask("out/kernel") is None
        True
        """
        check_call("set_mask", target, trainable, with_mask=True)
        if trainable is None:
            return self.clear_mask(target)
        variables = self._targets(target, "set_mask")
        checked = [(v, _masks.check_mask(trainable, v, "set_mask")) for v in variables]  # all, before any change
        if not self.built:
            for v, keep in checked:
                self._pending[v if isinstance(v, str) else variable_path(v)] = (keep, None if isinstance(v, str) else v)
            _foreign.watch(self, [v for v, _ in checked if not isinstance(v, str)])
            return
        dense = [(v, keep) for v, keep in checked if not self._sparse.check_set(v, keep)]  # refuses before storing
        for v, keep in dense:
            stored = self._put(v, keep)
            if self.policy == "reset" and not (stored.ndim == 0 and bool(stored)):
                self._reset_slots(v, stored)  # MaskedOptimizer's: the newly frozen entries' slots to their start

    def _put(self, variable: Any, keep: np.ndarray) -> np.ndarray:
        """Store a checked mask in the variable's mask variable (the one place a mask is stored after ``build``);
        return the stored value (``_masks.to_store``: a scalar for "every entry" or "none")."""
        stored = _masks.to_store(keep, tuple(variable.shape))
        self._masks.keep[self._mask_index[_keras_api.key(variable)]].assign(stored)
        _skip_flags.mask_stored(self, variable, stored)  # SkipFrozen: a change to follow, a flag to turn back on
        return stored

    def get_mask(self, target: Any) -> np.ndarray | dict[str, np.ndarray | None] | None:
        """Return the stored mask broadcast to the variable (True = trains), or None when there is none.

        The same before and after ``build``: a path names a variable (after ``build``) or a mask set on it (before);
        a path that names neither raises ``ValueError`` both times.

        Args:
            target: a variable, a path string, or a layer.

        Returns:
            A new boolean array shaped like the variable (before ``build``, a mask set on a path keeps the shape
            it was given), or None; for a layer, ``{variable.path: that}`` for each of its weights.

        >>> from freezing import MaskedOptimizer; v = keras.Variable([[1.0, 2.0]], name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v])
        >>> opt.get_mask(v) is None
        True
        >>> opt.set_mask("w", [False, True]); opt.get_mask("w").tolist()
        [[False, True]]
        """
        check_call("get_mask", target)
        if isinstance(target, keras.layers.Layer):
            return {variable_path(v): self._get_one(v) for v in self._targets(target, "get_mask")}
        return self._get_one(target)

    def _get_one(self, target: Any) -> np.ndarray | None:
        if not self.built:
            path = self._pending_path(target, "get_mask")
            if path is None:
                return None
            keep, variable = self._pending[path]
            variable = variable if variable is not None else (None if isinstance(target, str) else target)
            if keep.all():
                return None
            return np.array(keep if variable is None else np.broadcast_to(keep, tuple(variable.shape)))
        variable = self._resolve(target, "get_mask")
        sparse = self._sparse.mask(variable)
        if sparse is not None:
            return sparse
        keep = self._masks.keep[self._mask_index[_keras_api.key(variable)]].numpy()
        if keep.ndim == 0 and bool(keep):
            return None
        return np.array(np.broadcast_to(keep, tuple(variable.shape)))

    def clear_mask(self, target: Any) -> None:
        """Remove the stored mask: every entry of the variable trains again (``set_mask(target, None)``).

        Args:
            target: a variable, a path string, or a layer (each of its weights).

        Raises:
            ValueError: a path that names no variable (before ``build``: no mask set on it), or, with
                ``state="sparse"``, a variable whose selection is fixed.

        >>> from freezing import MaskedOptimizer; v = keras.Variable([1.0, 2.0], name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v]); opt.set_mask(v, [0, 1])
        >>> opt.clear_mask(v); opt.get_mask(v) is None
        True
        """
        check_call("clear_mask", target)
        variables = self._targets(target, "clear_mask")
        if not self.built:
            paths = [self._pending_path(v, "clear_mask") for v in variables]  # raises before any change
            for path in paths:
                if path is not None:
                    _foreign.unwatch(self, [self._pending.pop(path)[1]])
            return
        self.set_mask(variables[0], True) if len(variables) == 1 else [self.set_mask(v, True) for v in variables]

