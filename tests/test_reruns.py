"""Comparing two runs' metrics.json, timings aside: the helpers the rerun check uses, tested.

Timings are the one thing allowed to differ. They live under keys whose names say so
(``study.report.reproduction.is_timing``, which ``REPRODUCTION.md`` uses too); every other value, nested or not,
must be equal after a JSON round trip, which for floats means bit for bit. The real rerun check is in
``test_pipeline_reports``: the rerun after an interrupted run of 01 must equal the test session's uninterrupted
run, timings aside, bit for bit.
"""

from __future__ import annotations

from typing import Any

from study.report.reproduction import is_timing as is_timing_key


def without_timings(value: Any) -> Any:
    """``value`` with every dict entry whose key names a timing removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not is_timing_key(k)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


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


def test_timing_keys_are_recognised_and_nothing_else():
    timing = ["duration_s", "step_time_ms", "finished_at", "fine-tune adam: step time (ms), var_list / gate",
              "ms_per_step_time", "wall_s", "per_step_ms"]
    kept = ["acc_new_std", "finetune_steps", "seeds", "mask_steps", "data_sizes", "conv_changed_entries_mean",
            "masks p=0.5 adam/naive: final test accuracy (fraction) / frozen entries changed, summed over 8 steps"]
    assert [k for k in timing if not is_timing_key(k)] == []
    assert [k for k in kept if is_timing_key(k)] == []
    assert without_timings({"a": 1, "duration_s": 3, "b": [{"step_time_ms": 2, "c": 0.1}]}) == {"a": 1, "b": [{"c": 0.1}]}
    assert differences({"a": [1.0, 2.0], "b": 1}, {"a": [1.0, 2.0000000000000004], "c": 1}) == [
        "/b: only in the first run", "/c: only in the second run", "/a[1]: 2.0 != 2.0000000000000004"]
