"""Timing claims survive a rerun: a finding names the faster of two timed methods only when every interleaved round
(or seed) puts it on the same side by more than ``prose.TIMING_TOLERANCE``, else it says "about equal" with the
range, and it offers a mechanism only where the mechanism can explain the measured side. Each claim is fed two runs
on opposite sides (and one in between) and its wording checked."""

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from study import intervals
from study.gradients import findings, staleness, verdicts
from study.report import prose

REPO = Path(__file__).resolve().parents[1]
NAN = float("nan")


def _template(notebook: str, marker: str) -> str:
    nb = nbformat.read(REPO / "notebooks" / f"{notebook}.ipynb", as_version=4)
    (template,) = [t for _, t in prose.finding_templates(nb) if marker in t]
    return template


def _costs(persistent: list[float]) -> pd.DataFrame:
    """A fetch_costs table whose tf.function persistent tape took ``persistent`` × one pass in its rounds."""
    rows = []
    for mode, methods in (("TF1 graph", {"one sess.run(all gradients)": [1.0], "g.eval() per variable": [3.0, 3.4]}),
                          ("TF2 eager", {"one tape": [1.0],
                                         "persistent tape, one gradient call per variable": [2.6, 2.9],
                                         "recompute forward and backward per variable": [6.0, 7.0]}),
                          ("TF2 tf.function", {"one tape": [1.0],
                                               "persistent tape, one gradient call per variable": persistent,
                                               "recompute forward and backward per variable": [2.0, 2.3]})):
        for method, ratios in methods.items():
            rows.append({"mode": mode, "method": method, "ratio_to_one_pass": sorted(ratios)[len(ratios) // 2],
                         "ratio_low": min(ratios), "ratio_high": max(ratios)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("persistent, said, not_said", [
    ([0.62, 0.70], "below one pass in every round", ["about equal", "can bring it to one pass"]),
    ([0.96, 1.01], "about equal to one pass", ["in every round", "reads as noise"]),
    ([1.10, 1.25], "slower than one pass in every round", ["about equal", "reads as noise"]),
])
def test_04_persistent_tape_claim_follows_every_round(persistent, said, not_said):
    metrics = {"config": {"repeats": 5}, "cnn_variables": 8, "quoted": findings.fetch_numbers(_costs(persistent))}
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "persistent tape took"), metrics).split())
    assert said in text
    for phrase in not_said:
        assert phrase not in text
    if said.startswith("below"):  # a mechanism that cannot give a ratio below 1 is not offered for one
        assert "Nothing in how it works explains that" in text


def test_04_eval_per_gradient_gives_its_mechanism_as_likely_and_below_a_pass_per_call():
    metrics = {"config": {"repeats": 5}, "cnn_variables": 8, "quoted": findings.fetch_numbers(_costs([0.9, 1.0]))}
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "persistent tape took"), metrics).split())
    assert "because each call runs the forward and backward pass again" not in text  # the old, unmeasured wording
    assert "a likely reason, not measured" in text
    assert "below a full forward and backward pass per call, which would take about 8×" in text
    metrics["cnn_variables"] = 2  # a ratio at or above one pass per call: no "below" claim
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "persistent tape took"), metrics).split())
    assert "below a full forward and backward pass" not in text


def _metrics_02(versus: tuple[float, float]) -> dict:
    """The committed run's metrics of 02, with masked_hold / gate per seed spanning ``versus``."""
    metrics = json.loads((REPO / "results" / "02_mnist_cnn_freezing" / "metrics.json").read_text())
    metrics["timing_tolerance"] = prose.TIMING_TOLERANCE
    metrics["finetune_full"] = True
    metrics["confidence"] = intervals.CONFIDENCE
    metrics["finetune_gate_minus_exact"] = {o: {"mean": 0.001, "low": -0.01, "high": 0.012, "seeds": 3,
                                                "identical": False} for o in ("sgd", "adam")}
    # the trap against var_list as the fourth reader found it: SGD higher in 3 of 3 seeds, both intervals hold zero
    metrics["finetune_trap_minus_exact"] = {
        "adam": {"mean": -0.1013, "low": -0.3278, "high": 0.1251, "seeds": 3, "higher": 0, "identical": False},
        "sgd": {"mean": 0.034, "low": -0.0116, "high": 0.0796, "seeds": 3, "higher": 3, "identical": False}}
    metrics.setdefault("finetune_exact_same_weights", {"sgd": True, "adam": True})  # a run before digests
    for o, seeds in metrics["finetune_time_ratio_seeds"].items():
        seeds.update({"masked_vs_gate_min": versus[0], "masked_vs_gate_max": versus[1],
                      "masked_vs_gate_side": prose.timing_side(*versus),
                      "gate_side": prose.timing_side(seeds["gate_min"], seeds["gate_max"]),
                      "masked_side": prose.timing_side(seeds["masked_min"], seeds["masked_max"])})
    return metrics


@pytest.mark.parametrize("versus, said", [((0.80, 0.90), "shorter in each of the 3 seeds"),
                                          ((0.9986, 1.004), "about equal"),
                                          ((1.10, 1.20), "longer in each of the 3 seeds")])
