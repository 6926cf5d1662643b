"""Confidence intervals over seeds: the one rule every study uses to say whether two methods differ.

Two methods run on the same seeds are compared by their paired differences (one per seed), through the Student-t
interval of the mean difference at ``CONFIDENCE``; a difference counts only where that interval leaves out zero.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from study.report.prose import ceil, floor, printed_value

CONFIDENCE = 0.95
"""The level of every confidence interval the studies report (Student's t over seeds, paired by seed)."""
DECIMALS = 3
"""Decimals an interval bound is printed with, unless a study says otherwise; a verdict is read off the bounds as
printed (``interval_sign``)."""


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


def interval_sign(low: float, high: float, decimals: int = DECIMALS) -> str:
    """The verdict of a paired difference, read off its interval as the report prints it: each bound to ``decimals``
    decimals, rounded outward (``low`` toward -inf, ``high`` toward +inf, ``prose.floor``/``ceil``). ``"+"`` when
    the printed low end is above zero, ``"-"`` when the printed high end is below zero, ``"0"`` otherwise (the
    interval holds zero: the run cannot tell), also where a bound is NaN (not measured). So an interval that only
    leaves out zero in a decimal the report does not print counts as holding zero, and no verdict contradicts the
    interval printed beside it.

    >>> interval_sign(-0.039, -0.00017), interval_sign(-0.039, -0.0011), interval_sign(0.0004, 0.02)
    ('0', '-', '0')
    >>> interval_sign(0.0011, 0.02), interval_sign(float("nan"), float("nan"))
    ('+', '0')
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return "0"
    shown_low = printed_value(floor(low, "signed", 2, decimals))
    shown_high = printed_value(ceil(high, "signed", 2, decimals))
    return "+" if shown_low > 0 else "-" if shown_high < 0 else "0"


def bound_text(x: float, rounding: str, decimals: int = DECIMALS) -> str:
    """An interval bound as the report prints it: signed, ``decimals`` decimals, rounded outward (``"floor"``
    for a low end, ``"ceil"`` for a high end); one that rounds to zero prints unsigned.

    >>> bound_text(-0.023249, "floor"), bound_text(-0.283961, "ceil"), bound_text(-0.00017, "ceil")
    ('−0.024', '−0.283', '0.000')
    """
    text = (floor if rounding == "floor" else ceil)(x, "signed", 2, decimals)
    return text[1:] if printed_value(text) == 0 else text
