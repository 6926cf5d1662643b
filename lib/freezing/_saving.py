"""How a ``MaskedOptimizer`` saves and loads: its config (the inner optimizer, the options) and its state.

The state is ``variables``: the inner optimizer's, one mask per built variable, the modes, and any
sparse selections, in that order. ``.keras`` files (``load_own_variables``), ``set_weights`` and
checkpoints restore it; every value is checked against its variable before any is written, so a file
or list that does not fit leaves the optimizer exactly as it was.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from freezing import _keras_api, _masks
from freezing.selection import variable_path


class SavedState:
    """Mixin: ``set_weights``/``get_weights``, ``load_own_variables`` and ``get_config``/``from_config``."""

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every variable in ``variables`` (the inner optimizer's state, then masks, modes, selections).

        Every value is checked before any is written: a refused list leaves the optimizer as it was.

        Args:
            weights: one array per variable, in the order of ``variables``.

        Raises:
            ValueError: the optimizer is not built, a count or shape that does not match, or a mask or
                mode that does not fit its variable.

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.set_weights([0, 0.1, [True, False], [2]]); opt.get_mask(w).tolist()
        [True, False]
        """
        if not self.built:
            raise ValueError("You are calling `set_weights()` on a MaskedOptimizer that has not yet been built; build it "
                             "first: opt.build(model.trainable_variables)")
        self._assign_all([np.asarray(w) for w in weights], "set_weights")

    def get_weights(self) -> list[np.ndarray]:
        """The values of ``variables``, as NumPy arrays (what ``set_weights`` takes).

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("adam"); opt.build([w])
        >>> [a.shape for a in opt.get_weights()]
        [(), (), (1,), (1,), (), (1,)]
        """
        return [np.array(v.numpy()) for v in self.variables]

    def _assign_all(self, values: list[np.ndarray], where: str) -> None:
        variables = self.variables
        if len(values) != len(variables):
            raise ValueError(
                f"MaskedOptimizer.{where}: got {len(values)} values for {len(variables)} variables; was it saved "
                "from the same model and optimizer?"
            )
        masks = {id(m): v for m, v in zip(self._masks.keep, _keras_api.trainable_variables(self))}
        for value, variable in zip(values, variables):
            if id(variable) in masks:
                _masks.check_mask(value, masks[id(variable)], where)
            elif variable is self._masks.mode:
                if value.shape != tuple(variable.shape) or not np.isin(value, (0, 1, 2)).all():
                    raise ValueError(f"MaskedOptimizer.{where}: the modes {value.tolist()} are not one of 0, 1, 2 per "
                                     f"variable ({variable.shape[0]} variables)")
            elif tuple(np.shape(value)) != tuple(variable.shape):
                raise ValueError(
                    f"MaskedOptimizer.{where}: {variable_path(variable)!r} has shape {tuple(variable.shape)}; got "
                    f"{np.shape(value)}"
                )
        for value, variable in zip(values, variables):
            variable.assign(value)

    def load_own_variables(self, store: Any) -> None:
        """Restore the inner optimizer's variables and the masks from a ``.keras`` file's store.

        Every value is checked against its variable before any is written.

        Args:
            store: the mapping Keras' saving passes (``"0"``, ``"1"``, ... -> arrays).

        Raises:
            ValueError: the store holds a different number of variables, or a value that does not fit.

        >>> import keras; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.load_own_variables({"0": 0, "1": 0.1, "2": [True, False], "3": [2]}); opt.get_mask(w).tolist()
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


