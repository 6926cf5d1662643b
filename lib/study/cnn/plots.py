"""Figures of study 02 (``study.cnn``): one function per figure, each returning a matplotlib Figure.

The notebook calls these and ``reporting.save_figure`` writes them with a caption. Drift has one definition
here as everywhere in the study: *changed entries* (bit for bit) and *max |ΔW|*.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from study.report.reporting import column_decimals

METHOD_COLOURS = {"naive": "tab:red", "hold": "tab:green", "reset": "tab:blue", "var_list": "tab:purple",
                  "trainable_recompile": "tab:olive", "trainable_no_recompile": "tab:orange", "gate": "tab:red",
                  "masked_hold": "tab:green", "masked_skip": "tab:cyan"}
METHOD_STYLES = {"naive": "-", "hold": "--", "reset": ":"}
"""Line styles, so that methods whose lines coincide (hold and reset at 0 drift) can still be told apart."""
CONV_ENTRIES = 52_096
"""Entries of conv1 and conv2 of the Deep MNIST CNN (5·5·1·32 + 32 + 5·5·32·64 + 64)."""


def _legend_below(fig: plt.Figure, ax: plt.Axes, ncol: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, -0.02))


def finetune_bars(summary: pd.DataFrame) -> plt.Figure:
    """Fine-tuning: test accuracy on 5-9 and frozen conv entries changed, per method, grouped by optimizer.

    Accuracy is drawn as points with ± std whiskers and the mean printed beside each, on an axis that starts near
    the lowest value (bars from 0 would flatten the differences the report discusses). ``finetune_bars(s)``
    """
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    methods = list(dict.fromkeys(summary["method"]))
    width = 0.8 / len(methods)
    decimals = column_decimals(summary, ["acc_new"])["acc_new"] or 3  # as the report's table prints the means
    fig, (acc_ax, changed_ax) = plt.subplots(1, 2, figsize=(12, 4.4), sharex=True)
    for j, method in enumerate(methods):
        rows = summary[summary["method"] == method].set_index("optimizer").reindex(optimizers)
        xs = np.arange(len(optimizers)) + (j - (len(methods) - 1) / 2) * width
        colour = METHOD_COLOURS.get(method)
        acc_ax.errorbar(xs, rows["acc_new_mean"], yerr=rows["acc_new_std"].fillna(0), label=method, color=colour,
                        marker="o", ls="none", capsize=3, ms=6)
        for x, m, sd in zip(xs, rows["acc_new_mean"], rows["acc_new_std"].fillna(0)):
            if m == m:  # below the lower whisker, so that the whisker does not strike it through; upright, so that
                acc_ax.annotate(f"{m:.{decimals}f}", (x, m - sd), xytext=(0, -4), textcoords="offset points",  # the
                                ha="center", va="top", rotation=90, fontsize=7,
                                color=colour)  # neighbours' do not touch
        changed = rows["conv_changed_entries_mean"].to_numpy()
        changed_ax.bar(xs, changed, width, color=colour, label=method)
        for x, c in zip(xs, changed):
            if c == 0:
                changed_ax.text(x, CONV_ENTRIES * 0.01, "0", ha="center", va="bottom", fontsize=8, color=colour,
                                fontweight="bold")
    acc_ax.set_xticks(range(len(optimizers)), optimizers)
    low = float((summary["acc_new_mean"] - summary["acc_new_std"].fillna(0)).min())
    high = float((summary["acc_new_mean"] + summary["acc_new_std"].fillna(0)).max())
    acc_ax.set(ylabel="test accuracy on digits 5-9 (fraction)",
               ylim=(max(0.0, np.floor(10 * low) / 10 - 0.12), min(1.0, high + 0.03)),
               title="Accuracy of the fine-tuned head (mean ± std over seeds;\nthe axis does not start at 0)")
    acc_ax.grid(axis="y", alpha=0.3)
    acc_ax.set_xlim(-0.6, len(optimizers) - 0.4)
    changed_ax.axhline(CONV_ENTRIES, color="0.4", ls="--", lw=0.8)
    changed_ax.text(len(optimizers) - 0.55, CONV_ENTRIES * 1.02, f"all {CONV_ENTRIES:,} conv entries", ha="right",
                    va="bottom", fontsize=8, color="0.3")
    changed_ax.set(ylabel="conv entries changed at the end (count)", ylim=(0, CONV_ENTRIES * 1.15),
                   title="Frozen conv1/conv2 entries that changed (a printed 0: none did)")
    changed_ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    for ax in (acc_ax, changed_ax):
        ax.set_xlabel("optimizer (pretraining and fine-tuning)")
    _legend_below(fig, acc_ax, ncol=len(methods))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _panels(table: pd.DataFrame) -> tuple[list[str], list]:
    optimizers = list(dict.fromkeys(table["optimizer"]))
    ps = sorted(table["p"].unique()) if "p" in table.columns else [None]
    return optimizers, ps


def _select(table: pd.DataFrame, optimizer: str, p: float | None) -> pd.DataFrame:
    rows = table[table["optimizer"] == optimizer]
    return rows if p is None else rows[rows["p"] == p]


def masked_curves(table: pd.DataFrame, value: str, ylabel: str, log: bool = False,
                  block_every: int | None = None, blocks: Sequence[str] = ()) -> plt.Figure:
    """Mean over seeds of ``value`` against step (band = ± std); rows = optimizer, columns = p; a line per method.

    ``masked_curves(t, "accuracy", "test accuracy (fraction)")``. Every panel shares both axes. ``log`` uses a
    symmetric log scale that shows 0 (linear below 1). With ``block_every`` and ``blocks`` (block study), the
    top panels name the block that trains in each period.
    """
    optimizers, ps = _panels(table)
    fig, axes = plt.subplots(len(optimizers), len(ps), figsize=(3.9 * len(ps) + 1.2, 2.5 * len(optimizers) + 1.0),
                             squeeze=False, sharex=True, sharey=True)
    last = int(table["step"].max())
    for i, name in enumerate(optimizers):
        for j, p in enumerate(ps):
            ax = axes[i, j]
            rows = _select(table, name, p).dropna(subset=[value])
            for method, group in rows.groupby("method", sort=False):
                curve = group.groupby("step")[value].agg(["mean", "std"])
                colour = METHOD_COLOURS.get(method)
                sparse = len(curve) < 12
                ax.plot(curve.index, curve["mean"], label=method, color=colour, marker="o" if sparse else None,
                        ms=4, lw=1.6, ls=METHOD_STYLES.get(method, "-"))
                ax.fill_between(curve.index, curve["mean"] - curve["std"].fillna(0),
                                curve["mean"] + curve["std"].fillna(0), color=colour, alpha=0.15, lw=0)
            if log:
                ax.set_yscale("symlog", linthresh=1, linscale=0.5)
                if len(rows) and (rows[value] == 0).all():  # every line on the axis, where it cannot be seen
                    ax.text(0.5, 0.5, "0 in every step (all methods)", transform=ax.transAxes, ha="center",
                            va="center", fontsize=9, color="0.3")
            if block_every and blocks:
                for start in range(0, last, block_every):
                    block = blocks[(start // block_every) % len(blocks)]
                    if (start // block_every) % 2:
                        ax.axvspan(start + 0.5, min(start + block_every, last) + 0.5, color="0.93", zorder=0, lw=0)
                    if i == 0:
                        ax.text(start + 0.5 + block_every / 2, 1.0, block, transform=ax.get_xaxis_transform(),
                                ha="center", va="bottom", fontsize=7, color="0.35")
            if block_every and blocks:
                ax.set_xlim(0.5, last + 0.5)
            title = name if p is None else f"{name}, p = {p:g} trainable"
            ax.set_title(title, fontsize=9, pad=12 if (block_every and blocks and i == 0) else 4)
            ax.grid(alpha=0.25)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=9)
            if i == len(optimizers) - 1:
                ax.set_xlabel("training step")
    if log:  # limits once, for all panels together: 0 at the bottom, the largest mean at the top
        top = table.groupby([c for c in ("optimizer", "p", "method", "step") if c in table.columns],
                            dropna=False)[value].mean().max()
        axes[0, 0].set_ylim(0, max(10.0, 2.0 * float(top)))
    _legend_below(fig, axes[0, 0], ncol=4)
    fig.tight_layout(rect=(0, 0.05 + 0.03 / len(optimizers), 1, 1))
    return fig


def accuracy_vs_p(summary: pd.DataFrame) -> plt.Figure:
    """Final test accuracy against the trainable fraction p, a line
    per method, a panel per optimizer. ``accuracy_vs_p(s)``"""
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    ps = sorted(summary["p"].unique())
    fig, axes = plt.subplots(1, len(optimizers), figsize=(3.9 * len(optimizers) + 0.6, 3.8), squeeze=False,
                             sharey=True, sharex=True)
    methods = list(dict.fromkeys(summary["method"]))
    dodge = 0.012 if len(ps) > 1 else 0.04  # methods side by side, so that error bars do not hide each other
    for ax, name in zip(axes[0], optimizers):
        for method, rows in summary[summary["optimizer"] == name].groupby("method", sort=False):
            rows = rows.sort_values("p")
            shift = (methods.index(method) - (len(methods) - 1) / 2) * dodge
            ax.errorbar(rows["p"] + shift, rows["accuracy_mean"], yerr=rows["accuracy_std"].fillna(0), marker="o",
                        capsize=3, label=method, color=METHOD_COLOURS.get(method), ls=METHOD_STYLES.get(method, "-"))
        ax.set_xticks(ps, [f"{p:g}" for p in ps])
        if len(ps) == 1:
            ax.set_xlim(ps[0] - 0.25, ps[0] + 0.25)
        ax.set(title=name, xlabel="p, fraction of entries trainable each step")
        ax.grid(alpha=0.25)
    axes[0, 0].set_ylabel("final test accuracy (fraction)")
    _legend_below(fig, axes[0, 0], ncol=3)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
