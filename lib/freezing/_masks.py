"""Masks as optimizer state: validation, storage, and the per-variable mode a mask implies.

A stored mask is one boolean variable per trainable variable, scalar ``True`` ("no mask") until
``set_mask`` stores one. The mask is the only record of what a variable's step does; its mode is
read off it, never stored beside it (so no restored state can bring a mask and a mode that disagree):

* ``UNMASKED`` (0) -- a scalar ``True``: every entry trains: Keras' own update, nothing extra;
* ``FROZEN`` (1)   -- a scalar ``False``: no entry trains: no update at all, slots untouched;
* ``ELEMENTS`` (2) -- any mask that is not a scalar: the masked update (``freezing._write_path``),
  whose selects give Keras' bits at every entry the mask trains, even where it trains all of them.

``set_mask`` (and every restore through the wrapper) stores a mask that trains every entry, or none,
as the scalar, so the cheap paths are taken whenever they apply. A mask computed in the graph
(``trainable_masks=`` in ``apply_gradients``, ``mask_fn``) gets its mode in the graph from two
reductions over the mask (``reduce_all``/``reduce_any``).

**The way of a mask**, top-down, checked once:

1. ``MaskedOptimizer.set_mask(target, mask)`` (``freezing._mask_api``) turns the target into variables (a layer
   into its weights, a path into the one variable it names) and refuses a wrong kind;
2. ``check_mask`` (here) checks every one of those masks -- values, dtype, and the shape whenever the variable is
   known -- before anything changes. This is the only check: a mask set on a path before ``build`` has its shape
   checked at ``build`` (``check_shape``, the same error), when its variable is first known, and
   ``freezing._sparse_state`` takes a fixed selection as it was checked (after ``build`` it compares, never checks);
3. ``set_mask`` stores it: before ``build`` in the optimizer's pending masks, after ``build`` as ``to_store``'s
   value in the variable's ``MaskStore.keep`` entry;
4. the step reads the stored variable: ``stored_mode``, then ``freezing._write_path``'s selects.

A stored mask's shape is dynamic, so a new mask never retraces the step; under XLA, which compiles for
concrete shapes, each new combination of the stored masks' shapes compiles the step once
(``tests/library/test_masked_optimizer_xla_compiles.py`` counts it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from freezing import _keras_api as api
from freezing.selection import variable_path

UNMASKED, FROZEN, ELEMENTS = 0, 1, 2


class MaskStore(tf.Module):
    """The mask variables (one per built variable, in build order) and sparse selections (tracked for checkpoints)."""

    def __init__(self) -> None:
        super().__init__(name="masks")
        self.keep: list[tf.Variable] = []
        self.index: list[tf.Variable] = []  # the selections of variables with sparse state


def host_mode(keep: np.ndarray, shape: tuple[int, ...]) -> int:
    """What a host mask means for a variable of ``shape``: UNMASKED, FROZEN or ELEMENTS.

    >>> (host_mode(np.array([True, False]), (2,)), host_mode(np.array(True), (3, 4)),
    ...  host_mode(np.zeros((1, 4), bool), (3, 4)))
    (2, 0, 1)
    """
    trained = int(np.count_nonzero(keep)) * (int(np.prod(shape)) // max(keep.size, 1))
    size = int(np.prod(shape))
    if trained == size:
        return UNMASKED
    return FROZEN if trained == 0 else ELEMENTS


def to_store(keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The value a mask variable stores for a checked host mask: the scalar for "every entry" or "none", else the mask.

    >>> to_store(np.ones((2, 3), bool), (2, 3)).tolist(), to_store(np.array([True, False]), (2,)).tolist()
    (True, [True, False])
    """
    mode = host_mode(keep, shape)
    return np.asarray(mode == UNMASKED) if mode in (UNMASKED, FROZEN) else np.asarray(keep, bool)


def stored_mode(stored: Any) -> Any:
    """The mode of a stored mask variable, read off the mask: eagerly a Python int, in a graph an ``int32`` scalar.

    In a graph the read is O(1): the variable's entry count (from its shape when the step runs) and the first
    entry, never a reduction over the mask.

    >>> stored_mode(tf.Variable(True, shape=tf.TensorShape(None))), stored_mode(tf.Variable([True, True]))
    (0, 2)
    """
    keep = tf.convert_to_tensor(stored)
    if tf.executing_eagerly():
        if keep.shape.rank != 0:
            return ELEMENTS
        return UNMASKED if bool(keep.numpy()) else FROZEN
    # The entry count of the variable as it is when the step runs, read from the variable itself: a read's static
    # shape can be stale (a remote variable captured with the scalar it was created as), and TensorFlow folds
    # tf.rank/tf.size of a tensor whose static shape is known into constants. One entry (a scalar, or a mask of
    # one entry) is uniform: its value says unmasked or frozen.
    entries = tf.reduce_prod(api.variable_shape(stored))
    first = tf.reshape(keep, [-1])[0]
    return tf.where(tf.equal(entries, 1), tf.where(first, UNMASKED, FROZEN), ELEMENTS)


