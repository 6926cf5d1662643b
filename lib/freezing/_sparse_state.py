"""Sparse optimizer state for a fixed selection: inner slots only for the entries that train.

``MaskedOptimizer(inner, state="sparse")``: a variable whose mask is set before ``build`` (FISH-style
sparse fine-tuning, new embedding rows, new output columns) gets, instead of the inner optimizer's
full-size slots,

* ``index`` -- the flat positions of its K trainable entries (``int32``, row-major order), saved
  with the optimizer: the selection itself (the full mask is not stored);
* ``values`` -- a K-entry scratch variable the inner optimizer updates, and builds its slots from
  (Adam: ``m`` and ``v`` of K entries each).

At every step the trainable entries' values and gradients are gathered into ``values``, the inner
optimizer updates ``values`` with its own ``update_step`` (nothing masked, nothing extra), and the
result is scattered back. Memory is ``K * (4 + 4 + slot bytes)`` instead of ``N * slot bytes``, and
the update costs in proportion to K. An elementwise optimizer (SGD, Adam, AdamW, RMSprop, ...)
computes each entry from that entry's gradient and state alone, so the trainable entries get the
bits the dense ``hold`` path gives them (SGD, momentum, Adam, AdamW, Adamax, Nadam, AMSGrad, Lion,
Ftrl, checked). Two exceptions agree to float rounding only: an update of the form ``x / sqrt(y)``
(Adagrad, Adadelta, RMSprop), which Grappler rewrites as ``x * rsqrt(y)``, whose vectorised and
scalar loops round differently (the gather moves entries between them: a few ulp); and norms
(clipping, Lamb's trust ratio), which sum the K entries in another order than the dense variable.

A selection that is wholly frozen keeps no state at all; a wholly trainable one is a dense variable.
The selection is fixed: after ``build`` only the same mask is accepted (``set_mask`` raises).

**The base options** end where dense state ends, bit for bit
(``tests/library/test_masked_optimizer_sparse_options.py``): weight decay, ``clipvalue``, ``clipnorm`` and
``global_clipnorm`` (the frozen entries' gradients are zero for the norm in dense state and absent here), gradient
accumulation (K-entry accumulators), and ``use_ema``
with K-entry averages: ``fit``'s final overwrite (``finalize_variable_values``) writes them into the selection,
and ``keras.callbacks.SwapEMAWeights`` sees full-size averages (``ema_view``). Refused when built, because the
result would differ: ``norms="all"`` with ``clipnorm``/``global_clipnorm``, and ``use_ema`` on an optimizer
inside a ``LossScaleOptimizer`` or ``MultiOptimizer`` (see ``check_options``).

**Sparse gradients.** An ``IndexedSlices`` gradient (an ``Embedding``'s) reaches the inner optimizer as an
``IndexedSlices`` over the K entries: per slice, the selected entries of its row, duplicates kept. Nothing the
size of the variable is made, and the inner optimizer computes what it computes in dense state (Keras' Adam
squares each slice before summing duplicates). Under XLA, which needs static shapes, each entry of each slice
is a candidate and those outside the selection point at index -1, which XLA's scatters drop: the slices' own
size, still nothing the size of the variable.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing._keras_api import in_xla, index, key, tf_variable, trainable_variables
from freezing.selection import variable_path


class _Entry:
    __slots__ = ("variable", "index", "values", "size")

    def __init__(self, variable: Any, index: tf.Variable, values: keras.Variable, size: int):
        self.variable, self.index, self.values, self.size = variable, index, values, size


class SparseState:
    """The sparse state of one ``MaskedOptimizer``: one ``_Entry`` per variable with a fixed selection."""

    def __init__(self, wrapper: Any, sizes: list[int | None]):
        self.wrapper = wrapper
        self._sizes = list(sizes)  # K per built variable (None: dense), from a saved config: build recreates it
        self.entries: dict[int, _Entry] = {}  # variable key -> entry
        self.frozen: set[int] = set()  # variables wholly frozen under sparse state: no inner state at all
        self._by_values: dict[int, _Entry] = {}  # key of the scratch variable -> entry
        self.excluded: tuple[list[Any], Any] | None = None  # exclude_from_weight_decay's (var_list, var_names)

    @property
    def on(self) -> bool:
        return self.wrapper.state == "sparse"

    def check_options(self) -> None:
        """Refuse, with one message, a base option whose result under sparse state would differ from dense state.

        * ``norms="all"`` with ``clipnorm``/``global_clipnorm``: the norm is to see frozen entries' gradients,
          which sparse state never gathers.
        * ``use_ema`` on an optimizer inside a ``LossScaleOptimizer`` or ``MultiOptimizer``: ``SwapEMAWeights``
          looks past the wrapper there, at the K-entry scratch variables, and would swap nothing in the model.
        """
        if not self.on:
            return
        wrapper = self.wrapper
        leaves = wrapper._leaves()
        if wrapper.norms == "all" and any(leaf.clipnorm or leaf.global_clipnorm for leaf in leaves):
            raise ValueError("MaskedOptimizer: state='sparse' with norms='all' cannot clip by norm: the norm would "
                             "have to see frozen entries' gradients, which sparse state never gathers; use "
                             "norms='trainable' (the default) or state='dense'")
        if any(leaf.use_ema for leaf in leaves) and any(leaf is not wrapper.inner for leaf in leaves):
            raise ValueError("MaskedOptimizer: state='sparse' with use_ema=True needs the EMA optimizer directly "
                             "inside it: keras.callbacks.SwapEMAWeights looks past a LossScaleOptimizer or "
                             "MultiOptimizer at "
                             "the sparse scratch values. Wrap the plain optimizer (for mixed precision, a dtype "
                             "policy makes compile wrap the MaskedOptimizer itself) or use state='dense'")

    # -- build ------------------------------------------------------------------------------------
    def build(self, var_list: list[Any], pending: dict[str, np.ndarray]) -> list[Any]:
        """Create the sparse state; return what the inner optimizer is built with (scratch for sparse ones)."""
        if not self.on:
            return var_list
        wrapper, out = self.wrapper, []
        for i, v in enumerate(var_list):
            path, k = variable_path(v), key(v)
            keep = pending.get(path)
            if keep is not None:  # checked by set_mask (and build, for its shape)
                flat = np.flatnonzero(np.broadcast_to(keep, tuple(v.shape)))
                size = int(flat.size)
            elif i < len(self._sizes) and self._sizes[i] is not None:
                flat, size = None, int(self._sizes[i])
            else:
                out.append(v)
                continue
            if size == int(np.prod(v.shape)):
                out.append(v)
                continue
            if getattr(v, "constraint", None) is not None:
                raise ValueError(f"MaskedOptimizer: state='sparse' cannot apply the constraint of {path!r} "
                                 "to a selection; use the dense state for it")
            if size == 0:
                self.frozen.add(k)
                continue
            index = tf.Variable(np.zeros(size, np.int32) if flat is None else flat.astype(np.int32),
                                trainable=False, name=f"sparse_index_{len(self.entries)}")
            initial = np.zeros(size, v.dtype) if flat is None else np.asarray(v.numpy()).reshape(-1)[flat]
            values = keras.Variable(initial, dtype=v.dtype, trainable=False, name=v.name)
            entry = _Entry(v, index, values, size)
            self.entries[k] = entry
            self._by_values[id(values)] = entry
            wrapper._masks.index.append(index)
            out.append(values)
        self._exclude_scratch()
        return out

    def _exclude_scratch(self) -> None:
        """A variable excluded from weight decay by the list (``exclude_from_weight_decay(var_list=...)``) has its
        scratch values excluded too: the inner optimizer decays the scratch values, not the variable. (By name it
        needs nothing: the scratch values carry the variable's name.)"""
        if self.excluded is None:
            return
        var_list, var_names = self.excluded
        scratch = [self.entries[key(v)].values for v in var_list if key(v) in self.entries]
        if scratch:
            for leaf in self.wrapper._leaves():
                leaf.exclude_from_weight_decay(var_list=list(var_list) + scratch, var_names=var_names)

    def variables(self) -> list[Any]:
        """The saved sparse state: the selections (the scratch values are refilled at every step)."""
        return [e.index for e in self.entries.values()]

    def scratch(self) -> list[Any]:
        """The K-entry scratch variables (not saved: refilled from their variables at every step)."""
        return [e.values for e in self.entries.values()]

    def sizes(self) -> list[int | None]:
        """K per built variable (None: dense state), for the config: what ``build`` needs before loading the state."""
        out = []
        for v in trainable_variables(self.wrapper):
            k = key(v)
            out.append(0 if k in self.frozen else self.entries[k].size if k in self.entries else None)
        return out

    def inner_variables(self, var_list: Any) -> list[Any]:
        """``var_list`` as the inner optimizer knows it (scratch values for sparse variables)."""
        out = []
        for v in var_list:
            k = key(v)
            if k in self.frozen:
                continue
            out.append(self.entries[k].values if k in self.entries else v)
        return out

    def holds_all(self, variable: Any) -> bool:
        """Whether ``variable`` is wholly frozen under sparse state (the inner optimizer does not know it)."""
        return bool(self.frozen) and key(variable) in self.frozen

    def holds(self, variable: Any) -> bool:
        """Whether ``variable``'s state is sparse (or it is wholly frozen under sparse state): no mask to guard."""
        k = key(variable)
        return k in self.entries or k in self.frozen

    def reference(self, variable: Any) -> Any:
        """The variable the inner optimizer keeps state for: the scratch values of a sparse one."""
        entry = self.entries.get(key(variable)) if self.entries else None
        return variable if entry is None else entry.values

    # -- masks --------------------------------------------------------------------------------------
    def mask(self, variable: Any) -> np.ndarray | None:
        """The fixed selection of a sparse variable as a full boolean mask, or None when it is dense."""
        k = key(variable)
        if k in self.frozen:
            return np.zeros(tuple(variable.shape), bool)
        entry = self.entries.get(k)
        if entry is None:
            return None
        flat = np.zeros(int(np.prod(variable.shape)), bool)
        flat[entry.index.numpy()] = True
        return flat.reshape(tuple(variable.shape))

    def to_full(self, variable: Any, values: np.ndarray) -> np.ndarray:
        """Per-entry values of a sparse variable's K trainable entries, placed in an array shaped like it
        (0 elsewhere)."""
        entry = self.entries[key(variable)]
        flat = np.zeros(int(np.prod(variable.shape)), np.asarray(values).dtype)
        flat[entry.index.numpy()] = np.asarray(values).reshape(-1)
        return flat.reshape(tuple(variable.shape))

    def check_set(self, variable: Any, keep: np.ndarray) -> bool:
        """Refuse a changed selection; True when the variable's state is sparse (nothing else to store)."""
        current = self.mask(variable)
        if current is None:
            return False
        if not np.array_equal(np.broadcast_to(keep, current.shape), current):
            raise ValueError(
                f"MaskedOptimizer: {variable_path(variable)!r} has sparse state for a fixed selection of "
                f"{int(current.sum())} entries; a different mask needs state='dense' (or a new optimizer)"
            )
        return True

    def check_call_masks(self, variables: list[Any], masks: list[Any]) -> list[Any]:
        """Per-call masks cannot change a fixed selection: refuse one on a sparse variable."""
        for v, m in zip(variables, masks):
            k = key(v)
            if m is not None and (k in self.entries or k in self.frozen):
                raise ValueError(f"MaskedOptimizer: trainable_masks= for {variable_path(v)!r}, whose state is sparse "
                                 "(a fixed selection); pass None for it")
        return masks

    # -- the step -----------------------------------------------------------------------------------
    def gather(self, grads: list[Any], variables: list[Any]) -> tuple[list[Any], list[Any]]:
        """Swap each sparse variable for its scratch values (refilled from the variable) and gathered gradient.

        An ``IndexedSlices`` gradient (an ``Embedding``'s) stays an ``IndexedSlices``, over the selected entries
        of its touched rows: nothing the size of the variable is made (see ``_select_slices``). With ``use_ema``
        every sparse variable's scratch is refilled and written back, not only those in this step: Keras
        averages (and may overwrite) every variable it was built with.
        """
        self._pending_scatter = []
        if not (self.entries or self.frozen):
            return grads, variables
        out_g, out_v, called = [], [], set()
        for g, v in zip(grads, variables):
            k = key(v)
            if k in self.frozen:
                continue
            entry = self.entries.get(k)
            if entry is None:
                out_g.append(g)
                out_v.append(v)
                continue
            called.add(k)
            self._refill(entry)
            if isinstance(g, tf.IndexedSlices):
                select = _select_slices_static if in_xla() else _select_slices
                g = select(g, tf.convert_to_tensor(entry.index), tuple(v.shape))
            elif g is not None:
                g = tf.gather(tf.reshape(tf.convert_to_tensor(g), [-1]), tf.convert_to_tensor(entry.index))
            out_g.append(g)
            out_v.append(entry.values)
            self._pending_scatter.append(entry)
        if any(leaf.use_ema for leaf in self.wrapper._leaves()):
            for k, entry in self.entries.items():
                if k not in called:
                    self._refill(entry)
                    self._pending_scatter.append(entry)
        return out_g, out_v

    def _refill(self, entry: _Entry) -> None:
        """The scratch values <- the variable's selected entries (read from the variable alone, not all of it)."""
        if in_xla():  # XLA has no kernel for a gather from a variable: read it whole (XLA fuses the two)
            entry.values.assign(tf.gather(tf.reshape(tf.convert_to_tensor(entry.variable), [-1]), entry.index))
            return
        where = _unravel(tf.convert_to_tensor(entry.index), tuple(entry.variable.shape))
        entry.values.assign(tf.gather_nd(tf_variable(entry.variable), where))

    def scatter(self, everything: bool = False) -> None:
        """Write the updated scratch values back into their variables (``everything``: every sparse variable's)."""
        for entry in self.entries.values() if everything else getattr(self, "_pending_scatter", []):
            where = _unravel(tf.convert_to_tensor(entry.index), tuple(entry.variable.shape))
            variable = tf_variable(entry.variable)
            variable.scatter_nd_update(where, tf.convert_to_tensor(entry.values))
        self._pending_scatter = []

    # -- EMA, as keras.callbacks.SwapEMAWeights sees it ------------------------------------------------
    def ema_view(self, averages: list[Any]) -> list[Any]:
        """The inner optimizer's EMA averages aligned with the wrapper's variables, as ``SwapEMAWeights`` reads them.

        Keras' callback pairs ``optimizer._trainable_variables`` (the model's, full size) with these by position
        and swaps them with ``assign``/``assign_add``. A sparse variable's average has K entries, so it is shown
        as a new full-size variable holding what dense state would hold: the K averages at the selection, the
        variable's own bits elsewhere (a frozen entry's average is its weight). Every write to that variable is
        passed on to the K averages at once; it is rebuilt at the next read, so it costs N entries only while a
        callback holds it. A wholly frozen variable's stand-in is its own weight (its writes go nowhere).
        """
        if not (self.entries or self.frozen):
            return averages
        leaf = self.wrapper._leaves()[0]
        out = []
        with tf.init_scope():
            for v in trainable_variables(self.wrapper):
                k = key(v)
                entry = self.entries.get(k)
                if k in self.frozen:
                    out.append(tf.Variable(tf.convert_to_tensor(v), trainable=False, name="ema_view"))
                elif entry is None:
                    out.append(averages[index(leaf, v)])
                else:
                    out.append(self._full_average(entry, averages[index(leaf, entry.values)]))
        return out

    def _full_average(self, entry: _Entry, average: Any) -> tf.Variable:
        where = _unravel(tf.convert_to_tensor(entry.index), tuple(entry.variable.shape))
        full = tf.Variable(tf.tensor_scatter_nd_update(tf.convert_to_tensor(entry.variable), where,
                                                       tf.convert_to_tensor(average)), trainable=False, name="ema_view")
        for method in ("assign", "assign_add", "assign_sub"):
            plain = getattr(full, method)

            def write(*args: Any, plain: Any = plain, **kwargs: Any) -> Any:
                result = plain(*args, **kwargs)
                average.assign(tf.gather_nd(full, where))
                return result

            object.__setattr__(full, method, write)
        return full

    def optimizer_bytes(self, inner_slots: dict[str, Any], variable: Any) -> int:
        """Bytes of optimizer state for ``variable``: its slots, plus its selection and scratch when sparse."""
        total = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in inner_slots.values())
        entry = self.entries.get(key(variable))
        if entry is not None:
            total += entry.size * (4 + np.dtype(entry.values.dtype).itemsize)
        return total


