"""Study 04's pieces that run in one process: configuration, exact update, TensorBoard log, stale gradients."""

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from study.data import load_mnist
from study.gradients import fetch, findings, staleness, verdicts
from study.gradients.config import GradientStudyConfig


@pytest.fixture(scope="module")
def data():
    return load_mnist(seed=0)


@pytest.mark.parametrize("bad, match", [
    ({"worker_counts": [1, 0]}, "worker_counts: every value must be >= 1"),
    ({"taus": [0, -1]}, "taus: every value must be >= 0"),
    ({"taus": [2, 4]}, "taus: must include 0"),
    ({"staleness_optimizers": ["sgd", "lamb"]}, "staleness_optimizers: got 'lamb'"),
    ({"staleness_optimizers": ["adagrad"], "staleness_learning_rates": {"sgd": [0.1]}},
     "staleness_learning_rates: no rates for 'adagrad'"),
    ({"ps_steps": 0}, "ps_steps: expected an integer >= 1"),
    ({"n_push_sweep": [3]}, "ps_steps_per_function: must be a multiple of ps_n and of every n_push_sweep value"),
    ({"faults": ["disk"]}, "faults: got 'disk'"),
    ({"staleness_eval_every": 7}, "staleness_eval_every: must divide staleness_steps=300"),
])
def test_bad_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        GradientStudyConfig(**bad)


def test_parameters_none_keeps_the_default():
    config = GradientStudyConfig.from_parameters({"seeds": [3], "taus": None, "other": 1})
    assert config.seeds == [3] and config.taus == GradientStudyConfig().taus


def test_quadratic_writes_tensorboard_scalars_and_is_exact(tmp_path):
    trace = fetch.quadratic_with_tensorboard(tmp_path, steps=5)
    assert trace["error"].max() == 0.0
    assert trace["dy_dx"].iloc[0] == pytest.approx(-5.0)  # x0 - b = -2 - 3
    assert list(tmp_path.glob("events.out.tfevents.*"))


@pytest.mark.parametrize("name, keras_optimizer", [
    ("sgd", lambda: keras.optimizers.SGD(0.1)),
    ("adam", lambda: keras.optimizers.Adam(0.1)),
    ("adagrad", lambda: keras.optimizers.Adagrad(0.1)),
    ("adamw", lambda: keras.optimizers.AdamW(0.1)),
    # Muon's orthogonalised step on the hidden kernel (w1); AdamW's on the output kernel and the biases
    ("muon", lambda: keras.optimizers.Muon(0.1, exclude_layers=["w2"])),
])
def test_the_staleness_optimizers_are_keras_own_update_rules(data, name, keras_optimizer):
    trainer = staleness.StaleTrainer(data, name, seeds=[0, 1], steps=10, eval_every=10, tau_max=1)
    for slot in trainer.slots:
        for v in slot:
            v.assign(tf.fill(v.shape, 0.1 if name == "adagrad" and slot is trainer.slots[0] else 0.0))
    # one Keras optimizer per seed, on that seed's 2-D and 1-D variables (Muon chooses its step by the rank)
    references = [[keras.Variable(v[s], name=n) for v, n in zip(trainer.init, ("w1", "b1", "w2", "b2"))]
                  for s in range(2)]
    optimizers = [keras_optimizer() for _ in references]
    rng = np.random.default_rng(0)
    for step in range(3):
        grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in trainer.init]
        trainer._update(tf.constant(step), grads, tf.constant(0.1))
        for s, (optimizer, reference) in enumerate(zip(optimizers, references)):
            optimizer.apply_gradients(zip([g[s] for g in grads], reference))
    for s, reference in enumerate(references):
        for mine, theirs in zip(trainer.params, reference):
            np.testing.assert_allclose(mine.numpy()[s], theirs.numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(trainer.params[0].numpy(), trainer.init[0])  # the step moved the weights


def test_stale_gradients_slow_training_and_tau_zero_is_plain_training(data):
    trainer = staleness.StaleTrainer(data, "sgd", seeds=[0, 1], steps=60, eval_every=20, tau_max=16)
    fresh, late = trainer.run(0.5, 0), trainer.run(0.5, 16)
    assert fresh["test"].shape == fresh["val"].shape == (3, 2)
    assert (fresh["test"][-1] > 0.6).all() and (late["test"][-1] < fresh["test"][-1]).all()
    assert (fresh["val"][-1] > 0.6).all() and not np.array_equal(fresh["val"], fresh["test"])  # two splits
    np.testing.assert_array_equal(trainer.run(0.5, 0)["test"], fresh["test"])  # a rerun restarts from the same state


def test_dai_check_compares_each_optimizer_at_its_best_undelayed_rate():
    rows = []
    for name, lr, base in (("sgd", 0.1, 0.9), ("sgd", 0.5, 0.8), ("adam", 0.01, 0.9)):
        for tau, loss in ((0, 0.0), (4, 0.2 if name == "adam" else 0.1)):
            for seed in (0, 1):
                for updates in (10, 20):
                    acc = (base - loss) * updates / 20
                    rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed, "updates": updates,
                                 "accuracy": acc + 0.01 * seed, "val_accuracy": acc + 0.01 * seed})
    curves = pd.DataFrame(rows)
    assert staleness.best_learning_rates(curves) == {"adam": 0.01, "sgd": 0.1}
    check = staleness.dai_check(curves, target=0.4).set_index(["optimizer", "tau"])
    assert check.loc[("adam", 4), "drop_mean"] == pytest.approx(0.2)
    assert check.loc[("sgd", 4), "drop_mean"] == pytest.approx(0.1)
    assert check.loc[("sgd", 0), "slowdown_mean"] == 1.0
    diff = staleness.paired_difference(curves).set_index("tau")
    assert diff.loc[4, "mean"] == pytest.approx(0.1) and diff.loc[4, "std"] == pytest.approx(0.0, abs=1e-9)
    assert diff.loc[4, "ci_low"] == pytest.approx(0.1) == pytest.approx(diff.loc[4, "ci_high"])  # no spread


