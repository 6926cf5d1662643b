"""What kind of thing each value of a ``metrics.json`` is, as its study declares it: how a rerun is compared.

A study passes ``kinds`` to ``reporting.save_metrics(metrics, out, kinds=...)`` next to where it builds
``metrics``: an ordered mapping of path patterns to kinds, stored in ``metrics.json`` under ``"kinds"``. A path
names a value the way ``REPRODUCTION.md`` does: dict keys joined by ``/``, list items as ``[i]``
(``"faults/faults[2]/error"``). In a pattern, ``*`` matches within one key (no ``/``) and ``**`` matches anything,
``/`` included (keys such as ``"TF1 graph/one sess.run"`` hold a slash). A value's kind is that of the first
pattern matching its own path, else the first matching its nearest container (``"config"`` makes every value
under ``config`` a constant), else ``DEFAULT``. Nothing is inferred from key names.

The kinds, and how ``study.report.reproduction`` compares a rerun with the committed run:

* ``timing``: a duration or a rate (ms, s, steps per second): compared as a ratio rerun / committed, never as bits;
* ``timing_ratio``: a ratio of two timings, or a share of CPU time: also compared as a ratio rerun / committed;
* ``timing_spread``: the spread (std, min, max over seeds or rounds) of a timing: not compared (it is not a timing);
* ``timing_verdict``: a yes/no or label computed from timings: compared exactly, but a change is reported with the
  timings ("timings differ"), not as a difference of results;
* ``constant``: set by the code or the configuration (parameters, an assumed link speed, sizes): exact;
* ``count``: a whole number counted by the run: exact;
* ``accuracy`` and ``value``: a measured number: bit-identical, within ``RTOL``, or differing;
* ``sample``: an unordered collection (a list whose order carries no meaning): compared as a multiset, and where it
  differs, by its distribution (counts of each value, or mean and range);
* ``message``: text that may carry volatile parts (ports, addresses, process ids, temporary paths), compared after
  ``normalise_message`` replaces them;
* ``text``: restates other values as text (a headline): not compared.

``kind_of_leaves({"a": {"t_ms": 3.0}, "n": 2}, {"a/t_ms": "timing", "n": "count"})`` gives
``{"a/t_ms": (3.0, "timing"), "n": (2, "count")}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

KINDS = ("timing", "timing_ratio", "timing_spread", "timing_verdict", "constant", "count", "accuracy", "value",
         "sample", "message", "text")
"""Every kind a study may declare (see the module docstring)."""
TIMINGS = ("timing", "timing_ratio")
"""Kinds compared as a ratio rerun / committed."""
DEFAULT = "value"
"""The kind of a value no pattern matches: compared as a measured number (so an undeclared timing shows up as a
difference, never hides one)."""
KEY = "kinds"
"""Where ``save_metrics`` stores the declaration inside ``metrics.json``."""

_VOLATILE = [
    (re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?"), "<address>"),  # 127.0.0.1:40123
    (re.compile(r"\[::1?\](?::\d+)?|\blocalhost:\d+"), "<address>"),
    (re.compile(r"(?<=:)\d{4,5}\b"), "<port>"),  # host:40123
    (re.compile(r"\b(?:port|pid)[ =]\d+", re.IGNORECASE), lambda m: m.group(0).split()[0].split("=")[0] + " <n>"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "<id>"),
    (re.compile(r"/tmp/[^\s'\",)]+"), "<tmp>"),
]


def normalise_message(text: str) -> str:
    """``text`` with its volatile parts replaced (addresses and ports, pids, object ids, temporary paths).

    >>> normalise_message("UnavailableError: failed to connect to all addresses; last error: ipv4:127.0.0.1:40123")
    'UnavailableError: failed to connect to all addresses; last error: ipv4:<address>'
    """
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*)", pattern)
    body = "".join(".*" if p == "**" else "[^/]*" if p == "*" else re.escape(p) for p in parts)
    return re.compile(body + r"\Z")


def check(kinds: Mapping[str, str]) -> dict[str, str]:
    """``kinds`` as a plain dict, or one ``ValueError`` naming every entry that is not a pattern and a known kind."""
    if not isinstance(kinds, Mapping):
        raise ValueError(f"kinds must map path patterns to kinds; got {type(kinds).__name__}")
    bad = [f"{p!r}: {k!r}" for p, k in kinds.items() if not isinstance(p, str) or not p or k not in KINDS]
    if bad:
        raise ValueError(f"kinds: {', '.join(bad)}: each entry must be a non-empty path pattern mapped to one of "
                         f"{', '.join(KINDS)}")
    return dict(kinds)


def match(path: str, kinds: Mapping[str, str]) -> str | None:
    """The kind of the first pattern matching ``path`` exactly, or None.

    >>> match("fetch_costs/TF1 graph/one run/ms", {"fetch_costs/**/ms": "timing"})
    'timing'
    """
    for pattern, kind in kinds.items():
        if _regex(pattern).match(path):
            return kind
    return None


def kind_of_leaves(value: Any, kinds: Mapping[str, str], path: str = "",
                   inherited: str | None = None) -> dict[str, tuple[Any, str]]:
    """Every value to compare: path -> (value, kind). A list declared ``sample`` is one value (the whole list).

    >>> kind_of_leaves({"s": [1, 0], "c": {"n": 3}}, {"s": "sample", "c": "constant"})
    {'s': ([1, 0], 'sample'), 'c/n': (3, 'constant')}
    """
    own = match(path, kinds) if path else None
    kind = own or inherited
    if isinstance(value, dict):
        found: dict[str, tuple[Any, str]] = {}
        for k, v in value.items():
            found.update(kind_of_leaves(v, kinds, f"{path}/{k}" if path else str(k), kind))
        return found
    if isinstance(value, list) and kind != "sample":
        found = {}
        for i, v in enumerate(value):
            found.update(kind_of_leaves(v, kinds, f"{path}[{i}]", kind))
        return found
    return {path: (value, kind or DEFAULT)}