def test_02_masked_hold_against_the_gate_is_read_by_the_rule_every_timing_follows(versus, said):
    """One rule for every step-time comparison of 02 (the seventh reader): a verdict only where every seed is beyond
    the tolerance, and it is one run's: their order flipped between reruns even with every seed beyond the
    tolerance (0.839-0.963 in one run, about equal in the one before), which the report says."""
    metrics = _metrics_02(versus)
    text = " ".join(prose.fill(_template("02_mnist_cnn_freezing", "applies no update to a wholly frozen"),
                               metrics).split())
    part = text[text.index("Against the gate's step"):]
    part = part[:part.index("This run does not time")]
    assert f"{prose.floor(versus[0], 'fixed', 3)}× to {prose.ceil(versus[1], 'fixed', 3)}× per seed" in part
    assert said in part and "One rule reads every step-time comparison here" in part
    assert "has changed between reruns even when every seed agreed" in part  # one run's verdict, said so
    assert "The report ranks neither" not in part


@pytest.mark.parametrize("adam, said", [
    ({"mean": 0.0007, "low": -0.0104, "high": 0.0118, "seeds": 3, "identical": False},
     "+0.0007 under adam (95% interval, paired by seed: −0.0104 to +0.0118, which holds zero)"),
    ({"mean": 0.02, "low": 0.011, "high": 0.029, "seeds": 3, "identical": False},
     "+0.0200 under adam (95% interval, paired by seed: +0.0110 to +0.0290, which leaves out zero: here the `gate` "
     "scores higher)"),
])
def test_02_gate_against_exact_accuracy_is_judged_by_its_paired_interval(adam, said):
    metrics = _metrics_02((1.1, 1.2))
    metrics["finetune_gate_minus_exact"] = {"sgd": {"mean": 0.0, "low": 0.0, "high": 0.0, "seeds": 3,
                                                    "identical": True}, "adam": adam}
    text = " ".join(prose.fill(_template("02_mnist_cnn_freezing", "applies no update to a wholly frozen"),
                               metrics).split())
    assert "zero in every seed under sgd and " + said in text, text
    assert "costs no accuracy" not in text and "twice the seeds' spread" not in text
    assert ("So this run detects no accuracy cost of exactness" in text) == (adam["low"] <= 0 <= adam["high"])
    # trainable=False without a recompile: "more accurate in every seed" was read off 3 of 3 seeds, not an interval
    assert "+0.0340 under sgd (higher in 3 of 3 seeds; 95% interval, paired by seed: −0.0116 to +0.0796" in text
    assert "this run cannot say whether the extra training helps or hurts accuracy" in text
    assert "ends more accurate on digits 5–9 than the exact routes in every seed" not in text


def _mask_steps(reset_factor: dict[tuple[int, float], float], spread: float = 0.03) -> pd.DataFrame:
    """A steps table of 02's mask study (Adam; seeds 0-2; p 0.1, 0.5, 0.9): hold and naive take 10 ms a step,
    reset ``reset_factor[(seed, p)]`` times that; hold ends 0.01 + ``spread`` × seed above reset in accuracy."""
    rows = []
    for seed in (0, 1, 2):
        for p in (0.1, 0.5, 0.9):
            for method in ("naive", "hold", "reset"):
                for step in (1, 2, 3):
                    factor = reset_factor[(seed, p)] if method == "reset" else 1.0
                    accuracy = 0.7 - (0.01 + spread * seed) * (method == "reset")
                    rows.append({"experiment": "masks", "optimizer": "adam", "method": method, "seed": seed, "p": p,
                                 "step": step, "loss": 1.0, "frozen_entries": 10, "frozen_changed": 0,
                                 "frozen_max_abs_delta": 0.0, "step_time_ms": 10.0 * factor + 0.01 * step,
                                 "accuracy": accuracy if step == 3 else float("nan")})
    return pd.DataFrame(rows)


def _step_times_text(steps: pd.DataFrame) -> str:
    """The filled-in "hold or reset" and "Step times" findings of 02 for a mask-study ``steps`` table."""
    from study import cnn

    metrics = _metrics_02((1.1, 1.2))
    metrics["mask_step_times"] = cnn.step_times(steps)
    contrast = cnn.hold_vs_reset(steps).set_index("p")
    metrics["mask_tradeoff"] = {**metrics.get("mask_tradeoff", {}), **{
        "hold_minus_reset": {f"{p:g}": v for p, v in contrast["hold minus reset"].items()},
        "hold_reset_low": {f"{p:g}": v for p, v in contrast["hold minus reset interval low"].items()},
        "hold_reset_high": {f"{p:g}": v for p, v in contrast["hold minus reset interval high"].items()},
        "hold_clearly_better": [f"{p:g}" for p, r in contrast.iterrows() if r["differs"] and r["hold minus reset"] > 0],
        "hold_higher": int(contrast["seeds hold higher"].sum()), "hold_pairs": int(contrast["seeds"].sum()),
        "hold_over_p": cnn.pooled_over_p(steps, "hold", "reset")["adam"]}}
    return " ".join(prose.fill(_template("02_mnist_cnn_freezing", "**Step times.**"), metrics).split())


