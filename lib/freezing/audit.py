"""``FreezeAudit``: measure, step by step, whether frozen entries moved, and by how much.

Studies use it to show drift; tests use it to prove there is none. A change is counted bit for
bit (a -0.0 that became +0.0 counts, a NaN that stayed the same NaN does not), and its size is
the max |after - before| over frozen entries.

``audit = FreezeAudit([w], optimizer=opt)``, then for each step
``with audit.step(frozen=[~keep]): opt.apply_gradients(...)``; ``audit.changed == 0`` proves
that nothing frozen moved. ``FreezeAudit`` reads values with ``.numpy()`` (eager mode);
``frozen_change`` is the in-graph counterpart for ``tf.function`` loops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing.selection import variable_path
from freezing.slots import slots as slots_of

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class AuditRecord:
    """One tensor's drift over one step: how many frozen entries changed and the largest change.

    Args:
        step: the step index, counted from 0 by ``FreezeAudit.step``.
        tensor: the variable's path, or ``"<path>:<slot name>"`` for an optimizer slot.
        frozen: how many entries were frozen.
        changed: how many frozen entries changed, bit for bit.
        max_abs_delta: the largest ``|after - before|`` over frozen entries (0.0 if none is frozen).

    Example:
        >>> record = AuditRecord(step=0, tensor="w", frozen=2, changed=1, max_abs_delta=0.5)
        >>> record.changed, record.max_abs_delta
        (1, 0.5)
    """

    step: int
    tensor: str
    frozen: int
    changed: int
    max_abs_delta: float


def changed_bits(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Return a boolean array, True where the bits of ``before`` and ``after`` differ.

    Unlike ``before != after``, this sees a 0.0 that became -0.0 and does not count a NaN that
    stayed the same NaN.

    Args:
        before: an array whose items are 2, 4 or 8 bytes wide (float16, float32, float64, ints).
        after: an array of the same dtype, broadcastable against ``before``.

    Returns:
        A boolean array of the broadcast shape.

    Raises:
        KeyError: for dtypes whose items are 1 byte wide (bool, int8, uint8) or wider than 8 bytes.

    Example:
        >>> import numpy as np
        >>> before = np.float32([0.0, 1.0, np.nan, 2.0])
        >>> after = np.float32([-0.0, 1.0, np.nan, 2.5])
        >>> changed_bits(before, after).tolist()
        [True, False, False, True]
        >>> (before != after).tolist()
        [False, False, True, True]
    """
    before, after = np.asarray(before), np.asarray(after)
    width = _UINT[before.dtype.itemsize]
    return before.view(width) != after.view(width)


