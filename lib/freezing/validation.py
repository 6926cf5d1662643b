"""Parameter checks that fail early with one message naming what is wrong and what is allowed.

Every study validates its configuration with these before any training starts, so a typo in a
papermill parameter or a YAML file stops the run with a readable ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``. ``check_choice("policy", "hold", ["hold"])``"""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name}: got {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def check_choices(name: str, values: Any, allowed: Iterable[str]) -> list[str]:
    """Return ``values`` as a list if it is a non-empty list of allowed names. ``check_choices("o", ["sgd"], ["sgd"])``"""
    allowed = list(allowed)
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}: expected a non-empty list of names from {allowed}; got {values!r}")
    for v in values:
        check_choice(name, v, allowed)
    return list(values)


def check_int_list(name: str, values: Any, minimum: int | None = None) -> list[int]:
    """Return ``values`` if it is a non-empty list of integers. ``check_int_list("seeds", [0, 1])``"""
    ok = (
        isinstance(values, Sequence)
        and not isinstance(values, str)
        and len(values) > 0
        and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    )
    if not ok:
        raise ValueError(f"{name}: expected a non-empty list of integers, like [0, 1, 2]; got {values!r}")
    if minimum is not None and min(values) < minimum:
        raise ValueError(f"{name}: every value must be >= {minimum}; got {values!r}")
    return list(values)


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an integer >= 1. ``check_positive_int("steps", 10)``"""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1; got {value!r}")
    return value


def check_range(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """Return ``value`` as float if it lies in [low, high] (or (low, high]). ``check_range("p", 0.5, 0, 1)``"""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number in {'(' if low_open else '['}{low}, {high}]; got {value!r}")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        raise ValueError(f"{name}: expected a number in {'(' if low_open else '['}{low}, {high}]; got {value!r}")
    return float(value)