@pytest.mark.parametrize("close, said, not_said", [
    ({}, "was the slowest in 9 of the 9 (seed, p) comparisons", ["about equal", "No method"]),
    # the committed run's two pairs within the tolerance (reset / hold 1.005 and 1.019): no longer "each of the 9"
    ({(1, 0.1): 1.005, (0, 0.9): 1.019}, "was the slowest in 7 of the 9 (seed, p) comparisons; in 2 the two slowest "
     "were within 2% (about equal)", ["each of the 9", "No method"]),
    ({k: 1.01 for k in [(s, p) for s in (0, 1, 2) for p in (0.1, 0.5, 0.9)]},
     "No method is the slowest at every p in this run by more than 2%", ["was the slowest in"]),
])
def test_02_reset_is_named_the_slowest_only_beyond_the_tolerance(close, said, not_said):
    factors = {(s, p): close.get((s, p), 1.08) for s in (0, 1, 2) for p in (0.1, 0.5, 0.9)}
    text = _step_times_text(_mask_steps(factors))
    assert said in text, text
    for phrase in not_said:
        assert phrase not in text
    assert "has not held in every rerun" in text and "so it is this run's, not settled" in text  # one run's order


def test_02_hold_against_reset_says_the_run_cannot_tell_where_every_interval_holds_zero():
    text = _step_times_text(_mask_steps({(s, p): 1.08 for s in (0, 1, 2) for p in (0.1, 0.5, 0.9)}))
    part = text[text.index("**`hold` or `reset`?**"):text.index("**Step times.**")]
    # hold is above reset in every seed (0.01, 0.04, 0.07), but three seeds give an interval that holds zero
    assert "ended more accurate than `reset` in 9 of the 9 (seed, p) pairs" in part
    assert "at every p the interval holds zero: at one p alone, 3 seeds cannot tell the two policies apart" in part
    # the pairs at different p share a seed: the pooled claim rests on one value per seed (0.01, 0.04, 0.07)
    assert ("averaged over p within each seed (a test chosen after each p's interval was seen, so read it as post "
            "hoc), `hold` minus `reset` is +0.0100 to +0.0700 over the 3 seeds") in part
    assert "which holds zero" in part and "taken over every p together" not in part
    tight = _step_times_text(_mask_steps({(s, p): 1.08 for s in (0, 1, 2) for p in (0.1, 0.5, 0.9)}, spread=0.001))
    assert "a lead for `hold` over every p together, to be tested with more seeds, not a finding" in tight
    assert "`hold` is ahead" not in tight
    assert "clearly better" not in part and "lies above zero" not in part and "never clearly worse" in part


SLOW = {("adam", "sgd", 1): (0.11, -0.19, 0.42), ("muon", "adamw", 1): (-0.91, -1.16, -0.66)}
"""The paired slowdown gaps (mean, low, high) the fixture run is given: it predates them (Dai et al.'s measure, as the
eleventh reader computed it from a later run); every other delay has a seed that never reached the target."""


def _slowdowns(gaps: dict[tuple[str, str, int], tuple[float, float, float]]) -> pd.DataFrame:
    rows = [{"a": a, "b": b, "tau": t, "seeds": 16, "both_reached": 16 if (a, b, t) in gaps else 10,
             **dict(zip(("slowdown_gap_mean", "slowdown_gap_ci_low", "slowdown_gap_ci_high"),
                        gaps.get((a, b, t), (NAN, NAN, NAN))))}
            for a, b in {(a, b) for a, b, _ in gaps} for t in (0, 1, 2, 4, 8)]
    return pd.DataFrame(rows)


def _metrics_04(slow: dict | None = None, adamw_slowdown: tuple[float, float] = (1.74, 2.26),
                rate_margin: float | None = None) -> dict:
    """A fixed run of 04 (``tests/fixtures/04_run_85bdeed``, "the fixture run"), its quoted values recomputed from its
    tables by this code: a rerun of the study does not move what these tests check. It predates the slowdown
    intervals: ``slow`` (default ``SLOW``) gives the paired slowdown gaps and ``adamw_slowdown`` AdamW's interval at
    tau = 1 (every other optimizer's is its mean ± 0.1 where every seed reached the target)."""
    out = Path(__file__).parent / "fixtures" / "04_run_85bdeed"
    metrics = json.loads((out / "metrics.json").read_text())
    table = {name: pd.read_csv(out / f"{name}.csv") for name in (
        "fetch_costs", "ps_runs", "ps_placement", "n_push_sweep", "staleness_dai_check", "staleness_gaps",
        "staleness_best_per_tau", "staleness_retuned_gaps")}
    check = table["staleness_dai_check"]
    check["slowdown_ci_low"] = check["slowdown_mean"].where(np.isfinite(check["slowdown_mean"])) - 0.1
    check["slowdown_ci_high"] = check["slowdown_ci_low"] + 0.2
    at = (check["optimizer"] == "adamw") & (check["tau"] == 1)
    check.loc[at, "slowdown_ci_low"], check.loc[at, "slowdown_ci_high"] = adamw_slowdown
    metrics["quoted"] = findings.quoted(
        table["fetch_costs"], table["ps_runs"], table["ps_placement"], table["n_push_sweep"],
        check, table["staleness_gaps"], table["staleness_best_per_tau"].set_index("tau"),
        metrics["config"]["staleness_learning_rates"], retuned=table["staleness_retuned_gaps"],
        slowdowns=_slowdowns(SLOW if slow is None else slow),
        rate_margin=(staleness.worst_peek_cost(pd.read_csv(out / "staleness_rate_grid.csv"))["value"]
                     if rate_margin is None else rate_margin))
    metrics.setdefault("staleness_adamw_weight_decay", 0.004)  # not recorded in that run: Keras' default
    metrics.setdefault("test_images", 1000)  # not recorded in that run: the split of every run
    grid = pd.read_csv(out / "staleness_rate_grid.csv")
    metrics.setdefault("staleness_peek_cost_worst", staleness.worst_peek_cost(grid))  # not recorded in that run
    return metrics


