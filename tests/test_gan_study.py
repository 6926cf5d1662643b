"""Study 03's building blocks: configuration errors, scopes, the random gate's frozen part."""

import numpy as np
import pytest
import tensorflow as tf

from freezing import select_variables, variable_path
from study.gan import alternating, tables
from study.gan.alternating import Gan, GanStudyConfig, frozen_by_gates, gated_forward, unknown_variable_trap


@pytest.mark.parametrize("bad, match", [
    ({"methods": ["two_optimizers", "freeze_d"]}, "methods: got 'freeze_d'; allowed: 'two_optimizers'"),
    ({"optimizers": ["adam", "rmsprop"]}, "optimizers: got 'rmsprop'; allowed: 'sgd', 'adam'"),
    ({"iterations": 0}, "iterations: expected an integer >= 1; got 0"),
    ({"iterations": -5}, "iterations: expected an integer >= 1"),
    ({"generator_scope": ""}, "generator_scope: expected a variable scope"),
    ({"gate_probability": 1.5}, r"gate_probability: expected a number in \[0.0, 1.0\]"),
    ({"diagnostic_optimizers": ["adamw"]}, "diagnostic_optimizers: got 'adamw'; allowed: 'sgd', 'adam'"),
    ({"processes": 0}, "processes: expected an integer >= 1; got 0"),
])
def test_bad_parameters_fail_before_training(bad, match):
    with pytest.raises(ValueError, match=match):
        GanStudyConfig(**bad)


def test_scopes_select_each_network_and_a_typo_never_selects_nothing():
    gan = Gan()
    g = select_variables(gan, scope="generator/")
    d = select_variables(gan, scope="discriminator/")
    assert {variable_path(v).split("/")[0] for v in g} == {"generator"} and len(g) == 6
    assert {variable_path(v).split("/")[0] for v in d} == {"discriminator"} and len(d) == 6
    with pytest.raises(ValueError,
                       match=r"scope='generater/'.*available prefixes: discriminator/ \(6\), generator/ \(6\)"):
        select_variables(gan, scope="generater/")


