"""The harness that runs Keras' optimizer tests through MaskedOptimizer catches what it claims to catch."""

from __future__ import annotations

import contextlib
from unittest import mock

import keras
import keras_suite_harness as harness
import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.skipif(not harness.import_keras_tests()[0],
                                reason=f"Keras {keras.__version__}'s wheel ships no optimizer tests: the harness has "
                                       "nothing to run")
from freezing import MaskedOptimizer

REAL_APPLY = harness._ORIGINAL["apply"]


@contextlib.contextmanager
def running(pass_name: str):
    stack = harness.start(pass_name)
    try:
        with stack:
            yield harness.RUN
    finally:
        harness.finish("test_harness")


def test_a_wrapped_class_builds_a_masked_optimizer_and_isinstance_looks_through_it():
    wrapped_adam = harness.wrapped(keras.optimizers.Adam)
    opt = wrapped_adam(learning_rate=0.5)
    assert type(opt) is MaskedOptimizer and type(opt.inner) is keras.optimizers.Adam
    assert float(opt.learning_rate.numpy()) == 0.5
    assert isinstance(opt, wrapped_adam) and isinstance(keras.optimizers.Adam(), wrapped_adam)
    assert not isinstance(MaskedOptimizer(keras.optimizers.SGD()), wrapped_adam)
    assert wrapped_adam.from_config == keras.optimizers.Adam.from_config
    assert harness.wrapped(keras.optimizers.Adam) is wrapped_adam


def test_the_half_mask_freezes_every_other_entry_and_alternates_single_entry_variables():
    assert harness.pass_mask("half", 0, (2, 3)).tolist() == [[True, False, True], [False, True, False]]
    assert harness.pass_mask("half", 1, (4,)).tolist() == [False, True, False, True]
    assert [bool(harness.pass_mask("half", k, ())) for k in range(3)] == [True, False, True]
    assert harness.pass_mask("alltrue", 1, (2, 2)).all()


def test_the_masks_are_set_at_build_and_the_trainable_entries_train():
    with running("half") as run:
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
        opt.apply_gradients([(tf.ones(4), v)])
        assert opt.get_mask(v).tolist() == [True, False, True, False]
        assert v.numpy().tolist() == [0.0, 2.0, 2.0, 4.0]
        assert run.stats["bit_checks_eager"] == 1


def _apply_then_move_a_frozen_entry(self, *args, **kwargs):
    result = REAL_APPLY(self, *args, **kwargs)
    for v in self._trainable_variables:
        v.assign_add(tf.ones_like(v))  # a buggy wrapper: every entry moves, frozen ones included
    return result


def test_a_frozen_entry_that_moves_fails_the_test_eagerly():
    with running("half"), mock.patch.dict(harness._ORIGINAL, apply=_apply_then_move_a_frozen_entry):
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
        with pytest.raises(AssertionError, match=r"apply changed 2 frozen entries .* \(flat index \[1, 3\]"):
            opt.apply_gradients([(tf.ones(4), v)])


def test_a_frozen_entry_that_moves_fails_the_test_in_a_traced_step():
    with running("half"), mock.patch.dict(harness._ORIGINAL, apply=_apply_then_move_a_frozen_entry):
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
        opt.build([v])
        step = tf.function(lambda: opt.apply_gradients([(tf.ones(4), v)]))
        with pytest.raises(tf.errors.InvalidArgumentError, match="changed frozen entries"):
            step()
        assert harness.RUN.stats["bit_checks_traced"] == 1


def test_a_frozen_slot_entry_that_moves_fails_the_test():
    def move_the_momentum(self, *args, **kwargs):
        result = REAL_APPLY(self, *args, **kwargs)
        self.inner._momentums[0].assign_add(tf.ones(4))
        return result

    with running("half"), mock.patch.dict(harness._ORIGINAL, apply=move_the_momentum):
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        opt = MaskedOptimizer(keras.optimizers.Adam(1.0))
        with pytest.raises(AssertionError, match=r"Adam._momentums\[.*\(variable 0\)\]"):
            opt.apply_gradients([(tf.ones(4), v)])


def test_assertions_on_a_masked_variable_compare_its_trainable_entries_only():
    with running("half") as run:
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        MaskedOptimizer(keras.optimizers.SGD(1.0)).apply_gradients([(tf.ones(4), v)])  # -> [0, 2, 2, 4]
        golden = [0.0, 99.0, 2.0, 99.0]  # wrong only where frozen
        harness.reduced("assertAllClose", np.testing.assert_allclose, v, golden)
        harness.reduced("assertAllClose", np.testing.assert_allclose, v.numpy(), golden)  # found by its bits
        with pytest.raises(AssertionError):
            harness.reduced("assertAllClose", np.testing.assert_allclose, v, [0.5, 2.0, 2.0, 4.0])
        with pytest.raises(AssertionError):  # not a masked variable: every entry compared
            harness.reduced("assertAllClose", np.testing.assert_allclose, np.float32([0, 2, 2, 5]), golden)
        assert run.stats["on_masked_trainable_only"] == 3 and run.stats["entries_compared"] == 6


def test_where_the_update_is_not_elementwise_the_trainable_entries_must_be_finite():
    with running("half") as run:
        v = keras.Variable([1.0, 2.0, 3.0, 4.0])
        opt = MaskedOptimizer(keras.optimizers.Lamb(0.5))
        opt.apply_gradients([(tf.ones(4), v)])
        harness.reduced("assertAllClose", np.testing.assert_allclose, v, [-7.0, 2.0, -7.0, 4.0])
        assert run.stats["finiteness_only"] == 1
        v.assign([np.nan, 2.0, 3.0, 4.0])
        with pytest.raises(AssertionError, match="not finite"):
            harness.reduced("assertAllClose", np.testing.assert_allclose, v, [1.0, 2.0, 3.0, 4.0])
