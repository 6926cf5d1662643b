"""MaskedOptimizer(inner, state="sparse"): inner-optimizer state only for the entries a fixed selection trains.

The claims: the inner slots of a sparse variable have K entries (memory in proportion to the trainable
entries); an elementwise optimizer gives the trainable entries the bits the dense hold path gives them; frozen
entries never change; the selection is fixed; .keras save/load, checkpoints and diagnose work.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from optimizer_zoo import OPTIMIZERS, make_optimizer

from freezing import MaskedOptimizer, diagnose, slots

RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 8)).astype("float32")
Y = RNG.normal(size=(48, 3)).astype("float32")
KEEP = RNG.random((8, 16)) < 0.1  # a FISH-style selection: about 10% of fc1's kernel trains


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="fc1"), keras.layers.Dense(3, name="fc2")])


def _fit(state, inner=lambda: keras.optimizers.Adam(0.05), epochs=2, seed=0, extra=None):
    model = _model(seed)
    opt = MaskedOptimizer(inner(), state=state)
    fc1 = model.get_layer("fc1")
    opt.set_mask(fc1.kernel, KEEP)  # before build: with state="sparse" this fixes the selection
    opt.set_mask(fc1.bias, False)  # wholly frozen: no state at all
    if extra:
        extra(opt, model)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X, Y, epochs=epochs, batch_size=16, verbose=0, shuffle=False)
    return model, opt


def _bytes(tensors) -> int:
    return int(sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in tensors))


def test_sparse_state_keeps_slots_only_for_the_trainable_entries():
    k = int(KEEP.sum())
    dense_model, dense = _fit("dense")
    model, opt = _fit("sparse")
    kernel = model.get_layer("fc1").kernel
    m = slots(opt, kernel)
    assert {name: tuple(s.shape) for name, s in m.items()} == {"momentum": (k,), "velocity": (k,)}
    assert _bytes(m.values()) == 2 * 4 * k
    assert _bytes(slots(dense, dense_model.get_layer("fc1").kernel).values()) == 2 * 4 * KEEP.size
    with pytest.raises(ValueError, match="not one the optimizer"):  # the frozen bias keeps nothing
        slots(opt, model.get_layer("fc1").bias)
    np.testing.assert_array_equal(opt.get_mask(kernel), KEEP)
    assert opt.get_mask(model.get_layer("fc1").bias).tolist() == [False] * 16
    assert opt.mask_bytes() < KEEP.size  # the selection is stored as K int32 indices, not a full mask


# Grappler rewrites x / sqrt(y) as x * rsqrt(y), and Eigen's vectorised rsqrt rounds differently from its scalar
# tail loop; gathering the selection moves entries between the two, so these agree to a few ulp, not bit for bit
# (measured: at most 3 ulp after 5 steps). Lamb's trust ratio sums over the K entries in another order.
RSQRT = {"adagrad", "adadelta", "rmsprop", "rmsprop_centered"}
ELEMENTWISE = sorted(set(OPTIMIZERS) - {"lamb"})


@pytest.mark.parametrize("name", [n if n in ("sgd", "adam", "adagrad", "lion")
                                  else pytest.param(n, marks=pytest.mark.slow)
                                  for n in ELEMENTWISE])  # four in make test, every one in make test-slow
def test_trainable_entries_get_the_dense_hold_bits_and_frozen_entries_never_change(name):
    def inner():
        return make_optimizer(name, 0.05)

    dense_model, _ = _fit("dense", inner)
    model, _ = _fit("sparse", inner)
    initial = _model().get_layer("fc1").kernel.numpy()
    for layer in ("fc1", "fc2"):
        for a, b in zip(dense_model.get_layer(layer).weights, model.get_layer(layer).weights):
            if name in RSQRT:
                np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=2e-6, atol=0, err_msg=f"{name} {a.path}")
            else:
                assert a.numpy().tobytes() == b.numpy().tobytes(), (name, a.path)
    kernel = model.get_layer("fc1").kernel.numpy()
    assert kernel[~KEEP].tobytes() == initial[~KEEP].tobytes()
    assert np.any(kernel[KEEP] != initial[KEEP])  # the selection trained


def test_lamb_under_sparse_state_trains_the_selection_only():
    """Lamb's trust ratio reads the whole variable it updates: under sparse state that is the K selected entries
    (so it differs from dense Lamb, whose ratio is Keras' over the whole variable), and frozen entries never move."""
    initial = _model().get_layer("fc1").kernel.numpy()
    model, _ = _fit("sparse", lambda: keras.optimizers.Lamb(0.05))
    kernel = model.get_layer("fc1").kernel.numpy()
    assert kernel[~KEEP].tobytes() == initial[~KEEP].tobytes()
    assert (kernel[KEEP] != initial[KEEP]).all()


def test_the_selection_is_fixed():
    model, opt = _fit("sparse", epochs=1)
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)  # the same selection: accepted
    with pytest.raises(ValueError, match="sparse state for a fixed selection"):
        opt.set_mask(kernel, ~KEEP)
    with pytest.raises(ValueError, match="whose state is sparse"):
        opt.apply_gradients([(tf.ones(kernel.shape), kernel)], trainable_masks=[KEEP])
    opt.set_mask(model.get_layer("fc2").kernel, RNG.random((16, 3)) < 0.5)  # dense variables still take any mask


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_keras_file_round_trip_then_training_equals_training_without_interruption(tmp_path):
    from freezing.determinism import enable_determinism

    def run(interrupt):
        enable_determinism(3)
        model, opt = _fit("sparse", epochs=1)
        if interrupt:
            model.save(tmp_path / "m.keras")
            model = keras.saving.load_model(tmp_path / "m.keras")
            lopt = model.optimizer
            assert lopt.state == "sparse" and np.array_equal(lopt.get_mask(model.get_layer("fc1").kernel), KEEP)
            assert tuple(slots(lopt, model.get_layer("fc1").kernel)["momentum"].shape) == (int(KEEP.sum()),)
        model.fit(X, Y, epochs=1, batch_size=16, verbose=0, shuffle=False)
        return b"".join(w.numpy().tobytes() for w in model.weights)

    assert run(False) == run(True)