def test_learning_rates_are_chosen_on_the_validation_split_never_on_test():
    """The test split favours one rate, the validation split the other: validation chooses, test is reported."""
    rows = [{"optimizer": "sgd", "learning_rate": lr, "tau": tau, "seed": seed, "updates": 10,
             "accuracy": test - 0.1 * tau, "val_accuracy": val - 0.1 * tau}
            for lr, val, test in ((0.1, 0.8, 0.9), (0.5, 0.85, 0.7)) for tau in (0, 2) for seed in (0, 1)]
    curves = pd.DataFrame(rows)
    assert staleness.best_learning_rates(curves) == {"sgd": 0.5}
    tuned = staleness.best_per_tau(curves)
    assert tuned.loc[2, "sgd_lr"] == 0.5 and tuned.loc[2, "sgd"] == pytest.approx(0.5)  # its test accuracy
    assert tuned.loc[0, "sgd_val"] == pytest.approx(0.85)
    grid = staleness.rate_grid(curves).set_index(["learning_rate", "tau"])
    assert grid["chosen"].to_dict() == {(0.1, 0): False, (0.1, 2): False, (0.5, 0): True, (0.5, 2): True}
    assert grid.loc[(0.1, 0), "test_mean"] == pytest.approx(0.9)  # the grid shows both splits
    shown = staleness.rate_grid_display(staleness.rate_grid(curves))
    assert shown.loc[("sgd", "0.5"), "τ = 0: validation · test (mean ± std)"].endswith("◀")
    assert not shown.loc[("sgd", "0.1"), "τ = 0: validation · test (mean ± std)"].endswith("◀")


def test_a_gap_interval_holds_zero_only_when_the_seeds_disagree():
    mean, low, high = staleness.t_interval([0.01, 0.02, 0.03, 0.02])
    assert low > 0 and high < 0.04 and mean == pytest.approx(0.02)
    mean, low, high = staleness.t_interval([-0.02, 0.03, 0.01, -0.01])
    assert low < 0 < high
    assert staleness.gap_pairs(["sgd", "adam", "adagrad", "adamw", "muon"]) == [
        ("adam", "sgd"), ("adagrad", "sgd"), ("adamw", "sgd"), ("muon", "sgd"), ("muon", "adamw")]


