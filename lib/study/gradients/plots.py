"""Figures of study 04 (gradients across a boundary, Downpour SGD, staleness); one function per figure.

Each returns a matplotlib Figure with labelled axes (units in parentheses), a legend where lines must be told
apart, and shared axes where panels are compared. Captions are given to ``reporting.save_figure`` by the notebook.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

OPTIMIZER_COLOURS = {"sgd": "tab:blue", "adam": "tab:red", "adagrad": "tab:green", "adamw": "tab:orange",
                     "muon": "tab:purple"}


def fetch_cost_bars(table: pd.DataFrame) -> plt.Figure:
    """Median ms to get every gradient of the CNN, per mode and method, with whiskers from the fastest to the slowest
    round; on each bar the ratio to one pass (median over the rounds) and its range over the rounds, rounded outward
    as in the prose."""
    from study.report.prose import ceil, floor, times

    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    labels = [f"{mode}: {method}" for mode, method in zip(table["mode"], table["method"])]
    colours = [f"C{i}" for i in pd.factorize(table["mode"])[0]]
    whiskers = [table["ms"] - table["ms_min"], table["ms_max"] - table["ms"]]
    bars = ax.barh(range(len(table)), table["ms"], color=colours, xerr=whiskers, capsize=3,
                   error_kw={"lw": 0.8})
    for bar, top, ratio, low, high in zip(bars, table["ms_max"], table["ratio_to_one_pass"], table["ratio_low"],
                                          table["ratio_high"]):
        ax.text(top, bar.get_y() + bar.get_height() / 2,
                f"  {times(ratio)} one pass ({floor(low, 'num', 3)}–{ceil(high, 'num', 3)})", va="center", fontsize=8)
    ax.set_yticks(range(len(table)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, table["ms_max"].max() * 1.45)
    ax.set_xlabel("time to get all 8 gradients of the Deep MNIST CNN (ms): median over interleaved rounds; whiskers: "
                  "fastest–slowest round")
    ax.xaxis.label.set_fontsize(9)
    fig.tight_layout()
    return fig


def quadratic_trace(trace: pd.DataFrame) -> plt.Figure:
    """x and dy/dx of the seed's quadratic after each compute -> T(g) -> apply step (what TensorBoard shows)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot(trace["step"], trace["x"], marker=".", label="x (the variable)")
    ax.plot(trace["step"], trace["dy_dx"], marker=".", label="dy/dx (its gradient)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="step", ylabel="value (unitless)")
    ax.legend()
    fig.tight_layout()
    return fig


def accuracy_curves(runs: Mapping[str, Mapping[str, Any]]) -> plt.Figure:
    """Test accuracy against wall time and against applied updates, one line per run (``{label: result}``)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for i, (label, result) in enumerate(runs.items()):
        curve = pd.DataFrame(result["curve"])
        left.plot(curve["seconds"], curve["accuracy"], marker=".", color=f"C{i}", label=label)
        right.plot(curve["applied_updates"], curve["accuracy"], marker=".", color=f"C{i}", label=label)
    left.set(xlabel="wall time since the first scheduled function (s)", ylabel="test accuracy (fraction)")
    right.set(xlabel="updates applied on the ps (count)")
    left.set_ylim(0, 1)
    left.legend(loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def n_push_sweep(table: pd.DataFrame) -> plt.Figure:
    """Against n_push (= n_fetch), 2 workers: CPU time per step (workers, ps), steps/s (on the workers' clocks: the
    mean of the timed windows, with their std), staleness, accuracy."""
    table = table.sort_values("n_push")
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4), sharex=True)
    axes[0].plot(table["n_push"], 1e3 * table["worker_cpu_s_per_step"], marker="o", label="workers")
    axes[0].plot(table["n_push"], 1e3 * table["ps_cpu_s_per_step"], marker="s", label="ps tasks")
    axes[0].set(ylabel="CPU time per worker step (ms)", ylim=(0, None))
    axes[0].legend()
    rate = "steps_per_s_windows" if "steps_per_s_windows" in table.columns else "steps_per_s"  # older runs: chief's
    axes[1].errorbar(table["n_push"], table[rate], yerr=table["steps_per_s_std"], marker="o", capsize=3)
    axes[1].set(ylabel="steps per second, both workers (1/s)", ylim=(0, None))  # the windows' mean and their std
    axes[2].plot(table["n_push"], table["staleness_mean"], marker="o")
    axes[2].set(ylabel="mean staleness of a push (updates)", ylim=(0, 1.2 * float(table["staleness_mean"].max())))
    axes[3].plot(table["n_push"], table["final_accuracy"], marker="o", ls="none")  # runs of unequal training
    for n, accuracy, updates in zip(table["n_push"], table["final_accuracy"], table["applied_updates"]):
        axes[3].annotate(f"{int(updates)} updates", (n, accuracy), xytext=(0, 8), textcoords="offset points",
                         ha="center", fontsize=8)  # above the point: below it, the leftmost label ran into the ticks
    axes[3].set(ylabel="test accuracy after the run (fraction)", ylim=(0, 1))
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.margins(x=0.15)
        ax.set_xticks(table["n_push"], [str(n) for n in table["n_push"]])
        ax.minorticks_off()
        ax.set_xlabel("n_push = n_fetch (steps)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def staleness_histograms(runs: Mapping[str, Mapping[str, Any]]) -> plt.Figure:
    """Measured staleness of every push, one panel per run (``{label: result}``), as a fraction of its pushes.

    Each panel is titled with its run's workers, ``n_push`` and steps (from ``result["config"]``; else ``label``).
    """
    fig, axes = plt.subplots(1, len(runs), figsize=(3.3 * len(runs), 3.2), squeeze=False, sharey=True)
    top = max(max(r["staleness"]) for r in runs.values())
    for ax, (label, result) in zip(axes[0], runs.items()):
        values = np.asarray(result["staleness"])
        counts = np.bincount(values, minlength=top + 1) / len(values)
        ax.bar(range(top + 1), counts, width=0.8)
        job = result.get("config", {})
        setting = (f"{job['workers']} worker{'s' * (job['workers'] > 1)}, n_push = {job['n_push']}, "
                   f"{job['steps']} steps"
                   if {"workers", "n_push", "steps"} <= set(job) else label)
        ax.set_title(f"{setting}\nmean {values.mean():.2f}, {len(values)} pushes", fontsize=9)
        ax.set_xlabel("staleness (updates)")
        ax.set_xticks(range(0, top + 1, max(1, (top + 1) // 6)))
    axes[0, 0].set_ylabel("share of pushes (fraction)")
    fig.tight_layout()
    return fig


def staleness_curves(curves: pd.DataFrame, best: Mapping[str, float], target: float) -> plt.Figure:
    """Accuracy against updates for each τ at each optimizer's best τ = 0 rate; mean over seeds, band = ±1 std."""
    optimizers = list(best)
    taus = sorted(curves["tau"].unique())
    colours = plt.get_cmap("Dark2")(np.arange(len(taus)) % 8)  # distinct hues, and a line style each: neighbours
    styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]           # in τ must not look alike
    columns = min(3, len(optimizers))
    rows = -(-len(optimizers) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows + 0.4), sharey=True, squeeze=False)
    for ax in axes.flat[len(optimizers):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, optimizers):
        mine = curves[(curves["optimizer"] == name) & (curves["learning_rate"] == best[name])]
        for i, (colour, tau) in enumerate(zip(colours, taus)):
            stats = mine[mine["tau"] == tau].groupby("updates")["accuracy"].agg(["mean", "std"])
            ax.plot(stats.index, stats["mean"], color=colour, ls=styles[i % len(styles)], lw=1.6, label=f"τ = {tau}")
            ax.fill_between(stats.index, stats["mean"] - stats["std"].fillna(0),
                            stats["mean"] + stats["std"].fillna(0), color=colour, alpha=0.15, lw=0)
        ax.axhline(target, color="grey", ls="-", lw=0.8, label=f"target {target:g}")
        ax.set(title=f"{name}, learning rate {best[name]:g}", xlabel="updates (count)")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("test accuracy (fraction)")
    axes[0, 0].set_ylim(0, 1)
    handles, labels = axes[0, 0].get_legend_handles_labels()  # below the panels: inside, it hid low curves
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.08 / rows, 1, 1))
    return fig


