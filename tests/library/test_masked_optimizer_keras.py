"""MaskedOptimizer as a Keras 3 optimizer: compile/fit, masks as state, round trips, every Keras option."""

import keras
import keras_features
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, MaskSchedule, slots
from freezing.audit import changed_bits


def _model(constraint=None, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(6, name="fc1", kernel_constraint=constraint),
        keras.layers.Dense(2, name="fc2"),
    ])


def _data(n=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def _frozen_unchanged(before, after, keep):
    """True when no frozen entry's bits changed."""
    return not np.any(changed_bits(before, after) & ~np.broadcast_to(keep, before.shape))


def _fit(model, opt, epochs=2, callbacks=(), **kw):
    model.compile(optimizer=opt, loss="mse")
    x, y = _data()
    model.fit(x, y, epochs=epochs, batch_size=8, verbose=0, shuffle=False, callbacks=list(callbacks), **kw)
    return model


KEEP = np.random.default_rng(2).random((4, 6)) < 0.5


@pytest.mark.parametrize("inner", [keras.optimizers.Adam(0.05), "adam",
                                   {"class_name": "AdamW", "config": {"learning_rate": 0.05}}],
                         ids=["instance", "string", "config"])
def test_compile_fit_evaluate_predict(inner):
    model = _model()
    opt = MaskedOptimizer(inner, policy="hold")
    model.compile(optimizer=opt, loss="mse", metrics=["mae"])
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)
    before = kernel.numpy().copy()
    x, y = _data()
    history = model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert len(history.history["loss"]) == 2
    assert _frozen_unchanged(before, kernel.numpy(), KEEP)
    assert np.all(kernel.numpy()[KEEP] != before[KEEP])  # the trainable entries did train
    assert len(model.evaluate(x, y, verbose=0)) == 2
    assert model.predict(x, verbose=0).shape == (32, 2)


def test_mask_changed_between_batches_takes_effect_without_retracing():
    traces = []

    def count_traces(step, variable):  # runs in Python only when the step is traced
        traces.append(variable.path)
        return None

    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05), mask_fn=count_traces)
    kernel = model.get_layer("fc1").kernel
    rng = np.random.default_rng(0)
    violations = []

    class FlipMask(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.keep = rng.random((4, 6)) < 0.5
            opt.set_mask(kernel, self.keep)
            self.before = kernel.numpy().copy()

        def on_train_batch_end(self, batch, logs=None):
            if not _frozen_unchanged(self.before, kernel.numpy(), self.keep):
                violations.append(batch)

    _fit(model, opt, epochs=2, callbacks=[FlipMask()])
    assert violations == []
    flipping = len(traces)
    traces.clear()
    _fit(_model(), MaskedOptimizer(keras.optimizers.Adam(0.05), mask_fn=count_traces), epochs=2)
    assert flipping == len(traces) > 0  # 8 mask changes caused no trace beyond fit's own


def test_get_set_clear_by_path_and_variable():
    model = _model()
    opt = MaskedOptimizer("sgd")
    opt.build(model.trainable_variables)
    kernel, bias = model.get_layer("fc1").kernel, model.get_layer("fc1").bias
    opt.set_mask(kernel.path, KEEP)
    np.testing.assert_array_equal(opt.get_mask(kernel), KEEP)
    opt.set_mask(bias, 0)  # a scalar freezes the whole variable
    assert opt.get_mask(bias.path).tolist() == [False] * 6
    opt.clear_mask(kernel)
    assert opt.get_mask(kernel) is None and opt.get_mask(bias) is not None


def test_masks_set_before_build_apply_at_build():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05))
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)
    before = kernel.numpy().copy()
    _fit(model, opt, epochs=1)
    np.testing.assert_array_equal(opt.get_mask(kernel), KEEP)
    assert _frozen_unchanged(before, kernel.numpy(), KEEP)


