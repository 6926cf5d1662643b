"""Study 05: the which-method-for-which-job table across studies 01-05 (read from their metrics.json)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from study.recipes.labels import OPTIMIZER_NAMES, optimizer_name  # noqa: F401
from study.recipes.summary import method_state_kept
from study.report.prose import ceil, floor, pm, times


def _read(results_dir: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((Path(results_dir) / name / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def _get(metrics: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(metrics, Mapping) or key not in metrics:
            return None
        metrics = metrics[key]
    return metrics


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool, not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _first(metrics: Any, *keys: str) -> float | None:
    """The first of ``keys`` in ``metrics`` that holds a number, else None (for renamed keys)."""
    for key in keys:
        value = _number(_get(metrics, key)) if isinstance(metrics, Mapping) else None
        if value is not None:
            return value
    return None


def _n(value: Any) -> str:
    """A count with thousands separators, or "n/a"."""
    return "n/a" if _number(value) is None else f"{value:,}"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.1f}%"


def _ms(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None or value != value else f"{float(value):.{digits}f} ms"


def _ms_pm(mean: Any, std: Any, decimals: Any = None) -> str:
    """A step time as 'mean ± std ms' (std over seeds; the mean alone where there is none), or "n/a"; ``decimals``
    (an int) prints every time of one source at its table's precision.

    >>> _ms_pm(0.9781, 0.0041), _ms_pm(28.1, None), _ms_pm(None, 1.0), _ms_pm(16.8, 1.6, 2)
    ('0.9781 ± 0.0041 ms', '28.1 ms', 'n/a', '16.80 ± 1.60 ms')
    """
    mean, std = _number(mean), _number(std)
    if mean is None or std is None:
        return _ms(mean)
    return f"{pm(mean, std, decimals=decimals if isinstance(decimals, int) else None)} ms"


def _times(named: Mapping[str, tuple[Any, Any]], unit: str = "step") -> str:
    """Step times of methods compared in one cell, each 'mean ± std' over seeds: "1.34 ± 0.02 ms/step (exact) vs
    1.37 ± 0.03 ms (gradient mask)", and "; no order: ..." when the slowest's and the fastest's mean ± std ranges
    overlap (so no method is named faster). ``named`` maps a method's name to (mean, std) of its step time."""
    known = {k: (_number(m), _number(sd) or 0.0) for k, (m, sd) in named.items() if _number(m) is not None}
    if not known:
        return "n/a"
    items = list(known.items())
    text = f"{_ms_pm(*named[items[0][0]])}/{unit} ({items[0][0]})" + "".join(
        f" vs {_ms_pm(*named[k])} ({k})" for k, _ in items[1:])
    if len(known) > 1:
        (slow, (m_hi, s_hi)), (fast, (m_lo, s_lo)) = (max(items, key=lambda i: i[1][0]),
                                                      min(items, key=lambda i: i[1][0]))
        if m_hi - s_hi < m_lo + s_lo:
            text += (f"; no order: the ranges mean ± std over seeds of {slow} and {fast} overlap (gap "
                     f"{_ms(m_hi - m_lo, 3)}, stds {_ms(s_hi, 3)} and {_ms(s_lo, 3)})")
    return text


