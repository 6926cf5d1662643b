"""The numbers study 04's findings quote, read off the run's tables (``metrics["quoted"]``), and its headline.

Notebook 04's markdown cells are templates (``study.report.prose``) that quote ``{{ metrics.quoted.<name> }}``. Each
value is taken from a table the run produced; a value the run's settings did not measure (the smoke profile
runs one worker count, no ``n_push`` sweep and two delays) is NaN, so the same templates fill on every profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from study.gradients.verdicts import (
    GAP_DECIMALS,
    WEAK_SHARE,
    bound_text,
    census,
    interval_sign,
    provisional,
    rate_trends,
    twins,
)
from study.report.prose import TIMING_TOLERANCE, ceil, fixed, floor, signed, timing_side

NAN = float("nan")
RATE_DOMINATES = 2.0
"""A gap at the undelayed rates is said to mostly measure whether those rates survive the delay where, at every delay
with a verdict, it is more than this many times the gap with the rates re-chosen for that delay."""


def _at(frame: pd.DataFrame, row: Any, column: str) -> float:
    try:
        return float(frame.loc[row, column])
    except (KeyError, TypeError, ValueError):
        return NAN


def fetch_numbers(costs: pd.DataFrame) -> dict[str, Any]:
    """Ratio to one pass of each slow way of fetching gradients, by a short name (the median over interleaved
    rounds), with its range over the rounds (``<name>_spread_low`` / ``_high``) and which way that whole range
    goes (``<name>_side``: ``"slower"``, ``"faster"`` or ``"about equal"``, ``prose.timing_side``).

    >>> costs = pd.DataFrame({"mode": ["TF1 graph"], "method": ["g.eval() per variable"], "ratio_to_one_pass": [3.9]})
    >>> fetch_numbers(costs)["tf1_eval_per_variable"]
    3.9
    """
    ratio = costs.set_index(["mode", "method"])["ratio_to_one_pass"].to_frame()
    spread = costs.set_index(["mode", "method"]).reindex(columns=["ratio_low", "ratio_high"])
    names = {
        "tf1_eval_per_variable": ("TF1 graph", "g.eval() per variable"),
        "eager_recompute": ("TF2 eager", "recompute forward and backward per variable"),
        "eager_persistent": ("TF2 eager", "persistent tape, one gradient call per variable"),
        "function_persistent": ("TF2 tf.function", "persistent tape, one gradient call per variable"),
        "function_recompute": ("TF2 tf.function", "recompute forward and backward per variable"),
    }
    out: dict[str, Any] = {"timing_tolerance": TIMING_TOLERANCE}
    for name, key in names.items():
        out[name] = _at(ratio, key, "ratio_to_one_pass")
        low, high = _at(spread, key, "ratio_low"), _at(spread, key, "ratio_high")
        out[f"{name}_spread_low"], out[f"{name}_spread_high"] = low, high
        out[f"{name}_side"] = timing_side(low, high)  # NaN: "about equal"
    return out


def cluster_numbers(ps_runs: pd.DataFrame, placement: pd.DataFrame) -> dict[str, float]:
    """The 1- and 2-worker cluster runs side by side, and where the largest variable lives.

    Returns staleness, final accuracy, updates applied and worker CPU time per step (ms) for each worker count, their
    ratio, the largest variable's name and size (MB) and the MB each ps task holds.

    >>> runs = pd.DataFrame({"workers": [1, 2], "staleness_mean": [0.0, 0.9], "final_accuracy": [0.92, 0.94],
    ...                      "worker_cpu_s_per_step": [0.118, 0.119], "applied_updates": [150, 150]})
    >>> place = pd.DataFrame({"variable": ["m/fc1/kernel", "m/fc1/kernel", "m/b"], "task": ["ps:0", "ps:1", "ps:0"],
    ...                       "bytes": [6_000_000, 6_000_000, 40]})
    >>> q = cluster_numbers(runs, place)
    >>> round(q["worker_cpu_ratio"], 3), q["largest_variable"], q["largest_variable_mb"], q["largest_variable_shards"]
    (1.008, 'm/fc1/kernel', 12.0, 2)
    >>> q["updates_1"], q["updates_2"]
    (150, 150)
    """
    rows = ps_runs.set_index("workers")
    out: dict[str, Any] = {}
    for w in (1, 2):
        out[f"staleness_{w}"] = _at(rows, w, "staleness_mean")
        out[f"accuracy_{w}"] = _at(rows, w, "final_accuracy")
        out[f"worker_cpu_ms_{w}"] = 1e3 * _at(rows, w, "worker_cpu_s_per_step")
        updates = _at(rows, w, "applied_updates")
        out[f"updates_{w}"] = int(updates) if math.isfinite(updates) else NAN
        out[f"worker_cpu_share_{w}"] = _at(rows, w, "worker_cpu_share_min")
    out["accuracy_gap"] = abs(out["accuracy_2"] - out["accuracy_1"])
    out["worker_cpu_ratio"] = out["worker_cpu_ms_2"] / out["worker_cpu_ms_1"]
    out.update(throughput_numbers(ps_runs))
    per_variable = placement.groupby("variable", sort=False)["bytes"].agg(["sum", "count"])
    largest = per_variable["sum"].idxmax()
    out["largest_variable"] = str(largest)
    out["largest_variable_mb"] = float(per_variable.loc[largest, "sum"]) / 1e6
    out["largest_variable_shards"] = int(per_variable.loc[largest, "count"])
    out["model_mb"] = float(placement["bytes"].sum()) / 1e6
    out["mb_per_task"] = [float(b) / 1e6 for b in placement.groupby("task")["bytes"].sum()]
    return out


def throughput_numbers(ps_runs: pd.DataFrame) -> dict[str, Any]:
    """Steps per second with two workers / with one, all on the workers' clocks: ``steps_ratio`` (the ratio of the
    runs' window means), each run's mean and std over its timed windows (``steps_per_s_<w>``,
    ``steps_per_s_std_<w>``; the chief's rate over its own, longer span is ``steps_per_s_chief_<w>``), and, where the
    runs record their slowest and fastest window (``steps_per_s_window_min`` / ``_max``), the window-against-window
    range ``steps_ratio_windows_low`` (the slowest 2-worker window over the fastest 1-worker window) to
    ``steps_ratio_windows_high`` (the fastest over the slowest), with which way that whole range goes
    (``steps_ratio_side``: ``"more"`` when every 2-worker window beat every 1-worker window, ``"fewer"``, or
    ``"about equal"``, by ``prose.timing_side``). Without those columns the side is ``"not recorded"``: a mean ± std
    band over a few windows says nothing about every window, so no verdict is read off it. Wall time, unlike CPU
    time, shows whether the workers got their cores.

    >>> runs = pd.DataFrame({"workers": [1, 2], "steps_per_s": [23.0, 38.0], "steps_per_s_windows": [24.0, 40.0],
    ...                      "steps_per_s_std": [2.0, 3.0],
    ...                      "steps_per_s_window_min": [22.0, 36.0], "steps_per_s_window_max": [27.0, 44.0]})
    >>> q = throughput_numbers(runs)
    >>> round(q["steps_ratio"], 3), round(q["steps_ratio_windows_low"], 3), q["steps_ratio_side"]
    (1.667, 1.333, 'more')
    >>> throughput_numbers(runs.drop(columns=["steps_per_s_window_min", "steps_per_s_window_max"]))["steps_ratio_side"]
    'not recorded'
    """
    rows = ps_runs.set_index("workers")
    rate = "steps_per_s_windows" if "steps_per_s_windows" in ps_runs.columns else "steps_per_s"  # older runs
    s1, d1 = _at(rows, 1, rate), _at(rows, 1, "steps_per_s_std")
    s2, d2 = _at(rows, 2, rate), _at(rows, 2, "steps_per_s_std")
    low = _at(rows, 2, "steps_per_s_window_min") / _at(rows, 1, "steps_per_s_window_max")
    slowest_1 = _at(rows, 1, "steps_per_s_window_min")
    high = _at(rows, 2, "steps_per_s_window_max") / slowest_1 if slowest_1 > 0 else NAN
    if math.isfinite(low) and math.isfinite(high):
        side = {"slower": "more", "faster": "fewer"}.get(timing_side(low, high), "about equal")  # a ratio of rates
    else:
        side = "not recorded"
    return {"steps_per_s_1": s1, "steps_per_s_2": s2, "steps_per_s_std_1": d1, "steps_per_s_std_2": d2,
            "steps_per_s_chief_1": _at(rows, 1, "steps_per_s"), "steps_per_s_chief_2": _at(rows, 2, "steps_per_s"),
            "steps_ratio": s2 / s1, "steps_ratio_windows_low": low, "steps_ratio_windows_high": high,
            "steps_ratio_side": side}


def n_push_numbers(sweep: pd.DataFrame, model_mb: float, link_gbit_s: float = 1.0) -> dict[str, Any]:
    """The ``n_push`` sweep at its two ends: ps and worker CPU per step, staleness, updates; a transfer's time.

    CPU time per step (ms, per minibatch) at the smallest and the largest ``n`` (``ps_cpu_ms_smallest`` /
    ``_largest``, ``worker_cpu_ms_smallest`` / ``_largest``), how much it grows from the largest ``n`` to the
    smallest as a ratio (``ps_cpu_ratio``, ``worker_cpu_ratio_n``) and in ms (``ps_cpu_ms_added``,
    ``worker_cpu_ms_added``): a small ratio on a large base can be as many ms as a large ratio on a small one.
    Each ``n`` is one run, and a worker's CPU time per step moves with contention for the cores too, so no verdict on
    which side grew more is drawn from these.
    ``transfer_s`` is the time the model's bytes take one way over a ``link_gbit_s`` link (arithmetic, not measured).

    >>> sweep = pd.DataFrame({"n_push": [1, 8], "ps_cpu_s_per_step": [0.02, 0.005], "steps": [128, 128],
    ...                       "worker_cpu_s_per_step": [0.12, 0.125], "staleness_mean": [0.95, 0.9],
    ...                       "applied_updates": [128, 16]})
    >>> q = n_push_numbers(sweep, model_mb=13.0)
    >>> q["ps_cpu_ratio"], q["updates_smallest"], q["updates_largest"], round(q["transfer_s"], 3)
    (4.0, 128, 16, 0.104)
    >>> round(q["ps_cpu_ms_added"], 3), round(q["worker_cpu_ms_added"], 3)
    (15.0, -5.0)
    """
    out: dict[str, Any] = {"transfer_s": model_mb * 8e6 / (link_gbit_s * 1e9), "link_gbit_s": link_gbit_s}
    ends = ("ps_cpu_ms_smallest", "ps_cpu_ms_largest", "worker_cpu_ms_smallest", "worker_cpu_ms_largest",
            "ps_cpu_ms_added", "worker_cpu_ms_added", "worker_cpu_ratio_n")
    if len(sweep) < 2:
        return {**out, "ps_cpu_ratio": NAN, "worker_cpu_ms_min": NAN, "worker_cpu_ms_max": NAN,
                "staleness_min": NAN, "staleness_max": NAN, "n_smallest": NAN, "n_largest": NAN,
                "updates_smallest": NAN, "updates_largest": NAN, "sweep_steps": NAN, **dict.fromkeys(ends, NAN)}
    by_n = sweep.set_index("n_push")
    small, large = by_n.index.min(), by_n.index.max()
    ps_small, ps_large = (1e3 * float(by_n.loc[n, "ps_cpu_s_per_step"]) for n in (small, large))
    w_small, w_large = (1e3 * float(by_n.loc[n, "worker_cpu_s_per_step"]) for n in (small, large))
    return {**out,
            "ps_cpu_ratio": ps_small / ps_large,
            "ps_cpu_ms_smallest": ps_small, "ps_cpu_ms_largest": ps_large, "ps_cpu_ms_added": ps_small - ps_large,
            "worker_cpu_ms_smallest": w_small, "worker_cpu_ms_largest": w_large,
            "worker_cpu_ms_added": w_small - w_large, "worker_cpu_ratio_n": w_small / w_large,
            "worker_cpu_ms_min": 1e3 * float(by_n["worker_cpu_s_per_step"].min()),
            "worker_cpu_ms_max": 1e3 * float(by_n["worker_cpu_s_per_step"].max()),
            "staleness_min": float(by_n["staleness_mean"].min()),
            "staleness_max": float(by_n["staleness_mean"].max()),
            "n_smallest": int(small), "n_largest": int(large),
            "updates_smallest": int(by_n.loc[small, "applied_updates"]),
            "updates_largest": int(by_n.loc[large, "applied_updates"]),
            "sweep_steps": int(by_n.loc[large, "steps"])}


def _gaps(frame: pd.DataFrame, prefix: str, taus: Sequence[int]) -> dict[str, Any]:
    """``<prefix>_<a>_<b>_<tau>`` (mean), ``<prefix>_se_…``, ``<prefix>_low_…``, ``<prefix>_high_…`` and
    ``<prefix>_sign_…`` (``interval_sign``: "+" the printed interval is above zero, "-" below, "0" it holds zero or
    was not measured) for every pair."""
    d = frame.set_index(["a", "b", "tau"]) if len(frame) else pd.DataFrame()
    pairs = list(dict.fromkeys(zip(frame["a"], frame["b"]))) if len(frame) else []
    out: dict[str, Any] = {}
    for a, b in [*pairs, *([("adam", "sgd")] if ("adam", "sgd") not in pairs else [])]:
        for tau in (0, *taus):
            key = f"{a}_{b}_{tau}"
            out[f"{prefix}_{key}"] = _at(d, (a, b, tau), "mean")
            out[f"{prefix}_se_{key}"] = _at(d, (a, b, tau), "se")
            low, high = out[f"{prefix}_low_{key}"], out[f"{prefix}_high_{key}"] = (_at(d, (a, b, tau), "ci_low"),
                                                                                  _at(d, (a, b, tau), "ci_high"))
            out[f"{prefix}_sign_{key}"] = interval_sign(low, high)  # NaN: "0", cannot tell
    return out


def staleness_numbers(check: pd.DataFrame, differences: pd.DataFrame, tuned: pd.DataFrame,
                      grids: Mapping[str, Sequence[float]] | None = None,
                      taus: Sequence[int] = (1, 2, 4, 8), retuned: pd.DataFrame | None = None,
                      slowdowns: pd.DataFrame | None = None, rate_margin: float = 0.0) -> dict[str, Any]:
    """Dai et al.'s measure, the paired gaps with their intervals and the re-tuned accuracies, per optimizer and delay.

    Keys, for every optimizer ``<opt>`` of ``check`` and tau: ``slowdown_<opt>_<tau>``, ``slowdown_std_<opt>_<tau>``,
    ``drop_<opt>_<tau>`` with ``drop_low_<opt>_<tau>``/``drop_high_<opt>_<tau>`` (its 95% interval),
    ``reached_<opt>_<tau>``, ``final_<opt>_<tau>`` (final test accuracy at the undelayed rate,
    ``tuned_<opt>_0 - drop``), ``tuned_<opt>_<tau>``, ``tuned_std_<opt>_<tau>``, ``tuned_lr_<opt>_<tau>`` (test
    accuracy at the rate validation chose for that delay, its std, the rate), ``tuned_at_edge_<opt>_<tau>`` (1.0
    when that rate is the smallest or largest of ``grids[opt]``), ``lr_<opt>`` (the undelayed rate) and
    ``lr_at_edge_<opt>``; for every pair of ``differences``: ``gap_<a>_<b>_<tau>`` (a's accuracy lost minus b's,
    paired by seed), ``gap_se_…``, ``gap_low_…``/``gap_high_…`` (its 95% interval) and ``gap_sign_…`` (``"+"`` when
    the interval is above zero, ``"-"`` below, ``"0"`` when it holds zero: the run cannot tell), and
    ``gap_halfwidth_max_<tau>`` (the widest of those intervals at that delay, as a half-width), with the widest
    over every delay (``gap_halfwidth_max``) and its delay (``gap_halfwidth_max_tau``), and the narrowest interval of
    any gap at a delay, re-tuned ones included (``gap_halfwidth_min``). ``drop_sign_<opt>_<tau>``
    is the drop's verdict, read like a gap's. Every verdict is ``interval_sign``'s: read off the interval as printed,
    each bound to ``GAP_DECIMALS`` decimals rounded outward, so an interval that reaches zero only in a decimal not
    printed holds zero. ``rate_dominates_<a>_<b>`` is True where, at every delay with a verdict, the gap at the
    undelayed rates is more than ``RATE_DOMINATES`` times the re-tuned one (``tgap``): there the undelayed-rate gap
    mostly measures whether the rates chosen without delay survive it; ``rate_judged_<a>_<b>`` counts those delays
    (a verdict and a re-tuned gap). ``tgap_provisional_<a>_<b>_<tau>`` marks a re-tuned verdict where a re-chosen
    rate is an edge of its grid (``verdicts.provisional``), and ``intervals_read`` / ``weak_verdicts`` count the gap
    intervals and name the verdicts that only just leave out zero (``verdicts.census``). The Adam - SGD
    gap is also ``difference_<tau>`` / ``difference_se_<tau>`` (the headline's names), and ``tuned_gap_0`` is
    |Adam - SGD| at tau = 0. ``retuned`` (``staleness.tuned_differences``) adds the same keys under ``tgap``: the
    test accuracy a lost to the delay minus what b lost, each at the rate re-chosen for that tau. On Dai et al.'s own
    measure: ``slowdown_low_<opt>_<tau>``/``slowdown_high_…`` (the slowdown's 95% interval) with
    ``slowdown_sign_…`` (its interval against 1: "+" slower than without delay), and ``slowdowns``
    (``staleness.slowdown_differences``) adds ``slow_<a>_<b>_<tau>`` (a's slowdown minus b's, paired by seed) with
    ``slow_low_…``/``slow_high_…``/``slow_sign_…``, and ``slow_measured_<a>_<b>`` lists the delays where every
    seed of both reached the target (elsewhere there is no interval).

    >>> check = pd.DataFrame({"tau": [2], "optimizer": ["adam"], "slowdown_mean": [3.4], "slowdown_std": [0.5],
    ...                       "drop_mean": [0.01], "drop_ci_low": [0.0], "drop_ci_high": [0.02], "reached": [8],
    ...                       "learning_rate": [0.03]})
    >>> tuned = pd.DataFrame({"adam": [0.9], "adam_std": [0.01], "adam_lr": [0.03]}, index=pd.Index([2], name="tau"))
    >>> gaps = pd.DataFrame({"a": ["adam"], "b": ["sgd"], "tau": [2], "mean": [-0.1], "se": [0.02],
    ...                      "ci_low": [-0.15], "ci_high": [-0.05]})
    >>> q = staleness_numbers(check, gaps, tuned, {"adam": [0.01, 0.03]}, (2,))
    >>> q["slowdown_adam_2"], q["reached_adam_2"], q["gap_sign_adam_sgd_2"], q["tuned_at_edge_adam_2"]
    (3.4, 8, '-', 1.0)
    >>> q["difference_2"], q["lr_at_edge_adam"]
    (-0.1, 1.0)
    """
    at = check.set_index(["tau", "optimizer"]) if len(check) else pd.DataFrame()
    names = list(dict.fromkeys([*(check["optimizer"] if len(check) else []), *[c for c in tuned.columns
                                                                           if "_" not in c]]))
    out: dict[str, Any] = {}

    def at_edge(o: str, lr: float) -> float:
        grid = list((grids or {}).get(o, []))
        return NAN if not grid or math.isnan(lr) else float(lr in (min(grid), max(grid)))

    for o in names:
        lrs = check.loc[check["optimizer"] == o, "learning_rate"] if len(check) else pd.Series(dtype=float)
        out[f"lr_{o}"] = float(lrs.iloc[0]) if len(lrs) else NAN
        out[f"lr_at_edge_{o}"] = at_edge(o, out[f"lr_{o}"])
        for tau in (0, *taus):
            for name, column in (("slowdown", "slowdown_mean"), ("slowdown_std", "slowdown_std"),
                                 ("slowdown_low", "slowdown_ci_low"), ("slowdown_high", "slowdown_ci_high"),
                                 ("drop", "drop_mean"), ("drop_low", "drop_ci_low"), ("drop_high", "drop_ci_high")):
                out[f"{name}_{o}_{tau}"] = _at(at, (tau, o), column)
            out[f"slowdown_sign_{o}_{tau}"] = interval_sign(out[f"slowdown_low_{o}_{tau}"] - 1,
                                                            out[f"slowdown_high_{o}_{tau}"] - 1)
            out[f"drop_sign_{o}_{tau}"] = interval_sign(out[f"drop_low_{o}_{tau}"], out[f"drop_high_{o}_{tau}"])
            reached = _at(at, (tau, o), "reached")  # a count: an integer where measured
            out[f"reached_{o}_{tau}"] = int(reached) if math.isfinite(reached) else NAN
            out[f"tuned_{o}_{tau}"] = _at(tuned, tau, o)
            out[f"tuned_std_{o}_{tau}"] = _at(tuned, tau, f"{o}_std")
            lr = out[f"tuned_lr_{o}_{tau}"] = _at(tuned, tau, f"{o}_lr")
            out[f"tuned_at_edge_{o}_{tau}"] = at_edge(o, lr)
        for tau in (0, *taus):
            out[f"final_{o}_{tau}"] = out[f"tuned_{o}_0"] - out[f"drop_{o}_{tau}"]
    out.update(_gaps(differences, "gap", taus))
    out.update(_gaps(retuned if retuned is not None else pd.DataFrame(), "tgap", taus))
    slow = (slowdowns if slowdowns is not None else pd.DataFrame()).rename(columns={
        "slowdown_gap_mean": "mean", "slowdown_gap_ci_low": "ci_low", "slowdown_gap_ci_high": "ci_high"})
    out.update(_gaps(slow, "slow", taus))
    for a, b in list(dict.fromkeys(zip(slow["a"], slow["b"]))) if len(slow) else []:
        out[f"slow_measured_{a}_{b}"] = [t for t in taus if math.isfinite(out[f"slow_low_{a}_{b}_{t}"])]
    pairs = list(dict.fromkeys(zip(differences["a"], differences["b"]))) if len(differences) else []
    for tau in (0, *taus):  # the widest interval of any gap at this delay, as a half-width
        widths = [(out[f"gap_high_{a}_{b}_{tau}"] - out[f"gap_low_{a}_{b}_{tau}"]) / 2 for a, b in pairs]
        widths = [w for w in widths if not math.isnan(w)]
        out[f"gap_halfwidth_max_{tau}"] = max(widths) if widths else NAN
    delayed = [t for t in taus if t != 0 and not math.isnan(out[f"gap_halfwidth_max_{t}"])]
    widest = max(delayed, key=lambda t: out[f"gap_halfwidth_max_{t}"]) if delayed else NAN
    out["gap_halfwidth_max"] = out[f"gap_halfwidth_max_{widest}"] if delayed else NAN
    out["gap_halfwidth_max_tau"] = widest
    halves = [(out.get(f"{p}_high_{a}_{b}_{t}", NAN) - out.get(f"{p}_low_{a}_{b}_{t}", NAN)) / 2
              for p in ("gap", "tgap") for a, b in pairs for t in taus if t != 0]
    halves = [h for h in halves if math.isfinite(h)]
    out["gap_halfwidth_min"] = min(halves) if halves else NAN  # the narrowest interval of any gap at a delay
    out["rate_dominates_factor"] = RATE_DOMINATES
    out.update(provisional(out, pairs, taus))
    out.update(rate_trends(out, names, taus))
    out.update(twins(out, pairs, taus))
    out.update(census(out, pairs, taus, rate_margin))
    for a, b in pairs:  # does re-choosing the rates for the delay shrink the gap to a fraction of itself?
        judged = [t for t in taus if t != 0 and out[f"gap_sign_{a}_{b}_{t}"] != "0"
                  and not math.isnan(out.get(f"tgap_{a}_{b}_{t}", NAN))]
        out[f"rate_judged_{a}_{b}"] = len(judged)
        out[f"rate_dominates_{a}_{b}"] = bool(judged) and all(
            abs(out[f"gap_{a}_{b}_{t}"]) > RATE_DOMINATES * abs(out[f"tgap_{a}_{b}_{t}"]) for t in judged)
    for tau in (0, *taus):
        out[f"difference_{tau}"] = out[f"gap_adam_sgd_{tau}"]
        out[f"difference_se_{tau}"] = out[f"gap_se_adam_sgd_{tau}"]
    out["tuned_gap_0"] = abs(out.get("tuned_adam_0", NAN) - out.get("tuned_sgd_0", NAN))
    return out


def quoted(costs: pd.DataFrame, ps_runs: pd.DataFrame, placement: pd.DataFrame, sweep: pd.DataFrame,
           check: pd.DataFrame, differences: pd.DataFrame, tuned: pd.DataFrame,
           grids: Mapping[str, Sequence[float]] | None = None, retuned: pd.DataFrame | None = None,
           slowdowns: pd.DataFrame | None = None, rate_margin: float = 0.0) -> dict[str, Any]:
    """Every number notebook 04's prose quotes, in one flat dict (NaN where the run did not measure it).

    ``grids`` are the learning-rate grids of the staleness study (to tell whether a re-tuned rate is at an edge);
    ``slowdowns``: ``staleness.slowdown_differences`` (Dai et al.'s measure, paired by seed); ``rate_margin``: the
    most test accuracy choosing a rate on validation gave up (``staleness.worst_peek_cost``), below which a re-tuned
    verdict is weak (``verdicts.census``).
    """
    out: dict[str, Any] = {**fetch_numbers(costs), **cluster_numbers(ps_runs, placement)}
    out.update(n_push_numbers(sweep, out["model_mb"]))
    out.update(staleness_numbers(check, differences, tuned, grids, retuned=retuned, slowdowns=slowdowns,
                                 rate_margin=rate_margin))
    return {k: (NAN if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def gap_text(q: Mapping[str, Any], prefix: str, a: str, b: str, tau: int) -> str:
    """One gap as SUMMARY shows it: the mean, and its interval with each bound rounded outward (``GAP_DECIMALS``).

    >>> q = {"gap_adam_sgd_4": -0.0141, "gap_low_adam_sgd_4": -0.023249, "gap_high_adam_sgd_4": -0.00017}
    >>> gap_text(q, "gap", "adam", "sgd", 4)
    '−0.014 (−0.024 to 0.000, holds zero)'

    An end that prints as 0.000 is marked "holds zero" (no verdict), and a verdict ``verdicts.census`` calls weak
    (its ``weak_keys``) "weak".
    """
    key = f"{a}_{b}_{tau}"
    low, high = (bound_text(q[f"{prefix}_low_{key}"], "floor"), bound_text(q[f"{prefix}_high_{key}"], "ceil"))
    marks = (["holds zero"] if "0.000" in (low, high) else []) + (
        ["weak"] if f"{prefix}_{key}" in q.get("weak_keys", ()) else [])
    return f"{signed(q[f'{prefix}_{key}'], decimals=GAP_DECIMALS)} ({low} to {high}{''.join(', ' + m for m in marks)})"


def headline(metrics: dict[str, Any]) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study. ``headline(metrics)``"""
    def ratio(v: dict[str, Any]) -> str:  # the median to 3 significant digits, its range at the same decimals
        r = float(v["ratio"])
        d = max(2 - math.floor(math.log10(abs(r))), 0) if math.isfinite(r) and r else 2
        spread = (f" ({floor(v['ratio_low'], 'fixed', d)}–{ceil(v['ratio_high'], 'fixed', d)})"
                  if "ratio_low" in v and "ratio_high" in v else "")
        return f"{fixed(r, d)}{spread}"

    out = {f"{k}: time / one pass in the same mode (ratio; median and range over interleaved rounds)": ratio(v)
           for k, v in metrics["fetch_costs"].items() if v["ratio"] != 1.0 or "one" not in k.split("/")[1]}
    if metrics.get("data_source"):
        out = {"data": str(metrics["data_source"]), **out}
    error = metrics["exact_update_max_error"]
    out["max |x_after - (x_before - lr*T(g))| on the CNN"] = "0 (exact)" if error == 0 else f"{error:.1e}"
    for w, r in metrics["ps"].items():
        windows = r.get("steps_per_s_windows", r["steps_per_s"])  # older runs: the chief's
        out[f"Downpour CNN, {w} worker{'s' * (int(w) > 1)}: steps/s (workers' clocks, mean ± std of the timed "
            f"windows of one run; in brackets the chief's clock over its longer span) / final test accuracy / mean "
            f"staleness (updates; one run)"] = (
            f"{windows:.1f} ± {r['steps_per_s_std']:.1f} ({r['steps_per_s']:.1f}) / {r['final_accuracy']:.3f} / "
            f"{r['staleness_mean']:.2f}")
    q = metrics.get("quoted", {})
    rows = (("tgap", "the rate the validation split re-chose for each delay", "lost to the delay"),
            ("gap", "the rate the validation split chose without delay", "lost"))  # the re-chosen rates first
    def margin(prefix: str) -> str:  # the second weak rule, for the re-tuned rows (``verdicts.census``)
        m = q.get("rate_margin", 0.0)
        return (f", or, as printed, nearer zero than {ceil(m, 'fixed', GAP_DECIMALS)}, what choosing a rate on "
                "validation gave up" if prefix == "tgap" and isinstance(m, float) and m > 0 else "")

    for pair in metrics.get("staleness_gap_pairs", [["adam", "sgd"]]):
        a, b = pair
        for prefix, rate, lost in rows:
            shown = [f"τ = {tau}: {gap_text(q, prefix, a, b, tau)}"
                     + (" (provisional: a re-chosen rate at its grid's edge)"
                        if prefix == "tgap" and q.get(f"tgap_provisional_{a}_{b}_{tau}") else "")
                     for tau in (1, 2, 4, 8)
                     if isinstance(q.get(f"{prefix}_high_{a}_{b}_{tau}"), float)
                     and math.isfinite(q[f"{prefix}_high_{a}_{b}_{tau}"])]
            note = ("; mostly measures whether the rates chosen without delay survive it, not how the optimizers "
                    "tolerate late gradients" if prefix == "gap" and q.get(f"rate_dominates_{a}_{b}") else "")
            if shown:
                out[f"staleness, each optimizer at {rate}: {a}'s test accuracy {lost} minus {b}'s, paired by seed "
                    f"(mean and 95% interval, bounds rounded outward; negative: {a} loses less; weak: the interval's "
                    f"end nearer zero lies within {WEAK_SHARE:.0%} of its half-width of zero{margin(prefix)}"
                    f"{note})"] = "; ".join(shown)
    for pair in metrics.get("staleness_gap_pairs", [["adam", "sgd"]]):
        a, b = pair
        measured = q.get(f"slow_measured_{a}_{b}")
        if measured is None:
            continue
        out[f"staleness, Dai et al.'s measure at the rates chosen without delay: {a}'s slowdown (updates to reach the "
            f"target accuracy / the same seed's without delay) minus {b}'s, paired by seed (mean and 95% interval; —: "
            f"a seed never reached the target)"] = "; ".join(
            f"τ = {tau}: " + (gap_text(q, "slow", a, b, tau) if tau in measured else "—") for tau in (1, 2, 4, 8))
    f = metrics["fault_accounting"]
    out["faults: updates in the last checkpoint restored / lost with the ps / applied after the last restart"] = \
        f"{f['restored_version']} / {f['lost_with_ps']} / {f['applied_after_restart']}"
    return out


METRIC_KINDS = {
    "config": "constant", "freezing_version": "constant", "data_source": "constant", "cnn_variables": "constant",
    "cnn_parameters": "constant", "train_images": "constant", "cpu_count": "constant",
    "fetch_costs/**/ms": "timing", "fetch_costs/**/ratio_*": "timing_spread", "fetch_costs/**/ratio": "timing_ratio",
    "fetch_spread": "timing_spread",
    "downpour_demo/updates": "count", "downpour_demo/staleness_*": "sample", "ps_staleness/*": "sample",
    "ps/*/steps_per_s_std": "timing_spread", "ps/*/steps_per_s": "timing", "ps/*/updates_per_s": "timing",
    "ps/*/steps_per_s_windows": "timing",
    "ps/*/worker_cpu_share_min": "timing_ratio", "ps/*/worker_cpu_s_per_step": "timing",
    "ps/*/final_accuracy": "accuracy",
    "bytes_per_ps_task": "count",
    "n_push_sweep[*]/steps_per_s_std": "timing_spread", "n_push_sweep[*]/steps_per_s": "timing",
    "n_push_sweep[*]/n_push": "constant", "n_push_sweep[*]/final_accuracy": "accuracy",
    "faults/**/seconds": "timing", "faults/faults[*]/error": "message", "faults/faults[*]/restarted": "message",
    "fault_rows[*]/how it came back": "message",
    "ps_masked/workers": "constant", "ps_masked/mask_placement": "constant", "ps_masked/frozen_entries": "count",
    "ps_masked/trainable_entries": "count", "ps_masked/frozen_changed_bits": "count",
    "ps_masked/optimizer_bytes_per_task": "count", "ps_masked/*accuracy": "accuracy",
    "quoted/*_spread_*": "timing_spread", "quoted/*_side": "timing_verdict",  # before the ratios they belong to
    "quoted/tf1_eval_per_variable": "timing_ratio", "quoted/eager_*": "timing_ratio",
    "quoted/function_*": "timing_ratio",
    "quoted/worker_cpu_ms*": "timing", "quoted/worker_cpu_ratio": "timing_ratio",
    "quoted/worker_cpu_ratio_n": "timing_ratio", "quoted/ps_cpu_ratio": "timing_ratio",
    "quoted/ps_cpu_ms*": "timing",
    "quoted/worker_cpu_share_*": "timing_ratio",
    "quoted/rate_dominates_factor": "constant", "quoted/weak_share": "constant",
    "quoted/weak_verdicts": "message", "quoted/borderline_verdicts": "message",
    "quoted/weak_keys": "message", "quoted/tgap_edge_*": "message",
    "quoted/steps_per_s_std_*": "timing_spread", "quoted/steps_ratio_windows_*": "timing_spread",
    "quoted/steps_per_s_*": "timing", "quoted/steps_ratio": "timing_ratio",
    "quoted/link_gbit_s": "constant", "quoted/timing_tolerance": "constant",
    "confidence": "constant", "staleness_gap_pairs": "constant", "quoted/transfer_s": "constant",
    "staleness_peek_cost_worst/optimizer": "message", "staleness_peek_cost_worst/tau": "constant",
    "staleness_adamw_weight_decay": "constant",
    "quoted/largest_variable*": "constant",
    "quoted/model_mb": "constant", "quoted/mb_per_task": "constant", "quoted/n_smallest": "constant",
    "quoted/n_largest": "constant", "quoted/updates_smallest": "constant", "quoted/updates_largest": "constant",
    "quoted/sweep_steps": "constant", "quoted/accuracy_*": "accuracy",
    "quoted/updates_1": "count", "quoted/updates_2": "count",
    "duration_s": "timing", "staleness_seconds": "timing", "val_images": "constant", "test_images": "constant",
}
"""What each value of study 04's ``metrics.json`` is (``study.report.kinds``); the rest are measured values
(staleness, accuracy, counts of updates, which vary between asynchronous runs)."""
