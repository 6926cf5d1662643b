"""Optimizer slots (Adam's m and v, momentum, accumulators): find them, reset them, stash and restore them.

This is the seed's manual route to correct freezing with stateful optimizers: a frozen entry moves
under Adam because its moments carry over, so either reset the moments of the frozen entries
(``reset_slots``) or save them and put them back when the entries are unfrozen
(``stash_slots`` / ``restore_slots``). Works for Keras 3 optimizers, ``tf.compat.v1.train``
optimizers (graph and eager mode), and anything wrapping them (``MaskedOptimizer``,
``LossScaleOptimizer``).

``reset_slots``, ``stash_slots`` and ``restore_slots`` touch the optimizer's *moments* only (what
``update_step`` reads and writes: m, v, accumulators of squares, Adafactor's factors). Two kinds of
per-variable state are not moments, and are handled as ``MaskedOptimizer`` handles them:

* the EMA average (``use_ema=True``): a frozen entry's average is its weight. ``reset_slots`` sets the
  average of the entries it resets to their weight, so ``fit``'s final overwrite
  (``finalize_variable_values``) and ``SwapEMAWeights`` hand a frozen weight its own bits back; stash
  and restore leave averages alone. An ``ema_overwrite_frequency`` is refused: Keras then overwrites
  the weights *inside* the step, from an average it has just recomputed (``m*w + (1-m)*w`` is not
  ``w`` in floating point), before ``reset_slots`` can run.
* the gradient accumulator (``gradient_accumulation_steps``) is refused by ``reset_slots``: Keras adds
  what a frozen entry accumulated while it trained at the next update step, whatever its moments are,
  and zeroing it would drop that gradient (``MaskedOptimizer`` holds it until the entry is unfrozen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from freezing import _keras_api
from freezing._wrappers import unwrap, wrapper_chain
from freezing.selection import variable_path


def _keras_slots(optimizer: keras.optimizers.Optimizer, variable: Any) -> dict[str, tuple[Any, str]]:
    if not optimizer.built:
        raise ValueError(
            f"slots: optimizer {optimizer.name!r} is not built yet; call optimizer.build(variables) first"
        )
    try:
        index = _keras_api.index(optimizer, variable)
    except KeyError:
        raise ValueError(
            f"slots: variable {variable_path(variable)!r} is not one the optimizer {optimizer.name!r} "
            f"was built with (it knows {len(_keras_api.trainable_variables(optimizer))} variables)"
        ) from None
    ref = variable.path if hasattr(variable, "path") else str(variable.name).replace(":", "_")
    prefix = f"{optimizer.name}/{ref.replace('/', '_')}_"  # as keras' add_variable_from_reference names it
    result = {}
    for attr, values in _keras_api.per_variable_lists(optimizer).items():
        slot = values[index]
        if slot is None:
            continue
        path = slot.path
        # Keras names a slot "<optimizer>/<variable path>_<slot>" (add_variable_from_reference); Keras 3.5's Adagrad
        # "<optimizer>/<slot>"; Adafactor's factors after the variable itself, where the list's name says which
        last = path.rsplit("/", 1)[-1]
        own = last.split(":")[0] in (ref.rsplit("/", 1)[-1], str(getattr(variable, "name", "")).split(":")[0])
        name = path[len(prefix):] if path.startswith(prefix) else attr.strip("_") if own or not last else last
        result[name] = (slot, attr)
    return result


def _state(optimizer: Any, variable: Any) -> tuple[Any, Any, dict[str, tuple[Any, str | None]]]:
    """(the optimizer that owns the state, the variable it keeps it for, ``{name: (slot, list name or None)}``)."""
    for wrapper in wrapper_chain(optimizer):  # a MaskedOptimizer with sparse state keeps it for a scratch variable
        reference = getattr(getattr(wrapper, "_sparse", None), "reference", None)
        if reference is not None and getattr(wrapper, "built", False):
            variable = reference(variable)
    optimizer = unwrap(optimizer)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        found = {name: optimizer.get_slot(variable, name) for name in optimizer.get_slot_names()}
        return optimizer, variable, {name: (slot, None) for name, slot in found.items() if slot is not None}
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer, variable, _keras_slots(optimizer, variable)
    raise TypeError(
        f"slots: expected a Keras 3 optimizer, a tf.compat.v1.train optimizer or a MaskedOptimizer; "
        f"got {type(optimizer).__name__}"
    )


def slots(optimizer: Any, variable: Any) -> dict[str, Any]:
    """Return every optimizer-state variable (slot) of ``variable``, by name.

    Keras 3 slots are named as Keras names them (Adam: ``momentum``, ``velocity``, and
    ``velocity_hat`` with AMSGrad; Adagrad: ``accumulator``; ...); ``tf.compat.v1.train`` slots by
    their slot names (Adam: ``m``, ``v``; RMSProp: ``rms``, ``momentum``, ``mg``). Wrappers
    (``MaskedOptimizer``, ``LossScaleOptimizer``) are looked through. Plain SGD has none. A variable
    with ``MaskedOptimizer(..., state="sparse")`` state has slots of its K trainable entries only.
    With ``use_ema=True`` the EMA average is listed (``average``), with ``gradient_accumulation_steps``
    the gradient accumulator (``gradient_accumulator``); ``moments`` leaves both out.

    Args:
        optimizer: a Keras 3 optimizer (built), a ``tf.compat.v1.train.Optimizer``, or a wrapper of one.
        variable: a variable the optimizer trains.

    Returns:
        ``{slot name: slot variable}``; empty when the optimizer keeps no state for it (or, for a
        ``tf.compat.v1`` optimizer, has not created its slots yet).

    Raises:
        ValueError: if the Keras optimizer is not built yet, or was not built with ``variable``.
        TypeError: if ``optimizer`` is not an optimizer of a supported kind.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> w = tf.Variable([0.0, 0.0], name="w")
        >>> adam = keras.optimizers.Adam(0.1)
        >>> adam.build([w])
        >>> _ = adam.apply_gradients([(tf.constant([1.0, -1.0]), w)])
        >>> sorted(slots(adam, w))
        ['momentum', 'velocity']
        >>> slots(adam, w)["momentum"].numpy().round(4).tolist()
        [0.1, -0.1]
    """
    return {name: slot for name, (slot, _) in _state(optimizer, variable)[2].items()}


def moments(optimizer: Any, variable: Any) -> dict[str, Any]:
    """The slots of ``variable`` that are moments: every slot but the EMA average and the gradient accumulator.

    What ``reset_slots``, ``stash_slots`` and ``restore_slots`` reset, save and put back: the state
    ``update_step`` reads and writes. ``slots`` lists the average and accumulator too.

    Args:
        optimizer: as for ``slots``.
        variable: a variable the optimizer trains.

    Returns:
        ``{slot name: slot variable}``, a subset of ``slots(optimizer, variable)``.

    Raises:
        ValueError, TypeError: as ``slots`` does.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> w = tf.Variable([0.0, 0.0], name="w")
        >>> adam = keras.optimizers.Adam(0.1, use_ema=True)
        >>> adam.build([w])
        >>> sorted(slots(adam, w)), sorted(moments(adam, w))
        (['average', 'momentum', 'velocity'], ['momentum', 'velocity'])
    """
    found = _state(optimizer, variable)[2]
    return {name: slot for name, (slot, attr) in found.items() if attr not in _keras_api.OUTSIDE_UPDATE_STEP}


def _average(optimizer: Any, variable: Any) -> tuple[Any, Any]:
    """(the EMA average of ``variable``, the variable it averages), or (None, None) without ``use_ema``."""
    leaf, reference, _ = _state(optimizer, variable)  # checks that the optimizer is built and knows the variable
    averages = _keras_api.ema_averages(leaf) if isinstance(leaf, keras.optimizers.Optimizer) else []
    return (averages[_keras_api.index(leaf, reference)], reference) if averages else (None, None)


def _refuse_outside_update_step(optimizer: Any, who: str) -> None:
    """Refuse state that ``reset_slots`` cannot keep frozen entries still with (see the module docstring)."""
    if any(callable(getattr(o, "set_mask", None)) for o in wrapper_chain(optimizer)):
        return  # a MaskedOptimizer (told by its set_mask, not imported: it imports this module): its masks hold the
        # average and the accumulator of every entry they freeze
    leaf = unwrap(optimizer)
    steps = getattr(leaf, "gradient_accumulation_steps", None)
    if steps:
        raise ValueError(
            f"{who}: {type(leaf).__name__}(gradient_accumulation_steps={steps}) adds what a frozen entry accumulated "
            "while it trained at the next update step, whatever its moments are, and resetting the accumulator "
            "would drop that gradient; the manual route cannot hold it. Use freezing.MaskedOptimizer, which holds "
            "a frozen entry's accumulator until it is unfrozen."
        )
    frequency = getattr(leaf, "ema_overwrite_frequency", None)
    if getattr(leaf, "use_ema", False) and frequency:
        raise ValueError(
            f"{who}: {type(leaf).__name__}(use_ema=True, ema_overwrite_frequency={frequency}) overwrites the weights "
            "inside the step with averages it has just recomputed (m*w + (1-m)*w is not w in floating point), "
            "before reset_slots can set a frozen entry's average to its weight, so frozen weights would move. "
            "Use ema_overwrite_frequency=None (fit's final overwrite is kept exact), or freezing.MaskedOptimizer."
        )


def slot_initial_value(optimizer: Any, slot_name: str) -> float:
    """Return the value a slot starts from, the value ``reset_slots`` puts back.

    0 for most slots; the optimizer's ``initial_accumulator_value`` for the accumulators of
    Adagrad and FTRL (Keras ``accumulator``, ``tf.compat.v1`` ``accumulator``/``accum``) and its
    ``initial_gradient_squared_accumulator_value`` for ``tf.compat.v1`` AdagradDA; 1 for the ``rms``
    slot of ``tf.compat.v1.train.RMSPropOptimizer``, which starts at ones.

    Args:
        optimizer: an optimizer, or a wrapper of one; it need not be built.
        slot_name: a slot name as ``slots`` returns it.

    Returns:
        The initial value, as a float.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> slot_initial_value(keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25), "accumulator")
        0.25
        >>> slot_initial_value(keras.optimizers.Adam(0.1), "velocity")
        0.0
        >>> slot_initial_value(tf.compat.v1.train.RMSPropOptimizer(0.1), "rms")
        1.0
    """
    optimizer = unwrap(optimizer)
    if slot_name == "rms" and isinstance(optimizer, tf.compat.v1.train.RMSPropOptimizer):
        return 1.0  # TF1's RMSProp initializes its mean square with ones, not zeros
    return _keras_api.initial_accumulator(optimizer, slot_name)


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

    ``reset_slots(adam, w, where=~mask)`` zeroes m and v of the frozen entries, the seed's fix: a
    frozen entry whose moments are zero gets a zero Adam step from a zero gradient. Call it after
    every step. Every moment of ``variable`` (see ``moments``) is reset to ``slot_initial_value`` (or
    to ``value``) in one assign per slot. With ``use_ema=True`` the EMA average of the same entries is
    set to their weight (copied), as ``MaskedOptimizer`` keeps it, so ``fit``'s final overwrite leaves
    them as they are.

    Args:
        optimizer: as for ``slots``.
        variable: a variable the optimizer trains.
        where: a boolean mask that broadcasts to the variable's shape (array, list or tensor; a
            placeholder in graph mode), True where to reset; None resets every entry.
        value: the value to write instead of each moment's initial value (the EMA average still gets the weight).
        session: graph mode only: a ``tf.compat.v1.Session`` that runs the op now.

    Returns:
        None in eager mode (the slots are assigned at once); in graph mode the grouped assign op,
        to run now (when ``session`` is given it has been run already) or later.

    Raises:
        ValueError: an optimizer with ``gradient_accumulation_steps``, or with ``use_ema`` and an
            ``ema_overwrite_frequency`` (unless a ``MaskedOptimizer`` wraps it): the module docstring
            says why; otherwise as ``slots`` does.
        TypeError: as ``slots`` does.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> w = tf.Variable([0.0, 0.0, 0.0], name="w")
        >>> adam = keras.optimizers.Adam(0.1)
        >>> adam.build([w])
        >>> _ = adam.apply_gradients([(tf.constant([1.0, 1.0, 1.0]), w)])
        >>> reset_slots(adam, w, where=[True, False, True])
        >>> slots(adam, w)["momentum"].numpy().round(4).tolist()
        [0.0, 0.1, 0.0]
        >>> slots(adam, w)["velocity"].numpy().round(4).tolist()
        [0.0, 0.001, 0.0]
    """
    _refuse_outside_update_step(optimizer, "reset_slots")
    ops = [
        _assign_where(slot, where, slot_initial_value(optimizer, name) if value is None else value)
        for name, slot in moments(optimizer, variable).items()
    ]
    average, reference = _average(optimizer, variable)
    if average is not None:  # a frozen entry's average is its weight, copied
        ops.append(_assign_where(average, where, tf.convert_to_tensor(_keras_api.tf_variable(reference))))
    return _run(ops, session)