def graph_mode(keep: tf.Tensor) -> tf.Tensor:
    """The mode of a mask computed in the graph: UNMASKED, FROZEN or ELEMENTS."""
    every, some = tf.reduce_all(keep), tf.reduce_any(keep)
    return tf.where(every, UNMASKED, tf.where(some, ELEMENTS, FROZEN))


ALLOWED = "bool, or numbers that are each 0 or 1 (1/True = trains, 0/False = frozen)"


def _named(variable: Any) -> str:
    """The variable's path; before ``build`` a mask names its variable by the path string itself."""
    return variable if isinstance(variable, str) else variable_path(variable)


def check_values(array: np.ndarray, what: str, variable: Any) -> None:
    """Refuse a mask whose values are not 0/1 (NaN, 0.5, 2, inf): one message naming the first offender.

    ``variable`` is a variable, or (before ``build``) its path string.
    """
    if array.dtype.kind == "b":
        return
    if array.dtype.kind not in "iuf":
        raise ValueError(f"MaskedOptimizer: {what} for {_named(variable)!r} has dtype {array.dtype}; "
                         f"expected {ALLOWED}")
    bad = ~((array == 0) | (array == 1))
    if bad.any():
        first = array[bad].flat[0].item()
        count = int(np.count_nonzero(bad))
        raise ValueError(
            f"MaskedOptimizer: {what} for {_named(variable)!r} has {count} value(s) that are not 0 or 1 "
            f"(the first: {first!r}); expected {ALLOWED}"
        )


def _check_shape(shape: tuple[int, ...] | None, rank: int | None, variable: Any, what: str) -> None:
    target = tuple(variable.shape)
    if shape is None:
        return
    try:
        grown = np.broadcast_shapes(shape, target) != target
    except ValueError:
        grown = True
    if grown or (rank is not None and rank > len(target)):
        raise ValueError(
            f"MaskedOptimizer: {what} for {variable_path(variable)!r} has shape {shape}; "
            f"expected a scalar or a shape broadcastable to the variable's {target}"
        )


def check_mask(keep: Any, variable: Any, where: str) -> np.ndarray:
    """A host mask as a boolean array, checked: 0/1 values only, broadcastable to the variable without growing it.

    Before ``build`` ``variable`` is the path string: the values are checked now, the shape at ``build``.

    >>> import keras; v = keras.Variable([1.0, 2.0], name="w")
    >>> check_mask([1, 0], v, "set_mask").tolist()
    [True, False]
    >>> check_mask([0.5, 1.0], v, "set_mask")
    Traceback (most recent call last):
    ...
    ValueError: MaskedOptimizer: the mask (set_mask) for 'w' has 1 value(s) that are not 0 or 1 (the first: 0.5);
    expected bool, or numbers that are each 0 or 1 (1/True = trains, 0/False = frozen)
    """
    what = f"the mask ({where})"
    try:
        array = np.asarray(keep)
    except (TypeError, ValueError) as e:
        raise ValueError(f"MaskedOptimizer: {what} for {_named(variable)!r} is not array-like: {e}") from None
    check_values(array, what, variable)
    if not isinstance(variable, str):
        _check_shape(array.shape, array.ndim, variable, what)
    return array.astype(bool)


def check_shape(keep: np.ndarray, variable: Any, where: str) -> None:
    """The shape half of ``check_mask``, for a mask whose values were checked before its variable was known
    (a path given before ``build``): the same error ``check_mask`` gives."""
    _check_shape(keep.shape, keep.ndim, variable, f"the mask ({where})")


def as_keep(mask: Any, variable: Any, what: str) -> tf.Tensor:
    """Validate one per-step mask and return it as a boolean tensor (True = train this step).

    A mask whose values are known (NumPy, Python, an eager or constant tensor) is checked here; a
    symbolic float mask is checked in the graph, where a value other than 0/1 fails the step.
    """
    static = mask if isinstance(mask, (np.ndarray, list, tuple, bool, int, float)) else tf.get_static_value(mask)
    if static is not None:
        array = np.asarray(static)
        check_values(array, what, variable)
        _check_shape(array.shape, array.ndim, variable, what)
        return tf.constant(array.astype(bool))
    keep = tf.convert_to_tensor(mask)
    shape = tf.TensorShape(variable.shape)
    try:
        broadcast = tf.broadcast_static_shape(keep.shape, shape)
    except ValueError:
        broadcast = None
    too_many = keep.shape.rank is not None and keep.shape.rank > shape.rank
    if broadcast is None or too_many or (broadcast.is_fully_defined() and broadcast != shape):
        raise ValueError(
            f"MaskedOptimizer: {what} for {variable_path(variable)!r} has shape {keep.shape}; "
            f"expected None, a scalar, or a shape broadcastable to the variable's {shape}"
        )
    if keep.dtype == tf.bool:
        return keep
    if not (keep.dtype.is_floating or keep.dtype.is_integer):
        raise ValueError(f"MaskedOptimizer: {what} for {variable_path(variable)!r} has dtype {keep.dtype.name}; "
                         f"expected {ALLOWED}")
    binary = tf.reduce_all(tf.logical_or(tf.equal(keep, 0), tf.equal(keep, 1)))
    check = tf.debugging.Assert(binary, [f"MaskedOptimizer: {what} for {variable_path(variable)!r} has a value that "
                                         f"is not 0 or 1; expected {ALLOWED}"])
    with tf.control_dependencies([check]):
        return tf.not_equal(keep, tf.zeros((), keep.dtype))


