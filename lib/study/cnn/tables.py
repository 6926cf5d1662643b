"""Study 02: the summaries over seeds, the display tables and the SUMMARY.md headline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from study.cnn.finetune import FINETUNE_RUN_COLUMNS
from study.cnn.masks import STEP_COLUMNS, run_keys
from study.cnn.setup import CnnStudyConfig  # noqa: F401
from study.intervals import CONFIDENCE, t_interval
from study.report.prose import TIMING_TOLERANCE, pm, signed
from study.report.reporting import column_decimals, common_decimals, count_range, format_count, format_mean_std

# -- summaries ----------------------------------------------------------------------------------------
FINETUNE_SUMMARY_COLUMNS = {
    "optimizer": FINETUNE_RUN_COLUMNS["optimizer"],
    "method": FINETUNE_RUN_COLUMNS["method"],
    **{f"{value}_{stat}": f"{'mean' if stat == 'mean' else 'standard deviation'} over seeds of {value}: "
       f"{FINETUNE_RUN_COLUMNS[value]}"
       for value in ("acc_new", "acc_old", "conv_max_abs_delta", "conv_changed_entries", "step_time_ms")
       for stat in ("mean", "std")},
    **{f"conv_changed_entries_{stat}": f"{stat}imum over seeds of conv_changed_entries: "
       f"{FINETUNE_RUN_COLUMNS['conv_changed_entries']}" for stat in ("min", "max")},
    "seeds": "number of seeds (runs) averaged (count)",
}


def finetune_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per optimizer x method. ``finetune_summary(finetune_study(cfg, data))``"""
    values = ("acc_new", "acc_old", "conv_max_abs_delta", "conv_changed_entries", "step_time_ms")
    aggs = {f"{v}_{stat}": (v, stat) for v in values for stat in ("mean", "std")}
    aggs.update({f"conv_changed_entries_{stat}": ("conv_changed_entries", stat) for stat in ("min", "max")})
    return rows.groupby(["optimizer", "method"], sort=False).agg(**aggs, seeds=("seed", "nunique")).reset_index()


_RUN_VALUES = {
    "accuracy": "test accuracy after the last step (fraction of the first eval_samples test images, 0-1)",
    "frozen_changed_total": "frozen entries changed, summed over all steps of the run (count of entry-steps)",
    "frozen_entries_total": "entries frozen, summed over all steps of the run (count of entry-steps)",
    "frozen_max_abs_delta": "max over the run's steps of the max |ΔW| of an entry frozen in that step (weight units)",
    "step_time_ms": "median wall time of one step, step 1 (tracing) left out (ms)",
}
MASKED_SUMMARY_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "method": STEP_COLUMNS["method"],
    "p": STEP_COLUMNS["p"],
    **{f"{value}_{stat}": f"{'mean' if stat == 'mean' else 'standard deviation'} over seeds of: {text}"
       for value, text in _RUN_VALUES.items() for stat in ("mean", "std")},
    "seeds": "number of seeds (runs) averaged (count)",
}


