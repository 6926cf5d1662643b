"""``FreezeAudit``: measure, step by step, whether frozen entries moved, and by how much.

Studies use it to show drift; tests use it to prove there is none. A change is counted bit for
bit (a -0.0 that became +0.0 counts), and its size is the max |after - before| over frozen entries.

``audit = FreezeAudit([w]); with audit.step(frozen=[~keep]): opt.apply_gradients(...)``
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from freezing.selection import variable_path
from freezing.slots import slots as slots_of

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class AuditRecord:
    """One tensor's drift over one step: how many frozen entries changed and the largest change."""

    step: int
    tensor: str
    frozen: int
    changed: int
    max_abs_delta: float


def changed_bits(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Return a boolean array, True where the bits differ. ``changed_bits(np.float32([0.]), np.float32([-0.]))``"""
    before, after = np.asarray(before), np.asarray(after)
    width = _UINT[before.dtype.itemsize]
    return before.view(width) != after.view(width)


class FreezeAudit:
    """Record per step how many frozen entries of each variable (and, optionally, its slots) changed."""

    def __init__(self, variables: Sequence[Any], optimizer: Any = None):
        self.variables = list(variables)
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

    @contextlib.contextmanager
    def step(self, frozen: Sequence[Any]) -> Iterator[None]:
        """Audit the code inside; ``frozen[i]`` is True where variable i must not move. ``with audit.step([~m]): ...``"""
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
        """Total count of frozen entries that changed, over all steps and tensors. ``audit.changed == 0``"""
        return sum(r.changed for r in self.records)

    @property
    def max_abs_delta(self) -> float:
        """Largest single-step change of any frozen entry. ``audit.max_abs_delta``"""
        return max((r.max_abs_delta for r in self.records), default=0.0)

    def rows(self) -> list[dict[str, Any]]:
        """All records as dicts (step, tensor, frozen, changed, max_abs_delta): ``pandas.DataFrame(audit.rows())``."""
        return [asdict(r) for r in self.records]


def frozen_change(before: Any, after: Any, frozen: Any) -> tuple[Any, Any, Any]:
    """In-graph drift of frozen entries: (changed count, max |delta|, sum |delta|). ``frozen_change(w0, w, ~keep)``

    The ``tf.function`` counterpart of one ``FreezeAudit`` record, for training loops that audit every step.
    """
    frozen = tf.broadcast_to(tf.cast(frozen, tf.bool), tf.shape(after))
    width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[after.dtype.size]
    changed = tf.not_equal(tf.bitcast(before, width), tf.bitcast(after, width)) & frozen
    delta = tf.where(frozen, tf.abs(after - before), tf.zeros_like(after))
    return tf.reduce_sum(tf.cast(changed, tf.int64)), tf.reduce_max(delta), tf.reduce_sum(tf.cast(delta, tf.float64))
