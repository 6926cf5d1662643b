"""Comparing two runs' metrics.json, timings aside: the helpers the rerun check uses, tested.

Timings are the one thing allowed to differ. Each study declares which values are timings where it writes its
metrics (``metrics.json``'s ``"kinds"``, ``study.report.kinds``, which ``REPRODUCTION.md`` uses too); every other
value, nested or not, must be equal after a JSON round trip, which for floats means bit for bit. The real rerun check is
in ``test_pipeline_reports``: the rerun after an interrupted run of 01 must equal the test session's uninterrupted
run, timings aside, bit for bit.
"""

from __future__ import annotations

from typing import Any

from study.report import kinds

TIMING_KINDS = ("timing", "timing_ratio", "timing_spread", "timing_verdict")


def without_timings(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` (a ``metrics.json``) as path -> value, every value its ``"kinds"`` call a timing left out."""
    declared = metrics.get(kinds.KEY) or {}
    body = {k: v for k, v in metrics.items() if k not in (kinds.KEY, "headline")}
    return {p: v for p, (v, kind) in kinds.kind_of_leaves(body, declared).items() if kind not in TIMING_KINDS}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ: ``["finetune/adam/gate/acc_new_mean: 0.94 != 0.95", ...]``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in the {'first' if k in a else 'second'} run" for k in sorted(set(a) ^ set(b))]
        for k in a:
            if k in b:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]


def leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(leaves(v) for v in value)
    return 1


def test_declared_timings_are_left_out_and_nothing_else():
    metrics = {"a": 1, "duration_s": 3, "b": [{"step_time_ms": 2, "c": 0.1}], "acc_std": 0.2, "headline": {"x": "1"},
               "kinds": {"duration_s": "timing", "b[*]/step_time_ms": "timing"}}
    assert without_timings(metrics) == {"a": 1, "b[0]/c": 0.1, "acc_std": 0.2}
    assert differences({"a": [1.0, 2.0], "b": 1}, {"a": [1.0, 2.0000000000000004], "c": 1}) == [
        "/b: only in the first run", "/c: only in the second run", "/a[1]: 2.0 != 2.0000000000000004"]
