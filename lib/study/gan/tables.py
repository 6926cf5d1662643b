"""Study 03's tables: network sizes, the drift table, the per-method summary, Adam's shared-counter effect, headline.

They read the runs ``study.gan.alternating.gan_study`` returns; ``tables.gan_summary(runs)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from freezing.selection import select_variables
from study.gan.alternating import AUDIT_KEYS, Gan, GanStudyConfig, plural
from study.report.reporting import column_decimals, format_mean_std

QUALITY_VALUES = ("classes_seen", "coverage_entropy", "confidence", "final_d_loss", "time_per_iteration_ms")
"""The summary's mean ± std columns the report's quality tables show, each at one precision (``quality_decimals``)."""


def network_sizes(config: GanStudyConfig | None = None) -> dict[str, int]:
    """Entries (parameters) of G and D. ``network_sizes() == {"generator": 242832, "discriminator": 233985}``"""
    config = config or GanStudyConfig()
    gan = Gan()
    return {name: int(sum(np.prod(v.shape) for v in select_variables(gan, scope=scope)))
            for name, scope in (("generator", config.generator_scope), ("discriminator", config.discriminator_scope))}


def drift_table(summary: pd.DataFrame) -> pd.DataFrame:
    """What should stay frozen, per method and optimizer, as the report shows it: counts with thousands separators,
    max |ΔW| with two significant digits, 0 where not one bit changed. ``drift_table(gan_summary(runs))``"""
    from study.report.prose import num

    columns = {"g_changed_entries_in_d_step": "G in D steps: changed entry-steps",
               "d_changed_entries_in_g_step": "D in G steps: changed entry-steps",
               "gated_changed_entries": "gated-off part: changed entry-steps",
               "g_max_abs_dW_in_d_step": "G in D steps: max |ΔW| (W units)",
               "d_max_abs_dW_in_g_step": "D in G steps: max |ΔW| (W units)",
               "gated_max_abs_dW": "gated-off part: max |ΔW| (W units)"}
    out = summary[["method", "optimizer"]].copy()
    for column, heading in columns.items():
        out[heading] = [f"{v:,.0f}" if "changed" in column else num(float(v), 2) for v in summary[column]]
    return out.set_index(["method", "optimizer"])


def gan_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method x optimizer: audits (mean over seeds of per-run sums; max of maxima) and mean/std of quality.

    ``single_class_runs`` counts the runs whose samples the judge puts all in one class (mode collapse).
    ``gan_summary(runs)``
    """
    values = ["confidence", "coverage_entropy", "classes_seen", "time_per_iteration_ms", "final_d_loss", "final_g_loss"]
    return runs.groupby(["method", "optimizer"], sort=False).agg(
        **{k: (k, "max" if "max" in k else "mean") for k in AUDIT_KEYS},
        **{f"{v}_{stat}": (v, stat) for v in values for stat in ("mean", "std")},
        single_class_runs=("classes_seen", lambda c: int((c == 1).sum())),
        seeds=("seed", "nunique"),
    ).reset_index()


def quality_decimals(summary: pd.DataFrame) -> dict[str, int]:
    """The decimals each quality column (``QUALITY_VALUES``) is shown with: ``reporting.column_decimals`` at two
    significant digits of the std, two decimals where no row has a spread. The tables, the headline and the findings
    quote a value with them, so that it prints alike everywhere.

    >>> quality_decimals(pd.DataFrame({f"{v}_{s}": [9.333, 10.0] if s == "mean" else [0.577, 0.0]
    ...                                for v in QUALITY_VALUES for s in ("mean", "std")}))["classes_seen"]
    2
    """
    return column_decimals(summary, QUALITY_VALUES, digits=2, fallback=2)


def bias_correction_effect(logs: pd.DataFrame, beta_1: float = 0.5, beta_2: float = 0.999) -> pd.DataFrame:
    """Adam's bias correction sqrt(1-b2^t)/(1-b1^t) at the G step, shared counter vs G's own, from logged counters."""
    shared = logs[(logs["method"] == "shared_optimizer") & (logs["optimizer"] == "adam")]
    own = logs[(logs["method"] == "two_optimizers") & (logs["optimizer"] == "adam")]
    if not len(shared) or not len(own):
        return pd.DataFrame()
    merged = shared.merge(own, on=["seed", "iteration"], suffixes=("_shared", "_own"))

    def correction(t: pd.Series) -> pd.Series:
        return np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)

    out = merged[["seed", "iteration", "g_iterations_shared", "g_iterations_own"]].copy()
    out["correction_shared"] = correction(out["g_iterations_shared"])
    out["correction_own"] = correction(out["g_iterations_own"])
    out["ratio"] = out["correction_shared"] / out["correction_own"]
    return out


def headline(summary: pd.DataFrame, classifier_accuracy: float, source: str, iterations: int) -> dict[str, str]:
    """Every method x optimizer row, as text for ``results/SUMMARY.md``. ``headline(s, 0.97, data.source, 600)``"""
    seeds = plural(int(summary["seeds"].max()), "seed")
    d = quality_decimals(summary)
    out = {"data": source, "judge: the Deep MNIST CNN's test accuracy (fraction)": f"{classifier_accuracy:.3f}",
           "how the rows below are summarised": f"changed entry-steps: per-run sums over {iterations} iterations, "
                                                f"mean over {seeds}; the others: mean ± std over {seeds}"}
    for r in summary.itertuples():
        out[f"{r.method}, {r.optimizer}: changed entries of frozen G / D / gated part (count of entry-steps); classes "
            f"seen (of 10); coverage entropy (0–1); judge confidence (0–1)"] = (
            f"{r.g_changed_entries_in_d_step:,.0f} / {r.d_changed_entries_in_g_step:,.0f} / "
            f"{r.gated_changed_entries:,.0f}; "
            f"{format_mean_std(r.classes_seen_mean, r.classes_seen_std, 2, d['classes_seen'])}; "
            f"{format_mean_std(r.coverage_entropy_mean, r.coverage_entropy_std, 2, d['coverage_entropy'])}; "
            f"{format_mean_std(r.confidence_mean, r.confidence_std, 2, d['confidence'])}")
    for name in dict.fromkeys(summary["optimizer"]):
        rows = summary[summary["optimizer"] == name]
        out[f"time per iteration under {name} (ms): " + " / ".join(rows["method"])] = " / ".join(
            format_mean_std(r.time_per_iteration_ms_mean, r.time_per_iteration_ms_std, 2,
                            d["time_per_iteration_ms"]) for r in rows.itertuples())
    return out


METRIC_KINDS = {
    "config": "constant", "freezing_version": "constant", "data_source": "constant", "network_sizes": "constant",
    "trained": "constant",
    "on_page_step": "count", "runs/**/single_class_runs": "count", "random_gates_single_class_runs": "count",
    "random_gates_runs": "count", "random_gates/runs_all": "count", "classifier_test_accuracy": "accuracy",
    "d_loss_check/*": "count", "confidence": "constant", "gate_contrast/*/seeds": "constant",
    "runs/**/time_per_iteration_ms": "timing", "runs/**/time_per_iteration_ms_std": "timing_spread",
    "duration_s": "timing",
    "unknown_variable_trap[*]/outcome": "message",
    "decimals/time_per_iteration_ms": "timing_verdict",
}
"""What each value of study 03's ``metrics.json`` is (``study.report.kinds``); the rest are measured values."""
