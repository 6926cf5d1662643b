"""The Keras surface through the wrapper: options, callbacks, EMA, float8 scales, newer optimizers, nestings.

Each test here failed on the wrapper of freezing 0.2 (a user's report or Keras' own optimizer tests run
through the wrapper found it).
"""

from __future__ import annotations

import keras
import keras_features
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, slots


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="fc"), keras.layers.Dense(1, name="out")])
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


def test_ema_in_fit_leaves_frozen_weights_with_their_bits():
    """``fit`` ends by overwriting weights with their EMA averages; frozen ones used to become 0.0."""
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.05, use_ema=True))
    model.compile(optimizer=opt, loss="mse")
    kernel = model.get_layer("fc").kernel
    keep = np.array([[True, False, True]] * 4)
    opt.set_mask(kernel, keep)
    before = kernel.numpy().copy()
    model.fit(*_data(), epochs=2, verbose=0)
    after = kernel.numpy()
    assert (after[~keep].view(np.uint32) == before[~keep].view(np.uint32)).all()
    assert (after[keep] != before[keep]).all()


def test_swap_ema_weights_sees_through_the_wrapper_and_keeps_frozen_bits():
    model = _model()
    opt = MaskedOptimizer(keras.optimizers.SGD(0.05, use_ema=True))
    model.compile(optimizer=opt, loss="mse")
    kernel = model.get_layer("fc").kernel
    opt.set_mask(kernel, [[True, False, True]])
    before = kernel.numpy().copy()
    x, y = _data()
    model.fit(x, y, epochs=2, verbose=0, validation_data=(x, y), callbacks=[keras.callbacks.SwapEMAWeights()])
    assert (kernel.numpy()[:, 1] == before[:, 1]).all()


@pytest.mark.skipif(not keras_features.OVERWRITE_WITH_GRADIENT,
                    reason=f"Keras {keras.__version__} has no overwrite_with_gradient")
def test_overwrite_with_gradient_honours_the_mask():
    w = keras.Variable([1.0, 2.0, 3.0], name="scale")
    w.overwrite_with_gradient = True
    opt = MaskedOptimizer(keras.optimizers.SGD(0.1))
    opt.build([w])
    opt.set_mask(w, [True, False, True])
    opt.apply_gradients([(tf.constant([7.0, 8.0, 9.0]), w)])
    assert w.numpy().tolist() == [7.0, 2.0, 9.0]


@pytest.mark.parametrize("name", [pytest.param("Muon", marks=keras_features.needs("Muon")),
                                  pytest.param("ScheduleFreeAdamW", marks=keras_features.needs("ScheduleFreeAdamW"))])
def test_newer_optimizers_train_and_hold_frozen_entries(name):
    model = _model()
    opt = MaskedOptimizer(getattr(keras.optimizers, name)(0.05))
    model.compile(optimizer=opt, loss="mse")
    kernel, bias = model.get_layer("fc").kernel, model.get_layer("out").kernel
    opt.set_mask(kernel, [[True, False, True]])
    k0, b0 = kernel.numpy().copy(), bias.numpy().copy()
    model.fit(*_data(), epochs=2, verbose=0)
    assert (kernel.numpy()[:, 1] == k0[:, 1]).all()
    assert (kernel.numpy()[:, 0] != k0[:, 0]).all() and (bias.numpy() != b0).any()


def test_exclude_from_weight_decay_on_the_wrapper_reaches_the_inner_optimizer():
    kept, decayed = keras.Variable([2.0], name="exclude_me"), keras.Variable([2.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.AdamW(1.0, weight_decay=0.1))
    opt.exclude_from_weight_decay(var_names=["exclude"])
    opt.apply_gradients([(tf.zeros(1), kept), (tf.zeros(1), decayed)])
    assert kept.numpy().tolist() == [2.0] and decayed.numpy()[0] < 2.0


def test_set_weights_writes_the_inner_state_and_masks():
    w = keras.Variable([1.0, 2.0], name="w")
    src = MaskedOptimizer(keras.optimizers.Adam(0.1))
    src.build([w])
    src.set_mask(w, [True, False])
    src.apply_gradients([(tf.ones(2), w)])
    dst = MaskedOptimizer(keras.optimizers.Adam(0.1))
    dst.build([w])
    dst.set_weights(src.get_weights())
    assert int(dst.iterations.numpy()) == 1
    assert dst.get_mask(w).tolist() == [True, False]
    assert all((a == b).all() for a, b in zip(src.get_weights(), dst.get_weights()))
    with pytest.raises(ValueError, match=r"got 3 values for 5 variables"):
        dst.set_weights(src.get_weights()[:3])


def test_a_loss_scale_factor_reset_by_an_outer_loss_scale_optimizer_reaches_the_inner_one():
    inner, alone = keras.optimizers.SGD(0.5, loss_scale_factor=4.0), keras.optimizers.SGD(0.5, loss_scale_factor=4.0)
    keras.optimizers.LossScaleOptimizer(MaskedOptimizer(inner))
    keras.optimizers.LossScaleOptimizer(alone)
    assert inner.loss_scale_factor == alone.loss_scale_factor  # Keras 3.15 resets it to None; 3.5 leaves it
    w_plain, w_masked = keras.Variable([1.0, 2.0], name="w"), keras.Variable([1.0, 2.0], name="w")
    plain = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5, loss_scale_factor=4.0), initial_scale=8.0)
    masked = keras.optimizers.LossScaleOptimizer(MaskedOptimizer(keras.optimizers.SGD(0.5, loss_scale_factor=4.0)),
                                                 initial_scale=8.0)
    plain.apply_gradients([(tf.constant([8.0, 16.0]), w_plain)])
    masked.apply_gradients([(tf.constant([8.0, 16.0]), w_masked)])
    assert w_plain.numpy().tolist() == w_masked.numpy().tolist()