class FreezeAudit:
    """Record per step how many frozen entries of each variable (and, optionally, its slots) changed.

    Each ``with audit.step(frozen=...)`` adds one ``AuditRecord`` per variable and, when an
    optimizer is given, one per slot of the variable's shape (Adam's ``momentum`` and ``velocity``,
    named ``"<path>:<slot>"``). Slots are audited only once the optimizer is built: on a step
    that builds it, only the variables are.

    Args:
        variables: the variables to watch; a ``keras.layers.Layer`` stands for its trainable weights.
        optimizer: an optimizer whose slots of these variables are watched too (see ``slots``);
            None to watch only the variables.

    Attributes:
        records: the ``AuditRecord`` list, in the order recorded.

    Example:
        The naive way to freeze with Adam, a zero gradient, still moves the frozen entry,
        because Adam's moments carry over from the step before:

        >>> import keras
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> from freezing.gates import gate
        >>> w = tf.Variable([0.0, 0.0], name="w")
        >>> adam = keras.optimizers.Adam(0.1)
        >>> adam.build([w])
        >>> audit = FreezeAudit([w], optimizer=adam)
        >>> for keep in ([1.0, 1.0], [0.0, 1.0]):
        ...     with tf.GradientTape() as tape:
        ...         loss = tf.reduce_sum(gate(w, keep))
        ...     grad = tape.gradient(loss, w)
        ...     with audit.step(frozen=[np.array(keep) == 0]):
        ...         _ = adam.apply_gradients([(grad, w)])
        >>> [(r.step, r.tensor, r.frozen, r.changed) for r in audit.records if r.step == 1]
        [(1, 'w', 1, 1), (1, 'w:momentum', 1, 1), (1, 'w:velocity', 1, 1)]
        >>> audit.changed, round(audit.max_abs_delta, 4)
        (3, 0.067)
    """

    def __init__(self, variables: Sequence[Any], optimizer: Any = None):
        self.variables = [w for v in variables
                          for w in (v.trainable_weights if isinstance(v, keras.layers.Layer) else [v])]
        self.optimizer = optimizer
        self.records: list[AuditRecord] = []
        self._steps = 0

    def _tensors(self) -> list[tuple[str, int, Any]]:
        out = []
        for i, v in enumerate(self.variables):
            out.append((variable_path(v), i, v))
            if self.optimizer is not None and getattr(self.optimizer, "built", True):
                for name, slot in slots_of(self.optimizer, v).items():
                    if tuple(slot.shape) == tuple(v.shape):
                        out.append((f"{variable_path(v)}:{name}", i, slot))
        return out

    def _stored_frozen(self) -> list[np.ndarray]:
        """What the ``MaskedOptimizer``'s stored masks freeze, one array per variable (``step()`` with no masks)."""
        from freezing._wrappers import wrapper_chain
        from freezing.masked_optimizer import MaskedOptimizer  # masked_optimizer imports this module's neighbours

        masked = next((o for o in wrapper_chain(self.optimizer) if isinstance(o, MaskedOptimizer)), None) \
            if self.optimizer is not None else None
        if masked is None:
            raise ValueError("FreezeAudit.step: with no frozen masks, the audit reads a MaskedOptimizer's stored "
                             f"masks, and its optimizer is {type(self.optimizer).__name__}; pass frozen=[...] "
                             "(True = must not move), or FreezeAudit(variables, optimizer=masked_optimizer)")
        out = []
        for v in self.variables:
            keep = masked.get_mask(v)
            out.append(np.zeros(tuple(v.shape), bool) if keep is None else ~np.asarray(keep, bool))
        return out

    @contextlib.contextmanager
    def step(self, frozen: Sequence[Any] | None = None) -> Iterator[None]:
        """Audit the ``with`` block as one step; ``frozen[i]`` is True where variable i must not move.

        With no ``frozen``, the entries a ``MaskedOptimizer`` (the audit's ``optimizer``) holds frozen when the
        block starts: its stored masks, read the way ``set_mask`` means them (True = trains).

        Values are copied on entry and compared on exit; if the block raises, nothing is recorded.

        Args:
            frozen: one boolean mask per variable, each broadcastable to the variable's shape
                (a scalar True freezes the whole variable, False none of it); None (the default) reads
                them off the ``MaskedOptimizer``'s stored masks.

        Returns:
            A context manager; the records are added to ``records`` when the block exits.

        Raises:
            ValueError: if ``frozen`` does not have one mask per variable.

        Example:
            >>> import tensorflow as tf
            >>> w = tf.Variable([1.0, 2.0, 3.0], name="w")
            >>> audit = FreezeAudit([w])
            >>> with audit.step(frozen=[[True, True, False]]):
            ...     _ = w.assign_sub([0.0, 0.5, 0.5])
            >>> audit.records
            [AuditRecord(step=0, tensor='w', frozen=2, changed=1, max_abs_delta=0.5)]

            With a ``MaskedOptimizer``, the frozen entries are its stored masks:

            >>> import keras; from freezing import MaskedOptimizer
            >>> layer = keras.layers.Dense(2, name="d"); layer.build((None, 3))
            >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.1)); opt.set_mask(layer, [True, False])
            >>> audit = FreezeAudit([layer], optimizer=opt)
            >>> with audit.step():
            ...     _ = opt.apply_gradients([(tf.ones_like(w), w) for w in layer.trainable_weights])
            >>> [(r.tensor, r.frozen, r.changed) for r in audit.records]
            [('d/kernel', 3, 0), ('d/bias', 1, 0)]
        """
        if frozen is None:
            frozen = self._stored_frozen()
        if len(frozen) != len(self.variables):
            raise ValueError(f"FreezeAudit.step: got {len(frozen)} frozen masks for {len(self.variables)} variables")
        tensors = self._tensors()
        before = [np.array(t.numpy(), copy=True) for _, _, t in tensors]
        yield
        for (name, i, t), old in zip(tensors, before):
            where = np.broadcast_to(np.asarray(frozen[i], dtype=bool), old.shape)
            new = t.numpy()
            changed = changed_bits(old, new) & where
            delta = np.abs(new.astype(np.float64) - old.astype(np.float64))[where]
            self.records.append(
                AuditRecord(self._steps, name, int(where.sum()), int(changed.sum()),
                            float(np.nanmax(delta)) if delta.size else 0.0)
            )
        self._steps += 1

    @property
    def changed(self) -> int:
        """Total count of frozen entries that changed, over all steps and tensors (0: nothing frozen moved).

        Returns:
            The sum of ``changed`` over ``records``.

        Example:
            >>> import tensorflow as tf
            >>> w = tf.Variable([1.0, 2.0], name="w")
            >>> audit = FreezeAudit([w])
            >>> with audit.step(frozen=[[True, False]]):
            ...     _ = w.assign([1.0, 5.0])
            >>> audit.changed
            0
        """
        return sum(r.changed for r in self.records)

    @property
    def max_abs_delta(self) -> float:
        """Largest single-step change of any frozen entry, over all steps and tensors.

        Returns:
            The largest ``max_abs_delta`` of ``records``, or 0.0 before any step.

        Example:
            >>> import tensorflow as tf
            >>> w = tf.Variable([1.0, 2.0], name="w")
            >>> audit = FreezeAudit([w])
            >>> with audit.step(frozen=[True]):
            ...     _ = w.assign([1.25, 3.0])
            >>> audit.max_abs_delta
            1.0
        """
        return max((r.max_abs_delta for r in self.records), default=0.0)

    def rows(self) -> list[dict[str, Any]]:
        """Return all records as dicts, ready for a table (``pandas.DataFrame(audit.rows())``).

        Returns:
            One dict per record with keys ``step``, ``tensor``, ``frozen``, ``changed`` and
            ``max_abs_delta``.

        Example:
            >>> import tensorflow as tf
            >>> w = tf.Variable([1.0, 2.0], name="w")
            >>> audit = FreezeAudit([w])
            >>> with audit.step(frozen=[[True, False]]):
            ...     _ = w.assign([-1.0, 2.0])
            >>> audit.rows()
            [{'step': 0, 'tensor': 'w', 'frozen': 1, 'changed': 1, 'max_abs_delta': 2.0}]
        """
        return [asdict(r) for r in self.records]