def test_stored_masks_cost_at_most_a_byte_per_masked_entry():
    model = _model()
    opt = MaskedOptimizer("adam")
    opt.build(model.trainable_variables)
    n_vars = len(model.trainable_variables)
    assert opt.mask_bytes() == n_vars  # one byte per variable without a mask
    opt.set_mask(model.get_layer("fc1").kernel, KEEP)
    assert opt.mask_bytes() == n_vars - 1 + KEEP.size
    opt.set_mask(model.get_layer("fc2").kernel, [[1, 0]])  # broadcastable: stored at its own size
    assert opt.mask_bytes() == n_vars - 2 + KEEP.size + 2
    opt.set_mask(model.get_layer("fc2").kernel, np.ones((6, 2)))  # all trainable: no mask, one byte
    opt.set_mask(model.get_layer("fc2").bias, np.zeros(2))  # all frozen: scalar False, one byte
    assert opt.mask_bytes() == n_vars - 1 + KEEP.size


def _step_mask(step, variable):
    """A mask computed in the graph from the step: entries alternate with the step's parity."""
    if len(variable.shape) != 2:
        return None
    index = tf.reshape(tf.range(tf.size(variable)), variable.shape)
    return tf.equal((index + tf.cast(step, tf.int32)) % 2, 0)


def test_mask_fn_computes_masks_in_the_graph_with_nothing_stored():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05), mask_fn=_step_mask)
    kernel = model.get_layer("fc1").kernel
    violations = []

    class Check(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.step = int(opt.iterations.numpy())
            self.before = kernel.numpy().copy()

        def on_train_batch_end(self, batch, logs=None):
            keep = _step_mask(self.step, kernel).numpy()
            if not _frozen_unchanged(self.before, kernel.numpy(), keep) or np.all(self.before == kernel.numpy()):
                violations.append(batch)

    _fit(model, opt, epochs=1, callbacks=[Check()])
    assert violations == []
    assert opt.mask_bytes() == len(model.trainable_variables)  # nothing stored beyond the empty masks


def test_per_call_masks_override_the_stored_ones():
    w = keras.Variable(np.zeros(4, "float32"), name="w")
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    opt.build([w])
    opt.set_mask(w, [1, 1, 0, 0])
    opt.apply_gradients([(tf.ones(4), w)], trainable_masks=[[0, 0, 1, 1]])
    assert (w.numpy() != 0).tolist() == [False, False, True, True]
    opt.apply_gradients([(tf.ones(4), w)])  # the stored mask again
    assert (w.numpy() != 0).tolist() == [True, True, True, True]


def _train_and_snapshot(model, opt):
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)
    _fit(model, opt, epochs=1)
    return kernel


def test_keras_file_round_trip_keeps_inner_policy_masks_and_slots(tmp_path):
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05), policy="reset", norms="all")
    _train_and_snapshot(model, opt)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    lopt = loaded.optimizer
    assert isinstance(lopt, MaskedOptimizer) and isinstance(lopt.inner, keras.optimizers.Adam)
    assert (lopt.policy, lopt.norms) == ("reset", "all")
    np.testing.assert_array_equal(lopt.get_mask(loaded.get_layer("fc1").kernel), KEEP)
    assert lopt.get_mask(loaded.get_layer("fc2").kernel) is None
    for a, b in zip(opt.variables, lopt.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    saved_m = slots(opt, model.get_layer("fc1").kernel)["momentum"].numpy()
    np.testing.assert_array_equal(slots(lopt, loaded.get_layer("fc1").kernel)["momentum"].numpy(), saved_m)


def test_checkpoint_round_trip_restores_masks_before_or_after_build(tmp_path):
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05))
    _train_and_snapshot(model, opt)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(tmp_path / "ck")
    for build_first in (True, False):
        other = _model(seed=5)
        oopt = MaskedOptimizer(keras.optimizers.Adam(0.05))
        if build_first:
            oopt.build(other.trainable_variables)
        status = tf.train.Checkpoint(model=other, optimizer=oopt).restore(path)
        if not build_first:
            oopt.build(other.trainable_variables)
        status.assert_existing_objects_matched()
        np.testing.assert_array_equal(oopt.get_mask(other.get_layer("fc1").kernel), KEEP)
        for a, b in zip(opt.variables, oopt.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_training_after_a_restore_matches_training_without_interruption(tmp_path):
    from freezing.determinism import enable_determinism

    x, y = _data(64)

    def run(interrupt):
        enable_determinism(7)
        model = _model(seed=7)
        opt = MaskedOptimizer(keras.optimizers.Adam(0.02), mask_fn=None)
        model.compile(optimizer=opt, loss="mse")
        opt.build(model.trainable_variables)
        opt.set_mask(model.get_layer("fc1").kernel, KEEP)
        model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
        if interrupt:
            model.save(tmp_path / "mid.keras")
            model = keras.saving.load_model(tmp_path / "mid.keras")
        model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
        return np.concatenate([w.numpy().ravel() for w in model.weights])

    straight, resumed = run(False), run(True)
    assert straight.tobytes() == resumed.tobytes()


def test_mask_schedule_keeps_optimizer_state_across_stages():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05))
    fc1 = model.get_layer("fc1")
    seen = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = (fc1.kernel.numpy().copy(), slots(opt, fc1.kernel)["momentum"].numpy().copy())

    schedule = MaskSchedule({0: {fc1: True}, 1: {fc1: False}, 3: {fc1: None}})
    _fit(model, opt, epochs=4, callbacks=[schedule, Record()])
    assert [s for _, s in schedule.applied] == [0, 1, 3]
    assert np.array_equal(seen[0][0], seen[2][0])  # frozen in epochs 1-2: value held
    assert np.array_equal(seen[0][1], seen[2][1])  # and its moments held, not lost
    assert np.any(seen[0][1] != 0) and not np.array_equal(seen[2][0], seen[3][0])  # trains again in epoch 3


