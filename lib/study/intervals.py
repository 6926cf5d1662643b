"""Confidence intervals over seeds: the one rule every study uses to say whether two methods differ.

Two methods run on the same seeds are compared by their paired differences (one per seed), through the Student-t
interval of the mean difference at ``CONFIDENCE``; a difference counts only where that interval leaves out zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CONFIDENCE = 0.95
"""The level of every confidence interval the studies report (Student's t over seeds, paired by seed)."""


def t_interval(values: Any) -> tuple[float, float, float]:
    """Mean and the ``CONFIDENCE`` Student-t interval of the mean of ``values`` (one per seed): (mean, low, high).

    NaN bounds for fewer than two values.

    >>> mean, low, high = t_interval([0.1, 0.2, 0.3])
    >>> round(mean, 3), round(low, 3), round(high, 3)
    (0.2, -0.048, 0.448)
    """
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(np.mean(x)) if len(x) else float("nan")
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))
    return mean, mean - half, mean + half

