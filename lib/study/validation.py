"""The study's parameter checks: they fail early with one message naming what is wrong and what is allowed.

They belong to the study (its configs and its notebooks' papermill parameters), not to the ``freezing``
library. Every study validates its configuration with these before any training starts, so a typo in a
papermill parameter or a YAML file stops the run with a readable ``ValueError``. Each check returns
the value it accepted, so it can be used inline: ``steps = check_positive_int("steps", steps)``.
Booleans are not numbers here (``True`` is rejected where an integer is asked for), and neither are
NumPy scalars other than ``np.float64`` (a subclass of ``float``): convert with ``int()`` or
``float()`` first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise naming every allowed value.

    Args:
        name: the parameter's name, which starts the error message.
        value: the value to check.
        allowed: the allowed values (a list, a tuple, or the keys of a dict).

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``"<name>: got <value>; allowed: <each allowed value>"``.

    Example:
        >>> check_choice("policy", "hold", ["hold", "reset"])
        'hold'
        >>> check_choice("policy", "hodl", ["hold", "reset"])
        Traceback (most recent call last):
        ...
        ValueError: policy: got 'hodl'; allowed: 'hold', 'reset'
    """
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name}: got {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def check_choices(name: str, values: Any, allowed: Iterable[str]) -> list[str]:
    """Return ``values`` as a list if it is a non-empty list of allowed names.

    A single string is rejected rather than read as a list of characters, which is the usual
    mistake when a YAML file says ``optimizers: adam`` instead of ``optimizers: [adam]``.

    Args:
        name: the parameter's name, which starts the error message.
        values: a non-empty list or tuple of names.
        allowed: the allowed names.

    Returns:
        ``values`` as a new list.

    Raises:
        ValueError: if ``values`` is a string, not a sequence, or empty, or if any element is not
            allowed (the message of ``check_choice``).

    Example:
        >>> check_choices("optimizers", ("sgd", "adam"), ["sgd", "adam", "rmsprop"])
        ['sgd', 'adam']
        >>> check_choices("optimizers", "adam", ["sgd", "adam"])
        Traceback (most recent call last):
        ...
        ValueError: optimizers: expected a non-empty list of names from ['sgd', 'adam']; got 'adam'
    """
    allowed = list(allowed)
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}: expected a non-empty list of names from {allowed}; got {values!r}")
    for v in values:
        check_choice(name, v, allowed)
    return list(values)


def check_int_list(name: str, values: Any, minimum: int | None = None) -> list[int]:
    """Return ``values`` as a list if it is a non-empty list of integers, each ``>= minimum``.

    Args:
        name: the parameter's name, which starts the error message.
        values: a non-empty list or tuple of Python ``int`` (booleans are rejected).
        minimum: the smallest allowed value, or None for no bound.

    Returns:
        ``values`` as a new list.

    Raises:
        ValueError: if ``values`` is not a non-empty sequence of integers, or one is below ``minimum``.

    Example:
        >>> check_int_list("seeds", (0, 1, 2), minimum=0)
        [0, 1, 2]
        >>> check_int_list("seeds", [0, "1"])
        Traceback (most recent call last):
        ...
        ValueError: seeds: expected a non-empty list of integers, like [0, 1, 2]; got [0, '1']
        >>> check_int_list("seeds", [3, -1], minimum=0)
        Traceback (most recent call last):
        ...
        ValueError: seeds: every value must be >= 0; got [3, -1]
    """
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
    """Return ``value`` if it is an integer >= 1 (not a bool, not a float like ``10.0``).

    Args:
        name: the parameter's name, which starts the error message.
        value: the value to check.

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``"<name>: expected an integer >= 1; got <value>"``.

    Example:
        >>> check_positive_int("steps", 10)
        10
        >>> check_positive_int("steps", 0)
        Traceback (most recent call last):
        ...
        ValueError: steps: expected an integer >= 1; got 0
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1; got {value!r}")
    return value


def check_range(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """Return ``value`` as a float if it lies in ``[low, high]``, or in ``(low, high]`` with ``low_open``.

    NaN lies in no interval and is rejected.

    Args:
        name: the parameter's name, which starts the error message.
        value: an ``int`` or ``float`` (booleans are rejected).
        low: the lower bound, included unless ``low_open``.
        high: the upper bound, always included.
        low_open: exclude ``low`` itself (for a learning rate, which must be > 0).

    Returns:
        ``float(value)``.

    Raises:
        ValueError: ``"<name>: expected a number in [low, high]; got <value>"``, with ``(`` for an
            open lower bound.

    Example:
        >>> check_range("p", 1, 0, 1)
        1.0
        >>> check_range("learning_rate", 0, 0.0, 10.0, low_open=True)
        Traceback (most recent call last):
        ...
        ValueError: learning_rate: expected a number in (0.0, 10.0]; got 0
        >>> check_range("p", float("nan"), 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: p: expected a number in [0, 1]; got nan
    """
    message = f"{name}: expected a number in {'(' if low_open else '['}{low}, {high}]; got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(message)
    inside = (low < value <= high) if low_open else (low <= value <= high)  # False for NaN
    if not inside:
        raise ValueError(message)
    return float(value)