def test_gradual_unfreezing_unfreezes_one_layer_every_k_epochs():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05))
    fc1, fc2 = model.get_layer("fc1"), model.get_layer("fc2")
    kernels = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            kernels[epoch] = fc1.kernel.numpy().copy()

    before = fc1.kernel.numpy().copy()
    _fit(model, opt, epochs=3, callbacks=[MaskSchedule.gradual_unfreezing([fc1, fc2], every=2), Record()])
    assert np.array_equal(kernels[1], before) and not np.array_equal(kernels[2], before)


# -- every Keras option, exactly ----------------------------------------------------------------

def _custom_steps(opt, w, keep, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        opt.apply_gradients([(tf.constant(rng.normal(size=w.shape), w.dtype), w)], trainable_masks=[keep])


def test_adafactor_per_element_masks_hold_values_and_velocity_exactly():
    w = keras.Variable(np.random.default_rng(0).normal(size=(3, 4)).astype("float32"), name="w")
    opt = MaskedOptimizer(keras.optimizers.Adafactor(0.1))
    opt.build([w])
    keep = np.ones((3, 4), bool)
    keep[0, :] = False  # row 0 wholly frozen: its row statistic is held
    keep[1, 2] = False  # one entry of row 1: row 1's statistic still updates
    _custom_steps(opt, w, keep, steps=1)
    before = {k: s.numpy().copy() for k, s in slots(opt, w).items()}
    w0 = w.numpy().copy()
    _custom_steps(opt, w, keep, steps=3, seed=1)
    assert _frozen_unchanged(w0, w.numpy(), keep)
    after = {k: s.numpy() for k, s in slots(opt, w).items()}
    full = [k for k in after if after[k].shape == (3, 4)]
    rows = [k for k in after if after[k].shape == (3,)]
    assert full and rows
    for k in full:
        assert _frozen_unchanged(before[k], after[k], keep)
    for k in rows:
        assert after[k][0] == before[k][0] and after[k][1] != before[k][1]


def test_ema_overwrites_never_touch_frozen_entries_and_their_averages_are_their_weights():
    w = keras.Variable(np.random.default_rng(0).normal(size=(5,)).astype("float32"), name="w")
    inner = keras.optimizers.Adam(0.1, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2)
    opt = MaskedOptimizer(inner)
    opt.build([w])
    keep = np.array([1, 0, 1, 0, 1], bool)
    _custom_steps(opt, w, np.ones(5, bool), steps=3)  # averages differ from values now
    w0, avg0 = w.numpy().copy(), inner._model_variables_moving_average[0].numpy().copy()
    _custom_steps(opt, w, keep, steps=4, seed=1)  # includes two EMA overwrites
    assert _frozen_unchanged(w0, w.numpy(), keep)
    average = inner._model_variables_moving_average[0].numpy()
    assert average[~keep].tobytes() == w0[~keep].tobytes()  # a frozen entry's average is its weight, bit for bit
    assert not np.all(avg0[~keep] == w0[~keep])  # (it was not before the entries were frozen)
    assert np.all(w.numpy()[keep] != w0[keep])


def test_gradient_accumulation_holds_frozen_entries_and_their_accumulators():
    w = keras.Variable(np.zeros(4, "float32"), name="w")
    inner = keras.optimizers.Adam(0.1, gradient_accumulation_steps=3)
    opt = MaskedOptimizer(inner)
    opt.build([w])
    keep = np.array([1, 1, 0, 0], bool)
    for step in range(6):
        opt.apply_gradients([(tf.ones(4), w)], trainable_masks=[keep])
        acc = inner._accumulated_gradients[0].numpy()
        assert np.all(acc[~keep] == 0), step
        assert np.all(w.numpy()[~keep] == 0), step
    assert np.all(w.numpy()[keep] != 0)  # two update steps happened for the trainable entries


def test_constraints_never_change_frozen_entries():
    model = _model(constraint=keras.constraints.NonNeg())
    kernel = model.get_layer("fc1").kernel
    kernel.assign(-np.abs(kernel.numpy()) - 0.1)  # every entry violates NonNeg
    opt = MaskedOptimizer(keras.optimizers.SGD(0.01))
    opt.set_mask(kernel, KEEP)
    before = kernel.numpy().copy()
    _fit(model, opt, epochs=1)
    assert _frozen_unchanged(before, kernel.numpy(), KEEP)
    assert np.all(kernel.numpy()[KEEP] >= 0)  # the constraint still applies to trainable entries
    assert kernel.constraint is not None and type(kernel.constraint).__name__ == "NonNeg"  # restored


@pytest.mark.parametrize("clip", [{"clipnorm": 0.1}, {"global_clipnorm": 0.1}], ids=["clipnorm", "global_clipnorm"])
def test_norms_trainable_ignore_frozen_gradients_and_all_sees_them(clip):
    keep = np.array([1, 1, 0, 0], bool)
    grad = tf.constant([0.3, 0.4, 100.0, 100.0])  # huge frozen gradients dominate the norm if seen

    def step(norms=None, plain_grad=None):
        w = keras.Variable(np.zeros(4, "float32"), name="w")
        if norms is None:
            keras.optimizers.SGD(1.0, **clip).apply_gradients([(plain_grad, w)])
        else:
            MaskedOptimizer(keras.optimizers.SGD(1.0, **clip), norms=norms).apply_gradients([(grad, w)],
                                                                                          trainable_masks=[keep])
        return w.numpy()

    trainable, everything = step("trainable"), step("all")
    np.testing.assert_array_equal(trainable, step(plain_grad=tf.where(keep, grad, 0.0)) * keep)
    np.testing.assert_array_equal(everything, step(plain_grad=grad) * keep)
    assert np.all(trainable[:2] != everything[:2]) and np.all(trainable[2:] == 0) and np.all(everything[2:] == 0)


@pytest.mark.parametrize("nesting", ["compile_wraps_masked", "masked_wraps_loss_scale"])
def test_mixed_precision_keeps_frozen_entries_bit_exact(nesting):
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = _model()
        kernel = model.get_layer("fc1").kernel
        if nesting == "compile_wraps_masked":
            opt = MaskedOptimizer(keras.optimizers.Adam(0.05))
            _ = opt  # compile wraps it in a LossScaleOptimizer
            model.compile(optimizer=opt, loss="mse")
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            opt.set_mask(kernel, KEEP)
            before = kernel.numpy().copy()
            x, y = _data()
            model.fit(x, y, epochs=2, batch_size=8, verbose=0)
        else:
            opt = MaskedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05)))
            opt.build(model.trainable_variables)
            opt.set_mask(kernel, KEEP)
            before = kernel.numpy().copy()
            x, y = _data()
            for _ in range(4):
                with tf.GradientTape() as tape:
                    loss = opt.scale_loss(tf.reduce_mean((tf.cast(model(x), "float32") - y) ** 2))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
        assert kernel.dtype == "float32"
        assert _frozen_unchanged(before, kernel.numpy(), KEEP)
        assert np.any(kernel.numpy()[KEEP] != before[KEEP])
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@keras_features.needs("MultiOptimizer", "OptimizerMap")
@pytest.mark.parametrize("nesting", ["multi_inside", "masked_inside_multi"])
def test_multi_optimizer_in_both_nestings(nesting):
    model = _model()
    fc1, fc2 = model.get_layer("fc1"), model.get_layer("fc2")
    routes = {".*fc2.*": keras.optimizers.SGD(0.05, momentum=0.9)}
    if nesting == "multi_inside":
        multi = keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(keras.optimizers.Adam(0.05), routes))
        opt = masked = MaskedOptimizer(multi)
    else:
        masked = MaskedOptimizer(keras.optimizers.Adam(0.05))
        opt = keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(0.05, momentum=0.9), {".*fc1.*": masked}))
    model.compile(optimizer=opt, loss="mse")
    masked.set_mask(fc1.kernel, KEEP)
    if nesting == "multi_inside":
        masked.set_mask(fc2.kernel, [[1, 0]])
    before1, before2 = fc1.kernel.numpy().copy(), fc2.kernel.numpy().copy()
    x, y = _data()
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert _frozen_unchanged(before1, fc1.kernel.numpy(), KEEP)
    assert np.any(fc1.kernel.numpy()[KEEP] != before1[KEEP])
    if nesting == "multi_inside":
        assert np.array_equal(fc2.kernel.numpy()[:, 1], before2[:, 1])
        assert np.all(fc2.kernel.numpy()[:, 0] != before2[:, 0])