def test_the_staleness_tables_print_learning_rates_alike_and_units_in_parentheses():
    rows = [{"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed, "updates": updates,
             "accuracy": 0.9 * updates / 20 - 0.05 * tau + 0.01 * seed,
             "val_accuracy": 0.9 * updates / 20 - 0.05 * tau + 0.02 * seed}
            for name, lr in (("sgd", 0.5), ("adam", 0.01)) for tau in (0, 4) for seed in (0, 1)
            for updates in (10, 20)]
    curves = pd.DataFrame(rows)
    dai = staleness.dai_display(staleness.dai_check(curves, target=0.4))
    tuned = staleness.tuned_display(staleness.best_per_tau(curves))
    tuned = tuned.data if hasattr(tuned, "data") else tuned  # a Styler or a frame
    assert set(dai["learning rate"]) == {"0.01", "0.5"}
    assert set(staleness.rate_grid_display(staleness.rate_grid(curves)).index.get_level_values(1)) == {"0.01", "0.5"}
    gaps = staleness.difference_display(staleness.paired_differences(curves, [("adam", "sgd")]))
    assert list(gaps.index.get_level_values(0).unique()) == ["adam − sgd"]
    assert set(tuned["adam: learning rate"]) | set(tuned["sgd: learning rate"]) == {"0.01", "0.5"}
    assert "τ (updates late)" in dai.index.names and tuned.index.name == "τ (updates late)"
    assert not any("[" in str(c) for c in [*dai.columns, *tuned.columns])


def test_readable_tables_separate_thousands():
    from study.gradients import ps_tables

    shown = ps_tables.readable(pd.DataFrame({"variable": ["fc1/kernel"], "frozen_entries": [25122],
                                             "bytes": [6422528]}))
    assert list(shown.iloc[0]) == ["fc1/kernel", "25,122", "6,422,528"]
    assert list(shown.columns) == ["variable", "frozen entries", "bytes"]


def _gap_frame(low: float, high: float, tau: int = 2, a: str = "muon", b: str = "adamw") -> pd.DataFrame:
    return pd.DataFrame({"a": [a], "b": [b], "tau": [tau], "mean": [(low + high) / 2], "std": [0.02], "se": [0.01],
                         "ci_low": [low], "ci_high": [high], "seeds": [4]})


@pytest.mark.parametrize("low, high, sign", [
    (-0.0391, -0.00017, "0"),  # leaves out zero only in the fourth decimal: printed "-0.040 to 0.000", holds zero
    (-0.0391, -0.0011, "-"),  # printed "-0.040 to -0.001": below zero
    (0.0004, 0.02, "0"),  # printed "0.000 to +0.020"
    (0.0011, 0.02, "+"),
    (-0.02, 0.02, "0"),
])
def test_a_gap_verdict_is_read_off_its_interval_as_printed(low, high, sign):
    from study.gradients import findings

    tuned = pd.DataFrame({"muon": [0.9]}, index=pd.Index([0], name="tau"))
    q = findings.staleness_numbers(pd.DataFrame(), _gap_frame(low, high), tuned, taus=(2,),
                                   retuned=_gap_frame(low, high))
    assert q["gap_sign_muon_adamw_2"] == q["tgap_sign_muon_adamw_2"] == sign
    assert verdicts.interval_sign(low, high) == sign


def test_interval_bounds_are_rounded_outward_in_the_tables_and_summary():
    from study.gradients import findings

    frame = _gap_frame(-0.023249, -0.014961, tau=4, a="adam", b="sgd")  # to nearest: -0.023 to -0.015
    assert list(staleness.difference_display(frame)["95% interval"]) == ["-0.024 to -0.014"]
    frame = _gap_frame(-0.023249, -0.00017, tau=4, a="adam", b="sgd")
    assert list(staleness.difference_display(frame)["95% interval"]) == ["-0.024 to 0.000"]
    check = pd.DataFrame({"optimizer": ["sgd"], "tau": [4], "learning_rate": [0.5], "reached": [2], "seeds": [2],
                          "slowdown_mean": [2.0], "slowdown_std": [0.1], "drop_mean": [0.3], "drop_std": [0.01],
                          "drop_ci_low": [0.295149], "drop_ci_high": [0.444012]})
    assert list(staleness.dai_display(check)["accuracy lost, 95% interval"]) == ["+0.295 to +0.445"]
    q = {"gap_adam_sgd_4": -0.0141, "gap_low_adam_sgd_4": -0.023249, "gap_high_adam_sgd_4": -0.283961 + 0.28}
    assert findings.gap_text(q, "gap", "adam", "sgd", 4) == "−0.014 (−0.024 to −0.003)"
    q = {"quoted": {**{f"gap_{k}_adam_sgd_{t}": v for t in (1, 2, 4, 8)
                       for k, v in (("low", -0.023249), ("high", -0.00017))},
                    **{f"gap_adam_sgd_{t}": -0.0117 for t in (1, 2, 4, 8)},
                    **{f"tgap_{k}_adam_sgd_{t}": v for t in (1, 2, 4, 8)
                       for k, v in (("low", -0.064001), ("high", -0.035999))},
                    **{f"tgap_adam_sgd_{t}": -0.05 for t in (1, 2, 4, 8)}, "weak_keys": ["tgap_adam_sgd_4"]},
         "staleness_gap_pairs": [["adam", "sgd"]], "fetch_costs": {}, "exact_update_max_error": 0.0, "ps": {},
         "fault_accounting": {"restored_version": 1, "lost_with_ps": 2, "applied_after_restart": 3}}
    rows = findings.headline(q)
    undelayed = next(v for k, v in rows.items() if "without delay" in k)
    retuned = next(v for k, v in rows.items() if "re-chose for each delay" in k)
    assert "τ = 4: −0.012 (−0.024 to 0.000, holds zero)" in undelayed  # SUMMARY says what the notebook says
    assert "τ = 8: −0.050 (−0.065 to −0.035)" in retuned and "τ = 8: −0.050 (−0.065 to −0.035," not in retuned
    assert "τ = 4: −0.050 (−0.065 to −0.035, weak)" in retuned and "τ = 2: −0.050 (−0.065 to −0.035);" in retuned
    header = next(k for k in rows if "re-chose for each delay" in k)
    assert "nearer zero than" not in header  # no rate margin measured: the 25% rule alone
    q["quoted"]["rate_margin"] = 0.0037
    rows = findings.headline(q)
    header = next(k for k in rows if "re-chose for each delay" in k)
    undelayed_header = next(k for k in rows if "without delay" in k)
    assert "or, as printed, nearer zero than 0.004, what choosing a rate on validation gave up" in header
    assert "nearer zero than" not in undelayed_header  # the margin rule is the re-tuned gaps' only


