"""Study 01's figures: the seed example's trajectories, the drift heatmap, and Adam's drift predicted.

One function per figure, each returning a matplotlib Figure; ``reporting.save_figure`` writes them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.ticker import MaxNLocator

FAMILY_COLOURS = {"naive": "tab:red", "reset_slots": "tab:blue", "reset": "tab:blue",
                  "stash_restore": "tab:green", "hold": "tab:green"}


def seed2_trajectories(table: pd.DataFrame, entries: tuple[int, ...] = (1, 0)) -> plt.Figure:
    """W[i] before and after each step of the seed example, a panel per entry; colour = method, marker = API.

    Methods that give the same W share a colour: ``reset_slots`` and MaskedOptimizer's ``reset`` (blue),
    ``stash_restore`` and ``hold`` (green). The legend names each colour once and each marker once.
    ``seed2_trajectories(df)``
    """
    from matplotlib.lines import Line2D

    masks = [str(m) for m in table.drop_duplicates("step").sort_values("step")["mask"]]
    fig, axes = plt.subplots(1, len(entries), figsize=(5.2 * len(entries), 4.2), sharex=True, sharey=True,
                             squeeze=False)
    styles = {"TF1 graph": dict(ls="--", marker="x", ms=10), "TF2 Keras": dict(ls="-", marker="o", ms=5)}
    for ax, entry in zip(axes[0], entries):
        for step, mask in enumerate(masks, start=1):
            if mask.replace(" ", "").strip("[]").split(",")[entry] == "0":
                ax.axvspan(step - 0.45, step + 0.45, color="0.9", zorder=0)
        for (api, method), rows in table.groupby(["api", "method"], sort=False):
            steps = np.concatenate([[0], rows["step"].to_numpy()])  # W = 0 before step 1
            values = np.concatenate([[0.0], rows[f"W[{entry}]"].to_numpy()])
            ax.plot(steps, values, color=FAMILY_COLOURS.get(method, "0.4"), alpha=0.8, **styles.get(api, {}))
        ax.set_xticks(range(0, len(masks) + 1), ["start\n(W = 0)"]
                      + [f"step {i}\nMW = {m}" for i, m in enumerate(masks, start=1)], fontsize=8)
        same = table[f"W[{entry}]"].round(4).groupby(table["step"]).nunique().max() == 1  # TF1, TF2 differ ~1e-6
        ax.set_title(f"W[{entry}]" + (": the same under every method" if same else "")
                     + "\n(grey: frozen in that step, gradient 0)", fontsize=10)
        ax.set_xlabel("training step and its mask (1 = trains)")
        ax.set_xlim(-0.5, len(masks) + 0.5)  # the same steps at the same place in every panel
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("value after the step (W units)")
    present = list(dict.fromkeys(table["method"]))
    families = [("naive", "mask only (naive)"), ("reset_slots", "slots zeroed: reset_slots (TF1, TF2) = reset"),
                ("stash_restore", "slots stashed and restored: stash_restore (TF1, TF2) = hold")]
    handles = [Line2D([], [], color=FAMILY_COLOURS[m], lw=2, label=text) for m, text in families if m in present]
    handles += [Line2D([], [], color="0.3",
                       label=f"{api} ({'crosses, dashed' if api.startswith('TF1') else 'dots, solid'})",
                       **styles[api]) for api in dict.fromkeys(table["api"]) if api in styles]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("Seed example under Adam (lr 0.1). Colour: the method; marker: the API. TF1 and TF2 overlap, and "
                 "hold and reset\ngive exactly the W of stash_restore and reset_slots, so their lines lie under the "
                 "green and blue ones.", fontsize=10)
    fig.tight_layout()
    return fig


def drift_heatmap(matrix: pd.DataFrame, labels: dict[str, str] | None = None) -> plt.Figure:
    """Optimizer x steps since freezing, a panel per policy; colour = max |ΔW| of a frozen entry in that step.

    ``labels`` maps an optimizer name to its row label. The colour map leaves out magma's near-white end, so the
    smallest non-zero cell stays visibly coloured next to the grey of an exact zero. ``drift_heatmap(m)``
    """
    policies = list(dict.fromkeys(matrix["policy"]))
    optimizers = list(dict.fromkeys(matrix["optimizer"]))
    mean = matrix.groupby(["policy", "optimizer", "step"])["max_abs_dW"].mean()
    changed = matrix.groupby(["policy", "optimizer"])["changed_entries"].sum()
    positive = mean[mean > 0]
    norm = LogNorm(vmin=max(float(positive.min()), 1e-12), vmax=float(positive.max())) if len(positive) else None
    cmap = ListedColormap(plt.get_cmap("magma_r")(np.linspace(0.15, 0.95, 256)))
    cmap.set_bad("0.8")
    steps = sorted(matrix["step"].unique())
    names = [(labels or {}).get(o, o) for o in optimizers]
    label_in = 0.075 * max((len(n) for n in names), default=0)  # the row labels' width, so panels keep theirs
    fig, axes = plt.subplots(1, len(policies), figsize=(3.4 * len(policies) + 1.6 + label_in,
                                                        0.3 * len(optimizers) + 2.5),
                             sharey=True, sharex=True, squeeze=False, layout="constrained")
    image = None
    for ax, policy in zip(axes[0], policies):
        grid = mean.loc[policy].unstack("step").reindex(optimizers)
        values = np.ma.masked_less_equal(grid.to_numpy(), 0.0)
        image = ax.imshow(values, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                          extent=(steps[0] - 0.5, steps[-1] + 0.5, len(optimizers) - 0.5, -0.5))
        still = int((changed.loc[policy].reindex(optimizers) == 0).sum())
        ax.set_title(f"{policy}\n{still} of {len(optimizers)} optimizers\nchanged no frozen entry", fontsize=9.5)
        ax.set_xlabel("step after freezing")
        ax.set_yticks(range(len(optimizers)), names)
        ticks = [s for s in steps if s == 1 or s % max(1, len(steps) // 4) == 0]
        ax.set_xticks(ticks)
    if image is not None and norm is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="max |ΔW| of a frozen entry in that step\n"
                                                      "(W units, mean over seeds; grey = exactly 0)")
    fig.suptitle("How far frozen entries move in each step after freezing")
    return fig


def prediction_vs_measurement(prediction: pd.DataFrame) -> plt.Figure:
    """Left: measured vs predicted W − W_freeze; right: drift and
    prediction error per step. ``prediction_vs_measurement(p)``"""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.scatter(prediction["predicted"], prediction["measured"], s=6, alpha=0.5, label="a frozen entry after a step")
    lim = float(np.abs(prediction[["predicted", "measured"]].to_numpy()).max()) * 1.05
    left.plot([-lim, lim], [-lim, lim], color="k", lw=0.8, label="measured = predicted")
    left.set(xlabel="predicted W − W_freeze (W units)", ylabel="measured W − W_freeze (W units)",
             title=f"Every frozen entry after every step, {prediction['seed'].nunique()} "
                   f"seed{'s' if prediction['seed'].nunique() > 1 else ''}")
    left.xaxis.set_major_locator(MaxNLocator(5))  # no run-together tick labels
    left.legend(fontsize=8)
    per_step = prediction.assign(drift=prediction["measured"].abs(),
                                 error=(prediction["measured"] - prediction["predicted"]).abs()).groupby("step")
    drift, error = per_step["drift"].max(), per_step["error"].max()
    right.plot(drift.index, drift.values, marker="o", ms=3, label="max |W − W_freeze| (measured drift)")
    right.plot(error.index, error.values, marker="s", ms=3, color="tab:red", label="max |measured − predicted|")
    right.set(yscale="log", xlabel="step after freezing", ylabel="W units (log scale)",
              title="Drift and prediction error, max over entries and seeds")
    right.legend(fontsize=8, loc="center right")
    fig.suptitle("Adam's drift of frozen entries, predicted from m, v, β₁, β₂, ε and t, against the measurement",
                 fontsize=10)
    fig.tight_layout()
    return fig
