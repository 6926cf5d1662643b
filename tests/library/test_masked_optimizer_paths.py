"""Property tests beyond the custom loop: the fit path, the save/restore path, and every Keras option.

Masks are random and change at every step; the claim checked is always the same: no frozen entry of a
variable, nor of any slot shaped like it (moments, EMA averages, gradient accumulators), changes a bit.
"""

import keras
import keras_features
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from optimizer_zoo import OPTIMIZERS, make_optimizer

from freezing import MaskedOptimizer, slots
from freezing.audit import changed_bits

EVERY = {**{name: (lambda lr, n=name: make_optimizer(n, lr)) for name in OPTIMIZERS},
         "adafactor": lambda lr: keras.optimizers.Adafactor(lr)}
PROPERTY = settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _tensors(opt, variables):
    """Every variable and every slot shaped like its variable, as (name, tensor, index of variable)."""
    out = []
    for i, v in enumerate(variables):
        out.append((v.path, v, i))
        out += [(f"{v.path}:{n}", s, i) for n, s in slots(opt, v).items() if tuple(s.shape) == tuple(v.shape)]
    return out


class RandomMasksEveryBatch(keras.callbacks.Callback):
    """Sets a fresh random mask on every variable before each batch and checks nothing frozen moved."""

    def __init__(self, opt, seed):
        super().__init__()
        self.opt, self.rng, self.violations, self.batches = opt, np.random.default_rng(seed), [], 0

    def on_train_batch_begin(self, batch, logs=None):
        variables = self.model.trainable_variables
        if not self.opt.built:  # fit builds the optimizer inside its first step; build it now to read slots
            self.opt.build(variables)
        self.keeps = [self.rng.random(tuple(v.shape)) < 0.5 for v in variables]
        for v, keep in zip(variables, self.keeps):
            self.opt.set_mask(v, keep)
        self.before = [(n, t.numpy().copy(), i) for n, t, i in _tensors(self.opt, variables)]

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        now = {n: t for n, t, _ in _tensors(self.opt, self.model.trainable_variables)}
        for name, old, i in self.before:
            moved = changed_bits(old, now[name].numpy()) & ~self.keeps[i]
            if moved.any():
                self.violations.append((batch, name, int(moved.sum())))


def _mlp(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(3, name="out")])


@pytest.mark.parametrize("name", sorted(EVERY))
def test_fit_then_save_load_then_fit_never_moves_frozen_entries(name, tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 5)).astype("float32"), rng.normal(size=(24, 3)).astype("float32")
    model = _mlp(0)
    opt = MaskedOptimizer(EVERY[name](0.05), policy="hold")
    model.compile(optimizer=opt, loss="mse")
    check = RandomMasksEveryBatch(opt, seed=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[check])
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    for a, b in zip(opt.variables, loaded.optimizer.variables):  # slots and masks restored bit for bit
        assert a.numpy().tobytes() == b.numpy().tobytes()
    again = RandomMasksEveryBatch(loaded.optimizer, seed=2)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[again])
    assert check.batches == again.batches == 3
    assert check.violations == [] and again.violations == []


# -- every Keras option, random masks changing every step -----------------------------------------

def _option(kind):
    """(inner optimizer, variable constraint or None) for one Keras option."""
    return {
        "adafactor": (keras.optimizers.Adafactor(0.1), None),
        "ema": (keras.optimizers.Adam(0.1, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2), None),
        "accumulation": (keras.optimizers.Adam(0.1, gradient_accumulation_steps=2), None),
        "constraint": (keras.optimizers.Adam(0.1), keras.constraints.MaxNorm(0.5, axis=0)),
        "clipnorm": (keras.optimizers.Adam(0.1, clipnorm=0.1), None),
        "global_clipnorm": (keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.1), None),
        "lamb": (keras.optimizers.Lamb(0.1), None),
        "adamw_loss_scale": (keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.1)), None),
    }[kind]


OPTIONS = ["adafactor", "ema", "accumulation", "constraint", "clipnorm", "global_clipnorm", "lamb", "adamw_loss_scale"]
case = st.fixed_dictionaries({
    "shape": array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    "steps": st.integers(2, 5),
    "seed": st.integers(0, 2**16),
    "norms": st.sampled_from(["trainable", "all"]),
    "policy": st.sampled_from(["hold", "reset"]),
})


@pytest.mark.parametrize("kind", OPTIONS)
@PROPERTY
@given(case=case)
def test_every_keras_option_keeps_frozen_values_exact(kind, case):
    rng = np.random.default_rng(case["seed"])
    shape = case["shape"]
    inner, constraint = _option(kind)
    if constraint is not None and not keras_features.VARIABLE_CONSTRAINTS:
        pytest.skip(f"Keras {keras.__version__}'s Variable takes no constraint")
    options = {} if constraint is None else {"constraint": constraint}
    w = keras.Variable(rng.normal(size=shape).astype("float32"), name="w", **options)
    opt = MaskedOptimizer(inner, policy=case["policy"], norms=case["norms"])
    opt.build([w])
    opt.apply_gradients([(tf.constant(rng.normal(size=shape), "float32"), w)])  # state to drift with
    leaf = inner.inner_optimizer if isinstance(inner, keras.optimizers.LossScaleOptimizer) else inner
    for _ in range(case["steps"]):
        keep = rng.random(shape) < 0.5
        held = [(n, t.numpy().copy()) for n, t, _ in _tensors(opt, [w])]
        if case["policy"] == "reset":
            held = held[:1]  # reset re-initialises the frozen moments by design; values stay exact
        held = [(n, old) for n, old in held if not n.endswith("average")]  # a frozen entry's EMA average is its weight
        opt.apply_gradients([(tf.constant(rng.normal(size=shape), "float32"), w)], trainable_masks=[keep])
        now = dict((n, t.numpy()) for n, t, _ in _tensors(opt, [w]))
        for name, old in held:
            assert not np.any(changed_bits(old, now[name]) & ~keep), (kind, name)
        if leaf.use_ema:
            average = slots(opt, w)["average"].numpy()
            assert not np.any(changed_bits(w.numpy(), average) & ~keep), kind


def test_lamb_trainable_entries_get_keras_bits_on_the_masked_gradient():
    """Lamb reads the whole variable (its trust ratio): its trainable entries get Keras' bits for the gradient
    with frozen entries zeroed, and its frozen entries keep theirs."""
    rng = np.random.default_rng(0)
    init = rng.normal(size=6).astype("float32")
    keep = np.array([1, 0, 1, 1, 0, 1], bool)
    full, ref = keras.Variable(init, name="w"), keras.Variable(init, name="w")
    g = rng.normal(size=6).astype("float32")
    MaskedOptimizer(keras.optimizers.Lamb(0.1)).apply_gradients([(tf.constant(g), full)], trainable_masks=[keep])
    keras.optimizers.Lamb(0.1).apply_gradients([(tf.constant(g * keep), ref)])
    assert full.numpy()[keep].tobytes() == ref.numpy()[keep].tobytes()
    assert full.numpy()[~keep].tobytes() == init[~keep].tobytes()