def _ps_runs(cpu_ms: tuple[float, float], share: tuple[float, float], steps: tuple[float, float],
             std: tuple[float, float], windows: tuple[tuple[float, float], tuple[float, float]] | None = None
             ) -> pd.DataFrame:
    runs = pd.DataFrame({"workers": [1, 2], "staleness_mean": [0.0, 0.9], "final_accuracy": [0.92, 0.92],
                         "applied_updates": [64, 64], "worker_cpu_s_per_step": [c / 1e3 for c in cpu_ms],
                         "worker_cpu_share_min": list(share), "steps_per_s": list(steps),
                         "steps_per_s_std": list(std)})
    if windows is not None:  # (slowest, fastest) window of each run
        runs["steps_per_s_window_min"] = [w[0] for w in windows]
        runs["steps_per_s_window_max"] = [w[1] for w in windows]
    return runs


@pytest.mark.parametrize("runs, said, not_said", [
    # the fixture run: CPU per step 1.17x, shares 0.65 and 0.32, steps/s 1.11x, windows overlapping
    (_ps_runs((26.4, 31.0), (0.65, 0.32), (24.6, 27.2), (2.0, 11.1), ((22.0, 27.0), (15.0, 40.0))),
     ["yet it grew, in this one pair of runs", "did not each have a core to themselves", "the windows go both ways",
      "0.32 with two"],
     ["contend", "add compute", "more in every window", "grew little"]),
    # each worker kept its core and two ran faster in every window
    (_ps_runs((26.4, 27.0), (0.95, 0.95), (24.0, 46.0), (1.0, 2.0), ((23.0, 25.0), (44.0, 48.0))),
     ["yet it grew", "more in every window", "the slowest 2-worker window ran 1.76×"],
     ["contend", "did not each have a core", "go both ways"]),
    # the reviewer's case: the mean ± std band is above one, but the runs give no window against window
    (_ps_runs((26.5, 28.6), (0.80, 0.59), (30.07, 43.13), (2.32, 7.27)),
     ["1.43× the steps per second of one", "43.1 ± 7.3 against 30.1 ± 2.3", "no verdict on the windows"],
     ["in every window", "go both ways"]),
    # a ± std band entirely above one while a 2-worker window is slower than a 1-worker window
    (_ps_runs((26.5, 28.6), (0.80, 0.59), (30.0, 43.0), (1.0, 3.0), ((28.0, 33.0), (31.0, 47.0))),
     ["the windows go both ways"], ["more in every window"]),
])
def test_04_cluster_finding_reads_cores_off_wall_time_not_cpu_time(runs, said, not_said):
    metrics = _metrics_04()
    placement = pd.DataFrame({"variable": ["m/fc1/kernel"], "task": ["ps:0"], "bytes": [1000]})
    metrics["quoted"].update(findings.cluster_numbers(runs, placement))
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "CPU time per step was"), metrics).split())
    for phrase in said:
        assert phrase in text
    for phrase in not_said:
        assert phrase not in text


def test_04_staleness_finding_reads_verdicts_off_printed_bounds_and_gives_the_retuned_gaps():
    metrics = _metrics_04()
    q = metrics["quoted"]
    assert q["gap_high_muon_adamw_2"] == pytest.approx(-0.00017, abs=1e-5)  # the fixture run's borderline case
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "Dai et al.: does"), metrics).split())
    assert "τ = 2: −0.006 (−0.013 to 0.000)" in text  # the upper end rounded up, to an unsigned zero
    assert "muon loses less than adamw at τ = 4, 8; the run cannot tell muon from adamw at τ = 1, 2" in text
    assert "muon loses less than adamw at τ = 2" not in text
    assert "(−0.024 to +0.002)" in text  # adam - sgd at τ = 1: low -0.023249 rounded down, not to -0.023
    assert "Adam's test accuracy lost to the delay minus SGD's" in text and "τ = 8: −0.050 (" in text
    assert "Muon's test accuracy lost to the delay minus AdamW's" in text and "τ = 8: −0.066 (" in text
    assert text.count("mostly measures whether those rates survive the delay") == 3  # adam, adagrad, muon
    widest = max((t for t in (1, 2, 4, 8)), key=lambda t: q[f"gap_halfwidth_max_{t}"])
    assert f"{prose.ceil(q['gap_halfwidth_max'], 'fixed', 3)}, at τ = {widest}" in text
    assert "a smaller gap is beyond" not in text  # the widest interval is not the run's resolution
    assert "the narrowest interval of any gap at a delay a half-width of 0.005" in text
    assert "and nothing at any delay, the rates re-chosen for it included" in text  # the fixture run: 0 at every τ
    metrics["staleness_peek_cost_worst"] = {"value": 0.0037, "optimizer": "adagrad", "tau": 1}
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "Dai et al.: does"), metrics).split())
    assert "and at most 0.004 at any delay, the rates re-chosen for it included (adagrad at τ = 1)" in text


