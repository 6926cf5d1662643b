"""Argument checks that fail early with one message naming what is wrong and what is allowed (no dependencies).

Each returns the value it accepted; booleans are not numbers here. ``check_positive_int("steps", 10)``
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``, else ``ValueError: <name>: got <value>; allowed: <each>``.

    >>> check_choice("policy", "hold", ["hold", "reset"])
    'hold'
    """
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name}: got {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def check_positive_int(name: str, value: Any) -> int:
    """``value`` if it is an integer >= 1 (not a bool, not ``10.0``), else a ``ValueError`` saying so.

    >>> check_positive_int("steps", 0)
    Traceback (most recent call last):
    ...
    ValueError: steps: expected an integer >= 1; got 0
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1; got {value!r}")
    return value


def check_range(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """``float(value)`` if it lies in ``[low, high]`` (``(low, high]`` with ``low_open``; NaN in none), else a
    ``ValueError`` naming the interval.

    >>> check_range("learning_rate", 0, 0.0, 10.0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: learning_rate: expected a number in (0.0, 10.0]; got 0
    """
    message = f"{name}: expected a number in {'(' if low_open else '['}{low}, {high}]; got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(message)
    if not ((low < value <= high) if low_open else (low <= value <= high)):
        raise ValueError(message)
    return float(value)