def frozen_change(before: Any, after: Any, frozen: Any) -> tuple[Any, Any, Any]:
    """Return the in-graph drift of frozen entries: (changed count, max |delta|, sum |delta|).

    The ``tf.function`` counterpart of one ``FreezeAudit`` record, for training loops that audit
    every step: ``frozen_change(w0, w, ~keep)``. Changes are counted bit for bit, as
    ``changed_bits`` does.

    Args:
        before: the tensor's value before the step.
        after: its value after the step, same dtype and shape; 2, 4 or 8 bytes per item.
        frozen: boolean mask, True where the entry must not move; broadcast to ``after``'s shape.

    Returns:
        ``(changed, max_abs_delta, sum_abs_delta)``: an int64 count of frozen entries whose bits
        changed, the largest ``|after - before|`` over frozen entries (0 when none is frozen or
        moved), in ``after``'s dtype, and the sum of those, in float64.

    Raises:
        KeyError: for dtypes whose items are not 2, 4 or 8 bytes wide.

    Example:
        >>> import tensorflow as tf
        >>> before = tf.constant([1.0, 2.0, 3.0])
        >>> after = tf.constant([1.5, 2.0, 4.0])
        >>> changed, max_delta, sum_delta = frozen_change(before, after, [True, True, False])
        >>> int(changed), float(max_delta), float(sum_delta)
        (1, 0.5, 0.5)
    """
    frozen = tf.broadcast_to(tf.cast(frozen, tf.bool), tf.shape(after))
    width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[after.dtype.size]
    changed = tf.not_equal(tf.bitcast(before, width), tf.bitcast(after, width)) & frozen
    delta = tf.where(frozen, tf.abs(after - before), tf.zeros_like(after))
    return tf.reduce_sum(tf.cast(changed, tf.int64)), tf.reduce_max(delta), tf.reduce_sum(tf.cast(delta, tf.float64))