# -- bad input: one clear ValueError each ---------------------------------------------------------

def _built():
    model = _model()
    opt = MaskedOptimizer("adam")
    opt.build(model.trainable_variables)
    return model, opt


def test_unknown_path_lists_close_matches():
    model, opt = _built()
    with pytest.raises(ValueError, match=r"no variable with path '[a-z_0-9]+/fc1/kernal'.*close matches.*fc1/kernel"):
        opt.set_mask(model.get_layer("fc1").kernel.path.replace("kernel", "kernal"), 1)


def test_wrong_mask_shape_names_variable_and_shapes():
    model, opt = _built()
    with pytest.raises(ValueError, match=r"fc1/kernel.*shape \(6, 4\).*\(4, 6\)"):
        opt.set_mask(model.get_layer("fc1").kernel, np.ones((6, 4)))


def test_variable_not_built_for_is_named():
    _, opt = _built()
    stranger = keras.Variable(np.zeros(3, "float32"), name="stranger")
    with pytest.raises(ValueError, match="'stranger' is not one this optimizer was built with"):
        opt.apply_gradients([(tf.ones(3), stranger)])
    with pytest.raises(ValueError, match="'stranger' is not one"):
        opt.set_mask(stranger, 0)


def test_unknown_policy_and_norms_list_what_is_allowed():
    with pytest.raises(ValueError, match="policy: got 'freeze'; allowed: 'hold', 'reset', 'none'"):
        MaskedOptimizer("adam", policy="freeze")
    with pytest.raises(ValueError, match="norms: got 'some'; allowed: 'trainable', 'all'"):
        MaskedOptimizer("adam", norms="some")


def test_mask_fn_returning_the_wrong_shape_is_named_at_build_of_the_step():
    w = keras.Variable(np.zeros((2, 3), "float32"), name="w")
    opt = MaskedOptimizer("adam", mask_fn=lambda step, v: tf.ones((3, 2), tf.bool))
    with pytest.raises(ValueError, match=r"mask_fn's result for 'w' has shape \(3, 2\).*\(2, 3\)"):
        opt.apply_gradients([(tf.ones((2, 3)), w)])
