"""How a ``MaskedOptimizer`` saves and loads: its config (the inner optimizer, the options) and its state.

The state is ``variables``: the inner optimizer's, one mask per built variable, and any sparse
selections, in that order. ``.keras`` files (``load_own_variables``) and ``set_weights`` restore it;
every value is checked against its variable before any is written (a mask against its variable's
shape, a sparse variable's mask against its selection, a selection against its variable), so a file
or list that does not fit leaves the optimizer exactly as it was. State written by an earlier
freezing, which kept one mode per variable beside the masks, loads when each mode says what its mask
says and is refused otherwise. A ``tf.train.Checkpoint`` restores the masks by name; the mode of an
earlier checkpoint is not read (the mask alone decides, see ``freezing._masks``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from freezing import _keras_api, _masks, _skip_flags
from freezing.selection import variable_path


def _check_selection(value: np.ndarray, variable: Any, where: str) -> None:
    """A sparse selection must be flat positions inside its variable, strictly increasing (as ``build`` makes it)."""
    size = int(np.prod(tuple(variable.shape)))
    flat = np.asarray(value).reshape(-1)
    if flat.size and (flat.dtype.kind not in "iu" or flat.min() < 0 or flat.max() >= size
                      or (np.diff(flat) <= 0).any()):
        raise ValueError(
            f"MaskedOptimizer.{where}: the sparse selection of {variable_path(variable)!r} must be distinct flat "
            f"positions in 0..{size - 1}, in increasing order; got {flat[:8].tolist()}"
            + ("..." if flat.size > 8 else "")
        )


class SavedState:
    """Mixin: ``set_weights``/``get_weights``, ``load_own_variables`` and ``get_config``/``from_config``."""

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every variable in ``variables`` (the inner optimizer's state, then masks, then sparse selections).

        The list an earlier freezing wrote (with one mode per variable after the masks) is accepted when
        each mode says what its mask says, and refused otherwise.

        Every value is checked before any is written: a refused list leaves the optimizer as it was.

        Args:
            weights: one array per variable, in the order of ``variables``.

        Raises:
            ValueError: the optimizer is not built, a count or shape that does not match, a mask that does
                not fit its variable, a sparse selection outside it, or an earlier version's mode that
                disagrees with its mask.

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.set_weights([0, 0.1, [True, False]]); opt.get_mask(w).tolist()
        [True, False]
        """
        if not self.built:
            raise ValueError("You are calling `set_weights()` on a MaskedOptimizer that has not yet been built; "
                             "build it first: opt.build(model.trainable_variables)")
        self._assign_all([np.asarray(w) for w in weights], "set_weights")

    def get_weights(self) -> list[np.ndarray]:
        """The values of ``variables``, as NumPy arrays (what ``set_weights`` takes).

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("adam"); opt.build([w])
        >>> [a.shape for a in opt.get_weights()]
        [(), (), (1,), (1,), ()]
        """
        return [np.array(v.numpy()) for v in self.variables]

    def _assign_all(self, values: list[np.ndarray], where: str) -> None:
        variables = self.variables
        values = self._without_legacy_modes(values, len(variables), where)
        if len(values) != len(variables):
            raise ValueError(
                f"MaskedOptimizer.{where}: got {len(values)} values for {len(variables)} variables; was it saved "
                "from the same model and optimizer?"
            )
        masks = {id(m): v for m, v in zip(self._masks.keep, _keras_api.trainable_variables(self))}
        selections = {id(e.index): e.variable for e in self._sparse.entries.values()}
        checked = []
        for value, variable in zip(values, variables):
            if id(variable) in masks:
                model_variable = masks[id(variable)]
                keep = _masks.check_mask(value, model_variable, where)
                stored = _masks.to_store(keep, tuple(model_variable.shape))
                if self._sparse.holds(model_variable) and not (stored.ndim == 0 and bool(stored)):
                    raise ValueError(
                        f"MaskedOptimizer.{where}: {variable_path(model_variable)!r} has sparse state: its trainable "
                        "entries are its selection, and its mask must be True (no mask); got a mask that freezes "
                        f"{int(np.size(keep) - np.count_nonzero(keep))} entries"
                    )
                value = stored
            elif tuple(np.shape(value)) != tuple(variable.shape):
                raise ValueError(
                    f"MaskedOptimizer.{where}: {variable_path(variable)!r} has shape {tuple(variable.shape)}; got "
                    f"{np.shape(value)}"
                )
            elif id(variable) in selections:
                _check_selection(value, selections[id(variable)], where)
            checked.append(value)
        for value, variable in zip(checked, variables):
            variable.assign(value)
            if id(variable) in masks:  # SkipFrozen follows a mask written this way as one set_mask stores
                _skip_flags.mask_stored(self, masks[id(variable)], np.asarray(value))

    def _without_legacy_modes(self, values: list[np.ndarray], expected: int, where: str) -> list[np.ndarray]:
        """State written by freezing before the mask became the only record: one int32 mode per variable after the
        masks. Each mode must say what its mask says (then it is dropped); a disagreement is refused."""
        n_inner, n_masks = len(self.inner.variables), len(self._masks.keep)
        at = n_inner + n_masks
        if len(values) != expected + 1 or not n_masks or len(values) <= at:
            return values
        modes = values[at]
        if modes.dtype.kind not in "iu" or modes.shape != (n_masks,):
            return values  # not the earlier layout: the count check names the mismatch
        if not np.isin(modes, (_masks.UNMASKED, _masks.FROZEN, _masks.ELEMENTS)).all():
            raise ValueError(f"MaskedOptimizer.{where}: the modes {modes.tolist()} (state from an earlier freezing) "
                             f"are not one of 0, 1, 2 per variable ({n_masks} variables)")
        names = {_masks.UNMASKED: "no mask", _masks.FROZEN: "wholly frozen", _masks.ELEMENTS: "some entries frozen"}
        for mode, value, variable in zip(modes.tolist(), values[n_inner:at], _keras_api.trainable_variables(self)):
            keep = _masks.check_mask(value, variable, where)
            says = _masks.host_mode(keep, tuple(variable.shape))
            if says != mode:
                raise ValueError(
                    f"MaskedOptimizer.{where}: state from an earlier freezing stores a mode beside each mask, and for "
                    f"{variable_path(variable)!r} they disagree: the mode says {names[mode]!r}, the mask "
                    f"{names[says]!r}. Such state is refused (it would not train what it was trained with); "
                    "set the masks again with opt.set_mask"
                )
        return values[:at] + values[at + 1:]

    def load_own_variables(self, store: Any) -> None:
        """Restore the inner optimizer's variables and the masks from a ``.keras`` file's store.

        Every value is checked against its variable before any is written.

        Args:
            store: the mapping Keras' saving passes (``"0"``, ``"1"``, ... -> arrays).

        Raises:
            ValueError: the store holds a different number of variables, or a value that does not fit.

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.load_own_variables({"0": 0, "1": 0.1, "2": [True, False]}); opt.get_mask(w).tolist()
        [True, False]
        """
        self._assign_all([np.asarray(store[str(i)]) for i in range(len(store.keys()))], "load_own_variables")

    def get_config(self) -> dict[str, Any]:
        """The wrapper's config with the inner optimizer serialised (masks are state, not config).

        Returns:
            A JSON-serialisable dict; ``MaskedOptimizer.from_config`` rebuilds the wrapper from it.

        >>> from freezing import MaskedOptimizer
        >>> config = MaskedOptimizer("adam", policy="reset").get_config()
        >>> config["policy"], config["inner"]["class_name"]
        ('reset', 'Adam')
        """
        mask_fn = None
        if self.mask_fn is not None:
            if getattr(self.mask_fn, "__name__", "<lambda>") in ("<lambda>",) or "<locals>" in getattr(
                self.mask_fn, "__qualname__", ""
            ):
                warnings.warn(
                    "MaskedOptimizer: mask_fn is a lambda or local function and is not saved; "
                    "re-attach it after loading (opt.mask_fn = fn) or pass a module-level function",
                    stacklevel=2,
                )
            else:
                mask_fn = keras.saving.serialize_keras_object(self.mask_fn)
        config = {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner),
            "policy": self.policy,
            "norms": self.norms,
            "mask_fn": mask_fn,
        }
        if self.state != "dense":
            config.update(state=self.state, sparse_sizes=self._sparse.sizes())
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        """Rebuild from ``get_config``'s output.

        Args:
            config: what ``get_config`` returned.
            custom_objects: passed to Keras' deserialisation of the inner optimizer and ``mask_fn``.

        Returns:
            A new, unbuilt ``MaskedOptimizer``.

        >>> from freezing import MaskedOptimizer
        >>> opt = MaskedOptimizer.from_config(MaskedOptimizer("sgd", norms="all").get_config())
        >>> type(opt.inner).__name__, opt.norms
        ('SGD', 'all')
        """
        config = dict(config)
        config.pop("jit_update", None)  # written by freezing 0.2; the option is gone
        inner = keras.saving.deserialize_keras_object(config.pop("inner"), custom_objects=custom_objects)
        mask_fn = config.pop("mask_fn", None)
        if mask_fn is not None:
            mask_fn = keras.saving.deserialize_keras_object(mask_fn, custom_objects=custom_objects)
        return cls(inner, mask_fn=mask_fn, **config)