def masked_runs(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a steps table: final accuracy, frozen
    entries changed over all steps, worst |ΔW|, step time."""
    keys = run_keys(table)
    if table.empty:
        return pd.DataFrame(columns=[*keys, *_RUN_VALUES])
    runs = table.groupby(keys, sort=False, dropna=False)  # rows are in step order within each run
    later = table[table["step"] > 1].groupby(keys, sort=False, dropna=False)["step_time_ms"].median()
    out = pd.DataFrame({
        "accuracy": runs["accuracy"].last(),  # last evaluated step, which is always the final step
        "frozen_changed_total": runs["frozen_changed"].sum(),
        "frozen_entries_total": runs["frozen_entries"].sum(),
        "frozen_max_abs_delta": runs["frozen_max_abs_delta"].max(),
        "step_time_ms": later.reindex(runs.size().index).fillna(runs["step_time_ms"].median()),
    })
    if "weights_digest" in table.columns:  # recorded at a run's last step only
        out["weights_digest"] = runs["weights_digest"].last()
    return out.reset_index()


def same_weights(runs: pd.DataFrame, by: Sequence[str]) -> bool | None:
    """Whether, within every group of ``by`` (for instance each seed, or each optimizer and seed), every run ended
    with bit-identical weights (one ``weights_digest``); None where the runs recorded no digest.
    ``same_weights(masked_runs(blocks[blocks["optimizer"] == "sgd"]), ["seed"])``

    >>> runs = pd.DataFrame({"seed": [0, 0, 1, 1], "weights_digest": ["a", "a", "b", "b"]})
    >>> same_weights(runs, ["seed"]), same_weights(runs.assign(weights_digest=["a", "c", "b", "b"]), ["seed"])
    (True, False)
    """
    if "weights_digest" not in runs.columns or runs["weights_digest"].isna().any() or not len(runs):
        return None
    return bool((runs.groupby(list(by))["weights_digest"].nunique() == 1).all())


def masked_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer x method (x p): each run value's mean and std over seeds. ``masked_summary(mask_study(...))``

    Grouping never drops a group (``dropna=False``), and a study without ``p`` (blocks) has no ``p`` column.
    """
    runs = masked_runs(table)
    keys = [k for k in run_keys(table) if k != "seed"]
    aggs = {f"{v}_{stat}": (v, stat) for v in _RUN_VALUES for stat in ("mean", "std")}
    out = runs.groupby(keys, sort=False, dropna=False).agg(**aggs, seeds=("seed", "nunique")).reset_index()
    order = [k for k in ("optimizer", "p", "method") if k in out.columns]  # optimizer, then p, then method
    rank = {k: {v: i for i, v in enumerate(dict.fromkeys(out[k]))} for k in ("optimizer", "method")}
    return out.sort_values(order, key=lambda c: c.map(rank[c.name]) if c.name in rank else c,
                           kind="stable").reset_index(drop=True)


def formatted(table: pd.DataFrame, formats: Mapping[str, str], index: Sequence[str] = ()) -> pd.DataFrame:
    """``table`` with the columns in ``formats`` as text (``"{:+.3f}"``
    style), for display. ``formatted(t, {"a": "{:.1f}"})``"""
    out = table.copy()
    for column, spec in formats.items():
        out[column] = [spec.format(v) if v == v else "" for v in out[column]]
    return out.set_index(list(index)) if index else out


def config_table(config: CnnStudyConfig) -> pd.DataFrame:
    """The resolved parameters, one row each, as text; learning
    rates only of the optimizers used. ``config_table(cfg)``"""
    values = config.plain()
    used = {*config.finetune_optimizers, *config.mask_optimizers, *config.block_optimizers}
    values["learning_rates"] = {k: v for k, v in config.learning_rates.items() if k in used}

    def text(v: Any) -> str:
        if v is None:
            return "—"  # not used: the default (bundled digits, all of them, no download)
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, dict):
            return ", ".join(f"{k} {x:g}" for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
        return f"{v:,}" if isinstance(v, int) else str(v)

    return pd.DataFrame({"value": [text(v) for v in values.values()]}, index=pd.Index(list(values), name="parameter"))


def workload(config: CnnStudyConfig) -> pd.DataFrame:
    """Training runs and steps of each experiment: the work the study does, whatever the machine. ``workload(cfg)``"""
    n = len(config.seeds)
    rows = [("pretraining (fit, digits 0-4)", len(config.finetune_optimizers) * n, config.pretrain_steps),
            ("1. fine-tuning", len(config.finetune_optimizers) * len(config.finetune_methods) * n,
             config.finetune_steps),
            ("2. per-element masks", len(config.mask_optimizers) * len(config.mask_methods) * len(config.p_values) * n,
             config.mask_steps),
            ("3. blocks", len(config.block_optimizers) * len(config.mask_methods) * n, config.block_steps)]
    table = pd.DataFrame(rows, columns=["experiment", "runs", "steps per run"])
    table["steps"] = table["runs"] * table["steps per run"]
    total = pd.DataFrame([{"experiment": "total", "runs": table["runs"].sum(), "steps per run": "—",
                           "steps": table["steps"].sum()}])
    out = pd.concat([table, total], ignore_index=True).set_index("experiment")
    return out.map(lambda v: f"{v:,}" if isinstance(v, (int, np.integer)) else v)


def _paired_columns(first: str, second: str) -> dict[str, str]:
    return {
        f"{first} minus {second}": f"{first} minus {second} in final test accuracy, mean over seeds of each seed's "
                                   "difference (fraction, -1 to 1)",
        f"{first} minus {second} interval low": f"lower end of the {CONFIDENCE:.0%} Student-t interval of that "
                                                "difference, paired by seed (fraction; empty with fewer than 2 seeds)",
        f"{first} minus {second} interval high": "upper end of the same interval (fraction; empty with fewer than 2 "
                                                 "seeds)",
        "seeds": f"seeds run with both {first} and {second} (count)",
        f"seeds {first} higher": f"seeds in which {first} ended more accurate than {second} (count)",
        f"seeds {first} lower": f"seeds in which {first} ended less accurate than {second} (count)",
        "differs": "whether the interval leaves out zero (empty with fewer than 2 seeds)",
    }


def paired_contrast(steps: pd.DataFrame, first: str, second: str) -> pd.DataFrame:
    """Final accuracy of method ``first`` minus ``second`` per optimizer (and p), paired by seed (both start from
    the seed's weights and see its batches and masks): the mean difference, its ``CONFIDENCE`` Student-t interval,
    how many seeds went each way, and whether the interval leaves out zero. ``paired_contrast(steps, "hold", "reset")``
    """
    runs = masked_runs(steps)
    index = [k for k in ("optimizer", "p") if k in runs.columns]
    columns = [*index, *_paired_columns(first, second)]
    if not {first, second} <= set(runs["method"]):
        return pd.DataFrame(columns=columns)
    paired = runs.pivot_table(index=[*index, "seed"], columns="method", values="accuracy").dropna(
        subset=[first, second])
    rows = []
    for key, group in paired.groupby(level=index, sort=False):
        diff = group[first] - group[second]
        mean, low, high = t_interval(diff)
        rows.append(dict(zip(columns, [*(key if isinstance(key, tuple) else (key,)), mean, low, high, int(len(diff)),
                                       int((diff > 0).sum()), int((diff < 0).sum()),
                                       None if len(diff) < 2 else bool(low > 0 or high < 0)])))
    return pd.DataFrame(rows, columns=columns)


def pooled_over_p(steps: pd.DataFrame, first: str, second: str) -> dict[str, dict[str, float]]:
    """Per optimizer, ``first`` minus ``second`` in final accuracy averaged over every p within each seed, and the
    ``CONFIDENCE`` Student-t interval over seeds of those averages: one value per seed, since a seed's runs at
    different p share its weights and batches and are not independent. ``pooled_over_p(steps, "hold", "reset")``"""
    runs = masked_runs(steps)
    paired = runs.pivot_table(index=["optimizer", "seed", "p"], columns="method", values="accuracy")
    if not {first, second} <= set(paired.columns):
        return {}
    per_seed = (paired[first] - paired[second]).groupby(level=["optimizer", "seed"], sort=False).mean()
    out = {}
    for optimizer, values in per_seed.groupby(level="optimizer", sort=False):
        mean, low, high = t_interval(values)
        out[str(optimizer)] = {"mean": mean, "low": low, "high": high, "seeds": int(len(values)),
                               "seed_min": float(values.min()), "seed_max": float(values.max())}
    return out


HOLD_VS_RESET_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "p": STEP_COLUMNS["p"],
    "hold": "final test accuracy with policy hold, mean over seeds (fraction, 0-1)",
    "reset": "final test accuracy with policy reset, mean over seeds (fraction, 0-1)",
    **_paired_columns("hold", "reset"),
}


