"""slots / reset_slots / stash_slots / restore_slots on Keras 3 and tf.compat.v1 optimizers."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, reset_slots, restore_slots, slot_initial_value, slots, stash_slots


def _trained(opt, shape=(4,)):
    w = tf.Variable(tf.zeros(shape), name="w")
    opt.build([w])
    opt.apply_gradients([(tf.ones(shape), w)])
    return w


def test_keras_adam_slots_by_public_name():
    opt = keras.optimizers.Adam(0.1)
    w = _trained(opt)
    found = slots(opt, w)
    assert sorted(found) == ["momentum", "velocity"]
    assert all(any(s is v for v in opt.variables) for s in found.values())
    np.testing.assert_allclose(found["momentum"].numpy(), [0.1] * 4)


@pytest.mark.parametrize("make, expected", [
    (lambda: keras.optimizers.SGD(0.1), []),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9), ["momentum"]),
    (lambda: keras.optimizers.Adam(0.1, amsgrad=True), ["momentum", "velocity", "velocity_hat"]),
    (lambda: keras.optimizers.Adagrad(0.1), ["accumulator"]),
    (lambda: keras.optimizers.RMSprop(0.1, momentum=0.5, centered=True),
     ["average_gradient", "momentum", "velocity"]),
    (lambda: keras.optimizers.Ftrl(0.1), ["accumulator", "linear"]),
])
def test_every_slot_of_a_variable_is_found(make, expected):
    opt = make()
    w = _trained(opt)
    other = tf.Variable(tf.zeros(3), name="other")  # a second variable's slots must not leak in
    assert sorted(slots(opt, w)) == expected
    assert all(tuple(s.shape) == (4,) for s in slots(opt, w).values())
    del other


def test_slots_of_the_right_variable_when_two_share_a_prefix():
    a, ab = tf.Variable(tf.zeros(2), name="a"), tf.Variable(tf.zeros(3), name="a_b")
    opt = keras.optimizers.Adam()
    opt.build([a, ab])
    assert tuple(slots(opt, a)["momentum"].shape) == (2,)
    assert tuple(slots(opt, ab)["momentum"].shape) == (3,)


def test_masked_optimizer_is_looked_through():
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    w = _trained(opt)
    assert slots(opt, w)["momentum"] is slots(opt.inner, w)["momentum"]


def test_unbuilt_and_unknown_variables_raise():
    opt = keras.optimizers.Adam()
    w = tf.Variable(tf.zeros(2), name="w")
    with pytest.raises(ValueError, match="not built"):
        slots(opt, w)
    opt.build([w])
    with pytest.raises(ValueError, match="'stranger' is not one the optimizer"):
        slots(opt, tf.Variable(1.0, name="stranger"))
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        slots(object(), w)


def test_reset_slots_everywhere_and_where():
    opt = keras.optimizers.Adam(0.1)
    w = _trained(opt)
    reset_slots(opt, w, where=[True, False, False, True])
    np.testing.assert_allclose(slots(opt, w)["momentum"].numpy(), [0.0, 0.1, 0.1, 0.0])
    reset_slots(opt, w)
    assert not np.any(slots(opt, w)["velocity"].numpy())


def test_reset_returns_accumulators_to_their_start():
    opt = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25)
    w = _trained(opt)
    assert slot_initial_value(opt, "accumulator") == 0.25
    reset_slots(opt, w, where=np.array([True, True, False, False]))
    np.testing.assert_allclose(slots(opt, w)["accumulator"].numpy(), [0.25, 0.25, 1.25, 1.25])


def test_stash_and_restore_put_frozen_moments_back():
    opt = keras.optimizers.Adam(0.1)
    w = _trained(opt)
    frozen = np.array([False, True, True, False])
    stash = stash_slots(opt, w, where=frozen)
    reset_slots(opt, w, where=frozen)
    opt.apply_gradients([(tf.ones(4), w)])
    restore_slots(opt, w, stash)
    m = slots(opt, w)["momentum"].numpy()
    np.testing.assert_allclose(m[frozen], [0.1, 0.1])  # stashed value, not the reset-and-stepped one
    np.testing.assert_allclose(m[~frozen], [0.19, 0.19])


def test_tf1_optimizer_in_graph_mode():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros(4), use_resource=True)
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        train = opt.minimize(tf.reduce_sum(w * tf.constant([1.0, 2.0, 3.0, 4.0])))
        frozen = tf.compat.v1.placeholder(tf.bool, [4])
        reset = reset_slots(opt, w, where=frozen)
        assert isinstance(reset, tf.Operation)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            assert sorted(slots(opt, w)) == ["m", "v"]
            stash = stash_slots(opt, w, where=np.array([True, False, False, False]), session=sess)
            sess.run(reset, {frozen: [True, True, False, False]})
            np.testing.assert_allclose(sess.run(opt.get_slot(w, "m")), [0.0, 0.0, 0.3, 0.4], rtol=1e-6)
            restore_slots(opt, w, stash, session=sess)
            np.testing.assert_allclose(sess.run(opt.get_slot(w, "m")), [0.1, 0.0, 0.3, 0.4], rtol=1e-6)
            with pytest.raises(ValueError, match="session="):
                stash_slots(opt, w)


def test_tf1_optimizer_in_eager_mode():
    w = tf.Variable(tf.zeros(3), name="w_eager")
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)
    opt.apply_gradients([(tf.ones(3), w)])
    assert list(slots(opt, w)) == ["momentum"]
    reset_slots(opt, w, where=[True, False, True])
    np.testing.assert_allclose(slots(opt, w)["momentum"].numpy(), [0.0, 1.0, 0.0])


# -- the EMA average and the gradient accumulator are not moments --------------------------------------
def _ema_run(opt, frozen, steps=5):
    """The manual route: gradients zero where frozen, reset_slots after every step, then fit's final overwrite."""
    w = keras.Variable(np.array([1.0, 2.0, 3.0, 4.0], np.float32), name="w")
    before = w.numpy().copy()
    opt.build([w])
    for _ in range(steps):
        opt.apply_gradients([(tf.where(frozen, 0.0, tf.ones(4)), w)])
        reset_slots(opt, w, where=frozen)
    during = w.numpy().copy()
    opt.finalize_variable_values([w])  # what fit runs when it ends: weights := their averages
    return before, during, w.numpy()


