"""Study 03's building blocks: configuration errors, scopes, the random gate's frozen part."""

import numpy as np
import pytest
import tensorflow as tf

from freezing import select_variables, variable_path
from study.gan_study import Gan, GanStudyConfig, frozen_by_gates, gated_forward, unknown_variable_trap


@pytest.mark.parametrize("bad, match", [
    ({"methods": ["two_optimizers", "freeze_d"]}, "methods: got 'freeze_d'; allowed: 'two_optimizers'"),
    ({"optimizers": ["adam", "rmsprop"]}, "optimizers: got 'rmsprop'; allowed: 'sgd', 'adam'"),
    ({"iterations": 0}, "iterations: expected an integer >= 1; got 0"),
    ({"iterations": -5}, "iterations: expected an integer >= 1"),
    ({"generator_scope": ""}, "generator_scope: expected a variable scope"),
    ({"gate_probability": 1.5}, r"gate_probability: expected a number in \[0.0, 1.0\]"),
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
    with pytest.raises(ValueError, match=r"scope='generater/'.*available prefixes: discriminator/ \(6\), generator/ \(6\)"):
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
    assert trap.iloc[0]["outcome"].startswith("Unknown variable")
    assert trap.iloc[1]["outcome"] == "both steps applied"