def hold_vs_reset(steps: pd.DataFrame) -> pd.DataFrame:
    """Accuracy of hold and reset per optimizer and p, with ``paired_contrast(steps, "hold", "reset")``.
    ``hold_vs_reset(mask_study(cfg, data))``"""
    summary = masked_summary(steps)
    index = [k for k in ("optimizer", "p") if k in summary.columns]
    contrast = paired_contrast(steps, "hold", "reset")
    columns = [*index, *[c for c in HOLD_VS_RESET_COLUMNS if c not in ("optimizer", "p")]]
    if contrast.empty:
        return pd.DataFrame(columns=columns)
    means = summary.pivot_table(index=index, columns="method", values="accuracy_mean")[["hold", "reset"]]
    return contrast.merge(means.reset_index(), on=index)[columns]


def _interval_text(low: float, high: float, decimals: int) -> str:
    """``low to high``, each rounded outward (low toward -inf, high toward +inf); "—" where not measured."""
    if low != low:
        return "—"
    return f"{signed(low, decimals=decimals, rounding='floor')} to {signed(high, decimals=decimals, rounding='ceil')}"


def hold_vs_reset_display(contrast: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """``hold_vs_reset``'s table as the report shows it: the interval as "low to high" (rounded outward),
    ``differs`` as yes / no (— with one seed).

    Accuracies, their difference and the interval at the decimals the summary's accuracy column is shown with
    (``column_decimals(summary)``), so that a mean prints here as in the summary table; three without ``summary``.
    """
    decimals = (column_decimals(summary, ["accuracy"])["accuracy"] if summary is not None else None)
    decimals = 3 if decimals is None else decimals
    out = contrast[[k for k in ("optimizer", "p") if k in contrast.columns]].copy()
    if "p" in out.columns:
        out["p"] = [f"{p:g}" for p in out["p"]]
    for column in ("hold", "reset"):
        out[column] = [f"{v:.{decimals}f}" for v in contrast[column]]
    out["hold − reset"] = [signed(v, decimals=decimals) for v in contrast["hold minus reset"]]
    out[f"{CONFIDENCE:.0%} interval (paired by seed)"] = [
        _interval_text(low, high, decimals)
        for low, high in zip(contrast["hold minus reset interval low"], contrast["hold minus reset interval high"])]
    out["seeds hold higher"] = [f"{h} of {n}" for h, n in zip(contrast["seeds hold higher"], contrast["seeds"])]
    out["differs (interval leaves out 0)"] = ["—" if d is None or d != d else ("yes" if d else "no")
                                              for d in contrast["differs"]]
    return out.set_index([k for k in ("optimizer", "p") if k in contrast.columns])


NAIVE_VS_EXACT_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "p": STEP_COLUMNS["p"],
    "naive accuracy mean": "final test accuracy of the naive mask, mean over seeds (fraction, 0-1)",
    "naive accuracy std": "final test accuracy of the naive mask, standard deviation over seeds (fraction)",
    "hold accuracy mean": "final test accuracy with MaskedOptimizer(hold), mean over seeds (fraction, 0-1)",
    "hold accuracy std": "final test accuracy with MaskedOptimizer(hold), standard deviation over seeds (fraction)",
    **{k: v for k, v in _paired_columns("naive", "hold").items() if k != "differs"},
    "share of frozen entry-steps the naive mask moved": "frozen entries changed / entries frozen, each summed over "
                                                        "all steps (fraction of entry-steps, 0-1; mean over seeds)",
    "naive median step time (ms)": "median wall time of one naive step, mean over seeds (ms)",
    "hold median step time (ms)": "median wall time of one hold step, mean over seeds (ms)",
}


