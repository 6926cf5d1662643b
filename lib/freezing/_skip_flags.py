"""The ``trainable`` flags that ``SkipFrozen`` turned off, per optimizer, and putting them back.

The masks are the fact; a flag turned off here is derived from them and recorded only so that it can be put
back exactly: never a flag the user set, and always one whose variable trains again. Every stored mask
(``MaskAccess._put`` in ``freezing._mask_api``, and ``set_weights``/``load_own_variables`` in ``freezing._saving``)
calls ``mask_stored``: it bumps a counter (so the callback notices a change
without reading every mask at every batch) and, when the variable trains again, turns its flag back on at
once and drops the model's traced train function, so that nothing, not even a plain ``fit`` after a ``fit``
that raised, can keep differentiating without it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from freezing import _keras_api


@dataclass
class Skips:
    """One optimizer's skipped variables: the flags turned off (by variable key) and the model they belong to."""

    version: int = 0
    flipped: dict[int, Any] = field(default_factory=dict)
    model: Any = None  # a weakref.ref to the model whose train function reads the flags
    parked: Any = None  # Parked: the train function of the last fit's skipped set, for the next fit to take back

    def owner(self) -> Any:
        return None if self.model is None else self.model()


@dataclass(frozen=True)
class Parked:
    """A train function traced with ``skipped`` left out and ``trained`` differentiated, put aside at the end of a
    ``fit`` when the flags came back on; ``placeholder`` is the untraced function left on the model then. The
    next ``fit`` takes it back only if the model still has that placeholder (no ``compile`` or other rebuild in
    between) and, once the same flags are off again, differentiates exactly ``trained``: no retrace."""

    skipped: frozenset
    trained: frozenset
    function: Any
    placeholder: Any


_SKIPS: weakref.WeakKeyDictionary[Any, Skips] = weakref.WeakKeyDictionary()


def skips(optimizer: Any) -> Skips:
    """The record for ``optimizer`` (a ``MaskedOptimizer``), made on first use."""
    record = _SKIPS.get(optimizer)
    if record is None:
        record = _SKIPS[optimizer] = Skips()
    return record


def restore(record: Skips, keys: Any = None) -> bool:
    """Turn the recorded flags of ``keys`` (default: all) back on; True when one was turned back on.

    A flag the user turned on again meanwhile is left as it is; the record forgets it either way.
    """
    changed = False
    for k in list(record.flipped if keys is None else keys):
        variable = record.flipped.pop(k, None)
        if variable is not None and not variable.trainable:
            variable.trainable = True
            changed = True
    return changed


def retrace(record: Skips) -> None:
    """Make the model's next step trace again with the flags as they are now (no trace happens here)."""
    model = record.owner()
    record.parked = None
    if model is not None and getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)


def mask_stored(optimizer: Any, variable: Any, stored: np.ndarray) -> None:
    """Called by the optimizer for every mask it stores: note the
    change; a variable that trains again gets its flag back."""
    record = _SKIPS.get(optimizer)
    if record is None:
        return
    record.version += 1
    wholly_frozen = stored.ndim == 0 and not bool(stored)
    k = _keras_api.key(variable)
    if not wholly_frozen and k in record.flipped and restore(record, [k]):
        retrace(record)
