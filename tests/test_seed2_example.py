"""The seed-2 worked example, exactly: drift appears with the naive mask and vanishes with the fix."""

import numpy as np
import pytest

from study.drift import adam_drift

STEP1 = [0.0, 0.1, 0.1, 0.0]
STEP2_NAIVE = [0.0744, 0.1670, 0.1670, 0.0744]  # from the seed; checked on this machine (guide)
STEP2_FIXED = [0.0744, 0.1, 0.1, 0.0744]


def _w(table, step):
    return table[table["step"] == step][[f"W[{i}]" for i in range(4)]].to_numpy().reshape(-1)


@pytest.mark.parametrize("run", [adam_drift.seed2_tf1, adam_drift.seed2_tf2], ids=["tf1_graph", "tf2"])
def test_naive_mask_drifts_under_adam(run):
    table = run("naive")
    np.testing.assert_allclose(_w(table, 1), STEP1, atol=1e-6)
    np.testing.assert_allclose(_w(table, 2), STEP2_NAIVE, atol=1e-4)


@pytest.mark.parametrize("run", [adam_drift.seed2_tf1, adam_drift.seed2_tf2], ids=["tf1_graph", "tf2"])
@pytest.mark.parametrize("method", ["reset_slots", "stash_restore"])
def test_masking_the_slots_stops_the_drift(run, method):
    table = run(method)
    np.testing.assert_allclose(_w(table, 2), STEP2_FIXED, atol=1e-4)
    assert _w(table, 2)[1] == _w(table, 1)[1]  # exactly, not approximately


@pytest.mark.parametrize("policy", ["hold", "reset"])
def test_masked_optimizer_matches_the_manual_fix_exactly(policy):
    manual = adam_drift.seed2_tf2("stash_restore" if policy == "hold" else "reset_slots")
    wrapped = adam_drift.seed2_tf2(policy)
    for step in (1, 2, 3):
        np.testing.assert_array_equal(_w(wrapped, step), _w(manual, step))


def test_unfreezing_resumes_with_the_stashed_moments():
    hold, reset = adam_drift.seed2_tf1("stash_restore"), adam_drift.seed2_tf1("reset_slots")
    m_hold = hold[hold["step"] == 3]["m[1]"].item()
    m_reset = reset[reset["step"] == 3]["m[1]"].item()
    # step 3 gradient of W[1] is 2*(0.1*2-1)*2 = -3.2; resumed m = 0.9*(-0.4) + 0.1*(-3.2), restarted m = 0.1*(-3.2)
    assert m_hold == pytest.approx(-0.68, abs=1e-6)
    assert m_reset == pytest.approx(-0.32, abs=1e-6)


def test_summary_reports_agreement_between_tf1_and_tf2():
    import pandas as pd

    table = pd.concat([adam_drift.seed2_tf1(m) for m in adam_drift.SEED2_TF1_METHODS]
                      + [adam_drift.seed2_tf2(m) for m in adam_drift.SEED2_TF2_METHODS])
    summary = adam_drift.seed2_summary(table)
    assert summary["max_abs_diff_tf1_vs_tf2_naive"] < 1e-5  # float32 rounding of two formulations
    assert summary["max_abs_diff_stash_restore_vs_hold"] == 0.0
    assert summary["tf1_naive_frozen_max_abs_dW_step2"] == pytest.approx(0.0670, abs=1e-4)
    assert summary["tf1_naive_frozen_changed_entries_step2"] == 2
    assert summary["tf2_reset_slots_frozen_max_abs_dW_step2"] == 0.0
    assert summary["tf2_hold_frozen_changed_entries_step2"] == summary["tf2_reset_frozen_changed_entries_step2"] == 0


def test_predicted_adam_drift_matches_measurement():
    table = adam_drift.adam_drift_vs_prediction(steps=15, warmup=5, size=8, seed=0, learning_rate=0.01)
    assert table["measured"].abs().max() > 1e-3  # there is drift to predict
    np.testing.assert_allclose(table["measured"], table["predicted"], atol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rmsprop", "momentum", "adam", "sgd_wd"])
def test_drift_run_names_and_the_stateless_optimizers(name):
    table = adam_drift.drift_run(name, "naive", steps=3, warmup=2, size=8, seed=0, learning_rate=0.01)
    assert list(table.columns) == ["optimizer", "policy", "seed", "step", "changed_entries", "max_abs_dW",
                                   "max_abs_displacement", "frozen_entries"]
    moved = table["changed_entries"].sum() > 0
    assert moved != (name in adam_drift.STATELESS)
    assert (table["max_abs_dW"] > 0).all() == moved  # drifting optimizers move frozen entries in every step


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_drift_summary_and_headline_cover_every_optimizer_and_policy():
    config = adam_drift.AdamDriftConfig(optimizers=["sgd", "adam"], steps=3, warmup=2, size=8, seeds=[0, 1])
    matrix = adam_drift.drift_matrix(config, progress=False)
    summary = adam_drift.drift_summary(matrix)
    assert len(summary) == 2 * 3
    adam = summary.query("optimizer == 'adam' and policy == 'naive'").iloc[0]
    assert adam["changed_entries_sum_mean"] == 3 * adam["frozen_entries"] and adam["steps_with_change_mean"] == 3
    assert summary.query("policy != 'naive'")["changed_entries_sum_mean"].eq(0).all()
    import pandas as pd

    seed2 = adam_drift.seed2_summary(pd.concat([adam_drift.seed2_tf1(m) for m in adam_drift.SEED2_TF1_METHODS]
                                               + [adam_drift.seed2_tf2(m) for m in adam_drift.SEED2_TF2_METHODS]))
    metrics = {"seed2": seed2, "fixed_policies_changed_entries": 0, "prediction_max_abs_error": 1e-7,
               "prediction_max_abs_drift": 0.05}
    headline = adam_drift.headline(metrics, summary)
    assert all(isinstance(v, str) for v in headline.values())
    assert any(k.startswith("sgd (SGD): frozen entries") for k in headline)  # each named with its class and options
    assert any(k.startswith("adam (Adam): frozen entries") for k in headline)
    assert any("±" in v for v in headline.values())  # mean ± std over the two seeds


def test_config_defaults_live_in_the_dataclass():
    config = adam_drift.AdamDriftConfig.from_parameters(steps=None, seeds=[4])
    assert config.steps == adam_drift.AdamDriftConfig().steps and config.seeds == [4]
    assert sorted(config.optimizers) == sorted(adam_drift.OPTIMIZERS)
    with pytest.raises(ValueError, match="steps: expected an integer >= 1"):
        adam_drift.AdamDriftConfig.from_parameters(steps=0)


def test_runs_are_bit_identical():
    a = adam_drift.drift_run("adam", "naive", steps=4, warmup=3, size=8, seed=1, learning_rate=0.01)
    b = adam_drift.drift_run("adam", "naive", steps=4, warmup=3, size=8, seed=1, learning_rate=0.01)
    assert a.equals(b)