@dataclass(frozen=True)
class SlotStash:
    """Saved slot values of one variable and the entries they are saved for, made by ``stash_slots``.

    Args:
        values: ``{slot name: saved value}`` (tensors in eager mode, NumPy arrays in graph mode).
        where: the boolean mask of the entries to put back, or None for all of them.

    Example:
        >>> import numpy as np
        >>> stash = SlotStash(values={"momentum": np.array([0.1, 0.2])}, where=np.array([True, False]))
        >>> sorted(stash.values), stash.where.tolist()
        (['momentum'], [True, False])
    """

    values: dict[str, Any]
    where: Any


def stash_slots(optimizer: Any, variable: Any, where: Any = None, *, session: Any = None) -> SlotStash:
    """Save the slots of ``variable`` before freezing, to put them back with ``restore_slots`` later.

    ``stash = stash_slots(adam, w, where=frozen)`` copies every moment of ``w`` now (``moments``:
    not the EMA average, which for a frozen entry is its weight, nor the gradient accumulator); ``where``
    records which entries ``restore_slots`` will write back (the others keep whatever the
    optimizer made of them meanwhile).

    Args:
        optimizer: as for ``slots``.
        variable: a variable the optimizer trains.
        where: boolean mask of the entries to restore later, or None for all; a tensor is
            evaluated now (in graph mode through ``session``).
        session: required in graph mode: the ``tf.compat.v1.Session`` that reads the values.

    Returns:
        A ``SlotStash``.

    Raises:
        ValueError: in graph mode without ``session``; otherwise as ``slots`` does.

    Example:
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default():
        ...     w = tf.compat.v1.get_variable("w", initializer=[0.0, 0.0], use_resource=True)
        ...     opt = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)
        ...     train = opt.minimize(tf.reduce_sum(w * [1.0, 2.0]))
        ...     with tf.compat.v1.Session() as sess:
        ...         sess.run(tf.compat.v1.global_variables_initializer())
        ...         _ = sess.run(train)
        ...         stash = stash_slots(opt, w, where=np.array([True, False]), session=sess)
        >>> sorted(stash.values), stash.values["momentum"].tolist()
        (['momentum'], [1.0, 2.0])
    """
    found = moments(optimizer, variable)
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
    """Put stashed moments back (at the stash's ``where``) when those entries are unfrozen.

    Only moments are written (see ``moments``): the EMA average and the gradient accumulator are not.

    Args:
        optimizer: as for ``slots``.
        variable: the variable the stash was taken of.
        stash: the ``SlotStash`` from ``stash_slots``.
        session: graph mode only: a ``tf.compat.v1.Session`` that runs the op now.

    Returns:
        None in eager mode; in graph mode the grouped assign op (already run when ``session`` is given).

    Raises:
        ValueError: if the stash holds a moment that ``variable`` does not have; otherwise as
            ``slots`` does.

    Example:
        >>> import keras
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> w = tf.Variable([0.0, 0.0], name="w")
        >>> adam = keras.optimizers.Adam(0.1)
        >>> adam.build([w])
        >>> _ = adam.apply_gradients([(tf.constant([1.0, 1.0]), w)])
        >>> frozen = np.array([True, False])
        >>> stash = stash_slots(adam, w, where=frozen)
        >>> reset_slots(adam, w)
        >>> restore_slots(adam, w, stash)
        >>> slots(adam, w)["momentum"].numpy().round(4).tolist()
        [0.1, 0.0]
    """
    found = moments(optimizer, variable)
    missing = set(stash.values) - set(found)
    if missing:
        raise ValueError(f"restore_slots: stash has slots {sorted(missing)} that {variable_path(variable)!r} lacks")
    ops = [_assign_where(found[name], stash.where, saved) for name, saved in stash.values.items()]
    return _run(ops, session)