def test_04_fault_finding_counts_the_updates_a_kill_cost():
    metrics = _metrics_04()
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "Each fault cost"), metrics).split())
    assert "cost the" not in text  # "cost the at least 6 applied after ..."
    assert re.search(r"updates cost (at least )?\d+ updates, those applied after the checkpoint at \d+", text)


@pytest.mark.parametrize("shrink, said, not_said", [
    (0.1, "mostly measures whether those rates survive the delay", ["leaves more than"]),
    (0.9, "leaves more than 50% of the gap", ["mostly measures"]),
])
def test_04_the_undelayed_gap_is_called_a_rate_effect_only_where_re_tuning_shrinks_it(shrink, said, not_said):
    metrics = _metrics_04()
    q = metrics["quoted"]
    for t in (1, 2, 4, 8):  # the re-tuned gaps: a share `shrink` of the undelayed ones, verdicts kept
        for part in ("", "low_", "high_"):
            q[f"tgap_{part}adam_sgd_{t}"] = shrink * q[f"gap_{part}adam_sgd_{t}"]
    judged = [t for t in (1, 2, 4, 8) if q[f"gap_sign_adam_sgd_{t}"] != "0"]
    q["rate_dominates_adam_sgd"] = all(abs(q[f"gap_adam_sgd_{t}"]) > q["rate_dominates_factor"]
                                       * abs(q[f"tgap_adam_sgd_{t}"]) for t in judged)
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "Dai et al.: does"), metrics).split())
    dai = text[text.index("*Dai et al."):text.index("*Dean et al.")]
    assert said in dai
    for phrase in not_said:
        assert phrase not in dai


def test_04_n_push_finding_gives_the_absolute_cpu_increases_beside_the_ratios():
    metrics = _metrics_04()
    # the sweep the second skeptic read (cluster timings change with every run, so they are given here):
    # ps 2.05 -> 12.05 ms per minibatch, workers 24.8 -> 32.7 ms, from n = 8 to n = 1
    sweep = pd.DataFrame({"n_push": [1, 2, 8], "ps_cpu_s_per_step": [0.01205, 0.006, 0.00205],
                          "worker_cpu_s_per_step": [0.0327, 0.028, 0.0248], "steps": [128, 128, 128],
                          "staleness_mean": [0.9, 0.8, 0.7], "applied_updates": [128, 64, 16]})
    metrics["quoted"].update(findings.n_push_numbers(sweep, metrics["quoted"]["model_mb"]))
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "In this one sweep"), metrics).split())
    assert "and the workers much less" not in text  # true only as a ratio
    assert "applying updates more often costs the ps tasks CPU time, in this one sweep (one run per" in text
    assert "grew 5.88×, from 2.05 to 12.05 ms" in text and "1.32×, from 24.8 to 32.7 ms" in text
    assert "in absolute terms +10.0 ms and +7.9 ms per minibatch" in text
    # the workers' CPU time moves with contention for the cores: one run per n gives no verdict on their side
    assert "For the workers it gives no verdict" in text and "alike" not in text
    metrics["quoted"].update(findings.n_push_numbers(pd.DataFrame(), 13.0))  # no sweep: nothing is claimed
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "In this one sweep"), metrics).split())
    assert "costs the ps tasks CPU time" not in text and "no verdict" not in text


def test_04_throughput_verdict_needs_every_window_not_a_std_band():
    q = findings.throughput_numbers(_ps_runs((1, 1), (1, 1), (30.07, 43.13), (2.32, 7.27)))  # the committed pair
    assert q["steps_ratio_side"] == "not recorded"  # the old code said "more" off (mean - std) / (mean + std)
    both = _ps_runs((1, 1), (1, 1), (30.0, 43.0), (1.0, 3.0), ((28.0, 33.0), (31.0, 47.0)))
    assert findings.throughput_numbers(both)["steps_ratio_side"] == "about equal"


def _staleness_text(metrics: dict) -> str:
    return " ".join(prose.fill(_template("04_gradients_and_ps", "Dai et al.: does"), metrics).split())