def dai_slowdown(check: pd.DataFrame) -> plt.Figure:
    """Final test-accuracy drop against tau per optimizer (mean over seeds, whiskers: its confidence interval),
    at each one's undelayed rate; the optimizers side by side at each tau, a little apart so whiskers do not hide."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = list(dict.fromkeys(check["optimizer"]))
    for i, (name, group) in enumerate(check.groupby("optimizer", sort=False)):
        shift = 1 + 0.04 * (i - (len(names) - 1) / 2)  # a small offset on the log-like axis
        error = [(group["drop_mean"] - group["drop_ci_low"]).fillna(0),
                 (group["drop_ci_high"] - group["drop_mean"]).fillna(0)]
        ax.errorbar(group["tau"] * shift, group["drop_mean"], yerr=error, marker="o", capsize=3,
                    color=OPTIMIZER_COLOURS.get(name), label=f"{name} (lr {group['learning_rate'].iloc[0]:g})")
    taus = sorted(check["tau"].unique())
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(taus, [str(t) for t in taus])
    ax.minorticks_off()
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xlabel="τ: updates between reading the parameters and applying the gradient (count)",
           ylabel="test accuracy lost vs τ = 0 (fraction)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def fault_timeline(result: Mapping[str, Any]) -> plt.Figure:
    """The fault run attempt by attempt: the updates each chief attempt applied, the checkpoints it saved, each
    fault, and the updates a restart lost (from the checkpoint it resumed from to where the killed attempt was).

    One bar per attempt of the chief, from the update count it started at (0, or the checkpoint it resumed from)
    to the count when it ended (the next kill of the chief or a ps task, or the end of the job). An end that was not
    counted exactly (a killed chief: the launcher's last reading) is drawn dotted and labelled as estimated.
    """
    attempts = list(result.get("attempts", []))
    restarts = [f for f in result["faults"] if not f["killed"].startswith("worker")]
    starts = [int(a.get("restored_version") or 0) for a in attempts]
    ends = [int(f.get("version_at_failure") or f.get("version_seen") or 0) for f in restarts]
    ends.append(int(result["applied_updates"]))
    fig, ax = plt.subplots(figsize=(8, 1.9 + 0.75 * max(len(attempts), 1)))
    if len(starts) != len(ends):  # attempts not matched to faults: nothing honest to draw
        ax.text(0.5, 0.5, "attempts and faults do not match", ha="center", transform=ax.transAxes)
        return fig
    checkpoints = [int(c["version"]) for c in result.get("checkpoints", [])]
    labelled: set[str] = set()

    def once(label: str) -> str | None:
        return None if label in labelled or labelled.add(label) else label

    for i, (start, end) in enumerate(zip(starts, ends)):
        kept = min(end, starts[i + 1]) if i + 1 < len(starts) else end  # the next attempt resumed from here
        ax.barh(i, kept - start, left=start, height=0.5, color="C0", alpha=0.8, label=once("updates applied and kept"))
        if kept < end:
            ax.barh(i, end - kept, left=kept, height=0.5, color="C3", hatch="//", alpha=0.5,
                    label=once("applied after the last checkpoint, lost with the kill,\nredone by the next attempt"))
        upper = starts[i + 1] if i + 1 < len(starts) else end  # the latest checkpoint before a kill is resumed
        mine = [v for v in checkpoints if start < v <= upper]
        ax.plot(mine, [i] * len(mine), ls="none", marker="|", ms=16, mew=2, color="k", zorder=4,
                label=once("checkpoint saved"))
        if i < len(restarts):
            estimated = restarts[i].get("version_at_failure") is None  # the killed chief's own count died with it
            if estimated:
                ax.plot([end, end], [i - 0.34, i + 0.34], ls=":", lw=1.6, color="C3", zorder=5,
                        label=once("end estimated: the launcher's last reading\nbefore the kill (not exact)"))
            ax.annotate(f"{restarts[i]['killed']} killed at "
                        + (f"≈{end} (estimated)" if estimated else f"{end} (exact)"),
                        (end, i), xytext=(4, 8), textcoords="offset points", fontsize=8, color="C3")
    for fault in result["faults"]:
        if fault["killed"].startswith("worker"):
            seen = int(fault.get("version_seen") or 0)
            row = next((i for i, (a, b) in enumerate(zip(starts, ends)) if a <= seen <= b), 0)
            ax.plot(seen, row - 0.3, ls="none", marker="X", ms=9, color="C1", zorder=3,  # above the bar's ticks
                    label=once(f"{fault['killed']} killed at ≈{seen} (its function re-ran;\nnothing lost)"))
    ax.set_yticks(range(len(starts)), [f"attempt {i + 1}\n(from {s})" for i, s in enumerate(starts)])
    ax.set_ylim(len(starts) - 0.5, -0.75)  # inverted, with room above the first bar for a worker's kill marker
    ax.set(xlabel="updates on the ps (count)", xlim=(0, 1.04 * max(ends)))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