def test_the_widest_gap_interval_is_found_over_every_delay():
    from study.gradients import findings

    gaps = pd.concat([_gap_frame(-w, w, tau=t, a="adam", b="sgd") for t, w in ((1, 0.037), (2, 0.091), (8, 0.056))])
    tuned = pd.DataFrame({"adam": [0.9]}, index=pd.Index([0], name="tau"))
    q = findings.staleness_numbers(pd.DataFrame(), gaps, tuned, taus=(1, 2, 4, 8))
    assert q["gap_halfwidth_max"] == pytest.approx(0.091) and q["gap_halfwidth_max_tau"] == 2


@pytest.mark.parametrize("undelayed, retuned, dominates", [
    ((-0.36, -0.643), (-0.014, -0.025), True),  # SGD's undelayed rate fails: the gap is mostly the rate
    ((-0.36, -0.643), (-0.3, -0.5), False),  # re-tuning leaves most of the gap
])
def test_a_gap_is_said_to_measure_the_rate_only_where_re_tuning_shrinks_it(undelayed, retuned, dominates):
    from study.gradients import findings

    def frame(means):
        return pd.concat([_gap_frame(m - 0.01, m + 0.01, tau=t, a="adam", b="sgd") for t, m in zip((2, 4), means)])

    tuned = pd.DataFrame({"adam": [0.9]}, index=pd.Index([0], name="tau"))
    q = findings.staleness_numbers(pd.DataFrame(), frame(undelayed), tuned, taus=(2, 4), retuned=frame(retuned))
    assert q["rate_dominates_adam_sgd"] is dominates


def test_a_verdict_near_zero_is_weak_and_one_at_a_grid_edge_provisional():
    check = pd.DataFrame({"tau": [0, 0, 4, 4], "optimizer": ["adam", "sgd", "adam", "sgd"],
                          "learning_rate": [0.01, 0.5, 0.01, 0.5]})
    tuned = pd.DataFrame({"adam": [0.9, 0.8], "adam_lr": [0.01, 0.001], "sgd": [0.9, 0.8], "sgd_lr": [0.5, 0.02]},
                         index=pd.Index([0, 4], name="tau"))
    gaps = pd.DataFrame({"a": ["adam"], "b": ["sgd"], "tau": [4], "mean": [-0.3], "se": [0.02],
                         "ci_low": [-0.35], "ci_high": [-0.25]})
    retuned = gaps.assign(mean=-0.025, ci_low=-0.0465, ci_high=-0.0028)
    q = findings.staleness_numbers(check, gaps, tuned, {"adam": [0.001, 0.01, 0.1], "sgd": [0.02, 0.5, 1.0]},
                                   (4,), retuned)
    assert q["intervals_read"] == 2 and q["weak_verdict_count"] == 1
    assert q["weak_verdicts"] == ["adam − sgd at τ = 4, rates re-chosen (−0.047 to −0.002)"]
    assert q["tgap_provisional_adam_sgd_4"] and q["tgap_edge_adam_sgd_4"] == ["adam 0.001", "sgd 0.02"]
    inside = findings.staleness_numbers(check, gaps, tuned, {"adam": [0.0001, 0.01, 0.1], "sgd": [0.01, 0.5, 1.0]},
                                        (4,), retuned)
    assert not inside["tgap_provisional_adam_sgd_4"] and inside["tgap_edge_adam_sgd_4"] == []


