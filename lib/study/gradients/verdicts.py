"""Study 04's verdicts on the staleness gaps, and their bookkeeping: each read off its interval as printed, which
re-tuned verdicts are provisional, which optimizer repeats another, how the re-chosen rates move, and how many
separate comparisons the section's intervals are (with the weak and borderline ones named).

``study.gradients.findings`` puts these into ``metrics["quoted"]``; the prose of notebook 04 reads them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from study.intervals import DECIMALS, bound_text, interval_sign  # noqa: F401  (interval_sign: re-exported)
from study.report.prose import ceil, num, printed_value, signed

NAN = float("nan")
GAP_DECIMALS = DECIMALS
"""Decimals every gap, loss and interval bound of the staleness study is printed with (prose, tables, SUMMARY); a
verdict is read off the bounds as printed (``interval_sign``)."""
WEAK_SHARE = 0.25
"""A verdict is called weak where its interval's end nearer zero lies within this share of the interval's half-width
of zero: at 95% each, about one in twenty intervals of a gap whose true value is zero leaves out zero by chance, and
those that do mostly end near it."""


def provisional(q: Mapping[str, Any], pairs: Sequence[tuple[str, str]], taus: Sequence[int]) -> dict[str, Any]:
    """``tgap_provisional_<a>_<b>_<tau>``: True where the re-tuned gap has a verdict and either side's re-chosen rate
    is an edge of its grid (a rate beyond it might change the verdict), and ``tgap_edge_<a>_<b>_<tau>``: the
    optimizers whose rate is at an edge there, as ``"<opt> <rate>"``."""
    out: dict[str, Any] = {}
    for a, b in pairs:
        for tau in (0, *taus):
            key = f"{a}_{b}_{tau}"
            edge = [f"{o} {num(q.get(f'tuned_lr_{o}_{tau}', NAN))}" for o in (a, b)
                    if q.get(f"tuned_at_edge_{o}_{tau}") == 1]
            out[f"tgap_edge_{key}"] = edge
            out[f"tgap_provisional_{key}"] = bool(edge) and q.get(f"tgap_sign_{key}", "0") != "0"
    return out


TWINS = {"adamw": "adam"}
"""Optimizers that are another plus a small change: AdamW is Adam with a decoupled weight decay (``ADAMW``). Where
the validation split chose the same rate for both at every delay and their gaps against SGD agree in every verdict,
the twin's gaps against SGD repeat the other's on the same seeds, batches and SGD runs: one finding, counted once."""


def twins(q: Mapping[str, Any], pairs: Sequence[tuple[str, str]], taus: Sequence[int]) -> dict[str, Any]:
    """For each ``TWINS`` entry run against SGD: ``twin_same_rates_<twin>`` (the same rate chosen for both at every
    delay, undelayed and re-chosen), ``twin_same_verdicts_<twin>`` (every verdict of ``<twin> − sgd`` equals that of
    ``<base> − sgd``, both kinds of gap), ``twin_gap_diff_<twin>`` (the largest difference between the two gaps'
    means) and ``twin_<twin>``: the base where both hold (a repeat, counted once), else ``""``.

    >>> q = {"tuned_lr_adamw_0": 0.01, "tuned_lr_adam_0": 0.01, "tuned_lr_adamw_1": 0.01, "tuned_lr_adam_1": 0.01,
    ...      **{f"{p}_sign_{o}_sgd_1": "-" for p in ("gap", "tgap") for o in ("adam", "adamw")},
    ...      **{f"{p}_{o}_sgd_1": v for p in ("gap", "tgap") for o, v in (("adam", -0.30), ("adamw", -0.29))}}
    >>> t = twins(q, [("adam", "sgd"), ("adamw", "sgd")], (1,))
    >>> t["twin_adamw"], round(t["twin_gap_diff_adamw"], 3)
    ('adam', 0.01)
    """
    out: dict[str, Any] = {}
    for twin, base in TWINS.items():
        if not {(twin, "sgd"), (base, "sgd")} <= {tuple(p) for p in pairs}:
            continue
        same_rates = all(q.get(f"tuned_lr_{twin}_{t}") == q.get(f"tuned_lr_{base}_{t}") for t in (0, *taus))
        kinds = [(p, t) for p in ("gap", "tgap") for t in taus if f"{p}_sign_{twin}_sgd_{t}" in q]
        same_verdicts = all(q[f"{p}_sign_{twin}_sgd_{t}"] == q.get(f"{p}_sign_{base}_sgd_{t}") for p, t in kinds)
        diffs = [abs(q[f"{p}_{twin}_sgd_{t}"] - q.get(f"{p}_{base}_sgd_{t}", NAN)) for p, t in kinds]
        out[f"twin_same_rates_{twin}"], out[f"twin_same_verdicts_{twin}"] = same_rates, same_verdicts
        out[f"twin_gap_diff_{twin}"] = max([d for d in diffs if math.isfinite(d)], default=NAN)
        out[f"twin_{twin}"] = base if same_rates and same_verdicts and kinds else ""
    return out


def rate_trends(q: Mapping[str, Any], names: Sequence[str], taus: Sequence[int]) -> dict[str, Any]:
    """``rate_trend_<opt>``: how the rate the validation split re-chose moves as the delay grows, over ``(0, *taus)``:
    ``"falls"`` (it never rises from one delay to the next and ends lower), ``"stays"`` (the same at every delay),
    ``"mixed"`` (it rises somewhere) or ``"not measured"``.

    >>> q = {"tuned_lr_a_0": 0.5, "tuned_lr_a_8": 0.02, "tuned_lr_b_0": 0.003, "tuned_lr_b_8": 0.003}
    >>> t = rate_trends(q, ["a", "b", "c"], (8,))
    >>> t["rate_trend_a"], t["rate_trend_b"], t["rate_trend_c"]
    ('falls', 'stays', 'not measured')
    """
    out: dict[str, Any] = {}
    for o in names:
        rates = [q.get(f"tuned_lr_{o}_{t}", NAN) for t in (0, *taus)]
        if not rates or any(not math.isfinite(r) for r in rates):
            out[f"rate_trend_{o}"] = "not measured"
        elif all(r == rates[0] for r in rates):
            out[f"rate_trend_{o}"] = "stays"
        else:
            out[f"rate_trend_{o}"] = "falls" if all(b <= a for a, b in zip(rates, rates[1:])) else "mixed"
    return out


def census(q: Mapping[str, Any], pairs: Sequence[tuple[str, str]], taus: Sequence[int],
           rate_margin: float = 0.0) -> dict[str, Any]:
    """The gap intervals at a delay the section's tables hold, counted three ways, and the verdicts that only just
    leave out zero.

    ``intervals_read``: every interval printed (both kinds of gap, every pair and delay measured);
    ``intervals_distinct``: those left once two that are the same runs (where the rate re-chosen for a delay is the
    undelayed one, both gaps are one interval) count once; ``intervals_separate``: the distinct ones left once a
    twin's gaps against SGD (``twins``) count with their base's. ``weak_verdicts`` (and ``weak_verdict_count``):
    separate intervals with a verdict whose end nearer zero lies within ``WEAK_SHARE`` of the half-width of zero, or,
    for an interval with the rates re-chosen, an end nearer zero than ``rate_margin`` (the most test accuracy choosing
    a rate on validation gave up: a gap that small is within what the choice of rate alone can move), both as printed
    (``GAP_DECIMALS`` decimals, rounded outward). ``weak_keys``: every
    weak interval's ``<prefix>_<a>_<b>_<tau>``, copies included, for the prose to mark.
    ``borderline_verdicts`` (and ``borderline_count``): separate intervals that hold zero as printed (the one rule
    every verdict is read by, ``interval_sign``) but leave it out before rounding, each with that unrounded end.

    >>> q = {"gap_sign_a_b_1": "-", "gap_low_a_b_1": -0.0465, "gap_high_a_b_1": -0.0028}
    >>> census(q, [("a", "b")], (1,))["weak_verdicts"], census(q, [("a", "b")], (1,))["weak_keys"]
    (['a − b at τ = 1, undelayed rates (−0.047 to −0.002)'], ['gap_a_b_1'])
    >>> census({**q, "gap_high_a_b_1": -0.0120}, [("a", "b")], (1,))["weak_verdict_count"]
    0
    >>> t = {"tgap_sign_a_b_1": "-", "tgap_low_a_b_1": -0.014, "tgap_high_a_b_1": -0.0038}
    >>> census(t, [("a", "b")], (1,), rate_margin=0.0037)["weak_keys"], census(t, [("a", "b")], (1,))["weak_keys"]
    (['tgap_a_b_1'], [])
    >>> near = census({**q, "gap_sign_a_b_1": "0", "gap_high_a_b_1": -0.00017}, [("a", "b")], (1,))
    >>> near["borderline_verdicts"], near["weak_verdict_count"]
    (['a − b at τ = 1, undelayed rates (−0.047 to 0.000; high end −0.00017 before rounding)'], 0)
    """
    seen: dict[tuple[str, str, int, float, float], list[str]] = {}
    signs: dict[tuple[str, str, int, float, float], str] = {}
    for prefix, rates in (("tgap", "rates re-chosen"), ("gap", "undelayed rates")):
        for a, b in pairs:
            for tau in taus:
                key = f"{a}_{b}_{tau}"
                low, high = q.get(f"{prefix}_low_{key}", NAN), q.get(f"{prefix}_high_{key}", NAN)
                if tau == 0 or not (math.isfinite(low) and math.isfinite(high)):
                    continue
                seen.setdefault((a, b, tau, low, high), []).append(rates)
                signs[(a, b, tau, low, high)] = q.get(f"{prefix}_sign_{key}", "0")
    twins = {t: q.get(f"twin_{t}", "") for t in TWINS}
    separate = [k for k in seen if not (k[1] == "sgd" and twins.get(k[0]))]

    margin = printed_value(ceil(rate_margin, "fixed", GAP_DECIMALS)) if rate_margin > 0 else 0.0  # as printed

    def is_weak(key: tuple[str, str, int, float, float]) -> bool:
        low, high = key[3], key[4]
        near = min(abs(low), abs(high))
        shown = abs(printed_value(bound_text(high, "ceil") if high < 0 else bound_text(low, "floor")))  # as printed
        retuned = "rates re-chosen" in seen[key]
        return signs[key] != "0" and (near < WEAK_SHARE * (high - low) / 2  # near end vs half-width
                                      or (retuned and shown < margin))  # within what the rate choice can move

    weak, borderline = [], []
    for a, b, tau, low, high in separate:
        rates = " and ".join(seen[(a, b, tau, low, high)]).replace("rates re-chosen and undelayed rates",
                                                                 "undelayed or re-chosen rates, one interval")
        shown = f"{a} − {b} at τ = {tau}, {rates} ({bound_text(low, 'floor')} to {bound_text(high, 'ceil')}"
        if is_weak((a, b, tau, low, high)):
            copies = [t for t, base in twins.items() if base == a and b == "sgd" and any(
                k[:3] == (t, "sgd", tau) and is_weak(k) and seen[k] == seen[(a, b, tau, low, high)] for k in seen)]
            weak.append(shown + ")" + "".join(f", and {t}'s copy of it" for t in copies))
        elif signs[(a, b, tau, low, high)] == "0" and (low > 0 or high < 0):
            end = ("high", high) if high < 0 else ("low", low)
            borderline.append(f"{shown}; {end[0]} end {signed(end[1], digits=2)} before rounding)")
    prefix_of = {"rates re-chosen": "tgap", "undelayed rates": "gap"}
    weak_keys = sorted(f"{prefix_of[r]}_{k[0]}_{k[1]}_{k[2]}" for k in seen if is_weak(k) for r in seen[k])
    return {"intervals_read": sum(len(v) for v in seen.values()), "intervals_distinct": len(seen),
            "intervals_separate": len(separate), "weak_verdicts": weak, "weak_verdict_count": len(weak),
            "weak_keys": weak_keys,
            "borderline_verdicts": borderline, "borderline_count": len(borderline), "weak_share": WEAK_SHARE,
            "rate_margin": rate_margin}