def _prune_times(per_optimizer: Mapping[str, Any]) -> str:
    """Recipe 2's step times under every optimizer it ran, never pooled: the exact mask against the gradient mask
    and the constraint, and the exact mask over the gradient mask paired by run, read by 02's rule."""
    parts = []
    for o, r in per_optimizer.items():
        exact, grad, con = (_number(_get(r, m, "step_time_ms")) for m in ("exact", "gradient_mask", "constraint"))
        def ranged(method: str, mean: float | None) -> str:
            lo, hi = (_number(_get(r, method, f"step_time_ms_{end}")) for end in ("min", "max"))
            return _ms(mean) + ("" if lo is None or hi is None else
                                f" (runs {floor(lo, 'fixed', 1)}–{ceil(hi, 'fixed', 1)})")  # outward: holds every run

        text = (f"under {optimizer_name(o)}, per CNN step: exact {ranged('exact', exact)} vs gradient mask "
                f"{ranged('gradient_mask', grad)}, constraint {ranged('constraint', con)}")
        over = _get(r, "exact", "over", "gradient_mask")
        if isinstance(over, Mapping):  # paired by run, 02's rule: a verdict only where every run is beyond 2%
            verdict = {"slower": "slower in every run", "faster": "faster in every run"}.get(over.get("side"),
                                                                                         "about equal")
            text += (f" (exact / gradient mask, paired by run: {floor(over['min'], 'fixed', 3)}–"
                     f"{ceil(over['max'], 'fixed', 3)}×, {verdict}; one run's verdict)")
        parts.append(text)
    return ("; ".join(parts) + " (mean over sparsities and seeds)") if parts else "n/a"


def _constraint_bytes(total: Any, parts: Mapping[str, Any] | None) -> str:
    """Recipe 1's copy-back constraint state: its bytes, split into the float copy and the mask where known.

    >>> _constraint_bytes(2620, {"values": 2600, "mask": 20}), _constraint_bytes(2620, None)
    ('2,620 bytes: a float copy of the head (2,600) and its mask (20)', '2,620 bytes (a copy of the values + mask)')
    """
    copy, mask = _get(parts or {}, "values"), _get(parts or {}, "mask")
    if _number(copy) is None or _number(mask) is None or _number(total) != copy + mask:
        return f"{_n(total)} bytes (a copy of the values + mask)"
    return f"{_n(total)} bytes: a float copy of the head ({_n(copy)}) and its mask ({_n(mask)})"


def _prune_mask_bytes(total: Any, kernel: Any, variables: Any) -> str:
    """Recipe 2's exact-mask bytes: 1 per fc1 kernel entry, plus a one-byte mask per other variable of the CNN.

    >>> _prune_mask_bytes(3211271, 3211264, 8)
    "3,211,271 bytes of masks: 1 per fc1 kernel entry (3,211,264) and a one-byte mask for each of the CNN's
    7 other variables"
    >>> _prune_mask_bytes(3211271, None, None)
    '3,211,271 bytes of masks (fc1 kernel and the other variables)'
    """
    if _number(total) is None or _number(kernel) is None or _number(variables) is None \
            or total - kernel != variables - 1:
        return f"{_n(total)} bytes of masks (fc1 kernel and the other variables)"
    return (f"{_n(total)} bytes of masks: 1 per fc1 kernel entry ({_n(kernel)}) and a one-byte mask for each of the "
            f"CNN's {_n(variables - 1)} other variables")