def naive_vs_exact(steps: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer and p: what the drifting naive mask gains in accuracy (paired by seed, with its interval), how
    much it moved, what exactness costs.

    ``naive_vs_exact(mask_study(cfg, data))``; columns as ``NAIVE_VS_EXACT_COLUMNS``.
    """
    summary = masked_summary(steps)
    index = [k for k in ("optimizer", "p") if k in summary.columns]
    contrast = paired_contrast(steps, "naive", "hold").set_index(index) if not summary.empty else None
    rows = []
    for key, group in summary.groupby(index, sort=False, dropna=False):
        by = group.set_index("method")
        if not {"naive", "hold"} <= set(by.index):
            continue
        naive, hold = by.loc["naive"], by.loc["hold"]
        paired = contrast.loc[key]
        row = dict(zip(index, key if isinstance(key, tuple) else (key,)))
        row.update({
            "naive accuracy mean": naive["accuracy_mean"], "naive accuracy std": naive["accuracy_std"],
            "hold accuracy mean": hold["accuracy_mean"], "hold accuracy std": hold["accuracy_std"],
            **{c: paired[c] for c in _paired_columns("naive", "hold") if c != "differs"},
            "share of frozen entry-steps the naive mask moved": naive["frozen_changed_total_mean"]
            / max(naive["frozen_entries_total_mean"], 1.0),
            "naive median step time (ms)": naive["step_time_ms_mean"],
            "hold median step time (ms)": hold["step_time_ms_mean"],
        })
        rows.append(row)
    return pd.DataFrame(rows, columns=[*index, *list(NAIVE_VS_EXACT_COLUMNS)[2:]])


def naive_vs_exact_display(trade: pd.DataFrame, summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """``naive_vs_exact``'s table as the report shows it: accuracies as mean ± std, the share as a percentage.

    Accuracies (and their difference) and step times at the decimals the summary table's columns are shown with
    (``column_decimals(summary)``), so that the same mean prints the same in both tables; without ``summary``, one
    precision per column of this table.
    """
    out = trade[[k for k in ("optimizer", "p") if k in trade.columns]].copy()
    if "p" in out.columns:
        out["p"] = [f"{p:g}" for p in out["p"]]
    if summary is not None:
        decimals = column_decimals(summary, ["accuracy", "step_time_ms"])
        acc, time = decimals["accuracy"], decimals["step_time_ms"]
    else:
        acc = common_decimals([*trade["naive accuracy mean"], *trade["hold accuracy mean"]],
                              [*trade["naive accuracy std"], *trade["hold accuracy std"]])
        time = None
    for method in ("naive", "hold"):
        out[f"{method} accuracy (mean ± std)"] = [
            pm(m, s, decimals=acc) for m, s in zip(trade[f"{method} accuracy mean"], trade[f"{method} accuracy std"])]
    out["naive minus hold"] = [signed(v, decimals=3 if acc is None else acc) for v in trade["naive minus hold"]]
    out[f"{CONFIDENCE:.0%} interval (paired by seed)"] = [
        _interval_text(low, high, 3 if acc is None else acc)
        for low, high in zip(trade["naive minus hold interval low"], trade["naive minus hold interval high"])]
    out["seeds naive higher"] = [f"{h} of {n}" for h, n in zip(trade["seeds naive higher"], trade["seeds"])]
    out["share of frozen entry-steps the naive mask moved"] = [
        f"{v:.0%}" for v in trade["share of frozen entry-steps the naive mask moved"]]
    for method in ("naive", "hold"):
        out[f"{method} median step time (ms)"] = [f"{v:.{1 if time is None else time}f}"
                                                  for v in trade[f"{method} median step time (ms)"]]
    return out.set_index([k for k in ("optimizer", "p") if k in trade.columns])


def _slowest(times: pd.DataFrame, tolerance: float) -> pd.Series:
    """Per row of ``times`` (one column per method), the method slower than every other by more than ``tolerance``
    (its time over the next slowest's above ``1 + tolerance``), or "" where the two slowest are within it."""
    ordered = np.sort(times.to_numpy(dtype=float), axis=1)
    clear = ordered[:, -1] > (1 + tolerance) * ordered[:, -2] if times.shape[1] > 1 else np.ones(len(times), bool)
    return pd.Series(np.where(clear, times.idxmax(axis=1), ""), index=times.index)


def step_times(steps: pd.DataFrame, tolerance: float = TIMING_TOLERANCE) -> dict[str, Any]:
    """Each method's step time over its runs (each run's median step, ``masked_runs``), and which method was the
    slowest, run by run and in the means over seeds, by more than ``tolerance`` (``prose.TIMING_TOLERANCE``).

    ``methods``: per method, the mean and std over its runs (every seed and p) and how many runs; ``slowest_runs``:
    per method, in how many of the ``pairs`` (optimizer, seed, p) it was slower than every other method by more
    than ``tolerance``; ``about_equal_runs``: the pairs where the two slowest were within it;
    ``slowest_every_mean``: the method whose mean over seeds is the largest, by more than ``tolerance``, at every
    (optimizer, p) of the summary table, or "" where none is. ``step_times(mask_study(cfg, data))``
    """
    runs = masked_runs(steps)
    keys = [k for k in run_keys(steps) if k != "method"]
    times = runs.groupby("method", sort=False)["step_time_ms"]
    methods = {m: {"mean": float(t.mean()), "std": float(t.std()), "runs": int(t.size)} for m, t in times}
    pairs = _slowest(runs.pivot_table(index=keys, columns="method", values="step_time_ms"), tolerance)
    means = _slowest(runs.pivot_table(index=[k for k in keys if k != "seed"], columns="method",
                                      values="step_time_ms", aggfunc="mean"), tolerance)
    return {"methods": methods, "slowest_runs": {m: int((pairs == m).sum()) for m in methods},
            "about_equal_runs": int((pairs == "").sum()), "pairs": int(len(pairs)), "tolerance": tolerance,
            "slowest_every_mean": str(means.iloc[0]) if means.nunique() == 1 and means.iloc[0] else ""}


def headline(config: CnnStudyConfig, finetune: pd.DataFrame, traps: pd.DataFrame, masks: pd.DataFrame,
             blocks: pd.DataFrame, source: str, mask_times: Mapping[str, Any] | None = None,
             mask_steps: pd.DataFrame | None = None, block_steps: pd.DataFrame | None = None) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows: every section, every optimizer and method, mean ± std over seeds.

    ``headline(cfg, finetune_summary(f), traps, masked_summary(m), masked_summary(b), data.source, step_times(m))``
    (``mask_times``: the masks' step times as the prose quotes them; ``mask_steps``, ``block_steps``: the steps
    tables, for each comparison of two methods paired by seed with its interval). Keys name their units; step
    times sit under keys containing "time" (left out when reruns are compared).
    """
    seeds = len(config.seeds)
    out = {"data": source, "seeds per row": str(seeds),
           "test accuracy below is measured on": f"the first {config.eval_samples:,} test images (of digits 5-9 in "
                                                 "fine-tuning)"}
    acc = common_decimals(list(finetune["acc_new_mean"]), list(finetune["acc_new_std"]))
    for r in finetune.itertuples():
        out[f"fine-tune {r.optimizer}/{r.method}: test accuracy on digits 5-9 (fraction) / "
            f"frozen conv entries changed at the end (count, range over seeds)"] = (
            f"{format_mean_std(r.acc_new_mean, r.acc_new_std, decimals=acc)} / "
            f"{count_range(r.conv_changed_entries_min, r.conv_changed_entries_max)}")
    for name, group in finetune.groupby("optimizer", sort=False):
        step = column_decimals(finetune, ["step_time_ms"])["step_time_ms"]  # as the report's table shows them
        out[f"fine-tune {name}: median step time of a run (ms, mean ± std over seeds), "
            + " / ".join(group["method"])] = \
            " / ".join(format_mean_std(t, sd, decimals=step)
                       for t, sd in zip(group["step_time_ms_mean"], group["step_time_ms_std"]))
    if len(traps):
        wrong = int(((traps["trained"] == True) & (traps["layer 'a' should"] == "stay")).sum()  # noqa: E712
                    + ((traps["trained"] == False) & (traps["layer 'a' should"] == "train")).sum()  # noqa: E712
                    + (traps["error"] != "").sum())
        out[f"Keras trainable traps: scenarios that did not do what the flag says (of {len(traps)})"] = str(wrong)
    acc = common_decimals(list(masks["accuracy_mean"]), list(masks["accuracy_std"])) if len(masks) else None
    for r in masks.itertuples():
        out[f"masks p={r.p:g} {r.optimizer}/{r.method}: final test accuracy (fraction) / frozen entries "
            f"changed, summed over {config.mask_steps} steps (count of entry-steps)"] = (
            f"{format_mean_std(r.accuracy_mean, r.accuracy_std, decimals=acc)} / "
            f"{format_count(r.frozen_changed_total_mean, r.frozen_changed_total_std)}")
    for name, group in masks.groupby("optimizer", sort=False):
        methods = list(dict.fromkeys(group["method"]))
        if mask_times is not None and len(masks["optimizer"].unique()) == 1:  # as the prose quotes them
            t = mask_times["methods"]
            step = column_decimals(masks, ["step_time_ms"])["step_time_ms"]  # as the prose quotes them
            out[f"masks {name}: median step time of a run (ms; mean ± std over every seed and p), "
                + " / ".join(methods)] = \
                " / ".join(format_mean_std(t[m]["mean"], t[m]["std"], decimals=step) for m in methods)
        else:
            times = group.groupby("method", sort=False)["step_time_ms_mean"].agg(["mean", "std"])
            out[f"masks {name}: step time (ms; mean ± std over the p's of each p's mean over seeds), "
                + " / ".join(methods)] = " / ".join(format_mean_std(times.loc[m, "mean"], times.loc[m, "std"])
                                                    for m in methods)
    decimals = {"masks": acc}  # each section's accuracy decimals, for its paired differences below
    acc = decimals["blocks"] = (common_decimals(list(blocks["accuracy_mean"]), list(blocks["accuracy_std"]))
                                if len(blocks) else None)
    for r in blocks.itertuples():
        out[f"blocks {r.optimizer}/{r.method}: final test accuracy (fraction) / resting entries changed, "
            f"summed over {config.block_steps} steps (count of entry-steps)"] = (
            f"{format_mean_std(r.accuracy_mean, r.accuracy_std, decimals=acc)} / "
            f"{format_count(r.frozen_changed_total_mean, r.frozen_changed_total_std)}")
    for name, steps, pairs in (("masks", mask_steps, (("naive", "hold"), ("hold", "reset"))),
                               ("blocks", block_steps, (("hold", "naive"), ("reset", "naive")))):
        for first, second in pairs if steps is not None else ():
            for r in paired_contrast(steps, first, second).to_dict("records"):
                where = name + (f" p={r['p']:g}" if "p" in r else "") + f" {r['optimizer']}"
                low, high = r[f"{first} minus {second} interval low"], r[f"{first} minus {second} interval high"]
                tied = r[f"seeds {first} higher"] == r[f"seeds {first} lower"] == 0
                verdict = ("identical in every seed" if tied else "—" if low != low
                           else "holds zero: no verdict" if low <= 0 <= high else "leaves out zero")
                d = decimals[name] or 3
                out[f"{where}: {first} minus {second}, final test accuracy (mean over seeds; {CONFIDENCE:.0%} "
                    f"interval, paired by seed)"] = (f"{signed(r[f'{first} minus {second}'], decimals=d)} "
                                                     f"({_interval_text(low, high, d)}; {verdict})")
    return out


METRIC_KINDS = {
    "config": "constant", "parameters": "constant", "conv_entries": "constant", "fc1_entries": "constant",
    "cpu_count": "constant", "data_sizes": "constant", "freezing_version": "constant", "data_source": "constant",
    "finetune_full": "constant", "blocks_full": "constant", "blocks_late_steps": "constant",
    "one_step_gate/share": "value", "one_step_gate": "count", "one_step_masked_moment_nonzero": "count",
    "finetune_gate_changed_min": "count", "finetune_gate_changed_max": "count",
    "finetune_exact_changed_entries": "count", "fixed_policies_changed_entries": "count",
    "finetune_acc_old_max": "accuracy", "finetune/**/acc_*": "accuracy", "masks/**/accuracy_*": "accuracy",
    "blocks/**/accuracy_*": "accuracy",
    "finetune/**/step_time_ms_std": "timing_spread", "finetune/**/step_time_ms_mean": "timing",
    "masks/**/step_time_ms_mean": "timing",
    "blocks/**/step_time_ms_mean": "timing", "duration_s": "timing",
    "finetune_gate_time_ratio": "timing_ratio", "finetune_masked_time_ratio": "timing_ratio",
    "finetune_skip_time_ratio/*/median": "timing_ratio", "finetune_skip_time_ratio/*/seeds": "constant",
    "finetune_skip_time_ratio": "timing_spread",
    "finetune_time_ratio_seeds/*/*_slower": "timing_verdict",
    "finetune_time_ratio_seeds/*/*_side": "timing_verdict", "finetune_time_ratio_seeds/*/seeds": "constant",
    "finetune_time_ratio_seeds/*/*_median": "timing_ratio",
    "finetune_time_ratio_seeds": "timing_spread", "timing_tolerance": "constant", "confidence": "constant",
    "keras_traps[*]/error": "message",
    "finetune_trap_changed": "count",
    "decimals/*/step_time_ms": "timing_verdict",
    "mask_step_times/methods/*/mean": "timing", "mask_step_times/methods/*/std": "timing_spread",
    "mask_step_times/methods/*/runs": "constant", "mask_step_times/pairs": "constant",
    "mask_step_times/slowest_runs": "timing_verdict", "mask_step_times/slowest_every_mean": "timing_verdict",
    "mask_step_times/about_equal_runs": "timing_verdict", "mask_step_times/tolerance": "constant",
}
"""What each value of study 02's ``metrics.json`` is (``study.report.kinds``); the rest are measured values."""


def time_ratios(finetune: pd.DataFrame, optimizers: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per optimizer, each seed's step-time ratios ``gate`` / ``var_list``, ``masked_hold`` / ``var_list`` and
    ``masked_hold`` / ``gate`` (each run's median step time; the methods run in turn within a seed), as their range
    over seeds (and the first two's median over seeds, ``gate_median``/``masked_median``), and which way the first
    two go (``gate_side``, ``masked_side``: ``study.report.prose.timing_side``, "slower"/"faster" only when every
    seed agrees by more than its tolerance, else "about equal"), and the third's (``masked_vs_gate_side``) by the
    same rule: one run's verdict, which for these two has flipped between reruns on this machine even with every seed
    beyond the tolerance (the report says so).
    """
    from study.report.prose import timing_side

    times = finetune.pivot_table(index=["optimizer", "seed"], columns="method", values="step_time_ms")
    out: dict[str, dict[str, Any]] = {}
    for o in optimizers:
        if o not in times.index.get_level_values(0) or not {"gate", "masked_hold", "var_list"} <= set(times.columns):
            continue
        t = times.loc[o]
        gate, masked = t["gate"] / t["var_list"], t["masked_hold"] / t["var_list"]
        versus = t["masked_hold"] / t["gate"]
        out[o] = {"seeds": int(len(t)), "gate_median": float(gate.median()), "masked_median": float(masked.median()),
                  "gate_min": float(gate.min()), "gate_max": float(gate.max()),
                  "masked_min": float(masked.min()), "masked_max": float(masked.max()),
                  "masked_vs_gate_min": float(versus.min()), "masked_vs_gate_max": float(versus.max()),
                  "gate_side": timing_side(gate.min(), gate.max()),
                  "masked_side": timing_side(masked.min(), masked.max()),
                  "masked_vs_gate_side": timing_side(versus.min(), versus.max())}
    return out


def run_contrast(runs: pd.DataFrame, first: str, second: str, value: str = "acc_new") -> dict[str, dict[str, Any]]:
    """Per optimizer, ``value`` of method ``first`` minus ``second``, paired by seed, from a table with one row per
    run (columns optimizer, method, seed and ``value``): the mean, its ``CONFIDENCE`` Student-t interval, the seeds,
    how many went each way, and whether every seed's difference is exactly zero.
    ``run_contrast(finetune_study(cfg, data), "gate", "masked_hold")``; ``run_contrast(late_means(blocks, 20),
    "naive", "hold", "loss")``

    >>> runs = pd.DataFrame({"optimizer": ["adam"] * 4, "method": ["a", "b", "a", "b"], "seed": [0, 0, 1, 1],
    ...                      "loss": [1.0, 1.5, 1.2, 1.4]})
    >>> c = run_contrast(runs, "a", "b", "loss")["adam"]
    >>> round(c["mean"], 2), c["seeds"], c["higher"], c["lower"], c["identical"]
    (-0.35, 2, 0, 2, False)
    """
    table = runs.pivot_table(index=["optimizer", "seed"], columns="method", values=value)
    out: dict[str, dict[str, Any]] = {}
    if not {first, second} <= set(table.columns):
        return out
    for optimizer, t in table.groupby(level="optimizer", sort=False):
        diff = (t[first] - t[second]).dropna()
        mean, low, high = t_interval(diff)
        out[str(optimizer)] = {"mean": mean, "low": low, "high": high, "seeds": int(len(diff)),
                               "higher": int((diff > 0).sum()), "lower": int((diff < 0).sum()),
                               "identical": bool((diff == 0).all())}
    return out


def late_means(steps: pd.DataFrame, after: int, value: str = "loss") -> pd.DataFrame:
    """One row per run (optimizer, method, seed): the mean of ``value`` over the steps after ``after``, for
    ``run_contrast``. ``late_means(block_study(cfg, data), 20)``"""
    late = steps[steps["step"] > after]
    return late.groupby(["optimizer", "method", "seed"], sort=False)[value].mean().reset_index()
