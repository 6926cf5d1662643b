"""Study 04, sections 3-5 and 7: the asynchronous parameter-server runs (``downpour``) as tables, and the fault run.

* ``ps_table``, ``placement_table``, ``runs_display``, ``frozen_table``: one run of ``run_downpour`` per row,
  where each variable lives, and which frozen entries moved;
* ``fault_job`` and ``fault_accounting``: the run with a worker, the chief and a ps task killed, and what each
  restart restored, lost and redid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from study.gradients.config import GradientStudyConfig
from study.report.prose import fixed, pm


def window_rates(result: Mapping[str, Any], windows: int = 4) -> list[float]:
    """Worker steps per second in ``windows`` equal slices of a run's timed (steady) window, from the workers' clocks.

    The spread of these is the run's own variation over time; ``run_downpour`` results only.
    """
    times = result["function_times"][result.get("steady_from_function") or 0:]
    if len(times) < 2:
        return [result.get("steps_per_s", float("nan"))]
    start, end = min(t[1] for t in times), max(t[2] for t in times)
    edges = np.linspace(start, end, windows + 1)
    steps = result["config"]["steps_per_function"]
    ended = np.array([t[2] for t in times])
    counts = np.histogram(ended, bins=edges)[0]
    return (counts * steps / np.diff(edges)).tolist()


def ps_row(label: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """One run of ``run_downpour`` as a table row: throughput (mean and std over windows), staleness, accuracy, CPU."""
    rates = window_rates(result)
    cfg = result["config"]
    cpu = result.get("steady_task_cpu_s") or {}
    window = result.get("steady_seconds") or float("nan")
    workers = [v for k, v in cpu.items() if k.startswith("worker") and v is not None][:cfg["workers"]]
    ps_cpu = [v for k, v in cpu.items() if k.startswith("ps") and v is not None]
    staleness = np.asarray(result["staleness"]) if result["staleness"] else np.zeros(1)
    return {"run": label, "model": cfg["model"].rpartition(":")[2], "workers": cfg["workers"], "ps": cfg["ps"],
            "n_fetch": cfg["n_fetch"], "n_push": cfg["n_push"], "steps": result["returned_steps"],
            "applied_updates": result["applied_updates"], "steps_per_s": result.get("steps_per_s"),
            "steps_per_s_windows": float(np.mean(np.asarray(rates, dtype=float))),  # the workers' clocks
            "steps_per_s_std": float(np.std(rates, ddof=1)) if len(rates) > 1 else float("nan"),
            "steps_per_s_window_min": float(np.min(np.asarray(rates, dtype=float))),  # None: NaN
            "steps_per_s_window_max": float(np.max(np.asarray(rates, dtype=float))),
            "updates_per_s": result.get("updates_per_s"),
            "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
            "final_accuracy": result["final_accuracy"],
            "worker_cpu_share_min": min(workers) / window if workers else float("nan"),
            "worker_cpu_s_per_step": sum(workers) / result["steady_steps"] if workers and result.get("steady_steps")
            else float("nan"),
            "ps_cpu_s_per_step": sum(ps_cpu) / result["steady_steps"] if ps_cpu and result.get("steady_steps")
            else float("nan"),
            "samples_shared_between_workers": result["samples_shared_between_workers"]}


def ps_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``ps_row`` for every run. ``ps_table({"1 worker": r1, "2 workers": r2})``"""
    return pd.DataFrame([ps_row(label, r) for label, r in runs.items()])


def placement_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """Where each variable of a run lives: one row per shard, with its task, shape and bytes."""
    rows = []
    for row in result["placement"]:
        for i, shard in enumerate(row["shards"]):
            rows.append({"variable": row["variable"], "shard": f"{i + 1} of {len(row['shards'])}",
                         "task": shard["task"], "shard shape": "x".join(map(str, shard["shape"])) or "scalar",
                         "bytes": shard["bytes"]})
    return pd.DataFrame(rows)


RUN_DISPLAY = {  # ps_table column -> the report's header (units in parentheses); CPU seconds are shown in ms
    "workers": "workers", "n_push": "n_fetch = n_push", "steps": "steps (minibatches)",
    "applied_updates": "updates applied",
    "steps_per_s": "steps/s (chief's clock, over its timed span)",
    "steps_per_s_windows": "steps/s (workers' clocks: mean ± std of the timed windows, and their range)",
    "staleness_mean": "mean staleness (updates)",
    "staleness_max": "max staleness (updates)", "final_accuracy": "final test accuracy",
    "worker_cpu_s_per_step": "worker CPU per step (ms)", "ps_cpu_s_per_step": "ps CPU per step (ms)",
    "worker_cpu_share_min": "smallest share of a core a worker got",
    "samples_shared_between_workers": "samples both workers read",
}


