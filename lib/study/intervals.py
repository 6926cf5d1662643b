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


def sign_test(higher: int, lower: int) -> float:
    """Two-sided sign test: the chance of a split at least this uneven between ``higher`` and ``lower`` paired
    differences (ties left out) if either side were equally likely. 1.0 with no untied pair.

    >>> round(sign_test(9, 0), 4), sign_test(2, 2), sign_test(0, 0)
    (0.0039, 1.0, 1.0)
    """
    from scipy import stats

    n = int(higher) + int(lower)
    return 1.0 if n == 0 else float(stats.binomtest(int(higher), n, 0.5).pvalue)