def _unravel(flat: tf.Tensor, shape: tuple[int, ...]) -> tf.Tensor:
    """Flat row-major positions -> ``[K, rank]`` coordinates (``tf.unravel_index`` has no XLA kernel)."""
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    return tf.stack([(flat // stride) % dim for stride, dim in zip(strides, shape)], axis=1)



def _select_slices(g: tf.IndexedSlices, flat: tf.Tensor, shape: tuple[int, ...]) -> tf.IndexedSlices:
    """An ``IndexedSlices`` over ``shape``'s rows -> an ``IndexedSlices`` over the K selected entries (``flat``).

    Each slice gives one value per selected entry in its row (found by binary search: ``flat`` is sorted, as
    ``build`` stores it), in the slices' order, duplicates kept: the inner optimizer sees at the selected
    entries exactly the sparse gradient dense state hands it, and nothing the size of the variable is made.
    Cost: ``log K`` per slice plus the selected entries in the touched rows.
    """
    row = int(np.prod(shape[1:]))
    flat = tf.cast(flat, tf.int32)
    rows = flat // row
    touched = tf.cast(g.indices, tf.int32)
    at = tf.ragged.range(tf.searchsorted(rows, touched, side="left"), tf.searchsorted(rows, touched, side="right"))
    positions = at.flat_values
    columns = tf.gather(flat, positions) % row
    values = tf.gather_nd(tf.reshape(g.values, [-1, row]), tf.stack([tf.cast(at.value_rowids(), tf.int32), columns], 1))
    return tf.IndexedSlices(values, positions, dense_shape=tf.constant([int(flat.shape[0])], tf.int32))


def _select_slices_static(g: tf.IndexedSlices, flat: tf.Tensor, shape: tuple[int, ...]) -> tf.IndexedSlices:
    """``_select_slices`` with static shapes, for XLA: one candidate per entry of each slice (the slices' own size),
    an entry outside the selection pointing at index -1, which XLA's scatters and segment sums drop."""
    row = int(np.prod(shape[1:]))
    flat = tf.cast(flat, tf.int32)
    candidates = tf.reshape(tf.cast(g.indices, tf.int32)[:, None] * row + tf.range(row, dtype=tf.int32)[None, :], [-1])
    at = tf.minimum(tf.searchsorted(flat, candidates, out_type=tf.int32), int(flat.shape[0]) - 1)
    positions = tf.where(tf.gather(flat, at) == candidates, at, -1)
    return tf.IndexedSlices(tf.reshape(g.values, [-1]), positions,
                            dense_shape=tf.constant([int(flat.shape[0])], tf.int32))