def test_04_a_retuned_verdict_at_a_grid_edge_is_provisional_and_so_is_deans_conclusion():
    metrics = _metrics_04()  # fixture run: at τ = 8 SGD's re-chosen 0.02 and Adam's/AdamW's 0.0003 are grid edges
    q = metrics["quoted"]
    assert q["tgap_provisional_adagrad_sgd_8"] and q["tgap_edge_adagrad_sgd_8"] == ["sgd 0.02"]
    assert not q["tgap_provisional_adagrad_sgd_4"]  # no verdict there: nothing to call provisional
    text = _staleness_text(metrics)
    assert text.count("The verdict at τ = 8 with the rates re-chosen is provisional") == 3  # adam, adagrad, muon
    assert ("has support at this scale where Adagrad loses less: at none of the delays at the rate chosen without "
            "delay, and with the rate re-chosen for the delay at τ = 8 (provisionally at τ = 8") in text
    assert "with the rates re-chosen as well (provisionally" in text
    for key in [k for k in q if k.startswith("tgap_provisional_")]:  # every re-chosen rate inside its grid
        q[key] = False
    text = _staleness_text(metrics)
    assert "provisional" not in text.replace("is called provisional", "")
    assert "with the rate re-chosen for the delay at τ = 8. Elsewhere" in text
    for tau in (1, 2, 4, 8):  # Adagrad never loses less: no support claimed
        q[f"gap_sign_adagrad_sgd_{tau}"] = q[f"tgap_sign_adagrad_sgd_{tau}"] = "0"
    assert "does not support Dean et al.'s claim at any delay" in _staleness_text(metrics)


def test_04_the_staleness_finding_counts_its_intervals_and_names_the_weak_verdicts():
    metrics = _metrics_04()
    text = _staleness_text(metrics)
    assert "hold 40 intervals of gaps at a delay. 35 of them are distinct" in text  # τ = 1 (and muon − adamw τ = 2)
    assert "7 of those are AdamW's against SGD" in text and "28 separate comparisons" in text
    assert "about 1.4 of 28" in text  # the chance count is over the separate comparisons, not the 40 printed
    assert "adam − sgd at τ = 4, rates re-chosen (−0.047 to −0.002), and adamw's copy of it" in text
    assert "adamw − sgd at τ = 4" not in text  # the copy is not a second weak verdict
    assert "adagrad − sgd at τ = 8" not in text  # a clear verdict is not called weak
    assert "at no delay" not in text and "at none of the delays" in text  # "no delay" reads as τ = 0


def test_04_an_interval_that_leaves_out_zero_only_past_the_printed_decimals_is_named_not_judged():
    metrics = _metrics_04()  # fixture run: muon − adamw at τ = 2 ends at −0.00017, printed 0.000
    text = _staleness_text(metrics)
    assert "the run cannot tell muon from adamw at τ = 1, 2" in text  # one rule: the printed interval
    assert ("here 1, muon − adamw at τ = 2, undelayed or re-chosen rates, one interval (−0.013 to 0.000; high end "
            "−0.00017 before rounding)") in text
    q = metrics["quoted"]
    for prefix in ("gap", "tgap"):  # its high end a little further from zero: printed below zero, a weak verdict
        q[f"{prefix}_high_muon_adamw_2"] = -0.0011
        q[f"{prefix}_sign_muon_adamw_2"] = verdicts.interval_sign(q[f"{prefix}_low_muon_adamw_2"], -0.0011)
    q.update(verdicts.census(q, metrics["staleness_gap_pairs"], (1, 2, 4, 8)))
    text = _staleness_text(metrics)
    assert q["borderline_verdicts"] == [] and "past the third decimal counts as holding zero: none here" in text
    assert "muon − adamw at τ = 2, undelayed or re-chosen rates, one interval (−0.013 to −0.001)" in text  # weak


def test_04_adamw_counts_once_only_where_it_repeats_adam():
    metrics = _metrics_04()
    assert "Against SGD, AdamW repeats Adam" in _staleness_text(metrics)
    q = metrics["quoted"]
    q["gap_sign_adamw_sgd_1"] = "-"  # a verdict Adam's gap does not have: no longer a repeat
    q.update(verdicts.twins(q, metrics["staleness_gap_pairs"], (1, 2, 4, 8)))
    q.update(verdicts.census(q, metrics["staleness_gap_pairs"], (1, 2, 4, 8)))
    text = _staleness_text(metrics)
    assert "AdamW repeats Adam" not in text and "Against SGD, adamw loses less than sgd at τ = 1" in text
    assert "35 separate comparisons" in text and "about 1.8 of 35" in text


def test_04_the_rate_trend_is_read_per_optimizer():
    metrics = _metrics_04()  # fixture run: muon's re-chosen rate is 0.003 at every delay
    text = _staleness_text(metrics)
    assert "the rate falls as the delay grows for sgd, adam, adagrad, adamw" in text
    assert "muon keeps one rate at every delay" in text and "a smaller rate meets a longer delay" not in text
    metrics["quoted"]["rate_trend_muon"] = "mixed"
    assert "muon rises at some delay" in _staleness_text(metrics)