def test_gates_block_gradient_of_the_layers_before_a_zero():
    gan = Gan()
    g = gan.generator
    z = tf.random.normal((4, 64))
    for keep in ([1.0, 1.0], [0.0, 1.0], [1.0, 0.0]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(gated_forward(g, z, [tf.constant(k) for k in keep]))
        grads = tape.gradient(loss, g.trainable_variables)
        frozen = [bool(f) for f in frozen_by_gates(g, [tf.constant(k) for k in keep])]
        zero = [not np.any(gr.numpy()) for gr in grads]
        assert frozen == zero, (keep, frozen, zero)
    assert frozen == [True, True, True, True, False, False]  # a 0 after dense2 blocks dense1 and dense2


def test_unknown_variable_trap_and_its_fix():
    trap = unknown_variable_trap()
    assert trap.iloc[0]["outcome"].startswith("Unknown variable: generator/dense1/kernel. This optimizer")
    assert trap.iloc[1]["outcome"] == "both steps applied"


def test_config_defaults_live_in_the_dataclass():
    config = GanStudyConfig.from_parameters(iterations=None, seeds=[3], methods=None)
    assert config.iterations == GanStudyConfig().iterations and config.seeds == [3]
    assert tuple(config.methods) == alternating.METHODS
    with pytest.raises(ValueError, match="iterations: expected an integer >= 1"):
        GanStudyConfig.from_parameters(iterations=0)


def _tiny_study(methods, optimizers=("adam",), seeds=(0,), processes=1):
    from study.data import MnistSplits

    rng = np.random.default_rng(0)
    x = rng.random((64, 28, 28, 1)).astype(np.float32)
    y = np.tile(np.arange(10), 7)[:64]
    data = MnistSplits(x_train=x, y_train=y, x_val=x[:8], y_val=y[:8], x_test=x[:16], y_test=y[:16], source="random")
    config = GanStudyConfig(methods=list(methods), optimizers=list(optimizers), iterations=3, batch=8,
                            seeds=list(seeds), quality_samples=20, log_every=1, classifier_steps=1,
                            processes=processes)
    classifier, _ = alternating.train_classifier(data, 1)
    return config, alternating.gan_study(config, data, classifier, progress=False)


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_the_diagnostic_gates_draw_for_one_network_only_and_keep_the_rest_still():
    config, (runs, logs, grids) = _tiny_study(["random_gate_masked", "gate_d_only", "gate_g_only"],
                                              optimizers=("sgd", "adam"))
    # the diagnostics run only under diagnostic_optimizers (Adam by default)
    assert set(grids) == {(m, "adam") for m in config.methods} | {("random_gate_masked", "sgd")}
    audits = ["g_changed_entries_in_d_step", "d_changed_entries_in_g_step", "gated_changed_entries"]
    assert (runs[audits] == 0).all().all()  # all three are exact
    summary = tables.gan_summary(runs)
    assert {"classes_seen_mean", "classes_seen_std", "single_class_runs", "time_per_iteration_ms_mean"} <= set(summary)
    headline = tables.headline(summary, 0.5, "random", config.iterations)
    for method in config.methods:
        assert any(k.startswith(f"{method}, adam:") and "classes seen" in k for k in headline)
    assert not any(k.startswith("gate_d_only, sgd") for k in headline)
    assert any("time" in k for k in headline)  # timings sit under keys a rerun comparison can skip


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_a_study_run_gives_the_same_bits_in_one_worker_process_or_two():
    # processes=1 runs both pairings one after the other in one worker; processes=2 in two fresh workers
    first, logs1, grids1 = _tiny_study(["two_optimizers", "random_gate"], seeds=(0, 1))[1]
    runs, logs, grids = _tiny_study(["two_optimizers", "random_gate"], seeds=(0, 1), processes=2)[1]
    timing = [c for c in first.columns if "time" in c]
    assert runs.drop(columns=timing).equals(first.drop(columns=timing)) and logs.equals(logs1)
    assert grids.keys() == grids1.keys() and all(np.array_equal(grids[k], grids1[k]) for k in grids1)
    assert len(first) == 4 and len(grids1) == 2  # 2 methods x 2 seeds; a grid per method


class _Recorder:
    """A stand-in for ``alternating._Runner`` that records what ``run_one`` hands each iteration."""

    def __init__(self, method):
        self.method, self.seen = method, []

    @staticmethod
    def _out():
        return {**{k: 0 for k in alternating.AUDIT_KEYS}, "d_loss": 0.0, "g_loss": 0.0, "d_iterations": 0,
                "g_iterations": 0}

    def iteration(self, real, z_d, z_g, do_d, do_g):
        self.seen.append((np.array(real), np.array(z_d), np.array(z_g), np.array(do_d), np.array(do_g)))
        return {k: tf.constant(v) for k, v in self._out().items()}

    def keras_iteration(self, real, z_d, z_g):  # the Keras recipe has no gate
        self.seen.append((np.array(real), np.array(z_d), np.array(z_g), None, None))
        return self._out()


def test_every_method_sees_the_same_batches_latents_and_gate_draws():
    # trainable_flag once skipped the gate draws, so from its second iteration on it trained on other batches
    # and latent vectors than every other method.
    config = GanStudyConfig(iterations=6, batch=4, seeds=[0], log_every=1)
    images = np.arange(50, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)  # row i holds i: an index
    seen = {}
    for method in alternating.METHODS:
        recorder = _Recorder(method)
        alternating.run_one(recorder, images, config, seed=7)
        seen[method] = recorder.seen
    reference = seen["two_optimizers"]
    assert len(reference) == config.iterations
    for method, steps in seen.items():
        for it, (step, ref) in enumerate(zip(steps, reference), start=1):
            for name, a, b in zip(("batch", "z_d", "z_g"), step[:3], ref[:3]):
                assert np.array_equal(a, b), (method, it, name)
    assert len({tuple(step[0][:, 0]) for step in reference}) == config.iterations  # a fresh batch each iteration
    gates = {m: np.array([np.concatenate(s[3:]) for s in seen[m]]) for m in alternating.GATED}
    assert np.array_equal(gates["random_gate"], gates["random_gate_masked"])
    assert 0 < gates["random_gate"].mean() < 1  # gates are drawn, some open, some closed
    assert (np.array_equal(gates["gate_d_only"][:, :2], gates["random_gate"][:, :2])
            and (gates["gate_d_only"][:, 2:] == 1).all())
    assert (np.array_equal(gates["gate_g_only"][:, 2:], gates["random_gate"][:, 2:])
            and (gates["gate_g_only"][:, :2] == 1).all())


def test_the_stop_gradient_method_shows_no_keras_warning_about_missing_gradients(recwarn):
    """Keras warns "Gradients do not exist" when G's gradients are None; for stop_gradient that is the method."""
    from study.gan.alternating import GanStudyConfig, _Runner, run_one

    config = GanStudyConfig(iterations=2, seeds=[0], methods=["stop_gradient"], optimizers=["sgd"], batch=8)
    images = np.random.default_rng(0).random((32, 784)).astype("float32")
    run_one(_Runner("stop_gradient", "sgd", 0.05, config), images, config, seed=0)
    assert not [str(w.message) for w in recwarn if "Gradients do not exist" in str(w.message)]


def test_quality_columns_print_at_one_precision_each():
    import pandas as pd

    summary = pd.DataFrame({v: [1.0, 2.0]
                            for v in (f"{q}_{s}" for q in tables.QUALITY_VALUES for s in ("mean", "std"))})
    summary["classes_seen_mean"], summary["classes_seen_std"] = [9.333, 10.0], [0.577, 0.0]
    summary["final_d_loss_std"] = [0.0, 0.0]  # no spread anywhere: the fallback
    decimals = tables.quality_decimals(summary)
    assert decimals["classes_seen"] == 2 and decimals["final_d_loss"] == 2
    assert [f"{m:.{decimals['classes_seen']}f}" for m in summary["classes_seen_mean"]] == ["9.33", "10.00"]
