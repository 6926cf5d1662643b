"""``WriteTuning``: where a ``MaskedOptimizer`` switches between its (equally exact) ways of writing.

Every setting picks between constructions that give the same bits; they differ only in speed. The defaults
are what ``make bench`` measured best on a 2-core CPU. A setting is per optimizer (``opt.tuning``), read
when its step is traced: set it before the first step, or before ``model.compile`` builds a new step.

>>> import freezing
>>> opt = freezing.MaskedOptimizer("adam")
>>> opt.tuning
WriteTuning(dispatch_above=16384, fuse_above=131072, restore_in_graphs=False)
>>> opt.tuning = freezing.WriteTuning(fuse_above=2**40)  # never fuse a write into one XLA-compiled pass
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WriteTuning:
    """Thresholds of the write path, in entries of one variable; none of them changes a bit of any result.

    Args:
        dispatch_above: in a graph, a variable with at least this many entries chooses its path per step
            (no mask: Keras' own update; wholly frozen: none; else the masked update) in a ``switch_case``;
            a smaller one always takes the masked update, whose selects cost less than the conditional.
        fuse_above: in a graph that XLA does not compile, a masked dense write to a variable with at least
            this many entries runs as one XLA-compiled select-and-assign instead of TensorFlow's kernels.
        restore_in_graphs: also in graphs (not only in eager steps), snapshot the masked variables and their
            state, run Keras' update untouched and select the frozen bits back, instead of the guarded write.

    Raises:
        ValueError: a threshold that is not a positive ``int``, or a ``restore_in_graphs`` that is not a bool.

    >>> WriteTuning(dispatch_above=0)
    Traceback (most recent call last):
    ...
    ValueError: WriteTuning: dispatch_above must be an int >= 1; got 0
    """

    dispatch_above: int = 1 << 14
    fuse_above: int = 1 << 17
    restore_in_graphs: bool = False

    def __post_init__(self) -> None:
        for name in ("dispatch_above", "fuse_above"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WriteTuning: {name} must be an int >= 1; got {value!r}")
        if not isinstance(self.restore_in_graphs, bool):
            raise ValueError(f"WriteTuning: restore_in_graphs must be True or False; got {self.restore_in_graphs!r}")