def test_summary_puts_the_retuned_gaps_first_and_labels_the_undelayed_ones_by_the_notebooks_logic():
    metrics = {"quoted": {**{f"{p}_{k}_adam_sgd_{t}": v for p in ("gap", "tgap") for t in (1, 8)
                             for k, v in (("low", -0.3), ("high", -0.2))},
                          **{f"{p}_adam_sgd_{t}": -0.25 for p in ("gap", "tgap") for t in (1, 8)},
                          "rate_dominates_adam_sgd": True, "tgap_provisional_adam_sgd_8": True},
               "staleness_gap_pairs": [["adam", "sgd"]], "fetch_costs": {}, "exact_update_max_error": 0.0, "ps": {},
               "fault_accounting": {"restored_version": 1, "lost_with_ps": 2, "applied_after_restart": 3}}
    keys = [k for k in findings.headline(metrics) if k.startswith("staleness")]
    assert "re-chose for each delay" in keys[0] and "without delay" in keys[1]  # the re-chosen rates first
    assert "mostly measures whether the rates chosen without delay survive it" in keys[1]
    rows = findings.headline(metrics)
    assert rows[keys[0]].endswith("τ = 8: −0.250 (−0.300 to −0.200) (provisional: a re-chosen rate at its grid's edge)")
    assert "provisional" not in rows[keys[0]].split(";")[0]
    metrics["quoted"]["rate_dominates_adam_sgd"] = False
    assert not any("mostly measures" in k for k in findings.headline(metrics))


def _curves_reaching(first: dict[tuple[str, int, int], float]) -> pd.DataFrame:
    """Staleness curves of one rate per optimizer, 3 seeds, evaluated every 10 updates up to 100: accuracy jumps from
    0.5 to 0.9 at ``first[(optimizer, tau, seed)]`` updates (inf: never)."""
    rows = []
    for (o, tau, seed), at in first.items():
        for u in range(10, 101, 10):
            acc = 0.9 if u >= at else 0.5
            rows.append({"optimizer": o, "learning_rate": 0.1, "tau": tau, "seed": seed, "updates": u,
                         "accuracy": acc, "val_accuracy": acc})
    return pd.DataFrame(rows)


def test_slowdowns_are_compared_paired_by_seed_and_only_where_every_seed_reached_the_target():
    from study.gradients import staleness

    first = {("adam", 0, s): 20 for s in range(3)} | {("sgd", 0, s): 20 for s in range(3)}
    first |= {("adam", 1, 0): 40, ("adam", 1, 1): 40, ("adam", 1, 2): 60}  # 2.0, 2.0, 3.0
    first |= {("sgd", 1, 0): 20, ("sgd", 1, 1): 30, ("sgd", 1, 2): 30}     # 1.0, 1.5, 1.5
    first |= {("adam", 2, s): 50 for s in range(3)} | {("sgd", 2, 0): 40, ("sgd", 2, 1): 40,
                                                      ("sgd", 2, 2): float("inf")}
    curves = _curves_reaching(first)
    gaps = staleness.slowdown_differences(curves, 0.85, [("adam", "sgd")]).set_index("tau")
    assert gaps.loc[1, "slowdown_gap_mean"] == pytest.approx((1.0 + 0.5 + 1.5) / 3)
    assert gaps.loc[1, "slowdown_gap_ci_low"] < 1.0 < gaps.loc[1, "slowdown_gap_ci_high"]
    assert gaps.loc[1, "both_reached"] == 3
    assert gaps.loc[2, "both_reached"] == 2 and np.isnan(gaps.loc[2, "slowdown_gap_ci_low"])  # sgd seed 2 never did
    check = staleness.dai_check(curves, 0.85).set_index(["optimizer", "tau"])
    assert check.loc[("adam", 1), "slowdown_ci_low"] < 7 / 3 < check.loc[("adam", 1), "slowdown_ci_high"]
    assert np.isnan(check.loc[("sgd", 2), "slowdown_ci_low"]) and check.loc[("sgd", 2), "slowdown_mean"] == np.inf
