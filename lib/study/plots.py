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


METHOD_COLOURS = {"naive": "tab:red", "hold": "tab:green", "reset": "tab:blue", "var_list": "tab:purple",
                  "trainable_recompile": "tab:olive", "trainable_no_recompile": "tab:orange", "gate": "tab:red",
                  "masked_hold": "tab:green"}


def finetune_bars(summary: pd.DataFrame) -> plt.Figure:
    """Fine-tuning: test accuracy and frozen-layer drift per method, grouped by optimizer. ``finetune_bars(s)``"""
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    methods = list(dict.fromkeys(summary["method"]))
    width = 0.8 / len(methods)
    fig, (acc_ax, drift_ax) = plt.subplots(1, 2, figsize=(13, 4))
    for j, method in enumerate(methods):
        rows = summary[summary["method"] == method].set_index("optimizer").reindex(optimizers)
        xs = np.arange(len(optimizers)) + (j - (len(methods) - 1) / 2) * width
        colour = METHOD_COLOURS.get(method)
        acc_ax.bar(xs, rows["acc_new_mean"], width, yerr=rows["acc_new_std"].fillna(0), label=method, color=colour)
        drift = rows["conv_max_drift_mean"].to_numpy()
        drift_ax.bar(xs, np.where(drift > 0, drift, np.nan), width, color=colour, label=method)
        for x, d in zip(xs, drift):
            if d == 0:
                drift_ax.text(x, 1.2e-9, "0", ha="center", va="bottom", fontsize=8, color=colour)
    for ax in (acc_ax, drift_ax):
        ax.set_xticks(range(len(optimizers)), optimizers)
    acc_ax.set(ylabel="test accuracy on digits 5-9", title="Fine-tuned head, frozen conv1/conv2 (mean ± std)",
               ylim=(0, 1.18))
    drift_ax.set(yscale="log", ylim=(1e-9, None), ylabel="max |conv weight change| (0 printed)",
                 title="Drift of the frozen conv layers")
    acc_ax.legend(fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    return fig


def _grid(table: pd.DataFrame) -> tuple[plt.Figure, np.ndarray, list, list]:
    optimizers = list(dict.fromkeys(table["optimizer"]))
    ps = sorted(table["p"].dropna().unique()) or [np.nan]
    fig, axes = plt.subplots(len(optimizers), len(ps), figsize=(3.6 * len(ps) + 1, 2.6 * len(optimizers) + 0.6),
                             squeeze=False, sharex=True)
    return fig, axes, optimizers, ps


def _select(table: pd.DataFrame, optimizer: str, p: float) -> pd.DataFrame:
    rows = table[table["optimizer"] == optimizer]
    return rows[rows["p"].isna()] if p != p else rows[rows["p"] == p]


def masked_curves(table: pd.DataFrame, value: str, ylabel: str, log: bool = False) -> plt.Figure:
    """Mean over seeds of ``value`` against step; rows = optimizer, columns = p; a line per method. ``masked_curves(t, "accuracy", "acc")``"""
    fig, axes, optimizers, ps = _grid(table)
    for i, name in enumerate(optimizers):
        for j, p in enumerate(ps):
            ax = axes[i, j]
            rows = _select(table, name, p).dropna(subset=[value])
            for method, group in rows.groupby("method", sort=False):
                curve = group.groupby("step")[value].agg(["mean", "std"])
                colour = METHOD_COLOURS.get(method)
                ax.plot(curve.index, curve["mean"], label=method, color=colour)
                ax.fill_between(curve.index, curve["mean"] - curve["std"].fillna(0),
                                curve["mean"] + curve["std"].fillna(0), color=colour, alpha=0.15)
            if log:
                ax.set_yscale("symlog", linthresh=1e-3)
            ax.set_title(f"{name}" + ("" if p != p else f", p = {p:g} trainable"), fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(optimizers) - 1:
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def accuracy_vs_p(summary: pd.DataFrame) -> plt.Figure:
    """Final test accuracy against the trainable fraction p, a line per method, a panel per optimizer. ``accuracy_vs_p(s)``"""
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    fig, axes = plt.subplots(1, len(optimizers), figsize=(4 * len(optimizers), 3.4), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], optimizers):
        for method, rows in summary[summary["optimizer"] == name].groupby("method", sort=False):
            rows = rows.sort_values("p")
            ax.errorbar(rows["p"], rows["accuracy_mean"], yerr=rows["accuracy_std"].fillna(0), marker="o",
                        capsize=3, label=method, color=METHOD_COLOURS.get(method))
        ax.set(title=name, xlabel="p (fraction trainable each step)")
    axes[0, 0].set_ylabel("final test accuracy")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def gan_losses(logs: pd.DataFrame) -> plt.Figure:
    """D and G loss against iteration, mean over seeds; a panel per optimizer x network. ``gan_losses(logs)``"""
    optimizers = list(dict.fromkeys(logs["optimizer"]))
    fig, axes = plt.subplots(len(optimizers), 2, figsize=(12, 3.2 * len(optimizers)), squeeze=False, sharex=True)
    for i, name in enumerate(optimizers):
        for j, loss in enumerate(("d_loss", "g_loss")):
            ax = axes[i, j]
            for method, rows in logs[logs["optimizer"] == name].groupby("method", sort=False):
                curve = rows.groupby("iteration")[loss].mean()
                ax.plot(curve.index, curve.values, label=method, lw=1.2)
            ax.set(title=f"{name}: {'discriminator' if j == 0 else 'generator'} loss", xlabel="iteration")
    axes[0, 1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def sample_grids(grids: dict[str, np.ndarray], columns: int = 4) -> plt.Figure:
    """One 8x8 grid of generated digits per method, the same latent vectors for all. ``sample_grids({"m": x})``"""
    rows = int(np.ceil(len(grids) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.4 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (method, images) in zip(axes.flat, grids.items()):
        tiles = ((images[:64].reshape(8, 8, 28, 28) + 1) / 2).transpose(0, 2, 1, 3).reshape(8 * 28, 8 * 28)
        ax.imshow(tiles, cmap="gray", vmin=0, vmax=1)
        ax.set_title(method, fontsize=10)
    fig.suptitle("Samples under Adam, seed 0, fixed latent vectors")
    fig.tight_layout()
    return fig


def gan_drift_bars(summary: pd.DataFrame) -> plt.Figure:
    """Max drift of what should stay frozen, per method and optimizer (0 printed). ``gan_drift_bars(s)``"""
    methods = list(dict.fromkeys(summary["method"]))
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(optimizers)
    for j, name in enumerate(optimizers):
        rows = summary[summary["optimizer"] == name].set_index("method").reindex(methods)
        drift = rows[["g_max_drift_in_d_step", "d_max_drift_in_g_step", "gated_max_drift"]].max(axis=1).to_numpy()
        xs = np.arange(len(methods)) + (j - (len(optimizers) - 1) / 2) * width
        ax.bar(xs, np.where(drift > 0, drift, np.nan), width, label=name)
        for x, d in zip(xs, drift):
            if d == 0:
                ax.text(x, 1.2e-9, "0", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(methods)), methods, rotation=15, ha="right")
    top = float(np.nanmax(summary[["g_max_drift_in_d_step", "d_max_drift_in_g_step", "gated_max_drift"]].to_numpy()))
    ax.set(yscale="log", ylim=(1e-9, max(top, 1e-8) * 3), ylabel="max |change| of a frozen weight in one step",
           title="Does the network that should be frozen move? (0 printed)")
    ax.legend()
    fig.tight_layout()
    return fig


def bias_correction_ratio(effect: pd.DataFrame) -> plt.Figure:
    """Adam's bias correction with a shared counter over G's own, against iteration. ``bias_correction_ratio(e)``"""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    curve = effect.groupby("iteration")["ratio"].mean()
    ax.plot(curve.index, curve.values, marker=".")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="iteration", ylabel="c(t_shared) / c(t_own)",
           title="One Adam for D and G: G's step size vs its own optimizer")
    fig.tight_layout()
    return fig


def fetch_cost_bars(table: pd.DataFrame) -> plt.Figure:
    """ms to get every gradient, per mode and method, with the ratio to one pass written on the bar. ``fetch_cost_bars(t)``"""
    fig, ax = plt.subplots(figsize=(10, 3.8))
    labels = [f"{m}\n{meth}" for m, meth in zip(table["mode"], table["method"])]
    bars = ax.barh(range(len(table)), table["ms"], color=[f"C{i}" for i in pd.factorize(table["mode"])[0]])
    for bar, ratio in zip(bars, table["ratio_to_one_pass"]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {ratio:.2f}×", va="center", fontsize=8)
    ax.set_yticks(range(len(table)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="ms for all gradients of the Deep MNIST CNN (median)", title="One pass vs one per variable")
    fig.tight_layout()
    return fig


def quadratic_trace(trace: pd.DataFrame) -> plt.Figure:
    """x and dy/dx of the seed's quadratic against step (what TensorBoard shows). ``quadratic_trace(t)``"""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.plot(trace["step"], trace["x"], label="x")
    ax.plot(trace["step"], trace["dy_dx"], label="dy/dx")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="step", title="y = 0.5 (x - b)²: compute → T(g) = decay·g → apply")
    ax.legend()
    fig.tight_layout()
    return fig


def ps_curves(runs: dict[int, dict]) -> plt.Figure:
    """Accuracy against wall time and against applied updates, one line per worker count. ``ps_curves({1: r})``"""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for workers, result in runs.items():
        curve = pd.DataFrame(result["curve"])
        left.plot(curve["seconds"], curve["accuracy"], marker=".", label=f"{workers} worker(s)")
        right.plot(curve["applied_updates"], curve["accuracy"], marker=".", label=f"{workers} worker(s)")
    left.set(xlabel="wall time (s)", ylabel="test accuracy", title="Asynchronous Downpour SGD")
    right.set(xlabel="applied updates", title="per update")
    left.legend()
    fig.tight_layout()
    return fig


def staleness_histograms(runs: dict[int, dict]) -> plt.Figure:
    """Measured staleness of every applied gradient, one panel per worker count. ``staleness_histograms({2: r})``"""
    fig, axes = plt.subplots(1, len(runs), figsize=(3.6 * len(runs), 3.0), squeeze=False, sharey=True)
    for ax, (workers, result) in zip(axes[0], runs.items()):
        values = np.asarray(result["staleness"])
        ax.bar(*np.unique(values, return_counts=True))
        ax.set(title=f"{workers} worker(s): mean {values.mean():.2f}", xlabel="staleness (updates)")
    axes[0, 0].set_ylabel("applied gradients")
    fig.tight_layout()
    return fig


def staleness_accuracy(rows: pd.DataFrame) -> plt.Figure:
    """Test accuracy against the delay tau, a line per learning rate, a panel per optimizer. ``staleness_accuracy(r)``"""
    optimizers = list(dict.fromkeys(rows["optimizer"]))
    fig, axes = plt.subplots(1, len(optimizers), figsize=(4.2 * len(optimizers), 3.4), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], optimizers):
        for lr, group in rows[rows["optimizer"] == name].groupby("learning_rate"):
            stats = group.groupby("tau")["accuracy"].agg(["mean", "std"])
            ax.errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=3, label=f"lr {lr:g}")
        ax.set(xscale="symlog", xlabel="tau (updates late)", title=name)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("test accuracy")
    fig.tight_layout()
    return fig
