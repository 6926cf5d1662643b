"""Optimizer slots (Adam's m and v, momentum, accumulators): find them, reset them, stash and restore them.

This is the seed's manual route to correct freezing with stateful optimizers: a frozen entry moves
under Adam because its moments carry over, so either reset the moments of the frozen entries
(``reset_slots``) or save them and put them back when the entries are unfrozen
(``stash_slots`` / ``restore_slots``). Works for Keras 3 optimizers, ``tf.compat.v1.train``
optimizers (graph and eager mode), and anything wrapping them (``MaskedOptimizer``,
``LossScaleOptimizer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from freezing.selection import variable_path


def _unwrap(optimizer: Any) -> Any:
    """Look through wrappers (MaskedOptimizer.inner, LossScaleOptimizer.inner_optimizer)."""
    while True:
        inner = getattr(optimizer, "inner", None) or getattr(optimizer, "inner_optimizer", None)
        if inner is None:
            return optimizer
        optimizer = inner


def _keras_slot_lists(optimizer: keras.optimizers.Optimizer) -> dict[str, Sequence[Any]]:
    """Every per-variable list of optimizer variables, found by alignment with the built variables."""
    n = len(optimizer._trainable_variables)
    shared = {id(getattr(optimizer, a, None)) for a in ("_iterations", "_learning_rate")}
    public = {id(v) for v in optimizer.variables} - shared
    found = {}
    for attr, value in vars(optimizer).items():
        if attr in ("_trainable_variables", "_variables") or isinstance(value, (str, bytes)):
            continue
        if not isinstance(value, Sequence) or len(value) != n or n == 0:
            continue
        if all(x is None or id(x) in public for x in value) and any(x is not None for x in value):
            found[attr] = value
    return found


def _keras_slots(optimizer: keras.optimizers.Optimizer, variable: Any) -> dict[str, Any]:
    if not optimizer.built:
        raise ValueError(
            f"slots: optimizer {optimizer.name!r} is not built yet; call optimizer.build(variables) first"
        )
    try:
        index = optimizer._get_variable_index(variable)
    except KeyError:
        raise ValueError(
            f"slots: variable {variable_path(variable)!r} is not one the optimizer {optimizer.name!r} "
            f"was built with (it knows {len(optimizer._trainable_variables)} variables)"
        ) from None
    ref = variable.path if hasattr(variable, "path") else str(variable.name).replace(":", "_")
    prefix = f"{optimizer.name}/{ref.replace('/', '_')}_"  # as keras' add_variable_from_reference names it
    result = {}
    for attr, values in _keras_slot_lists(optimizer).items():
        slot = values[index]
        if slot is None:
            continue
        path = slot.path
        name = path[len(prefix):] if path.startswith(prefix) else attr.strip("_")
        result[name] = slot
    return result


def slots(optimizer: Any, variable: Any) -> dict[str, Any]:
    """Return every optimizer-state variable of ``variable``. ``slots(adam, w) -> {"momentum": m, "velocity": v}``"""
    optimizer = _unwrap(optimizer)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        found = {name: optimizer.get_slot(variable, name) for name in optimizer.get_slot_names()}
        return {name: slot for name, slot in found.items() if slot is not None}
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return _keras_slots(optimizer, variable)
    raise TypeError(
        f"slots: expected a Keras 3 optimizer, a tf.compat.v1.train optimizer or a MaskedOptimizer; "
        f"got {type(optimizer).__name__}"
    )


def slot_initial_value(optimizer: Any, slot_name: str) -> float:
    """Return the value a slot starts from: 0, or the accumulator's start. ``slot_initial_value(adagrad, "accumulator") == 0.1``"""
    optimizer = _unwrap(optimizer)
    if slot_name in ("accumulator", "accum"):
        for attr in ("initial_accumulator_value", "_initial_accumulator_value"):
            if hasattr(optimizer, attr):
                return float(getattr(optimizer, attr))
    return 0.0


def _assign_where(slot: Any, where: Any, new: Any) -> Any:
    """``slot[where] = new[where]`` as one assign; returns the op (graph mode) or the variable."""
    if where is None:
        target = tf.broadcast_to(tf.cast(new, slot.dtype), slot.shape)
    else:
        where = tf.cast(where, tf.bool)
        target = tf.where(where, tf.cast(new, slot.dtype), tf.convert_to_tensor(slot))
    return slot.assign(target)


def _run(ops: list[Any], session: Any) -> Any:
    if tf.executing_eagerly():
        return None
    op = tf.group(*ops)
    if session is not None:
        session.run(op)
    return op


def reset_slots(
    optimizer: Any,
    variable: Any,
    where: Any = None,
    *,
    value: float | None = None,
    session: Any = None,
) -> Any:
    """Set the slots of ``variable`` back to their initial values, everywhere or where ``where`` is true.

    ``reset_slots(adam, w, where=~mask)`` zeroes m and v of the frozen entries, the seed's fix.
    In graph mode returns the assign op (run now when ``session`` is given).
    """
    ops = [
        _assign_where(slot, where, slot_initial_value(optimizer, name) if value is None else value)
        for name, slot in slots(optimizer, variable).items()
    ]
    return _run(ops, session)


@dataclass(frozen=True)
class SlotStash:
    """Saved slot values of one variable and the entries they are saved for."""

    values: dict[str, Any]
    where: Any


def stash_slots(optimizer: Any, variable: Any, where: Any = None, *, session: Any = None) -> SlotStash:
    """Save the slots of ``variable`` (at ``where``) before freezing. ``stash = stash_slots(adam, w, where=~mask)``"""
    found = slots(optimizer, variable)
    if tf.executing_eagerly():
        values = {name: tf.identity(slot) for name, slot in found.items()}
    else:
        if session is None:
            raise ValueError("stash_slots: in graph mode pass session=, so the values can be read now")
        values = dict(zip(found, session.run([tf.convert_to_tensor(s) for s in found.values()])))
        if tf.is_tensor(where):
            where = session.run(where)
    return SlotStash(values=values, where=where)


def restore_slots(optimizer: Any, variable: Any, stash: SlotStash, *, session: Any = None) -> Any:
    """Put stashed slot entries back when they are unfrozen. ``restore_slots(adam, w, stash)``"""
    found = slots(optimizer, variable)
    missing = set(stash.values) - set(found)
    if missing:
        raise ValueError(f"restore_slots: stash has slots {sorted(missing)} that {variable_path(variable)!r} lacks")
    ops = [_assign_where(found[name], stash.where, saved) for name, saved in stash.values.items()]
    return _run(ops, session)