def runs_display(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``ps_table`` rows as the report shows them: indexed by run, readable headers with units, CPU in ms,
    the windows' steps/s as mean ± std (range). ``runs_display(ps_table(runs), ["steps_per_s", "final_accuracy"])``"""
    out = pd.DataFrame(index=pd.Index(table["run"], name="run"))
    for column in columns:
        values = table[column].to_numpy()
        if column == "steps_per_s":
            shown = [fixed(v, 1) for v in values]
        elif column == "steps_per_s_windows":
            shown = [f"{pm(m, s)} ({fixed(lo, 1)}–{fixed(hi, 1)})" for m, s, lo, hi in zip(
                values, table["steps_per_s_std"], table["steps_per_s_window_min"], table["steps_per_s_window_max"])]
        elif column.endswith("_cpu_s_per_step"):
            shown = [fixed(1e3 * v, 1) for v in values]
        elif column in ("staleness_mean", "final_accuracy", "worker_cpu_share_min"):
            shown = [fixed(v, 3 if column == "final_accuracy" else 2) for v in values]
        else:
            shown = [f"{int(v):,}" for v in values]
        out[RUN_DISPLAY[column]] = shown
    return out


def frozen_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """A masked run's frozen and trainable entries per masked variable: how many, and how many changed (bitwise)."""
    tasks = {row["variable"]: ", ".join(s["task"] for s in row["shards"]) for row in result["placement"]}
    return pd.DataFrame([{"variable": path, "shards_on": tasks.get(path, ""), "frozen_entries": r["frozen_entries"],
                          "frozen_bits_changed": r["frozen_changed"], "trainable_entries": r["trainable_entries"],
                          "trainable_changed": r["trainable_changed"]}
                         for path, r in result["frozen"]["per_variable"].items()])


def fault_job(config: GradientStudyConfig, data: Mapping[str, Any]) -> tuple[Any, Any]:
    """The fault run: the job (2 workers, the ps tasks, checkpoints) on ``data`` (its ``data`` and ``data_kwargs``,
    ``ps_data.mnist_job_data``) and its ``Faults``, each fault in ``config.faults`` at a fixed share of the run."""
    from downpour import DownpourConfig, Faults

    updates = config.fault_steps // 2
    at = {"worker": 0.15, "chief": 0.35, "ps": 0.6}
    faults = Faults(**{f"{name}_at": max(1, int(at[name] * updates)) for name in config.faults})
    job = DownpourConfig(**data, model=config.fault_model, workers=2, ps=config.ps_tasks, steps=config.fault_steps,
                         n_fetch=2, n_push=2, steps_per_function=4, learning_rate=0.1, optimizer="adagrad",
                         checkpoint_every=max(2, updates // 6), shard_min_bytes=64 * 1024, seed=config.seeds[0])
    return job, faults
"""Every column of study 04's tables: meaning (unit), for the data dictionary (``reporting.save_table``)."""


def fault_accounting(result: Mapping[str, Any]) -> pd.DataFrame:
    """Every update of a fault run, accounted for: per fault, what was in the checkpoint, lost, applied after."""
    rows = []
    resumed = [a for a in result["attempts"] if a["resumed"]]
    restored = iter(resumed)
    for fault in result["faults"]:
        row = {"fault": f"{fault['killed']} killed", "updates when killed (seen)": fault.get("version_seen"),
               "updates when killed (exact)": fault.get("version_at_failure")}
        if fault["killed"].startswith("worker"):  # nothing restarts from a checkpoint; its pushes stay applied
            row["in the last checkpoint"], row["lost"], row["lost is exact"] = None, 0, True
            row["how it came back"] = "the coordinator re-ran its function; the worker was started again"
        else:
            attempt = next(restored)
            row["in the last checkpoint"] = attempt["restored_version"]
            at_failure = fault.get("version_at_failure")
            exact = at_failure is not None  # read on a ps task that survived; else what the launcher last saw
            row["lost"] = (at_failure if exact else fault.get("version_seen") or 0) - attempt["restored_version"]
            row["lost is exact"] = exact
            row["how it came back"] = (f"{'ps restarted, ' if fault['killed'].startswith('ps') else ''}"
                                       f"chief restarted with --resume from update {attempt['restored_version']}")
        rows.append(row)
    return pd.DataFrame(rows)


HEADERS = {
    "ms": "median time (ms)", "ms_min": "fastest repeat (ms)", "ms_max": "slowest repeat (ms)",
    "ratio_to_one_pass": "ratio to one pass", "ratio_low": "ratio, low end", "ratio_high": "ratio, high end",
    "learning_rate": "learning rate", "reached": "seeds that reached the target",
    "slowdown_mean": "slowdown, mean (ratio of updates)", "slowdown_std": "slowdown, std",
    "drop_mean": "accuracy lost, mean", "drop_std": "accuracy lost, std",
    "shards_on": "shards on", "frozen_entries": "frozen entries",
    "frozen_bits_changed": "frozen entries changed (bitwise)",
    "trainable_entries": "trainable entries", "trainable_changed": "trainable entries changed",
    "tau": "τ (updates late)", "staleness_mean": "mean staleness (updates)",
}
"""Readable table headers for the report (the CSV keeps the column names ``COLUMNS`` describes)."""


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with readable headers (``HEADERS``; any other ``a_b`` as ``a b``, ``adam_lr`` as ``adam learning
    rate``) and whole-number columns with thousands separators, as the prose writes them; for display only.
    ``readable(frozen_table(run))``

    >>> readable(pd.DataFrame({"variable": ["fc1/kernel"], "frozen_entries": [25122]}))
         variable frozen entries
    0  fc1/kernel         25,122
    """
    def name(column: Any) -> Any:
        if not isinstance(column, str):
            return column
        return HEADERS.get(column, column.replace("_lr", " learning rate").replace("_", " "))

    out = table.rename(columns=name)
    for column in out.columns:
        if pd.api.types.is_integer_dtype(out[column].dtype):
            out[column] = [f"{int(v):,}" for v in out[column]]
    names = [name(n) for n in out.index.names]
    out.index = out.index.set_names(names if isinstance(out.index, pd.MultiIndex) else names[0])
    return out
