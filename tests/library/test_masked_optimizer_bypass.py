"""The step checks all of itself: a write that bypasses the guarded write methods, on any route a Keras step writes
by (update_step, weight decay, EMA, gradient accumulation, a constraint), in a nested graph or not, with any op
name, makes a traced step raise; an eager step keeps the frozen bits anyway (snapshot-and-select).
"""

from __future__ import annotations

import keras
import keras_features
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, _keras_api, slots
from freezing.audit import changed_bits

SHAPE = (6, 5)
KEEP = np.random.default_rng(0).random(SHAPE) < 0.5


def _raw_add(variable, delta) -> None:
    """A write no ``tf.Variable`` method sees: the resource op itself."""
    handle = _keras_api.tf_variable(variable).handle
    tf.raw_ops.AssignAddVariableOp(resource=handle, value=tf.cast(delta, variable.dtype))


class RouteSGD(keras.optimizers.SGD):
    route = ""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient, variable, learning_rate)
        if self.route == "update_step":
            _raw_add(variable, gradient)
        elif self.route == "update_step_slot":
            _raw_add(self.momentums[self._get_variable_index(variable)], gradient)
        elif self.route == "nested_cond":
            tf.cond(tf.constant(True), lambda: _raw_add(variable, gradient) or tf.constant(0), lambda: tf.constant(0))
        elif self.route == "nested_function":
            tf.function(lambda: _raw_add(variable, gradient))()
        elif self.route == "scatter":
            handle = _keras_api.tf_variable(variable).handle
            tf.raw_ops.ResourceScatterAdd(resource=handle, indices=[0], updates=tf.ones((1,) + SHAPE[1:]))
        elif self.route == "named_like_the_guard":
            with tf.name_scope("freezing_guard"):
                _raw_add(variable, gradient)

    def _apply_weight_decay(self, variables):
        super()._apply_weight_decay(variables)
        if self.route == "weight_decay":
            for v in variables:
                _raw_add(v, tf.ones(v.shape))

    def _update_model_variables_moving_average(self, trainable_variables):
        super()._update_model_variables_moving_average(trainable_variables)
        if self.route == "ema":
            for average in self._model_variables_moving_average:
                _raw_add(average, tf.ones(average.shape))

    def _backend_increment_gradient_accumulators(self, grads, acc_grads):
        super()._backend_increment_gradient_accumulators(grads, acc_grads)
        if self.route == "accumulation":
            for acc in acc_grads:
                _raw_add(acc, tf.ones(acc.shape))


class _RawConstraint(keras.constraints.Constraint):
    def __call__(self, w):
        _raw_add(w, tf.ones(SHAPE))
        return w


ROUTES = ["update_step", "update_step_slot", "nested_cond", "nested_function", "scatter", "named_like_the_guard",
          "weight_decay", "ema", "accumulation", "constraint"]


def _setup(route: str):
    options = {"weight_decay": 0.1} if route == "weight_decay" else {}
    options.update({"use_ema": True, "ema_momentum": 0.5} if route == "ema" else {})
    options.update({"gradient_accumulation_steps": 2} if route == "accumulation" else {})
    inner = RouteSGD(0.1, momentum=0.9, **options)
    inner.route = route
    w = keras.Variable(np.random.default_rng(1).normal(size=SHAPE).astype("float32"), name="w")
    if route == "constraint":
        if not keras_features.VARIABLE_CONSTRAINTS:
            pytest.skip(f"Keras {keras.__version__}'s Variable takes no constraint")
        w.constraint = _RawConstraint()  # keras.Variable(constraint=...) is silently ignored by Keras 3.15
        assert w.constraint is not None
    opt = MaskedOptimizer(inner)
    opt.build([w])
    opt.set_mask(w, KEEP)
    return w, opt


def _state(opt, w) -> dict[str, np.ndarray]:
    return {"w": w.numpy().copy(), **{n: s.numpy().copy() for n, s in slots(opt, w).items() if s.shape == w.shape}}


