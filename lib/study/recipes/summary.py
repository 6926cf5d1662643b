"""Study 05: the per-seed summaries, the numbers metrics.json keeps per recipe, and the SUMMARY.md headline."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from study.recipes.labels import method_label, optimizer_name
from study.recipes.setup import NEW_COLUMN_METHODS, SUBNET_METHODS, StudyResult
from study.report.prose import TIMING_TOLERANCE, ceil, fixed, floor, pct, timing_side
from study.report.reporting import count_range, format_count, format_mean_std


# -- summaries, tables, headline -------------------------------------------------------------------------
def summarize(runs: pd.DataFrame, by: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean, std, min and max over seeds of ``values`` per group,
    and the seed count. ``summarize(r, ["method"], ["acc_new"])``"""
    grouped = runs.groupby(list(by), sort=False, dropna=False)
    out = grouped[list(values)].agg(["mean", "std", "min", "max"])
    out.columns = [f"{v}_{stat}" for v, stat in out.columns]
    out["seeds"] = grouped["seed"].nunique()
    return out.reset_index()


def recipe_metrics(r1: StudyResult, r2: StudyResult, r3: StudyResult, r4: StudyResult, r5: StudyResult,
                   traps: pd.DataFrame) -> dict[str, Any]:
    """The numbers metrics.json keeps per recipe (the tests and the method table read these). ``recipe_metrics(...)``"""

    def per_method(runs: pd.DataFrame, moved: str, extra: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        out = {}
        for method, g in runs.groupby("method", sort=False):
            out[method] = {"moved_min": int(g[moved].min()), "moved_max": int(g[moved].max()),
                           "step_time_ms": float(g["step_time_ms"].mean()),
                           "step_time_ms_std": float(g["step_time_ms"].std()) if len(g) > 1 else 0.0,
                           "extra_state_bytes": int(g["extra_state_bytes"].max()), "seeds": int(g["seed"].nunique()),
                           **{e: float(g[e].mean()) for e in extra}, **{f"{e}_std": float(g[e].std()) for e in extra}}
        return out

    new = r1.runs
    un = r3.runs
    sp = r4.runs
    sn = r5.runs
    unfreeze = {}
    for method, g in un.groupby("method", sort=False):
        b = r3.extra["boundaries"]
        b = b[b["method"] == method] if len(b) else b
        unfreeze[method] = {"finished": bool(g["finished"].all()), "error": g["error"].iloc[0],
                            "acc_new": float(g["acc_new"].mean()), "acc_new_std": float(g["acc_new"].std()),
                            "frozen_moved_max": int(g["frozen_moved"].max()),
                            "unfrozen_trained": bool(g["unfrozen_trained"].all()),
                            "state_kept": bool(g["state_kept"].all()) if g["finished"].all() else False,
                            "boundaries": int(len(b) / max(g["seed"].nunique(), 1)),
                            "boundaries_kept": int(b["kept"].sum() / max(g["seed"].nunique(), 1)) if len(b) else 0,
                            "boundaries_total": int(len(b)),
                            "boundaries_kept_total": int(b["kept"].sum()) if len(b) else 0,
                            "momentum_norm_after_min": float(b["norm_after"].min()) if len(b) else float("nan"),
                            "raised_at_stage": None if g["finished"].all() else  # 1-based: the stage whose fit raised
                            int(len(b) / max(g["seed"].nunique(), 1)) + 1,
                            **_stage_ratios(r3.extra.get("stage_ratios"), method),
                            "step_time_ms": float(g["step_time_ms"].mean()),
                            "step_time_ms_std": float(g["step_time_ms"].std()) if len(g) > 1 else 0.0,
                            "seeds": int(g["seed"].nunique()), "extra_state_bytes": int(g["extra_state_bytes"].max())}
    return {
        "new_columns": {
            "optimizer": str(new["optimizer"].iloc[0]), "old_entries": int(new["old_entries"].iloc[0]),
            "methods": per_method(new, "old_moved", ["acc_new", "acc_old", "acc_old_among_old", "new_changed",
                                                     "frozen_momentum_nonzero", "old_max_relative_change"]),
            "constraint_same_weights_as_exact": bool(new[new["method"] == "constraint"]["same_weights_as_exact"].all()),
            "diagnose": _causes(r1.diagnosis)},
        "pruning": _pruning_metrics(r2),
        "unfreezing": {"methods": unfreeze, "diagnose": _causes(r3.diagnosis)},
        "sparse": {"methods": {
            v: {
                "outside_max": int(g["changed_outside_selection"].max()), "changed_mean": float(g["changed"].mean()),
                "method": str(g["method"].iloc[0]), "label": method_label(v),  # the name a reader sees
                "fraction": _float_or_none(g["fraction"].iloc[0]),
                "lora_rank": None if g["lora_rank"].isna().all() else int(g["lora_rank"].iloc[0]),
                "trained_entries": int(g["trained_entries"].iloc[0]), "total_entries": int(g["total_entries"].iloc[0]),
                "acc_new": float(g["acc_new"].mean()), "acc_new_std": float(g["acc_new"].std()),
                "forgetting": float(g["forgetting"].mean()), "forgetting_std": float(g["forgetting"].std()),
                "step_time_ms": float(g["step_time_ms"].mean()),
                "step_time_ms_std": float(g["step_time_ms"].std()) if len(g) > 1 else 0.0,
                "seeds": int(g["seed"].nunique())}
            for v, g in sp.groupby("variant", sort=False)}},
        "subnetwork": {"p": float(sn["p"].iloc[0]),
                       "methods": per_method(sn, "moved", ["accuracy", "frozen", "moved"]),
                       "diagnose": _causes(r5.diagnosis)},
        "traps": traps.to_dict(orient="records"),
    }


def state_kept_text(kept: int, boundaries: int, seeds: int, finished: bool = True, trained: bool = True) -> str:
    """How many stage boundaries kept the optimizer state, per seed and over all seeds (``kept`` and
    ``boundaries`` are totals over ``seeds``). ``state_kept_text(6, 6, 3)`` -> '2 of 2 per seed (6 of 6 over 3 seeds)'

    >>> state_kept_text(1, 1, 1, finished=False)
    '1 of 1, then raised'
    >>> state_kept_text(6, 6, 3, trained=False)
    '2 of 2 per seed (6 of 6 over 3 seeds; but the unfrozen layers did not train)'
    """
    per_seed = seeds > 1 and kept % seeds == 0 and boundaries % seeds == 0
    text = f"{kept // seeds} of {boundaries // seeds} per seed" if per_seed else f"{kept} of {boundaries}"
    notes = [f"{kept} of {boundaries} over {seeds} seeds"] if per_seed else []
    if not trained:
        notes.append("but the unfrozen layers did not train")
    text += f" ({'; '.join(notes)})" if notes else ""
    return text if finished else f"{text}, then raised"


def method_state_kept(r: Mapping[str, Any], trained: bool = True) -> str:
    """``state_kept_text`` for one unfreezing method's entry of ``recipe_metrics`` (its boundary totals and seeds).
    ``method_state_kept(metrics["unfreezing"]["methods"]["mask_schedule"])``"""
    return state_kept_text(r["boundaries_kept_total"], r["boundaries_total"], r["seeds"], trained=trained)


def short_error(message: str) -> str:
    """An exception message short enough for a table cell: the error's name and the variable it names.

    >>> short_error("Unknown variable: <Variable path=mlp/fc2/kernel, shape=(128, 64), dtype=float32>. This ...")
    'Unknown variable (mlp/fc2/kernel)'
    >>> short_error("")
    ''
    """
    m = re.match(r"^([^:<]+):\s*<Variable path=([^,>]+)", message or "")
    if m:
        return f"{m.group(1).strip()} ({m.group(2).strip()})"
    first = (message or "").split(". ")[0]
    return first if len(first) <= 80 else first[:77] + "..."


def spread_caption(table: pd.DataFrame, seeds: int, note: str = ""):
    """``table`` with a caption saying what its spreads are (a Styler, for display). ``spread_caption(t, 3)``"""
    caption = f"a ± b: mean ± std over {seeds} seeds; a–b: lowest–highest over seeds" + (f"; {note}" if note else "")
    if "method" in table.index.names:  # the ids as a reader reads them
        table = table.rename(index=method_label, level="method")
    return table.style.set_caption(caption)


def value_ranges(groups: Any, digits: int = 3) -> pd.Series:
    """Each group's range of values as text, 'lowest–highest' rounded outward (one number where they agree), every
    group of the column at one precision: the decimals that give the smallest non-zero value ``digits`` significant
    digits; whole numbers with thousands separators. ``groups``: a ``SeriesGroupBy``, or a ``DataFrameGroupBy`` whose
    columns share one precision (columns of one quantity). ``value_ranges(b.groupby("method")["norm_after"])``

    >>> value_ranges(pd.Series([2.14, 4.75, 1.4, 4.75, 0.0, 0.0]).groupby([0, 0, 1, 1, 2, 2])).tolist()
    ['2.14–4.75', '1.40–4.75', '0.00']
    >>> value_ranges(pd.Series([15, 30, 1500]).groupby([0, 0, 1])).tolist()
    ['15–30', '1,500']
    >>> value_ranges(pd.DataFrame({"a": [0.925, 1.398], "b": [1.17, 2.33]}).groupby([0, 0])).values.tolist()
    [['0.925–1.398', '1.170–2.330']]
    """
    lows = groups.min()  # the selected columns only (obj may also hold the keys)
    frame = groups.obj[list(lows.columns)] if isinstance(lows, pd.DataFrame) else groups.obj.to_frame()
    values = frame.to_numpy().ravel()
    whole = all(pd.api.types.is_integer_dtype(t) for t in frame.dtypes)
    nonzero = [abs(float(v)) for v in values if v == v and v != 0]
    d = 0 if whole or not nonzero else max(digits - 1 - int(np.floor(np.log10(min(nonzero)))), 0)

    def text(lo: Any, hi: Any) -> str:
        if whole:
            return count_range(lo, hi)
        return fixed(lo, d) if lo == hi else f"{floor(lo, 'fixed', d)}–{ceil(hi, 'fixed', d)}"  # outward: holds all

    return groups.agg(lambda x: text(x.min(), x.max()))


def _float_or_none(x: Any) -> float | None:
    return None if x is None or x != x else float(x)


def _pruning_metrics(r2: StudyResult) -> dict[str, Any]:
    """Recipe 2's numbers, never pooled over optimizers: per optimizer/method/sparsity (``by_optimizer``), per
    optimizer and method over sparsities and seeds (``per_optimizer``; the exact mask's ``over``: its step time over
    each other method's, paired by run, with ``prose.timing_side``'s verdict, 02's rule), and the fresh-optimizer
    check."""
    pr = r2.runs
    by_optimizer = {}
    for (o, m, s), g in pr.groupby(["optimizer", "method", "sparsity"], sort=False):
        by_optimizer[f"{o}/{m}/{s:g}"] = {
            "moved_min": int(g["moved"].min()), "moved_max": int(g["moved"].max()),
            "moved_mean": float(g["moved"].mean()), "moved_std": float(g["moved"].std()),
            "pruned": int(g["pruned"].iloc[0]),
            "sparsity_kept": float(g["sparsity_kept"].mean()), "sparsity_kept_min": float(g["sparsity_kept"].min()),
            "momentum_changed_min": int(g["momentum_changed"].min()),
            "acc_finetuned": float(g["acc_finetuned"].mean()), "acc_finetuned_std": float(g["acc_finetuned"].std()),
            "step_time_ms": float(g["step_time_ms"].mean()), "step_time_ms_std": float(g["step_time_ms"].std()),
            "seeds": int(g["seed"].nunique())}
    per_optimizer: dict[str, dict[str, Any]] = {}
    for (o, m), g in pr.groupby(["optimizer", "method"], sort=False):
        per_optimizer.setdefault(o, {})[m] = {  # over this optimizer's sparsities and seeds
            "moved_min": int(g["moved"].min()), "moved_max": int(g["moved"].max()),
            "still_zero_min": float((1 - g["moved"] / g["pruned"]).min()),
            "momentum_changed_min": int(g["momentum_changed"].min()),
            "momentum_changed_max": int(g["momentum_changed"].max()),
            "momentum_changed_share_min": float((g["momentum_changed"] / g["pruned"]).min()),
            "step_time_ms": float(g["step_time_ms"].mean()),
            "step_time_ms_min": float(g["step_time_ms"].min()), "step_time_ms_max": float(g["step_time_ms"].max()),
            "extra_state_bytes": int(g["extra_state_bytes"].max()), "runs": int(len(g))}
    times = pr.pivot_table(index=["optimizer", "sparsity", "seed"], columns="method", values="step_time_ms")
    for o, exact in per_optimizer.items():  # the exact mask's step over each other method's, paired by run
        for m in ("gradient_mask", "constraint"):
            if "exact" in exact and m in times.columns:
                ratio = (times.loc[o, "exact"] / times.loc[o, m]).dropna()
                exact["exact"].setdefault("over", {})[m] = {
                    "min": float(ratio.min()), "max": float(ratio.max()), "runs": int(len(ratio)),
                    "side": timing_side(ratio.min(), ratio.max())}
    fresh = r2.extra.get("fresh_gradient_mask", pd.DataFrame())
    diagnosis = r2.diagnosis
    return {
        "headline_optimizer": str(pr["optimizer"].iloc[0]),
        "timing_tolerance": TIMING_TOLERANCE,  # the margin ``over``'s verdicts read (``prose.timing_side``)
        "by_optimizer": by_optimizer,
        "per_optimizer": per_optimizer,
        "fresh_gradient_mask": {o: {"moved_max": int(g["moved"].max()), "pruned": int(g["pruned"].iloc[0]),
                                    "sparsity": float(g["sparsity"].iloc[0]),
                                    "momentum_nonzero_at_start_max": int(g["momentum_nonzero_at_start"].max()),
                                    "seeds": int(g["seed"].nunique())}
                                for o, g in fresh.groupby("optimizer", sort=False)} if len(fresh) else {},
        "constraint_same_weights_as_exact": bool(pr[pr["method"] == "constraint"]["same_weights_as_exact"].all()),
        "dense_adam_step_time_ms": r2.extra.get("dense_adam_step_time_ms"),
        "diagnose": {recipe.split(", ")[-1]: _causes(g) for recipe, g in diagnosis.groupby("recipe", sort=False)}
        if len(diagnosis) else {}}


def _causes(diagnosis: pd.DataFrame) -> dict[str, list[str]]:
    if not len(diagnosis):
        return {}
    return {m: sorted(set(g["cause"]) - {"(none)"}) for m, g in diagnosis.groupby("method", sort=False)}


def _stage_ratios(ratios: Any, method: str) -> dict[str, list[float]]:
    """A method's step time per stage over a fresh recompile's: median, min and max over seeds, one per stage."""
    if ratios is None or not len(ratios) or method not in set(ratios["method"]):
        return {}
    r = ratios[ratios["method"] == method].sort_values("stage")
    return {"stage_step_ratio": [float(v) for v in r["ratio_median"]],
            "stage_step_ratio_min": [float(v) for v in r["ratio_min"]],
            "stage_step_ratio_max": [float(v) for v in r["ratio_max"]]}


_LABELS = {"gradient_mask": "gradient mask (zeroed gradient)", "constraint": "re-zeroing constraint",
           "exact": "exact mask (MaskedOptimizer)", "naive_gate": "naive gate (zeroed gradient)",
           "mask_schedule": "MaskSchedule in one fit", "skip_frozen": "MaskSchedule + SkipFrozen in one fit",
           "recompile_fresh": "recompile with a new optimizer per stage",
           "trainable_flip": "flip trainable between fits, no recompile", "full": "full fine-tuning",
           "last_layer": "last layer only", "sparse": "FISH-selected", "sparse_state": "FISH-selected"}


def _sparse_label(variant: str, r: Mapping[str, Any]) -> str:
    method = r.get("method", variant)
    if method in ("sparse", "sparse_state"):
        state = "dense optimizer state" if method == "sparse" else "sparse optimizer state"
        return f"FISH-selected {pct(r['fraction'], 0)} of entries, {state}"
    if method == "lora":
        return f"Keras LoRA (enable_lora), rank {r['lora_rank']}"
    return _LABELS.get(method, variant)


def headline(metrics: Mapping[str, Any], source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study, as text. ``headline(metrics, data.source)``

    Each label names its statistic (mean ± std over seeds, or max over seeds) and a count and what it is out
    of use the same statistic.
    """
    r1, r2, r3, r4, r5 = (metrics[k] for k in ("new_columns", "pruning", "unfreezing", "sparse", "subnetwork"))
    m1, m3, m5 = r1["methods"], r3["methods"], r5["methods"]
    decimals = metrics.get("decimals") or {}  # each table column's decimals: a mean prints here as in its table

    def pm(r: Mapping[str, Any], value: str, recipe: str, mean: str | None = None) -> str:
        return format_mean_std(r[mean or value], r[f"{value}_std"], decimals=(decimals.get(recipe) or {}).get(value))

    out = {"data": source}
    opt1 = optimizer_name(r1["optimizer"])
    out[f"Recipe 1 (new output columns), {opt1}: old entries changed, max over seeds (of {r1['old_entries']:,}), "
        "gradient mask / copy-back constraint / exact mask"] = " / ".join(
            f"{m1[m]['moved_max']:,}" for m in NEW_COLUMN_METHODS)
    out[f"Recipe 1 (new output columns), {opt1}, exact mask: test accuracy on digits 5-9 / 0-4 (10-way), "
        f"mean ± std"] = \
        f"{pm(m1['exact'], 'acc_new', 'new_columns')} / {pm(m1['exact'], 'acc_old', 'new_columns')}"
    top = max(float(k.split("/")[2]) for k in r2["by_optimizer"])
    for key, row in r2["by_optimizer"].items():
        name, method, sparsity = key.split("/")
        if float(sparsity) == top:
            label = (f"Recipe 2 (pruning fc1 to {pct(float(sparsity), 0)}), fine-tuned by {optimizer_name(name)} "
                     f"with the "
                     f"dense run's state, {_LABELS.get(method, method)}")
            out[f"{label}: pruned entries moved (of {row['pruned']:,}) / test accuracy / median step time (ms), "
                "mean ± std over seeds"] = (
                f"{format_count(row['moved_mean'], row['moved_std'])} / "
                f"{pm(row, 'acc_finetuned', 'pruning')} / {pm(row, 'step_time_ms', 'pruning')}")
    for method in ("mask_schedule", "skip_frozen", "recompile_fresh", "trainable_flip"):
        if method in m3:
            r = m3[method]
            kept = method_state_kept(r, trained=r["unfrozen_trained"])
            out[f"Recipe 3 (gradual unfreezing), {_LABELS[method]}: test accuracy on 5-9 (mean ± std) / stage "
                "boundaries with the optimizer state kept"] = f"{pm(r, 'acc_new', 'unfreezing')} / {kept}"
    if "recompile_same" in m3:
        r = m3["recompile_same"]
        error = r["error"].split(":")[0]
        out["Recipe 3 (gradual unfreezing), recompile with the same optimizer per stage"] = (
            f"raised '{error}' at stage {r['raised_at_stage']} (no result)" if error else "finished")
    for variant, r in r4["methods"].items():
        out[f"Recipe 4 (sparse fine-tuning), {_sparse_label(variant, r)}: test accuracy on 5-9 / forgetting of 0-4 "
            f"(accuracy lost on 0-4, fraction) "
            f"(mean ± std) / entries changed (mean, of {r['total_entries']:,})"] = \
            f"{pm(r, 'acc_new', 'sparse')} / {pm(r, 'forgetting', 'sparse')} / {r['changed_mean']:,.0f}"
    for method in SUBNET_METHODS:
        r = m5[method]
        out[f"Recipe 5 (random sub-network: each unit trains with probability {r5['p']:g} at each step, mask_fn, "
            f"Adam), {_LABELS[method]}: "
            "frozen entry-steps (entries × steps frozen) that moved, of those frozen / test accuracy, "
            "mean ± std over seeds"] = \
            f"{format_count(r['moved'], r['moved_std'])} of {format_count(r['frozen'], r['frozen_std'])} / " \
            f"{pm(r, 'accuracy', 'subnetwork')}"
    return out


METRIC_KINDS = {  # first match wins: a specific pattern before the general one it would fall under
    "decimals/*/step_time_ms": "timing_verdict",  # a table's precision, chosen from timings (not a timing)
    "config": "constant", "freezing_version": "constant", "data_source": "constant", "data_sizes": "constant",
    "keras_version": "constant", "cnn_parameters": "constant", "fc1_kernel_entries": "constant",
    "**/stage_step_ratio_min": "timing_spread", "**/stage_step_ratio_max": "timing_spread",
    "**/stage_step_ratio": "timing_ratio",
    "**/step_time_ms_std": "timing_spread", "**/step_time_ms_min": "timing_spread",
    "**/step_time_ms_max": "timing_spread",
    "**/step_time_ms": "timing", "pruning/dense_adam_step_time_ms": "timing", "pruning_step_time_ms": "timing",
    "pruning/per_optimizer/*/exact/over/*/side": "timing_verdict", "pruning/timing_tolerance": "constant",
    "pruning/per_optimizer/*/exact/over/*/runs": "constant",
    "pruning/per_optimizer/*/exact/over/*/*": "timing_spread",
    "duration_s": "timing",
    "traps[*]/error": "message", "**/methods/*/error": "message",
    "optimizer_names": "constant", "cnn_variables": "constant",
    "sparse/methods/*/label": "constant", "confidence": "constant", "sparse_ladder/**/seeds": "constant",
}
"""What each value of study 05's ``metrics.json`` is (``study.report.kinds``); the rest are measured values."""