def _blocks_text(accuracy: tuple[float, float], loss: tuple[float, float], same: bool = True) -> str:
    """02's block finding over the committed run's metrics, with both methods' paired intervals set to ``accuracy``
    (hold or reset minus naive, test accuracy) and ``loss`` (naive minus hold or reset, late training loss)."""
    metrics = json.loads((REPO / "results" / "02_mnist_cnn_freezing" / "metrics.json").read_text())
    metrics["blocks_accuracy_contrast"] = {m: {"mean": sum(accuracy) / 2, "low": accuracy[0], "high": accuracy[1]}
                                           for m in ("hold", "reset")}
    metrics["blocks_loss_contrast"] = {m: {"mean": sum(loss) / 2, "low": loss[0], "high": loss[1]}
                                       for m in ("hold", "reset")}
    metrics["blocks_sgd_same_weights"] = same
    return " ".join(prose.fill(_template("02_mnist_cnn_freezing", "`hold` and `reset` leave every resting"),
                               metrics).split())


def test_02_the_block_finding_reads_each_measure_off_its_paired_interval():
    text = _blocks_text((-0.026, 0.390), (-0.238, -0.170))  # the committed run's: accuracy holds zero, loss does not
    assert "disagree" not in text
    assert "(−0.026 to +0.390; the interval holds zero)" in text and "(−0.238 to −0.170; below zero)" in text
    assert "So the run resolves one difference: the naive mask has the lower training loss" in text
    text = _blocks_text((-0.026, 0.390), (-0.238, 0.010))  # both hold zero
    assert "Neither measure tells the methods apart with 3 seeds" in text and "resolves one" not in text
    text = _blocks_text((0.05, 0.390), (-0.238, -0.170))  # both leave out zero
    assert "Each measure's verdict is its interval's" in text and "resolves one" not in text
    assert "with bit-identical weights (the digests of each seed's three final models match)" in text  # SGD
    assert "bit-identical" not in _blocks_text((0.05, 0.390), (-0.238, -0.170), same=False)


def test_02_same_training_is_claimed_bit_for_bit_only_where_the_weights_digests_match():
    metrics = _metrics_02((0.8, 0.9))

    def text(same: dict) -> str:
        metrics["finetune_exact_same_weights"] = same
        return " ".join(prose.fill(_template("02_mnist_cnn_freezing", "They are the same training of the head"),
                                   metrics).split())

    assert "and with bit-identical weights (every run's digest" in text({"sgd": True, "adam": True})
    mixed = text({"sgd": True, "adam": False})
    assert "bit-identical across them under sgd, and differ in some bits under the others (adam)" in mixed
    assert "and with bit-identical weights" not in mixed


def test_04_throughput_is_read_on_one_clock_and_the_chiefs_span_is_named_apart():
    metrics = _metrics_04()
    q = metrics["quoted"]
    q.update({"steps_per_s_1": 35.4, "steps_per_s_std_1": 2.0, "steps_per_s_2": 52.0, "steps_per_s_std_2": 7.0,
              "steps_per_s_chief_1": 31.5, "steps_per_s_chief_2": 44.6, "steps_ratio": 52.0 / 35.4})
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "CPU time counts only the time a worker"),
                               metrics).split())
    assert "Two workers ran 1.47× the steps per second of one (52.0 ± 7.0 against 35.4 ± 2.0" in text
    assert "by the workers' clocks). The chief's own clock, over its timed span, gives 44.6 and 31.5, lower" in text
    assert "every ratio here is read on the workers' clocks" in text
    q.update({"steps_per_s_chief_1": 36.0, "steps_per_s_chief_2": 53.0})  # not lower: no explanation offered
    text = " ".join(prose.fill(_template("04_gradients_and_ps", "CPU time counts only the time a worker"),
                               metrics).split())
    assert "gives 53.0 and 36.0; every ratio" in text and "lower:" not in text


def test_03_the_d_loss_is_not_offered_as_a_symptom_where_runs_that_did_not_collapse_show_it_too():
    metrics = json.loads((REPO / "results" / "03_gan_alternating" / "metrics.json").read_text())

    metrics["confidence"] = 0.95
    metrics["gate_contrast"] = {"adam": {"mean": 8.33, "low": 6.9, "high": 9.8, "seeds": 3}}  # set, not read: reruns

    def text(above: int) -> str:
        metrics["d_loss_check"] = {"adam_covered_runs": 14, "adam_covered_d_above_guess": above}
        return " ".join(prose.fill(_template("03_gan_alternating", "the collapse comes from gating D"),
                                   metrics).split())

    said = text(2)
    assert "D's loss is no evidence for it here: it does not single out collapse. 2 of the 14 distinct" in said
    assert "it shows its symptoms" not in said and "not why" in said
    assert "none of the 14 distinct Adam runs" in text(0)
    assert "saw 8.3 more classes than `gate_d_only` (95% interval over 3 seeds: 6.9 to 9.8, above zero)" in text(2)
    metrics["gate_contrast"]["adam"].update(low=-1.0)
    assert "which holds zero: with these seeds the run cannot tell the two apart" in text(2)