def slot_keep(keep: tf.Tensor, variable: Any, slot: Any, axis: int | None = None) -> tf.Tensor:
    """The mask of an optimizer variable that belongs to ``variable``.

    A slot shaped like the variable has the variable's mask. A statistic shared by several entries
    (Adafactor's row and column factors: the variable's shape with one axis removed; a scalar
    placeholder) is held only when every entry that shares it is frozen: the mask is an any-of over
    the axis the statistic averages over. That axis is ``axis`` when the statistic's role is known
    (``_keras_api.factor_axis``), not guessed from shapes: on a square kernel a row and a column
    statistic have the same shape. A statistic of unknown role that several axes fit is held only
    where every entry along each of them is frozen (so it is never held for an entry that trains).

    >>> keep = tf.constant([[True, False], [False, False]])  # row 1 and column 1 wholly frozen
    >>> v, factor = tf.zeros((2, 2)), tf.zeros(2)
    >>> slot_keep(keep, v, factor, axis=-1).numpy().tolist(), slot_keep(keep, v, factor, axis=-2).numpy().tolist()
    ([True, False], [True, False])
    >>> keep = tf.constant([[True, True], [False, False]])  # row 1 frozen, no column wholly frozen
    >>> slot_keep(keep, v, factor, axis=-1).numpy().tolist(), slot_keep(keep, v, factor, axis=-2).numpy().tolist()
    ([True, False], [True, True])
    """
    var_shape, slot_shape = tuple(variable.shape), tuple(slot.shape)
    if slot_shape == var_shape or keep.shape.rank == 0:
        return keep
    full = tf.broadcast_to(keep, var_shape)
    rank = len(var_shape)
    if axis is not None and rank and var_shape[:axis % rank] + var_shape[axis % rank + 1:] == slot_shape:
        return tf.reduce_any(full, axis=axis % rank)
    fits = [a for a in range(rank) if var_shape[:a] + var_shape[a + 1:] == slot_shape]
    if fits:
        held_nowhere = tf.reduce_any(full, axis=fits[0])
        for a in fits[1:]:
            held_nowhere = tf.logical_or(held_nowhere, tf.reduce_any(full, axis=a))
        return held_nowhere
    return tf.reduce_any(full)


def where(keep: tf.Tensor, new: Any, old: Any, like: Any) -> tf.Tensor:
    """``tf.where(keep, new, old)`` with the static shape of ``like`` (a stored mask's shape is dynamic)."""
    result = tf.where(keep, new, old)
    if not tf.executing_eagerly() and result.shape != like.shape:
        result.set_shape(like.shape)
    return result


def full_rank(keep: tf.Tensor, rank: int) -> tf.Tensor:
    """``keep`` reshaped to ``rank`` dimensions by leading ones (a stored mask's rank is dynamic)."""
    if keep.shape.rank == rank:
        return keep
    shape = tf.shape(keep)
    pad = tf.ones([rank - tf.size(shape)], tf.int32)
    out = tf.reshape(keep, tf.concat([pad, shape], 0))
    out.set_shape([None] * rank)
    return out


def keep_rows(keep: tf.Tensor, indices: tf.Tensor, rank: int) -> tf.Tensor:
    """The mask's rows at ``indices`` (an ``IndexedSlices`` update's rows), broadcastable to its values.

    A mask with one row (a per-column mask, or a scalar) applies to every row, so the rows read are
    ``min(index, rows - 1)``: no broadcast of the mask to the variable's shape is made.
    """
    keep = full_rank(keep, rank)
    last = tf.cast(tf.shape(keep)[0] - 1, indices.dtype)
    return tf.gather(keep, tf.minimum(indices, last))


def zero_where_frozen(grad: Any, keep: tf.Tensor, variable: Any) -> Any:
    """The gradient with frozen entries' values set to 0 (an ``IndexedSlices`` stays sparse)."""
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.IndexedSlices(grad.values, tf.convert_to_tensor(grad.indices), grad.dense_shape)  # a tuple too
        rows = keep_rows(keep, grad.indices, len(variable.shape))
        values = tf.where(rows, grad.values, tf.zeros((), grad.values.dtype))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    grad = tf.convert_to_tensor(grad)
    return where(keep, grad, tf.zeros((), grad.dtype), grad)
