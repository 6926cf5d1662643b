"""Figures of study 05 (the recipes): one function per figure, each returning a matplotlib Figure.

Bars and points are means over seeds with ±1 standard deviation as error bars; counts of moved entries
are printed on the bars, since zero is the number that matters and a log axis cannot show it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from study.recipes.labels import method_label

COLOURS = {"gradient_mask": "tab:red", "naive_gate": "tab:red", "constraint": "tab:orange", "exact": "tab:green",
           "mask_schedule": "tab:green", "skip_frozen": "tab:cyan", "recompile_fresh": "tab:blue",
           "recompile_same": "tab:gray",
           "trainable_flip": "tab:red", "full": "tab:blue", "last_layer": "tab:purple", "sparse": "tab:green",
           "sparse_state": "tab:olive", "lora": "tab:brown"}


def _tick(method: str) -> str:
    """A label broken over two lines, for crowded tick labels."""
    words = method_label(method).split(" ")
    half = (len(words) + 1) // 2
    return " ".join(words[:half]) + ("\n" + " ".join(words[half:]) if words[half:] else "")


def _bar_counts(ax: plt.Axes, xs: Sequence[float], counts: Sequence[float], of: Sequence[float] | None = None) -> None:
    counts = [float(c) for c in counts]
    of = None if of is None else [float(o) for o in of]
    top = max(counts + [1.0])
    for i, (x, c) in enumerate(zip(xs, counts)):
        text = f"{c:,.0f}" + (f"\nof {of[i]:,.0f}" if of is not None else "")
        ax.text(x, float(c) + 0.02 * top, text, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, top * 1.35)


def new_columns(runs: pd.DataFrame) -> plt.Figure:
    """Recipe 1: accuracies on old and new digits, and old entries that moved, per method. ``new_columns(r1.runs)``"""
    methods = list(dict.fromkeys(runs["method"]))
    g = runs.groupby("method", sort=False)
    mean, std = g.mean(numeric_only=True).reindex(methods), g.std(numeric_only=True).reindex(methods).fillna(0)
    fig, (acc_ax, moved_ax) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    bars = [("acc_new", "new digits 5-9 (10-way)"), ("acc_old", "old digits 0-4 (10-way)"),
            ("acc_old_among_old", "old digits 0-4, among old classes")]
    width = 0.8 / len(bars)
    for j, (col, label) in enumerate(bars):
        xs = np.arange(len(methods)) + (j - (len(bars) - 1) / 2) * width
        acc_ax.bar(xs, mean[col], width, yerr=std[col], label=label, color=plt.get_cmap("Blues")(0.4 + 0.25 * j))
    acc_ax.set_xticks(range(len(methods)), [_tick(m) for m in methods])
    acc_ax.set(ylabel="test accuracy (fraction)", ylim=(0, 1.3), yticks=np.arange(0, 1.01, 0.2),
               title="Accuracy after training the new columns")
    acc_ax.legend(fontsize=8, loc="upper center", ncol=2)
    xs = np.arange(len(methods))
    moved_ax.bar(xs, mean["old_moved"], color=[COLOURS.get(m) for m in methods])
    _bar_counts(moved_ax, xs, mean["old_moved"], mean["old_entries"])
    moved_ax.set_xticks(xs, [_tick(m) for m in methods])
    moved_ax.set(ylabel="old entries changed (count, mean over seeds)", title="Old columns that moved (bitwise)")
    fig.tight_layout()
    return fig


def pruning(runs: pd.DataFrame) -> plt.Figure:
    """Recipe 2: fc1 sparsity at the end and accuracy after fine-tuning
    vs target sparsity, per optimizer. ``pruning(r2.runs)``"""
    optimizers = list(dict.fromkeys(runs["optimizer"]))
    fig, axes = plt.subplots(2, len(optimizers), figsize=(5.2 * len(optimizers), 7), squeeze=False, sharex=True)
    for col, name in enumerate(optimizers):
        rows = runs[runs["optimizer"] == name]
        top, bottom = axes[0, col], axes[1, col]
        targets = sorted(rows["sparsity"].unique())
        top.plot(100 * np.array(targets), 100 * np.array(targets), "k--", lw=1.2, zorder=5,
                 label="target")  # drawn over the points that reach it, so that it stays visible
        for k, (method, g) in enumerate(rows.groupby("method", sort=False)):
            s = g.groupby("sparsity")
            x = 100 * np.array(targets) + 0.8 * (k - 1)  # side by side: identical results would hide each other
            label = method_label(method)
            top.errorbar(x, 100 * s["sparsity_kept"].mean().reindex(targets),
                         yerr=100 * s["sparsity_kept"].std().reindex(targets).fillna(0), marker="o",
                         color=COLOURS.get(method), label=label, capsize=3)
            bottom.errorbar(x, s["acc_finetuned"].mean().reindex(targets),
                            yerr=s["acc_finetuned"].std().reindex(targets).fillna(0), marker="o",
                            color=COLOURS.get(method), label=label, capsize=3, alpha=0.8)
        pruned = rows.groupby("sparsity")["acc_pruned"]
        bottom.errorbar(100 * np.array(targets), pruned.mean().reindex(targets),
                        yerr=pruned.std().reindex(targets).fillna(0),
                        color="0.5", ls="--", marker="x", label="just pruned (before fine-tuning)", capsize=3)
        top.set(ylabel="fc1 entries exactly zero at the end (%)",
                title=f"{name}: sparsity kept\n(markers offset sideways to avoid overlap)",
                ylim=(-5, 100))
        bottom.set(xlabel="target sparsity of fc1 (%)", ylabel="test accuracy (fraction)",
                   title=f"{name}: accuracy after fine-tuning\n({_noise_note(rows, 'acc_finetuned')})")
        bottom.title.set_fontsize(10)
    legend = {}  # one legend for all panels, below them: inside a panel it covered the error bars
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=len(legend), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _noise_note(rows: pd.DataFrame, column: str) -> str:
    """Whether the methods' means of ``column`` differ by less than one standard deviation over seeds, per sparsity."""
    g = rows.groupby(["sparsity", "method"])[column]
    spread = g.mean().groupby(level="sparsity").agg(lambda m: m.max() - m.min())
    noise = g.std().groupby(level="sparsity").max()
    if noise.isna().all():
        return "one seed: no spread to compare with"
    largest = f"{spread.max():.4f}"  # the largest gap itself (a bound rounded up from 0.0080 printed 0.009)
    if (spread < noise).all():
        return f"method means differ by at most {largest}, under 1 std: noise"
    return f"method means differ by at most {largest}; largest std {noise.max():.4f}"


