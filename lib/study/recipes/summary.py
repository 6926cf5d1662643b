"""Study 05: the per-seed summaries, the numbers metrics.json keeps per recipe, and the SUMMARY.md headline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from study.reporting import format_mean_std
from study.recipes.setup import NEW_COLUMN_METHODS, SUBNET_METHODS, StudyResult


# -- summaries, tables, headline -------------------------------------------------------------------------
def summarize(runs: pd.DataFrame, by: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean, std, min and max over seeds of ``values`` per group, and the seed count. ``summarize(r, ["method"], ["acc_new"])``"""
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
                           "extra_state_bytes": int(g["extra_state_bytes"].max()), "seeds": int(g["seed"].nunique()),
                           **{e: float(g[e].mean()) for e in extra}, **{f"{e}_std": float(g[e].std()) for e in extra}}
        return out

    new = r1.runs
    pr = r2.runs
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
                            "momentum_norm_after_min": float(b["norm_after"].min()) if len(b) else float("nan"),
                            "step_time_ms": float(g["step_time_ms"].mean()), "seeds": int(g["seed"].nunique())}
    return {
        "new_columns": {
            "optimizer": str(new["optimizer"].iloc[0]), "old_entries": int(new["old_entries"].iloc[0]),
            "methods": per_method(new, "old_moved", ["acc_new", "acc_old", "acc_old_among_old", "new_changed",
                                                     "frozen_momentum_nonzero", "old_max_relative_change"]),
            "constraint_same_weights_as_exact": bool(new[new["method"] == "constraint"]["same_weights_as_exact"].all()),
            "diagnose": _causes(r1.diagnosis)},
        "pruning": {
            "headline_optimizer": str(pr["optimizer"].iloc[0]),
            "methods": per_method(pr, "moved", ["acc_finetuned", "sparsity_kept", "momentum_nonzero_at_start"]),
            "by_optimizer": {f"{o}/{m}/{s:g}": {"moved_min": int(g["moved"].min()), "moved_max": int(g["moved"].max()),
                                                "pruned": int(g["pruned"].iloc[0]),
                                                "sparsity_kept_min": float(g["sparsity_kept"].min()),
                                                "acc_finetuned": float(g["acc_finetuned"].mean()),
                                                "acc_finetuned_std": float(g["acc_finetuned"].std()),
                                                "step_time_ms": float(g["step_time_ms"].mean())}
                             for (o, m, s), g in pr.groupby(["optimizer", "method", "sparsity"], sort=False)},
            "pruned_still_zero": {m: float((1 - g["moved"] / g["pruned"]).min())
                                  for m, g in pr.groupby("method", sort=False)},
            "constraint_same_weights_as_exact": bool(pr[pr["method"] == "constraint"]["same_weights_as_exact"].all()),
            "dense_adam_step_time_ms": r2.extra.get("dense_adam_step_time_ms"),
            "diagnose": _causes(r2.diagnosis)},
        "unfreezing": {"methods": unfreeze, "diagnose": _causes(r3.diagnosis)},
        "sparse": {"methods": {
            v: {
                "outside_max": int(g["changed_outside_selection"].max()), "changed_mean": float(g["changed"].mean()),
                "trained_entries": int(g["trained_entries"].iloc[0]), "total_entries": int(g["total_entries"].iloc[0]),
                "acc_new": float(g["acc_new"].mean()), "acc_new_std": float(g["acc_new"].std()),
                "forgetting": float(g["forgetting"].mean()), "forgetting_std": float(g["forgetting"].std()),
                "step_time_ms": float(g["step_time_ms"].mean()), "seeds": int(g["seed"].nunique())}
            for v, g in sp.groupby("variant", sort=False)}},
        "subnetwork": {"methods": per_method(sn, "moved", ["accuracy", "frozen"]), "diagnose": _causes(r5.diagnosis)},
        "traps": traps.to_dict(orient="records"),
    }


def _causes(diagnosis: pd.DataFrame) -> dict[str, list[str]]:
    if not len(diagnosis):
        return {}
    return {m: sorted(set(g["cause"]) - {"(none)"}) for m, g in diagnosis.groupby("method", sort=False)}


def headline(metrics: Mapping[str, Any], source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study, as text. ``headline(metrics, data.source)``"""
    r1, r2, r3, r4, r5 = (metrics[k] for k in ("new_columns", "pruning", "unfreezing", "sparse", "subnetwork"))
    m1, m3, m5 = r1["methods"], r3["methods"], r5["methods"]
    out = {"data": source}
    key = f"1 new columns ({r1['optimizer']}): old entries moved, gradient mask / constraint / exact"
    out[f"{key} (of {r1['old_entries']})"] = " / ".join(str(m1[m]["moved_max"]) for m in NEW_COLUMN_METHODS)
    out["1 new columns, exact: accuracy on digits 5-9 / 0-4 (10-way)"] = \
        f"{format_mean_std(m1['exact']['acc_new'], m1['exact']['acc_new_std'])} / " \
        f"{format_mean_std(m1['exact']['acc_old'], m1['exact']['acc_old_std'])}"
    for key, row in r2["by_optimizer"].items():
        name, method, sparsity = key.split("/")
        if float(sparsity) == max(float(k.split("/")[2]) for k in r2["by_optimizer"]):
            key = f"2 pruning fc1 to {100 * float(sparsity):.0f} %, {name}, {method}"
            out[f"{key}: pruned entries moved (of {row['pruned']:,}) / accuracy / step time (ms)"] = (
                f"{row['moved_max']:,} / {format_mean_std(row['acc_finetuned'], row['acc_finetuned_std'])} / "
                f"{row['step_time_ms']:.0f}")
    for method in ("mask_schedule", "recompile_fresh", "trainable_flip"):
        if method in m3:
            r = m3[method]
            out[f"3 gradual unfreezing, {method}: accuracy on 5-9 / optimizer state kept at stage boundaries"] = \
                f"{format_mean_std(r['acc_new'], r['acc_new_std'])} / {r['boundaries_kept']} of {r['boundaries']}" + \
                ("" if r["unfrozen_trained"] else " (unfrozen layers did not train)")
    if "recompile_same" in m3:
        error = m3["recompile_same"]["error"]
        out["3 gradual unfreezing, recompile with the same optimizer"] = error.split(":")[0] or "no error"
    for key, r in r4["methods"].items():
        out[f"4 {key}: accuracy on 5-9 / forgetting of 0-4 / entries changed (of {r['total_entries']:,})"] = \
            f"{format_mean_std(r['acc_new'], r['acc_new_std'])} / " \
            f"{format_mean_std(r['forgetting'], r['forgetting_std'])} / {r['changed_mean']:,.0f}"
    for method in SUBNET_METHODS:
        r = m5[method]
        out[f"5 random units, adam, {method}: frozen entry-steps moved / accuracy"] = \
            f"{r['moved_max']:,} of {r['frozen']:,.0f} / {format_mean_std(r['accuracy'], r['accuracy_std'])}"
    return out
