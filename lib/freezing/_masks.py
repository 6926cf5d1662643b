"""Masks as optimizer state: validation, storage, and the per-variable mode a mask implies.

A stored mask is one boolean variable per trainable variable, scalar ``True`` ("no mask") until
``set_mask`` stores one at its own (broadcastable) shape, next to one ``int32`` mode variable that
says what the mask means for the step, decided on the host when the mask is stored:

* ``UNMASKED`` (0) -- every entry trains: Keras' own update, nothing extra;
* ``FROZEN`` (1)   -- no entry trains: no update at all, slots untouched;
* ``ELEMENTS`` (2) -- some entries train: the masked update;
* ``RESTORE`` (3)  -- most entries train: Keras' own update, then the few frozen entries' old bits
  put back by gather/scatter (cheaper than masking every write when few entries are frozen).

A mask computed in the graph (``masks=`` in ``apply_gradients``, ``mask_fn``) gets its mode in the
graph from two reductions over the mask (``reduce_all``/``reduce_any``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from freezing.selection import variable_path

UNMASKED, FROZEN, ELEMENTS, RESTORE = 0, 1, 2, 3

RESTORE_BELOW = 0.125
"""A stored mask whose frozen share is below this (and above 0) uses ``RESTORE``: the plain update
followed by a scatter of the frozen entries' saved bits, instead of a ``where`` in every write."""


class MaskStore(tf.Module):
    """The mask variables (one per built variable, in build order), their modes and sparse selections (tracked for checkpoints)."""

    def __init__(self) -> None:
        super().__init__(name="masks")
        self.keep: list[tf.Variable] = []
        self.mode: tf.Variable | None = None  # one int32 vector: the mode of every built variable
        self.index: list[tf.Variable] = []  # the selections of variables with sparse state


def host_mode(keep: np.ndarray, shape: tuple[int, ...]) -> int:
    """The mode of a stored mask, decided on the host: see the module docstring."""
    trained = int(np.count_nonzero(keep)) * (int(np.prod(shape)) // max(keep.size, 1))
    size = int(np.prod(shape))
    if trained == size:
        return UNMASKED
    if trained == 0:
        return FROZEN
    return RESTORE if (size - trained) < RESTORE_BELOW * size else ELEMENTS


def graph_mode(keep: tf.Tensor) -> tf.Tensor:
    """The mode of a mask computed in the graph: UNMASKED, FROZEN or ELEMENTS."""
    every, some = tf.reduce_all(keep), tf.reduce_any(keep)
    return tf.where(every, UNMASKED, tf.where(some, ELEMENTS, FROZEN))


def check_mask(keep: Any, variable: Any, where: str) -> np.ndarray:
    """A stored mask as a boolean array, checked to broadcast to the variable without growing it."""
    try:
        array = np.asarray(keep)
    except (TypeError, ValueError) as e:
        raise ValueError(f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} is not array-like: {e}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} has dtype {array.dtype}; "
            "expected bool or numbers (1/True = train, 0/False = frozen)"
        )
    shape = tuple(variable.shape)
    try:
        grown = np.broadcast_shapes(array.shape, shape) != shape
    except ValueError:
        grown = True
    if grown or array.ndim > len(shape):
        raise ValueError(
            f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} has shape {array.shape}; "
            f"expected a scalar or a shape broadcastable to the variable's {shape}"
        )
    return array.astype(bool)


def as_keep(mask: Any, variable: Any, what: str) -> tf.Tensor:
    """Validate one in-graph mask and return it as a boolean tensor (True = train this step)."""
    keep = tf.convert_to_tensor(mask)
    if keep.dtype != tf.bool:
        keep = tf.not_equal(keep, tf.zeros((), keep.dtype))
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
    return keep


def slot_keep(keep: tf.Tensor, variable: Any, slot: Any, name: str) -> tf.Tensor:
    """The mask of a slot: the variable's, or for a factored statistic (Adafactor's row/column), any-of."""
    var_shape, slot_shape = tuple(variable.shape), tuple(slot.shape)
    if slot_shape == var_shape or keep.shape.rank == 0:
        return keep
    full = tf.broadcast_to(keep, var_shape)
    for axis in range(len(var_shape)):
        if var_shape[:axis] + var_shape[axis + 1:] == slot_shape:
            return tf.reduce_any(full, axis=axis)
    raise ValueError(
        f"MaskedOptimizer: slot {name!r} of {variable_path(variable)!r} has shape {slot_shape}, which is "
        f"neither the variable's {var_shape} nor the variable's with one axis reduced; only a scalar "
        "mask can hold it"
    )


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
        rows = keep_rows(keep, grad.indices, len(variable.shape))
        values = tf.where(rows, grad.values, tf.zeros((), grad.values.dtype))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    grad = tf.convert_to_tensor(grad)
    return where(keep, grad, tf.zeros((), grad.dtype), grad)