def test_indexed_slices_with_tuple_indices_are_accepted():
    table = keras.Variable(np.ones((4, 2), np.float32), name="table")
    opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
    opt.build([table])
    opt.set_mask(table, [[True], [False], [True], [True]])
    grad = tf.IndexedSlices(tf.ones((2, 2)), (0, 1), dense_shape=(4, 2))
    opt.apply_gradients([(grad, table)])
    assert table.numpy().tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]


def test_reset_with_a_sparse_gradient_leaves_trainable_rows_outside_the_batch_alone():
    """Adagrad keeps an Embedding's update sparse; a per-call mask with policy="reset" resets only frozen rows."""
    start = np.ones((4, 2), np.float32)
    table, plain_table = keras.Variable(start, name="table"), keras.Variable(start, name="table")
    opt = MaskedOptimizer(keras.optimizers.Adagrad(0.1), policy="reset")
    plain = keras.optimizers.Adagrad(0.1)
    for o, t in ((opt, table), (plain, plain_table)):
        o.apply_gradients([(tf.ones((4, 2)), t)])  # every row has an accumulator now
    keep = np.array([[True], [False], [True], [True]])
    grad = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), dense_shape=(4, 2))
    opt.apply_gradients([(grad, table)], trainable_masks=[keep])
    plain.apply_gradients([(grad, plain_table)])
    accumulator = slots(opt, table)["accumulator"].numpy()
    assert (accumulator[1] == 0.1).all()  # the frozen row's accumulator reset to initial_accumulator_value
    assert accumulator[[0, 2, 3]].tobytes() == slots(plain, plain_table)["accumulator"].numpy()[[0, 2, 3]].tobytes()
    assert table.numpy()[[0, 2, 3]].tobytes() == plain_table.numpy()[[0, 2, 3]].tobytes()


class LastGradient(keras.optimizers.SGD):
    """SGD that also keeps each variable's last gradient, written with ``assign`` (a scatter when it is sparse)."""

    def build(self, variables):
        super().build(variables)
        self.last = [self.add_variable_from_reference(v, "last_gradient") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        self.assign(self.last[self._get_variable_index(variable)], gradient)
        super().update_step(gradient, variable, learning_rate)


def test_reset_with_a_sparse_assign_writes_no_zeros_into_trainable_rows_outside_the_batch():
    """freezing 0.2 densified an IndexedSlices ``assign`` under policy="reset" and zeroed untouched trainable rows."""
    table = keras.Variable(np.ones((4, 2), np.float32), name="table")
    opt = MaskedOptimizer(LastGradient(0.1), policy="reset")
    opt.apply_gradients([(tf.fill((4, 2), 3.0), table)])
    keep = np.array([[True], [False], [True], [True]])
    grad = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), dense_shape=(4, 2))
    opt.apply_gradients([(grad, table)], trainable_masks=[keep])
    last = slots(opt, table)["last_gradient"].numpy()
    assert last.tolist() == [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0], [3.0, 3.0]]  # row 1 reset; rows 2, 3 untouched


def test_a_learning_rate_on_the_wrapper_is_refused_with_where_it_belongs():
    with pytest.raises(ValueError, match=r"learning_rate=0.1 belongs on the inner optimizer"):
        MaskedOptimizer("adam", learning_rate=0.1)


def test_options_read_and_write_through():
    opt = MaskedOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.01, clipnorm=1.0, use_ema=True))
    assert (opt.weight_decay, opt.clipnorm, opt.use_ema) == (0.01, 1.0, True)
    opt.clipnorm = 2.0
    assert opt.inner.clipnorm == 2.0
    assert opt._clip_gradients([np.array([30.0, 40.0])])[0].numpy().tolist() == pytest.approx([1.2, 1.6])
    assert keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=4.0).initial_scale == 4.0
    assert MaskedOptimizer(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=4.0)).initial_scale == 4.0


@pytest.mark.parametrize("nesting", ["plain", "inside_loss_scale", "loss_scale_inside"])
def test_learning_rate_callbacks_see_through_every_nesting(nesting, tmp_path):
    model = _model()
    inner = keras.optimizers.Adam(0.1)
    opt = {"plain": lambda: MaskedOptimizer(inner),
           "inside_loss_scale": lambda: keras.optimizers.LossScaleOptimizer(MaskedOptimizer(inner)),
           "loss_scale_inside": lambda: MaskedOptimizer(keras.optimizers.LossScaleOptimizer(inner))}[nesting]()
    model.compile(optimizer=opt, loss="mse")
    x, y = _data()
    callbacks = [keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1)),
                 keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, factor=0.5, min_delta=10.0),
                 keras.callbacks.TensorBoard(log_dir=str(tmp_path))]
    history = model.fit(x, y, epochs=3, verbose=0, callbacks=callbacks)
    assert history.history["learning_rate"][0] == pytest.approx(0.1)
    assert float(inner.learning_rate.numpy()) < 0.1 / 3  # the scheduler and the plateau both reached Adam