def method_table(metrics: Mapping[str, Any], results_dir: str | Path) -> pd.DataFrame:
    """Which method for which job, across studies 01-05: what it guarantees, what it costs, and the numbers.

    ``metrics`` is this notebook's metrics (the recipe numbers); studies 01-04 are read from
    ``results_dir/<study>/metrics.json`` when present ("not in results/" otherwise). ``method_table(m, "../results")``
    """
    s01, s02 = _read(results_dir, "01_adam_drift"), _read(results_dir, "02_mnist_cnn_freezing")
    s03, s04 = _read(results_dir, "03_gan_alternating"), _read(results_dir, "04_gradients_and_ps")
    missing = "not in results/"
    r1, r2, r3, r4, r5 = (metrics.get(k, {}) for k in ("new_columns", "pruning", "unfreezing", "sparse", "subnetwork"))
    # Studies 01-04 have renamed keys over time: each number is looked up under its current and its older names.
    ft = _get(s02, "finetune") or {}
    ft_decimals = _get(s02, "decimals", "finetune", "step_time_ms")  # 02's step times as 02's table prints them
    drift01 = _get(s01, "drift") or _get(s01, "drift_final_mean") or {}
    naive01 = {k.split("/")[0]: _number(v if not isinstance(v, Mapping) else _first(v, "changed_entries_sum_mean"))
               for k, v in drift01.items() if k.endswith("/naive")}
    drifting = sorted(k for k, v in naive01.items() if v is not None and v > 0)
    kept01 = sorted(k for k, v in naive01.items() if v == 0)  # a zero gradient moved nothing under these
    n_opt = len(naive01)

    def ft_cell(method: str) -> str:
        r = ft.get(f"adam/{method}")
        changed = _first(r, "conv_changed_entries_mean", "conv_changed")
        step = _first(r, "step_time_ms_mean", "ms_per_step")
        if changed is None:
            return missing
        std = _first(r, "step_time_ms_std")
        return (f"02 ({method}): {changed:,.0f} frozen conv entries changed, {_ms_pm(step, std, ft_decimals)}/CNN "
                "step (Adam)")

    def ft_time(method: str) -> str:
        r = ft.get(f"adam/{method}")
        step, std = _first(r, "step_time_ms_mean", "ms_per_step"), _first(r, "step_time_ms_std")
        return missing if step is None else f"02: {_ms_pm(step, std, ft_decimals)}/CNN step ({method}, Adam)"

    hold02 = _first(_get(s02, "masks", "adam/hold/p=0.5"), "frozen_changed_total_mean", "changed_total")
    gan03 = _first(_get(s03, "runs", "zeroed_gradients/adam"), "g_changed_entries_in_d_step", "g_changed_in_d_step")
    eval04 = _number(_get(s04, "fetch_costs", "TF1 graph/g.eval() per variable", "ratio"))
    exact04 = _number(_get(s04, "exact_update_max_error"))
    low04, high04 = (_number(_get(s04, "quoted", f"tf1_eval_per_variable_spread_{end}")) for end in ("low", "high"))

    def recipe(m: Mapping[str, Any], method: str, key: str = "moved_max") -> Any:
        return _get(m, "methods", method, key)

    po2 = r2.get("per_optimizer") or {}  # recipe 2 per optimizer, never pooled over optimizers
    p2 = po2.get(r2.get("headline_optimizer", "adam"), {})
    still_zero = [v for v in (_number(_get(r, "exact", "still_zero_min")) for r in po2.values()) if v is not None]

    def prune(method: str, key: str) -> Any:
        """Recipe 2's ``key`` for ``method`` under its headline optimizer (over its sparsities and seeds)."""
        return _get(p2, method, key)

    sparse = next((k for k in r4.get("methods", {}) if k.startswith("sparse")), "sparse")
    by_fraction = (metrics.get("sparse_costs") or {}).get("by_fraction", {})
    sparse_state = next(iter(by_fraction.values()), None)
    def sparse_times(key: str) -> str:
        """Recipe 4's step times of the ``key`` variant ('state_variant' or 'dense_variant') at each budget."""
        return ", ".join(f"{_ms_pm(recipe(r4, c[key], 'step_time_ms'), recipe(r4, c[key], 'step_time_ms_std'))}/step "
                         f"({_pct(c['fraction']).replace('.0%', '%')})"
                         for c in by_fraction.values())

    skip3 = "skip_frozen" in (_get(r3, "methods") or {})  # the recipe as the README gives it: with SkipFrozen
    un = _get(r3, "methods", "skip_frozen" if skip3 else "mask_schedule") or {}
    kept3 = method_state_kept(un) if {"boundaries_kept_total", "boundaries_total", "seeds"} <= set(un) else "n/a"
    budgets = " or ".join(_pct(c["fraction"]).replace(".0%", "%") for c in by_fraction.values()) or "a small share"
    rows = [
        ("freeze whole layers for the whole run (fine-tuning)", "layer.trainable = False, then compile (or a var_list)",
         "exact: frozen layers get no gradient and no optimizer state",
         "no gradient or optimizer update for frozen layers; " + ("; ".join(
             ft_time(m) for m in ("trainable_recompile", "var_list") if ft.get(f"adam/{m}")) or missing), "none",
         ft_cell("trainable_recompile") if ft else missing),
        ("change which layers train during one fit (gradual unfreezing)",
         "MaskedOptimizer(hold) + MaskSchedule.gradual_unfreezing" + (" + SkipFrozen" if skip3 else ""),
         f"exact and optimizer state kept at {kept3} stage boundaries",
         _times({m: (recipe(r3, k, "step_time_ms"), recipe(r3, k, "step_time_ms_std"))
                 for m, k in ((("with SkipFrozen", "skip_frozen"),) if skip3 else ())
                 + (("MaskSchedule", "mask_schedule"), ("recompiling", "recompile_fresh"))}, "MLP step")
         + (" (SkipFrozen: frozen layers get no gradient, one retrace per stage)" if skip3
            else " (frozen layers' gradients are still computed)"),
         f"{_n(recipe(r3, 'mask_schedule', 'extra_state_bytes'))} bytes in all (a scalar mask per variable)",
         "05 recipe 3; recompiling loses the state, trainable without recompile trains the wrong layers"),
        ("keep some entries of a tensor fixed, fixed mask (new output columns / embedding rows)",
         "MaskedOptimizer(hold) + set_mask",
         f"bit-exact: {_n(recipe(r1, 'exact'))} of {r1.get('old_entries', '?')} old entries moved",
         _times({m: (recipe(r1, k, 'step_time_ms'), recipe(r1, k, 'step_time_ms_std'))
                 for m, k in (("exact", "exact"), ("gradient mask", "gradient_mask"), ("constraint", "constraint"))}),
         f"{_n(recipe(r1, 'exact', 'extra_state_bytes'))} bytes of masks",
         f"05 recipe 1; a gradient mask under {optimizer_name(r1.get('optimizer', 'adamw'))} moved "
         f"{_n(recipe(r1, 'gradient_mask', 'moved_min'))} of "
         f"{r1.get('old_entries', '?')} (weight decay)"),
        ("the same job, another way", "a constraint that copies old values back",
         "values exact; the frozen entries' moments keep changing",
         f"{_ms_pm(recipe(r1, 'constraint', 'step_time_ms'), recipe(r1, 'constraint', 'step_time_ms_std'))}/step "
         "(compared in the row above)",
         _constraint_bytes(recipe(r1, 'constraint', 'extra_state_bytes'), metrics.get("new_columns_constraint_bytes")),
         "05 recipe 1"),
        ("pruned weights stay zero while fine-tuning", "MaskedOptimizer(hold) + set_mask(fc1.kernel, keep)",
         ("bit-exact: every pruned entry still zero in every run"
          if still_zero == [1.0] * len(still_zero) and still_zero
          else f"{_pct(min(still_zero, default=None))} of pruned entries still zero (fewest of any optimizer's runs)"),
         _prune_times(po2),
         _prune_mask_bytes(prune('exact', 'extra_state_bytes'), metrics.get("fc1_kernel_entries"),
                           metrics.get("cnn_variables")),
         "05 recipe 2; " + "; ".join(f"under {optimizer_name(o)} a gradient mask moved "
                                     f"{_n(_get(r, 'gradient_mask', 'moved_min'))} "
                                     "or more pruned entries in every run" for o, r in po2.items())
         + " (carried-over moments)"),
        (f"fine-tune a fixed {budgets} of entries (FISH-style)",
         "MaskedOptimizer(hold, state='sparse'), masks set before build (or the dense state: any mask, any time)",
         f"exact: {_n(recipe(r4, sparse, 'outside_max'))} entries outside the selection changed; the sparse state "
         "ends with the dense state's weights bit for bit" + (
             "" if sparse_state is None
             else " (checked: every seed)" if all(c["same_bits"] for c in by_fraction.values())
             else " (NOT in every seed of this run)"),
         (f"sparse state: {sparse_times('state_variant')}; dense state: {sparse_times('dense_variant')}; "
          f"full fine-tuning: {_ms(recipe(r4, 'full', 'step_time_ms'), 2)}/step") if by_fraction else
         f"{_ms(recipe(r4, sparse, 'step_time_ms'))}/step vs {_ms(recipe(r4, 'full', 'step_time_ms'))} "
         "full fine-tuning",
         "dense state: 1 byte of mask per entry; sparse state: optimizer state for the selection only"
         + ("" if sparse_state is None else f" ({_pct(sparse_state['sparse_state_bytes_share'])} of the dense state's "
                                            f"bytes at a {_pct(sparse_state['fraction']).replace('.0%', '%')} budget)"),
         "05 recipe 4; Keras' LoRA at a comparable size changes nearly every kernel entry"),
        ("masks that change every step (random sub-networks, block-coordinate)", "MaskedOptimizer(hold, mask_fn=...)",
         f"exact: {_n(recipe(r5, 'exact'))} frozen entry-steps moved",
         _times({m: (recipe(r5, k, "step_time_ms"), recipe(r5, k, "step_time_ms_std"))
                 for m, k in (("exact", "exact"), ("naive gate", "naive_gate"))}),
         f"{_n(recipe(r5, 'exact', 'extra_state_bytes'))} bytes in all: a one-byte placeholder per variable, no mask "
         "stored; mask_fn computes each step's masks in the graph",
         f"05 recipe 5; the naive gate moved {_n(recipe(r5, 'naive_gate', 'moved_min'))} or more frozen entry-steps "
         "in every seed; 02: "
         + (f"random masks (p = 0.5) held exactly under Adam changed {hold02:,.0f} frozen CNN entries"
            if hold02 is not None else missing)),
        ("a zero gradient / stop_gradient mask (what people do today)", "gate(x, keep), tf.where(keep, g, 0)",
         "exact only where a zero gradient gives a zero update: "
         + (f"in 01, {', '.join(kept01)} (of {n_opt} optimizers)" if kept01 else "plain SGD, Adagrad")
         + "; not momentum, Adam or weight decay",
         (f"{ft_time('gate')} vs {ft_time('var_list')} (the gate still computes the frozen layers' zero gradients: a "
          "likely reason, not timed apart in 02); "
          "05 recipe 5: " + _times({m: (recipe(r5, k, "step_time_ms"), recipe(r5, k, "step_time_ms_std"))
                                    for m, k in (("naive gate", "naive_gate"), ("exact", "exact"))}))
         if ft else missing, "none",
         f"01: frozen entries drift under {len(drifting)} of {n_opt} optimizers ({', '.join(drifting)})"
         if drift01 else missing),
        ("alternating steps of two networks (GAN)", "two optimizers, or var_list per step",
         "exact (0 changed entries in the frozen network)", "not compared here (03 reports each method's time)",
         "one optimizer state per network",
         f"03: zeroed gradients under Adam moved {gan03:,.0f} generator entry-steps (entries changed, summed over the "
         "run's iterations; mean over seeds)"
         if gan03 is not None else missing),
        ("transform gradients between compute and apply (parameter server)",
         "freezing.gradients: one tape, transform, apply", "exact update: x_after == x_before - lr*T(g)",
         f"04 (TF1 graph): fetching each variable's gradient with its own g.eval() costs {times(eval04)} fetching them "
         "all in one sess.run" + (f" ({floor(low04, 'times', 3)} to {ceil(high04, 'times', 3)} over the repeats)"
                                  if low04 is not None and high04 is not None else "")
         if eval04 is not None else missing, "none",
         f"04: max error {exact04}" if exact04 is not None else missing),
    ]
    return pd.DataFrame(rows, columns=["task", "method", "guarantee", "time per step", "memory", "evidence"])
