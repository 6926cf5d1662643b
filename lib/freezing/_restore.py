"""The snapshot-and-select construction: Keras' own writes, then every frozen bit selected back.

Before the inner optimizer's ``apply`` runs, the step reads the old value of every masked variable and of
every optimizer variable that belongs to it (slots, EMA average, gradient accumulator, Adafactor's
factors); after it, each of them is written once more as ``where(keep, new, old)`` (an EMA average's
frozen entries take the variable's old bits: a frozen entry's average is its weight). Whatever wrote
them in between -- any write method, a raw op, a nested function, a write this library has never seen
-- the frozen entries end with their old bits, so no check is needed.

It costs a copy and a select per masked tensor whether or not anything was frozen, where the guarded
write (``freezing._write_path``) folds the select into each write: measured in graphs (``make bench``'s
former ``*_restore`` rows, issue 33), the guarded write was cheaper in every row but one, so graphs keep the
guarded write and its trace-time check, and this construction runs only where there is no trace to check:
eager steps (``freezing._write_path.write_step``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from freezing import _keras_api as api
from freezing import _masks


def _component(variable: Any) -> Any:
    """The ``tf.Variable`` this replica writes: the only one, or under a strategy the copy on the replica's device.

    Chosen by device, not by replica id: under ``MultiWorkerMirroredStrategy`` the replica id counts every
    worker's devices, while a worker holds only its own copies.
    """
    components = api.components(variable)
    if len(components) == 1:
        return components[0]
    here = tf.DeviceSpec.from_string(tf.constant(0).device)  # an eager op runs on the replica's device
    for component in components:
        there = tf.DeviceSpec.from_string(component.device)
        if (there.device_type, there.device_index) == (here.device_type, here.device_index) and \
                there.task in (here.task, None) and there.job in (here.job, None):
            return component
    raise RuntimeError(f"MaskedOptimizer: no copy of {variable.name!r} on {here.to_string()!r} "
                       f"(copies on {[c.device for c in components]})")


@contextlib.contextmanager
def restored(entries: dict[int, Any]) -> Iterator[None]:
    """Run the block, then write back the old bits of every frozen entry of the entries' variables and state."""
    saved = []
    for entry in entries.values():
        variable = _component(entry.variable)
        old_variable = tf.identity(variable.read_value())
        saved.append((variable, entry.target, old_variable, None))
        for slot, target, _ in entry.slots:
            component = _component(slot)
            saved.append((component, target, tf.identity(component.read_value()), old_variable))
    try:
        yield
    finally:
        for component, target, old, variable_old in saved:
            frozen = old if target.source is None else tf.cast(variable_old, old.dtype)
            now = component.read_value()
            type(component).assign(component, _masks.where(target.keep(), now, frozen, now), read_value=False)
