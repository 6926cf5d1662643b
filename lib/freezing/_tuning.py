"""``WriteTuning``: where a ``MaskedOptimizer`` switches between its (equally exact) ways of writing.

Not API: every setting picks between constructions that give the same bits; they differ only in speed, and only
``make bench`` (its ``hold_unfused`` and ``frozen_half_undispatched`` rows) and the tests change them. The defaults
are what ``make bench`` measured best on a 2-core CPU. A setting is per optimizer, read when its step is traced:
set it before the first step, or before ``model.compile`` builds a new step.

>>> import freezing
>>> opt = freezing.MaskedOptimizer("adam")
>>> tune(opt, fuse_above=2**40)  # never fuse a write into one XLA-compiled pass
WriteTuning(dispatch_above=16384, fuse_above=1099511627776)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class WriteTuning:
    """Thresholds of the write path, in entries of one variable; none of them changes a bit of any result.

    Args:
        dispatch_above: in a graph XLA does not compile, a variable with at least this many entries chooses its
            path per step (no mask: Keras' own update; wholly frozen: none; else the masked update) in a
            ``switch_case``; a smaller one always takes the masked update, whose selects cost less than the
            conditional.
        fuse_above: in a graph that XLA does not compile, a masked dense write to a variable with at least
            this many entries runs as one XLA-compiled select-and-assign instead of TensorFlow's kernels.

    Raises:
        ValueError: a threshold that is not a positive ``int``.

    >>> WriteTuning(dispatch_above=0)
    Traceback (most recent call last):
    ...
    ValueError: WriteTuning: dispatch_above must be an int >= 1; got 0
    """

    dispatch_above: int = 1 << 14
    fuse_above: int = 1 << 17

    def __post_init__(self) -> None:
        for name in ("dispatch_above", "fuse_above"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WriteTuning: {name} must be an int >= 1; got {value!r}")


def tune(optimizer: Any, **fields: int) -> WriteTuning:
    """Set some of a ``MaskedOptimizer``'s thresholds (the others keep their values); returns them all.

    Raises:
        ValueError: an unknown field, or a value ``WriteTuning`` refuses.
    """
    unknown = sorted(set(fields) - {"dispatch_above", "fuse_above"})
    if unknown:
        raise ValueError(f"tune: unknown fields {unknown}; allowed: dispatch_above, fuse_above")
    guards = optimizer._guards
    guards.tuning = replace(guards.tuning, **fields)
    return guards.tuning
