"""Study 04's pieces that run in one process: configuration, exact update, TensorBoard log, stale gradients."""

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from study.gradients import fetch, staleness
from study.gradients.config import GradientStudyConfig
from study.data import load_mnist


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
])
def test_the_staleness_optimizers_are_keras_own_update_rules(data, name, keras_optimizer):
    trainer = staleness.StaleTrainer(data, name, seeds=[0, 1], steps=10, eval_every=10, tau_max=1)
    for slot in trainer.slots:
        for v in slot:
            v.assign(tf.fill(v.shape, 0.1 if name == "adagrad" and slot is trainer.slots[0] else 0.0))
    reference = [tf.Variable(v) for v in trainer.init]
    optimizer = keras_optimizer()
    rng = np.random.default_rng(0)
    for step in range(3):
        grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in trainer.init]
        trainer._update(tf.constant(step), grads, tf.constant(0.1))
        optimizer.apply_gradients(zip(grads, reference))
    for mine, theirs in zip(trainer.params, reference):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_stale_gradients_slow_training_and_tau_zero_is_plain_training(data):
    trainer = staleness.StaleTrainer(data, "sgd", seeds=[0, 1], steps=60, eval_every=20, tau_max=16)
    fresh, late = trainer.run(0.5, 0), trainer.run(0.5, 16)
    assert fresh.shape == (3, 2) and (fresh[-1] > 0.6).all() and (late[-1] < fresh[-1]).all()
    np.testing.assert_array_equal(trainer.run(0.5, 0), fresh)  # a rerun restarts from the same state


def test_dai_check_compares_each_optimizer_at_its_best_undelayed_rate():
    rows = []
    for name, lr, base in (("sgd", 0.1, 0.9), ("sgd", 0.5, 0.8), ("adam", 0.01, 0.9)):
        for tau, loss in ((0, 0.0), (4, 0.2 if name == "adam" else 0.1)):
            for seed in (0, 1):
                for updates in (10, 20):
                    acc = (base - loss) * updates / 20
                    rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed, "updates": updates,
                                 "accuracy": acc + 0.01 * seed})
    curves = pd.DataFrame(rows)
    assert staleness.best_learning_rates(curves) == {"adam": 0.01, "sgd": 0.1}
    check = staleness.dai_check(curves, target=0.4).set_index(["optimizer", "tau"])
    assert check.loc[("adam", 4), "drop_mean"] == pytest.approx(0.2)
    assert check.loc[("sgd", 4), "drop_mean"] == pytest.approx(0.1)
    assert check.loc[("sgd", 0), "slowdown_mean"] == 1.0
    diff = staleness.paired_difference(curves).set_index("tau")
    assert diff.loc[4, "mean"] == pytest.approx(0.1) and diff.loc[4, "std"] == pytest.approx(0.0, abs=1e-9)


def test_the_staleness_tables_print_learning_rates_alike_and_units_in_parentheses():
    rows = [{"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed, "updates": updates,
             "accuracy": 0.9 * updates / 20 - 0.05 * tau + 0.01 * seed}
            for name, lr in (("sgd", 0.5), ("adam", 0.01)) for tau in (0, 4) for seed in (0, 1)
            for updates in (10, 20)]
    curves = pd.DataFrame(rows)
    dai = staleness.dai_display(staleness.dai_check(curves, target=0.4))
    tuned = staleness.tuned_display(staleness.best_per_tau(curves))
    tuned = tuned.data if hasattr(tuned, "data") else tuned  # a Styler or a frame
    assert set(dai["learning rate"]) == {"0.01", "0.5"}
    assert set(staleness.staleness_table(curves).index.get_level_values("learning_rate")) == {"0.01", "0.5"}
    assert set(tuned["adam: learning rate"]) | set(tuned["sgd: learning rate"]) == {"0.01", "0.5"}
    assert "τ (updates late)" in dai.index.names and tuned.index.name == "τ (updates late)"
    assert not any("[" in str(c) for c in [*dai.columns, *tuned.columns])


def test_readable_tables_separate_thousands():
    from study.gradients import ps_tables

    shown = ps_tables.readable(pd.DataFrame({"variable": ["fc1/kernel"], "frozen_entries": [25122],
                                             "bytes": [6422528]}))
    assert list(shown.iloc[0]) == ["fc1/kernel", "25,122", "6,422,528"]
    assert list(shown.columns) == ["variable", "frozen entries", "bytes"]
