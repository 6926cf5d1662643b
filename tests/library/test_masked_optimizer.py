"""MaskedOptimizer: the contract beyond the property test (errors, subsets, tf.function, decay)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import FreezeAudit, MaskedOptimizer, slots


def _var(name="w", shape=(4,)):
    return tf.Variable(tf.reshape(tf.range(1.0, 1.0 + np.prod(shape)), shape), name=name)


def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"policy: got 'freeze'; allowed: 'hold', 'reset', 'none'"):
        MaskedOptimizer(keras.optimizers.Adam(), policy="freeze")


def test_inner_must_be_a_keras_optimizer():
    with pytest.raises(ValueError, match="inner must be a Keras 3 optimizer.*got AdamOptimizer"):
        MaskedOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))


def test_wrong_mask_shape_names_the_variable_and_the_expected_shape():
    w = _var(shape=(2, 3))
    opt = MaskedOptimizer(keras.optimizers.Adam())
    with pytest.raises(ValueError, match=r"trainable_masks\[0\] for 'w' has shape \(4,\); expected a scalar or a "
                                         r"shape broadcastable to the variable's \(2, 3\)"):
        opt.apply_gradients([(tf.ones((2, 3)), w)], trainable_masks=[np.ones(4)])
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(tf.ones((2, 3)), w)], trainable_masks=[np.ones((1, 2, 3))])


def test_broadcastable_masks_are_accepted():
    w = _var(shape=(2, 3))
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    before = w.numpy().copy()
    opt.apply_gradients([(tf.ones((2, 3)), w)], trainable_masks=[[[True], [False]]])  # freeze row 1
    np.testing.assert_array_equal(w.numpy()[1], before[1])
    assert np.all(w.numpy()[0] != before[0])


def test_more_masks_than_variables_is_an_error():
    w = _var()
    with pytest.raises(ValueError, match="2 masks for 1 variables"):
        MaskedOptimizer(keras.optimizers.SGD()).apply_gradients([(tf.ones(4), w)], trainable_masks=[None, None])


def test_build_all_then_any_subset_avoids_the_unknown_variable_trap():
    g, d = _var("g"), _var("d")
    plain = keras.optimizers.Adam()
    plain.apply_gradients([(tf.ones(4), g)])
    with pytest.raises(ValueError, match="Unknown variable"):
        plain.apply_gradients([(tf.ones(4), d)])
    opt = MaskedOptimizer(keras.optimizers.Adam())
    opt.build([g, d])
    opt.apply_gradients([(tf.ones(4), g)])
    opt.apply_gradients([(tf.ones(4), d)], trainable_masks=[[1, 0, 1, 0]])
    assert int(opt.iterations.numpy()) == 2


def test_masks_change_every_call_inside_one_tf_function_without_retracing():
    w = _var()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1), "hold")
    opt.build([w])

    @tf.function
    def step(keep):
        opt.apply_gradients([(tf.ones(4), w)], trainable_masks=[keep])

    audit = FreezeAudit([w], optimizer=opt)
    rng = np.random.default_rng(0)
    for _ in range(5):
        keep = rng.random(4) < 0.5
        with audit.step(frozen=[~keep]):
            step(tf.constant(keep))
    assert step.experimental_get_tracing_count() == 1
    assert audit.changed == 0
    assert sum(r["frozen"] for r in audit.rows()) > 0


def test_weight_decay_never_touches_frozen_entries():
    w = _var()
    opt = MaskedOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.5), "hold")
    opt.apply_gradients([(tf.zeros(4), w)], trainable_masks=[[0, 0, 1, 1]])
    np.testing.assert_array_equal(w.numpy()[:2], [1.0, 2.0])
    np.testing.assert_allclose(w.numpy()[2:], [3.0 * 0.95, 4.0 * 0.95], rtol=1e-6)  # decayed, lr*wd = 0.05


def test_reset_policy_restarts_moments_of_frozen_entries():
    w = _var()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1), "reset")
    opt.apply_gradients([(tf.ones(4), w)])
    opt.apply_gradients([(tf.ones(4), w)], trainable_masks=[[1, 1, 0, 0]])
    m = slots(opt, w)["momentum"].numpy()
    np.testing.assert_allclose(m, [0.19, 0.19, 0.0, 0.0], rtol=1e-6)


def test_the_wrapper_adds_only_one_mask_variable_per_variable_and_one_mode_vector():
    w, b = _var(), _var("b")
    inner = keras.optimizers.Adam()
    opt = MaskedOptimizer(inner)
    opt.build([w, b])
    assert len(inner.variables) == 6  # iterations, learning_rate, 2 x (m, v): nothing added to the inner optimizer
    assert len(opt.variables) == 6 + 2  # plus one unset (scalar) mask each: no other state
    assert opt.mask_bytes() == 2  # 1 byte per unset mask


def test_the_former_masks_argument_still_works_with_a_deprecation_warning():
    w, v = _var(), _var()
    with pytest.warns(DeprecationWarning, match="masks= is now trainable_masks="):
        MaskedOptimizer(keras.optimizers.SGD(1.0)).apply_gradients([(tf.ones(4), w)], masks=[[1, 0, 1, 0]])
    MaskedOptimizer(keras.optimizers.SGD(1.0)).apply_gradients([(tf.ones(4), v)], trainable_masks=[[1, 0, 1, 0]])
    assert w.numpy().tolist() == v.numpy().tolist()
    with pytest.raises(ValueError, match="not both"):
        MaskedOptimizer("sgd").apply_gradients([(tf.ones(4), w)], masks=[1], trainable_masks=[1])