@pytest.mark.parametrize("route", ROUTES)
def test_a_traced_step_with_a_write_that_bypasses_the_guard_raises(route):
    w, opt = _setup(route)
    with pytest.raises(RuntimeError, match=r"wrote '.*' with \w+ \(op '.*'\) outside the masked write; frozen entries "
                                           "would move"):
        tf.function(lambda: opt.apply_gradients([(tf.ones(SHAPE), w)]))()


@pytest.mark.parametrize("route", ROUTES)
def test_an_eager_step_with_a_write_that_bypasses_the_guard_keeps_every_frozen_bit(route):
    w, opt = _setup(route)
    for _ in range(2):
        before = _state(opt, w)
        opt.apply_gradients([(tf.ones(SHAPE), w)])
        after = _state(opt, w)
        assert set(before) == set(after) and len(before) >= 2
        for name in before:
            if name == "average":  # a frozen entry's EMA average is its weight
                assert not (changed_bits(after["w"], after[name]) & ~KEEP).any()
            else:
                assert not (changed_bits(before[name], after[name]) & ~KEEP).any(), name


# -- the compat check: what each private name is, and that the library touches none elsewhere ---------------
@pytest.mark.parametrize("name, wrong, message", [
    ("_use_weight_decay", True, r"has '_use_weight_decay' as bool, not a method"),
    ("_trainable_variables", {}, r"has '_trainable_variables' as dict, not a list"),
    ("_trainable_variables_indices", [], r"has '_trainable_variables_indices' as list, not a dict"),
    ("_iterations", 3, r"has '_iterations' as int, not a variable"),
    ("_var_key", None, r"has '_var_key' as NoneType, not a method"),
])
def test_the_compat_check_verifies_what_each_private_name_is(name, wrong, message):
    opt = keras.optimizers.Adam()
    opt.build([keras.Variable([1.0])])
    object.__setattr__(opt, name, wrong)
    with pytest.raises(RuntimeError, match=rf"Keras {keras.__version__}, TensorFlow .*: Adam {message}"):
        _keras_api.check(opt)


def test_the_compat_check_verifies_the_per_variable_lists_of_the_options_that_are_on():
    opt = keras.optimizers.Adam(use_ema=True)
    opt.build([keras.Variable([1.0]), keras.Variable([2.0])])
    _keras_api.check(opt)
    object.__setattr__(opt, "_model_variables_moving_average", opt._model_variables_moving_average[:1])
    with pytest.raises(RuntimeError, match=r"with use_ema has no '_model_variables_moving_average' as a list of 2"):
        _keras_api.check(opt)


@pytest.mark.parametrize("inner", ["adamw", "ema"])
def test_the_eager_step_gives_the_traced_steps_bits(inner):
    """An eager step (guarded writes plus snapshot-and-select) gives the bits of the traced guarded step, bit for bit
    (a graph's: XLA rounds differently from TensorFlow's kernels whatever the wrapper does, and so does Grappler's
    ``x / sqrt(y)`` -> ``x * rsqrt(y)`` in Adafactor's update, unwrapped too)."""
    make = {"adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1),
            "ema": lambda: keras.optimizers.Adam(0.1, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2)}[inner]
    rng = np.random.default_rng(3)
    init = rng.normal(size=SHAPE).astype("float32")
    grads = [tf.constant(rng.normal(size=SHAPE).astype("float32")) for _ in range(4)]
    masks = [rng.random(SHAPE) < 0.5 for _ in range(4)]
    results = []
    for how in ("eager", "graph"):
        w = keras.Variable(init, name="w")
        opt = MaskedOptimizer(make())
        opt.build([w])
        step = lambda g, m: opt.apply_gradients([(g, w)], trainable_masks=[m])  # noqa: E731
        if how != "eager":
            step = tf.function(step)
        for g, m in zip(grads, masks):
            step(g, tf.constant(m))
        results.append([w.numpy().tobytes()] + [s.numpy().tobytes() for s in slots(opt, w).values()])
    assert results[0] == results[1]