def coinciding(curves: pd.DataFrame, column: str, seed: Any = None) -> list[list[str]]:
    """The groups of methods (labels, two or more) whose ``column`` is the same series, value for value, in the run of
    ``seed`` (default: the first seed): lines a figure draws on top of each other. ``coinciding(curves, "accuracy")``
    """
    seed = curves["seed"].min() if seed is None else seed
    series: dict[tuple, list[str]] = {}
    for method, g in curves[curves["seed"] == seed].groupby("method", sort=False):
        key = tuple(np.nan_to_num(g[column].to_numpy(dtype=float), nan=-1.0).tolist())
        series.setdefault(key, []).append(method_label(method))
    return [names for names in series.values() if len(names) > 1]


def unfreezing(curves: pd.DataFrame, every: int, layers: Sequence[str]) -> plt.Figure:
    """Recipe 3: accuracy per epoch, and the head's Adam momentum across
    stage boundaries. ``unfreezing(r3.extra["curves"], 1, names)``"""
    fig, (acc_ax, mom_ax) = plt.subplots(1, 2, figsize=(12, 4))
    ends = curves[curves["when"] == "end"]
    for method, g in ends.groupby("method", sort=False):
        s = g.groupby("epoch")["accuracy"]
        acc_ax.errorbar(s.mean().index + 1, s.mean(), yerr=s.std().fillna(0), marker="o", capsize=3,
                        color=COLOURS.get(method), label=method_label(method))
    first = curves[curves["seed"] == curves["seed"].min()].copy()
    first["t"] = first["epoch"] + np.where(first["when"] == "end", 1.0, 0.0)
    for method, g in first.groupby("method", sort=False):
        same = method == "recompile_same"  # one stage only (it raises at the next): drawn on top, or it is hidden
        mom_ax.plot(g["t"], g["momentum_norm"], marker="s" if same else ".", ms=7 if same else 6,
                    ls="--" if same else "-", zorder=3 if same else 2, color=COLOURS.get(method),
                    label=method_label(method) + (" (one seed; raised at the next stage)" if same else ""), alpha=0.8)
    stages = len(layers)
    for ax in (acc_ax, mom_ax):
        ax.xaxis.get_major_locator().set_params(integer=True)
        for s in range(1, stages):
            ax.axvline(s * every, color="0.6", ls=":", lw=1)
            ax.text(s * every, 1.0, f"+{layers[stages - 1 - s]}", transform=ax.get_xaxis_transform(),
                    fontsize=8, va="bottom", ha="center", color="0.4")  # above the frame, clear of the legends
    acc_ax.set(xlabel="epochs completed (dotted: a layer is unfrozen)", ylabel="test accuracy on digits 5-9 (fraction)",
               title="Accuracy at the end of each epoch (mean ± std)\n")
    mom_ax.set(xlabel="epoch (points at each epoch's start and end)",
               ylabel="L2 norm of the head kernel's Adam momentum",
               title="Optimizer state across stages (first seed)\n")
    handles, labels = mom_ax.get_legend_handles_labels()  # one legend below both panels: inside, it covered lines
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def sparse(runs: pd.DataFrame) -> plt.Figure:
    """Recipe 4: new-task accuracy against forgetting, and optimizer memory against step time, per variant.
    ``sparse(r4.runs)``

    The sparse state trains the same bits as the dense state, so its points sit on the dense ones in the
    left panel (hollow markers).
    """
    fig, (ax, cost) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.2, 1]})
    budgets = sorted({f for f in runs["fraction"] if f == f})  # sparse budgets, and LoRA ranks: one look each
    ranks = sorted({int(r) for r in runs["lora_rank"] if r == r})
    for (method, variant), g in runs.groupby(["method", "variant"], sort=False):
        share = g["trained_entries"].iloc[0] / g["total_entries"].iloc[0]
        if method == "lora":  # LoRA trains adapters, yet changes nearly every entry: say what the share counts
            rank = int(g["lora_rank"].iloc[0])
            label = (f"LoRA r={rank}: {int(g['trained_entries'].iloc[0]):,} adapter and bias "
                     f"params ({100 * share:.1f}% of model size)")
            colour, marker = _pick(_LORA_LOOKS, ranks.index(rank))
        elif method in ("sparse", "sparse_state"):
            label = f"{method_label(method)}: {100 * share:.1f}% of entries trained"
            colour, marker = _pick(_SPARSE_LOOKS, budgets.index(g["fraction"].iloc[0]))
        else:
            label = f"{method_label(method)}: {100 * share:.1f}% of entries trained"
            colour, marker = COLOURS.get(method), "o"
        style = dict(marker=marker, ms=7 if method != "sparse_state" else 13, capsize=3, color=colour, ls="none")
        if method == "sparse_state":  # on the dense state's point: a hollow ring around it, in the budget's colour
            style.update(mfc="none", mew=1.5)
        std = (lambda c: g[c].std() if len(g) > 1 else 0)
        ax.errorbar(g["forgetting"].mean(), g["acc_new"].mean(), xerr=std("forgetting"), yerr=std("acc_new"),
                    label=label, **style)
        cost.errorbar(g["optimizer_bytes"].mean(), g["step_time_ms"].mean(), yerr=std("step_time_ms"), **style)
    ax.set(xlabel="forgetting: accuracy lost on digits 0-4 (fraction)",
           ylabel="accuracy on digits 5-9 after fine-tuning (fraction)",
           title="Learning vs forgetting (mean ± std)", xlim=(-0.05, 1.05), ylim=(0, 1.05))
    cost.set(xscale="log", xlabel="optimizer state (bytes, log scale)", ylabel="median step time (ms)",
             title="What it costs (mean ± std over seeds)")
    handles, labels = ax.get_legend_handles_labels()  # below both panels: inside, it covered error bars
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 * ((len(labels) + 1) // 2), 1, 1))
    return fig


_SPARSE_LOOKS = [("tab:green", "s"), ("tab:cyan", "D"), ("tab:olive", "p")]  # per sparse budget, smallest first
_LORA_LOOKS = [("tab:brown", "^"), ("tab:red", "v"), ("tab:pink", "<")]     # per LoRA rank, smallest first


def _pick(looks: Sequence[tuple[str, str]], i: int) -> tuple[str, str]:
    """The colour and marker of the ``i``-th budget or rank (the last look repeats beyond the list)."""
    return looks[min(i, len(looks) - 1)]


def subnetwork(steps: pd.DataFrame, runs: pd.DataFrame) -> plt.Figure:
    """Recipe 5: moved frozen entries accumulated over steps, and
    final accuracy, per method. ``subnetwork(steps, runs)``"""
    fig, (moved_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    spreads = []
    for method, g in steps.groupby("method", sort=False):
        for _, one in g.groupby("seed"):  # thin: each seed
            moved_ax.plot(one["step"], one["cumulative_moved"] / 1e6, color=COLOURS.get(method), lw=0.8, alpha=0.6)
        s = g.groupby("step")["cumulative_moved"]
        moved_ax.plot(s.mean().index, s.mean() / 1e6, color=COLOURS.get(method), label=method_label(method) + " (mean)",
                      lw=2)
        last = g[g["step"] == g["step"].max()]["cumulative_moved"]
        if last.mean() > 0 and last.size > 1:
            spreads.append(((last - last.mean()).abs().max() / last.mean(), last.min(), last.max()))
    worst = max(spreads) if spreads else None  # the largest |total - mean| / mean over methods
    # a bound, so rounded up: 0.44% reads "within 0.5%"
    note = "thin lines: each seed" + (
        f";\nseeds' totals within {np.ceil(1000 * worst[0]) / 10:.1f}% of their mean "
        f"({worst[1] / 1e6:.2f}–{worst[2] / 1e6:.2f} M),\nso their lines overlap" if worst else "")
    moved_ax.set(xlabel="training step", ylabel="frozen entry-steps that moved\n(cumulative, millions)",
                 title="Frozen entries that moved, summed over steps")
    moved_ax.legend(fontsize=8, loc="upper left", title=note, title_fontsize=8, alignment="left")
    methods = list(dict.fromkeys(runs["method"]))
    g = runs.groupby("method", sort=False)["accuracy"]
    xs = np.arange(len(methods))
    acc_ax.bar(xs, g.mean().reindex(methods), yerr=g.std().reindex(methods).fillna(0), capsize=4,
               color=[COLOURS.get(m) for m in methods])
    acc_ax.set_xticks(xs, [_tick(m) for m in methods])
    acc_ax.set(ylabel="test accuracy, all digits (fraction)", ylim=(0, 1), title="Accuracy at the end (mean ± std)")
    fig.tight_layout()
    return fig