def test_reset_slots_with_ema_keeps_frozen_weights_through_the_final_overwrite():
    """reset_slots used to reset the EMA average like a moment: finalize_variable_values then zeroed frozen weights."""
    frozen = np.array([True, False, True, False])
    opt = keras.optimizers.Adam(0.1, use_ema=True)
    before, during, after = _ema_run(opt, frozen)
    assert (during[frozen] == before[frozen]).all()
    assert (after[frozen] == before[frozen]).all()
    assert (after[~frozen] != during[~frozen]).all()  # trainable entries did take their averages
    average = slots(opt, opt._trainable_variables[0])["average"].numpy()
    assert (average[frozen] == before[frozen]).all()


def test_stash_and_restore_leave_the_ema_average_and_the_accumulator_alone():
    from freezing.slots import moments

    opt = keras.optimizers.Adam(0.1, use_ema=True, gradient_accumulation_steps=3)
    w = _trained(opt)
    assert sorted(slots(opt, w)) == ["average", "gradient_accumulator", "momentum", "velocity"]
    assert sorted(moments(opt, w)) == ["momentum", "velocity"]
    frozen = np.array([True, False, True, False])
    stash = stash_slots(opt, w, where=frozen)
    assert sorted(stash.values) == ["momentum", "velocity"]
    average, accumulator = slots(opt, w)["average"], slots(opt, w)["gradient_accumulator"]
    average.assign([5.0, 6.0, 7.0, 8.0])
    accumulator.assign([1.0, 2.0, 3.0, 4.0])
    restore_slots(opt, w, stash)
    assert average.numpy().tolist() == [5.0, 6.0, 7.0, 8.0]
    assert accumulator.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("options, message", [
    ({"gradient_accumulation_steps": 2},
     r"reset_slots: Adam\(gradient_accumulation_steps=2\) adds what a frozen entry"),
    ({"use_ema": True, "ema_overwrite_frequency": 3}, r"reset_slots: Adam\(use_ema=True, ema_overwrite_frequency=3\)"),
])
def test_reset_slots_refuses_what_the_manual_route_cannot_hold_and_changes_nothing(options, message):
    if "gradient_accumulation_steps" in options and not hasattr(keras.optimizers.Adam(), "gradient_accumulation_steps"):
        pytest.skip(f"Keras {keras.__version__} has no gradient_accumulation_steps")
    opt = keras.optimizers.Adam(0.1, **options)
    w = _trained(opt)
    state = [v.numpy().copy() for v in opt.variables]
    with pytest.raises(ValueError, match=message):
        reset_slots(opt, w, where=[True, False, False, False])
    assert all((a == v.numpy()).all() for a, v in zip(state, opt.variables))
    masked = MaskedOptimizer(keras.optimizers.Adam(0.1, **options))  # its masks hold both: not refused
    reset_slots(masked, _trained(masked), where=[True, False, False, False])