def test_checkpoint_round_trip_restores_selection_and_slots(tmp_path):
    model, opt = _fit("sparse", epochs=1)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(tmp_path / "ck")
    other = _model(seed=5)
    oopt = MaskedOptimizer(keras.optimizers.Adam(0.05), state="sparse")
    oopt.set_mask(other.get_layer("fc1").kernel, KEEP)
    oopt.set_mask(other.get_layer("fc1").bias, False)
    oopt.build(other.trainable_variables)
    tf.train.Checkpoint(model=other, optimizer=oopt).restore(path).assert_existing_objects_matched()
    for a, b in zip(opt.variables, oopt.variables):
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_diagnose_sees_the_sparse_selection_as_held():
    model, opt = _fit("sparse", epochs=1)
    kernel, bias = model.get_layer("fc1").kernel, model.get_layer("fc1").bias
    assert len(diagnose(model, masks={kernel.path: KEEP, bias.path: False})) == 0
    rows = {(r.variable, r.cause): r.entries for r in diagnose(model, [kernel])}
    assert rows == {(kernel.path, "not_masked"): int(KEEP.sum()), (kernel.path, "moments"): int(KEEP.sum())}


def test_constraints_mask_fn_and_strategies_are_refused_with_sparse_state():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg())])
    opt = MaskedOptimizer("adam", state="sparse")
    opt.set_mask(model.layers[0].kernel, [[1, 0], [0, 0], [0, 0]])
    with pytest.raises(ValueError, match="cannot apply the constraint"):
        opt.build(model.trainable_variables)
    with pytest.raises(ValueError, match="state='sparse' keeps no state for frozen entries"):
        MaskedOptimizer("adam", state="sparse", policy="none")
    with pytest.raises(ValueError, match="mask_fn"):
        MaskedOptimizer("adam", state="sparse", mask_fn=lambda step, v: None)


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_sparse_state_runs_under_xla_with_frozen_bits_exact():
    def fit(state):
        model = _model()
        opt = MaskedOptimizer(keras.optimizers.Adam(0.05), state=state)
        opt.set_mask(model.get_layer("fc1").kernel, KEEP)
        model.compile(optimizer=opt, loss="mse", jit_compile=True)
        model.fit(X, Y, epochs=2, batch_size=16, verbose=0, shuffle=False)
        return model.get_layer("fc1").kernel.numpy()

    initial = _model().get_layer("fc1").kernel.numpy()
    sparse, dense = fit("sparse"), fit("dense")
    assert sparse[~KEEP].tobytes() == initial[~KEEP].tobytes()
    np.testing.assert_allclose(sparse, dense, rtol=1e-5, atol=1e-6)  # XLA fuses each graph its own way
