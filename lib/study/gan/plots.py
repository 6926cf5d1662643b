"""Study 03's figures: GAN losses, sample grids, drift of the frozen network, coverage, bias correction.

One function per figure, each returning a matplotlib Figure; ``reporting.save_figure`` writes them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

SMOOTH = 5
"""Logged loss values averaged into each plotted point (a centred rolling mean): the raw curves of nine methods
are too noisy to tell apart."""
GATED_METHODS = ("random_gate", "random_gate_masked", "gate_d_only", "gate_g_only")
"""The study-03 methods that draw a random gate; ``gan_losses`` gives them their own row of panels."""


def gan_losses(logs: pd.DataFrame) -> plt.Figure:
    """D and G loss against iteration, mean over seeds, smoothed (``SMOOTH``). ``gan_losses(logs)``

    A row per optimizer x method group (methods that train whole networks; the random gates, with
    ``two_optimizers`` as a grey reference), a column per network. A method whose curve is identical to one
    already drawn in the panel is not drawn again: its name joins that line's label (``a = b``).
    """
    optimizers = list(dict.fromkeys(logs["optimizer"]))
    methods = list(dict.fromkeys(logs["method"]))
    gated = [m for m in methods if m in GATED_METHODS]
    groups = [("whole networks", [m for m in methods if m not in GATED_METHODS]),
              ("random gates", (["two_optimizers"] if "two_optimizers" in methods else []) + gated)]
    groups = [(title, members) for title, members in groups
              if set(members) - {"two_optimizers"} or title == "whole networks"]
    palette = [c for k, c in enumerate(plt.get_cmap("tab10").colors) if k != 7]  # grey is the reference's
    colours = dict(zip(methods, palette * 2))
    styles = ["-", "--", "-.", ":"]
    rows = [(name, title, members) for name in optimizers for title, members in groups]
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 2.5 * len(rows) + 0.8), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    for i, (name, title, members) in enumerate(rows):
        for j, loss in enumerate(("d_loss", "g_loss")):
            ax = axes[i, j]
            drawn: list[tuple[list[str], np.ndarray, pd.Series]] = []
            for method in members:
                rows_ = logs[(logs["optimizer"] == name) & (logs["method"] == method)]
                if rows_.empty:
                    continue
                curve = rows_.groupby("iteration")[loss].mean().rolling(SMOOTH, min_periods=1, center=True).mean()
                same = next((d for d in drawn if np.array_equal(d[1], curve.to_numpy())), None)
                if same is not None:
                    same[0].append(method)
                else:
                    drawn.append(([method], curve.to_numpy(), curve))
            for k, (names, _, curve) in enumerate(drawn):
                reference = title == "random gates" and names[0] == "two_optimizers"
                ax.plot(curve.index, curve.values, label=" = ".join(names) + (" (reference)" if reference else ""),
                        lw=1.6 if reference else 1.2, color="0.6" if reference else colours[names[0]],
                        ls="-" if reference else styles[k % len(styles)])
            ax.axhline(2 * np.log(2) if j == 0 else np.log(2), color="k", lw=0.7, ls=":")
            ax.set_title(f"{name}, {title}: {'discriminator' if j == 0 else 'generator'} loss"
                         + (" (dotted: 2 ln 2)" if j == 0 else " (dotted: ln 2)"), fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("iteration")
            if j == 0:
                ax.set_ylabel("BCE (nats)")
                ax.legend(fontsize=7, loc="upper right", ncol=2 if len(drawn) > 3 else 1, framealpha=0.8)
    n = logs["seed"].nunique()
    fig.suptitle(f"Losses, mean over {n} seed{'s' if n > 1 else ''}, each point the mean of {SMOOTH} logged values "
                 "around it; methods with identical curves share one line (a = b).\nDotted: the losses of a D that "
                 "cannot tell real from fake", fontsize=9)
    return fig


def sample_grids(grids: dict, quality: pd.DataFrame | None = None, optimizer: str = "adam") -> plt.Figure:
    """One 8x8 grid of generated digits per method (one optimizer), the same latent vectors for all. ``sample_grids(g)``

    ``grids`` maps (method, optimizer) to images in [-1, 1]; ``quality`` (a runs table) adds the judge's
    classes seen to each title.
    """
    chosen = {m: x for (m, o), x in grids.items() if o == optimizer}
    rows = int(np.ceil(len(chosen) / 4))
    columns = int(np.ceil(len(chosen) / rows))  # at most 4 a row, rows as even as they can be
    fig, axes = plt.subplots(rows, columns, figsize=(3.1 * columns, 3.5 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat:
        ax.axis("off")
    for ax, (method, images) in zip(axes.flat, chosen.items()):
        tiles = ((images[:64].reshape(8, 8, 28, 28) + 1) / 2).transpose(0, 2, 1, 3).reshape(8 * 28, 8 * 28)
        ax.imshow(tiles, cmap="gray", vmin=0, vmax=1)
        title = method
        if quality is not None:
            q = quality[(quality["method"] == method) & (quality["optimizer"] == optimizer)]
            if len(q):
                q = q.sort_values("seed").iloc[0]
                title += f"\n{int(q['classes_seen'])} of 10 classes seen"
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"Samples under {optimizer}, first seed, the same fixed latent vectors for every method", fontsize=10)
    return fig


def gan_drift_bars(summary: pd.DataFrame) -> plt.Figure:
    """What should stay frozen: changed entries and max |ΔW| per
    method and optimizer (zeros labelled). ``gan_drift_bars(s)``"""
    methods = list(dict.fromkeys(summary["method"]))
    optimizers = list(dict.fromkeys(summary["optimizer"]))
    changed = ["g_changed_entries_in_d_step", "d_changed_entries_in_g_step", "gated_changed_entries"]
    delta = ["g_max_abs_dW_in_d_step", "d_max_abs_dW_in_g_step", "gated_max_abs_dW"]
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True, layout="constrained")
    width = 0.8 / len(optimizers)
    panels = [(axes[0], changed, "sum", "frozen entries changed, summed over\niterations (count, mean over seeds)"),
              (axes[1], delta, "max", "largest one-step |ΔW| of a frozen\nentry (W units, max over seeds)")]
    for ax, columns, how, label in panels:
        values = summary[columns].sum(axis=1) if how == "sum" else summary[columns].max(axis=1)
        top = max(float(values.max()), 1.0 if how == "sum" else 1e-8)
        bottom = 0.5 if how == "sum" else 1e-9
        for j, name in enumerate(optimizers):
            rows = summary["optimizer"] == name
            v = values[rows].to_numpy()
            xs = (np.array([methods.index(m) for m in summary.loc[rows, "method"]])
                  + (j - (len(optimizers) - 1) / 2) * width)
            ax.bar(xs, np.where(v > 0, v, np.nan), width, label=name, color=f"C{j}")
            for x, d in zip(xs, v):
                if d == 0:
                    ax.text(x, bottom * 1.5, "0", ha="center", va="bottom", fontsize=8, color=f"C{j}")
        ax.set(yscale="log", ylim=(bottom, top * 5), ylabel=label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(range(len(methods)), methods, rotation=20, ha="right", rotation_mode="anchor")
    axes[1].set_xlim(-0.6, len(methods) - 0.4)
    axes[0].legend(title="optimizer", fontsize=8)
    fig.suptitle("Does what should stay frozen move? Other network in each step, plus the gated-off part "
                 "(0 = not one bit changed)", fontsize=10)
    return fig


def gan_coverage(runs: pd.DataFrame) -> plt.Figure:
    """Classes the judge sees in the samples and its confidence, per
    method and optimizer; a dot per seed. ``gan_coverage(runs)``"""
    methods = list(dict.fromkeys(runs["method"]))
    optimizers = list(dict.fromkeys(runs["optimizer"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharex=True, layout="constrained")
    width = 0.8 / len(optimizers)
    for ax, value, label, top in ((axes[0], "classes_seen", "classes seen by the judge (of 10)", 12.2),
                                  (axes[1], "coverage_entropy", "coverage: entropy of the judged classes\n"
                                                                "(0 = one class, 1 = all ten equally)", 1.05)):
        for j, name in enumerate(optimizers):
            rows = runs[runs["optimizer"] == name]
            stats = rows.groupby("method", sort=False)[value].agg(["mean", "min", "max"]).reindex(methods)
            xs = np.arange(len(methods)) + (j - (len(optimizers) - 1) / 2) * width
            span = np.vstack([(stats["mean"] - stats["min"]).fillna(0), (stats["max"] - stats["mean"]).fillna(0)])
            ax.bar(xs, stats["mean"], width, yerr=span, capsize=2, color=f"C{j}", alpha=0.6,
                   label=name)
            for x, method in zip(xs, methods):
                seeds = rows.loc[rows["method"] == method, value].to_numpy()
                ax.scatter(np.full(len(seeds), x), seeds, s=12, color="k", zorder=3,
                           label="one seed" if (j, method) == (0, methods[0]) else None)
        ax.set(ylim=(0, top), ylabel=label, xlim=(-0.6, len(methods) - 0.4))
        ax.set_xticks(range(len(methods)), methods, rotation=25, ha="right", rotation_mode="anchor")
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1, color="tab:red", lw=0.8, ls="--")
    axes[0].set_yticks(range(0, 11))
    axes[0].legend(fontsize=8, loc="upper center", ncol=3)  # above the bars, which end at 10
    n = int(runs["seed"].nunique())
    fig.suptitle(f"Mode collapse: what the judge sees in the samples of {n} seed{'s' if n > 1 else ''}. Bars: the "
                 "mean; whiskers: lowest to highest seed; dots: single seeds; red dashed: a single class", fontsize=10)
    return fig


def bias_correction_ratio(effect: pd.DataFrame, beta_1: float = 0.5, beta_2: float = 0.999) -> plt.Figure:
    """G's Adam bias-correction factor with one optimizer for D and G over that with its own, against iteration.

    The factor c(t) = sqrt(1 - beta_2^t) / (1 - beta_1^t) multiplies the step size; the steps also depend on m and v.
    ``bias_correction_ratio(e)``
    """
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    t = np.arange(1, int(effect["iteration"].max()) + 1, dtype=np.float64)
    c = lambda n: np.sqrt(1 - beta_2 ** n) / (1 - beta_1 ** n)  # noqa: E731
    ax.plot(t, c(2 * t) / c(t), color="0.5", lw=1, label="c(2t) / c(t), every iteration")
    logged = effect.groupby("iteration")["ratio"].mean()
    ax.plot(logged.index, logged.values, "o", ms=3, label="from the counters logged in the run")
    ax.axhline(1.0, color="k", lw=0.8)
    ticks = [x for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if x <= t[-1]]
    ax.set(xscale="log", xlabel="iteration t (log scale)", ylabel="c(t_shared) / c(t_own)",
           title=f"One Adam for D and G (β₁ = {beta_1}): G's bias-correction factor\nrelative to that of G's own "
                 "optimizer")
    ax.set_xticks(ticks, [str(x) for x in ticks])
    ax.legend(fontsize=8)
    return fig
