"""Figures of the studies: one function per figure, each returning a matplotlib Figure.

The notebooks call these and ``reporting.save_figure`` writes them; no plotting code lives in a notebook.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm


FAMILY_COLOURS = {"naive": "tab:red", "reset_slots": "tab:blue", "reset": "tab:blue",
                  "stash_restore": "tab:green", "hold": "tab:green"}


def seed2_trajectories(table: pd.DataFrame, entry: int = 1) -> plt.Figure:
    """W[entry] after each step of the seed example; colour = outcome, dashed = TF1. ``seed2_trajectories(df)``"""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.axvspan(1.5, 2.5, color="0.92", zorder=0, label=f"W[{entry}] frozen (gradient 0)")
    for (api, method), rows in table.groupby(["api", "method"], sort=False):
        tf1 = api.startswith("TF1")
        ax.plot(rows["step"], rows[f"W[{entry}]"], "--" if tf1 else "-", marker="x" if tf1 else "o",
                ms=9 if tf1 else 5, color=FAMILY_COLOURS.get(method, "0.4"), alpha=0.75, label=f"{api}: {method}")
    ax.set(xlabel="step", ylabel=f"W[{entry}]", xticks=sorted(table["step"].unique()),
           title=f"Seed 2 under Adam: W[{entry}] (red: naive, blue: reset, green: hold)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def drift_heatmap(matrix: pd.DataFrame) -> plt.Figure:
    """Optimizer x steps since freezing, one panel per policy; colour = max |drift| (grey = exactly 0). ``drift_heatmap(m)``"""
    policies = list(dict.fromkeys(matrix["policy"]))
    optimizers = list(dict.fromkeys(matrix["optimizer"]))
    mean = matrix.groupby(["policy", "optimizer", "step"])["cumulative_drift"].mean()
    positive = mean[mean > 0]
    norm = LogNorm(vmin=max(float(positive.min()), 1e-9), vmax=float(positive.max())) if len(positive) else None
    cmap = plt.get_cmap("magma_r").copy()
    cmap.set_bad("0.85")
    fig, axes = plt.subplots(1, len(policies), figsize=(4.2 * len(policies), 0.32 * len(optimizers) + 1.6),
                             sharey=True, squeeze=False)
    image = None
    for ax, policy in zip(axes[0], policies):
        grid = mean.loc[policy].unstack("step").reindex(optimizers)
        values = np.ma.masked_less_equal(grid.to_numpy(), 0.0)
        image = ax.imshow(values, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                          extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5, len(optimizers) - 0.5, -0.5))
        zero = int((grid.to_numpy() == 0).all(axis=1).sum())
        ax.set_title(f"{policy}: {zero}/{len(optimizers)} rows exactly 0", fontsize=10)
        ax.set_xlabel("steps since freezing")
        ax.set_yticks(range(len(optimizers)), optimizers)
    if image is not None and norm is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="max |W - W_frozen| over frozen entries (grey = 0)")
    fig.suptitle("Drift of frozen entries, mean over seeds", y=1.02)
    return fig


def prediction_vs_measurement(prediction: pd.DataFrame, entries: int = 6) -> plt.Figure:
    """Left: measured vs predicted Adam drift; right: a few entries over steps. ``prediction_vs_measurement(p)``"""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.scatter(prediction["predicted"], prediction["measured"], s=6, alpha=0.5)
    lim = float(np.abs(prediction[["predicted", "measured"]].to_numpy()).max()) * 1.05
    left.plot([-lim, lim], [-lim, lim], color="k", lw=0.8, label="measured = predicted")
    left.set(xlabel="predicted drift", ylabel="measured drift", title="Every frozen entry, every step")
    left.legend()
    first = prediction[prediction["seed"] == prediction["seed"].min()]
    for n, (entry, rows) in enumerate(first.groupby("entry")):
        if n >= entries:
            break
        right.plot(rows["step"], rows["measured"], lw=2, alpha=0.6)
        right.plot(rows["step"], rows["predicted"], "k:", lw=1)
    right.set(xlabel="steps since freezing", ylabel="W - W_frozen",
              title="Measured (colour) and predicted (dotted)")
    fig.tight_layout()
    return fig