def test_04_deans_conclusion_marks_weak_verdicts_and_undelayed_gaps_that_measure_the_rates():
    metrics = _metrics_04()  # fixture run: Adagrad loses less than SGD only re-tuned at τ = 8, provisionally
    q = metrics["quoted"]
    q["weak_keys"] = [*q["weak_keys"], "tgap_adagrad_sgd_8"]
    q["gap_sign_adagrad_sgd_2"], q["rate_dominates_adagrad_sgd"] = "-", True
    text = _staleness_text(metrics)
    assert ("at none of the delays at the rate chosen without delay (Adagrad loses less there at τ = 2, but that gap "
            "mostly measures whether the rates survive the delay, as said above, so it is not counted), and with the "
            "rate re-chosen for the delay at τ = 8 (weak)") in text
    assert "Provisional verdicts: here" in text and "holds for these grids only" in text
    for key in [k for k in q if k.startswith("tgap_provisional_")]:
        q[key] = False
    q["rate_dominates_adagrad_sgd"] = False
    text = _staleness_text(metrics)
    assert "Provisional verdicts: none here, every re-chosen rate lies inside its grid" in text
    assert "at the rate chosen without delay at τ = 2, and with" in text  # counted where it is not a rate effect


@pytest.mark.parametrize("adamw, gap, said, not_said", [
    ((1.74, 2.26), (-0.91, -1.16, -0.66),
     ["AdamW needed 2.00× (1.74–2.26×): slower, so on this measure AdamW does degrade under a one-step delay",
      "Muon slows down less, so on this measure Muon is the more robust at one step, as reported"],
     ["no slowdown this run can tell from 1; Muon", "the run cannot tell which slows down more"]),
    ((0.95, 1.30), (-0.10, -0.30, 0.10),
     ["no slowdown this run can tell from 1; Muon", "the run cannot tell which slows down more"],
     ["AdamW does degrade", "Muon slows down less"]),
])
def test_04_the_adamw_muon_claim_is_read_on_dais_convergence_measure_too(adamw, gap, said, not_said):
    """The eleventh reader's H item: the one-step-delay claim was read on accuracy lost alone, while the same section's
    slowdown table showed AdamW twice as slow to reach the target."""
    metrics = _metrics_04({**SLOW, ("muon", "adamw", 1): gap}, adamw_slowdown=adamw)
    text = _staleness_text(metrics)
    assert "on accuracy lost after 300 updates this run does not show AdamW degrading" in text
    for phrase in said:
        assert phrase in text
    for phrase in not_said:
        assert phrase not in text


def test_04_dais_claim_is_read_on_its_own_measure_where_every_seed_reached_the_target():
    text = _staleness_text(_metrics_04())
    assert ("Adam's slowdown minus SGD's, paired by seed, is τ = 1: +0.110 (−0.190 to +0.420), the interval holds "
            "zero") in text
    assert "at τ = 2, 4, 8 a seed of Adam or of SGD never reached the target" in text
    assert "So on their measure too, this run does not show Adam slowing down more than SGD" in text
    text = _staleness_text(_metrics_04({**SLOW, ("adam", "sgd", 1): (0.5, 0.2, 0.8)}))
    assert "τ = 1: +0.500 (+0.200 to +0.800), Adam slows down more" in text
    assert "So on their measure Dai's direction shows at τ = 1." in text


@pytest.mark.parametrize("clear, said, not_said", [
    ({}, "the run shows smaller means at larger p, not the gap closing", "no test of a trend across p is made, so"),
    ({"0.1": (0.1, 0.3), "0.5": (0.01, 0.05)}, "that the gap closes is what the means suggest, not a finding",
     "not the gap closing"),
])
def test_02_a_shrinking_gap_across_p_is_not_called_a_trend(clear, said, not_said):
    """The eleventh reader's M item: "the gap closes as p grows" rested on means whose intervals all held zero."""
    metrics = json.loads((REPO / "results" / "02_mnist_cnn_freezing" / "metrics.json").read_text())
    t = metrics["mask_tradeoff"]
    for p in ("0.1", "0.5", "0.9"):
        t["naive_low"][p], t["naive_high"][p] = clear.get(p, (-0.01, 0.01))
    text = " ".join(prose.fill(_template("02_mnist_cnn_freezing", "At larger\np the mean gap"), metrics).split())
    assert "At larger p the mean gap is smaller" in text and "closes as p grows" not in text
    assert said in text and not_said not in text


def test_04_a_retuned_verdict_within_the_rate_choice_margin_is_weak():
    """The thirteenth reader's M item: re-tuned verdicts nearer zero than what choosing a rate can move were counted
    unqualified."""
    loose, strict = _metrics_04(rate_margin=0.0)["quoted"], _metrics_04(rate_margin=0.02)["quoted"]
    retuned = [k for k in strict["weak_keys"] if k.startswith("tgap_")]
    assert set(loose["weak_keys"]) < set(strict["weak_keys"]) and retuned  # only re-tuned verdicts are added
    assert all(k in strict["weak_keys"] for k in loose["weak_keys"])
    assert not set(strict["weak_keys"]) - set(loose["weak_keys"]) - set(retuned)
    text = _staleness_text(_metrics_04(rate_margin=0.02))
    assert "and so is one with the rates re-chosen whose interval ends within 0.020 of zero" in text
    assert "within 0.000 of zero" not in _staleness_text(_metrics_04(rate_margin=0.0))
