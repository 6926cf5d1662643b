"""find_stalls / StallWatch: weights meant to train that did not move, one test per cause, and clean runs clean.

Each cause is reproduced in a few steps and must be named. At 53e6206 nothing reported any of them (diagnose
looked only at entries believed frozen).
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

from freezing import MaskedOptimizer, StallWatch, _keras_api, find_stalls, trainable_changes
from freezing.stalls import snapshot

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(32, 3)).astype("float32"), RNG.normal(size=(32, 1)).astype("float32")


def make(**dense) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="fc", **dense),
                             keras.layers.Dense(1, name="out")], name="net")


def found(diagnosis) -> dict[tuple[str, str], int]:
    """Rows by (path without the model's name, cause)."""
    return {(row.variable.split("/", 1)[-1], row.cause): row.entries for row in diagnosis}


RECORDS = pytest.mark.skipif(not _keras_api.records_compiled_trainable_state(),
                             reason=f"Keras {keras.__version__} records no trainable flag at compile")


def watched(model, epochs=1, window=2):
    watch = StallWatch(window=window, warn=False)
    model.fit(X, Y, batch_size=8, epochs=epochs, verbose=0, callbacks=[watch])
    out = {}
    for report in watch.reports:
        out.update(found(report))
    return out


@RECORDS
def test_a_layer_made_trainable_after_compile_is_named_not_trained_and_its_change_reported():
    model = make()
    model.get_layer("fc").trainable = False
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(X, Y, batch_size=8, verbose=0)  # traced: the same batch shape reuses this step below
    model.get_layer("fc").trainable = True  # Keras' warning for this never fires (it follows a raise)
    assert found(trainable_changes(model)) == {("fc/kernel", "trainable_changed_after_compile"): 12,
                                               ("fc/bias", "trainable_changed_after_compile"): 4}
    watch = StallWatch(window=2)
    with pytest.warns(UserWarning, match=r"(?s)weights meant to train that do not.*fc/kernel.*not_trained"):
        model.fit(X, Y, batch_size=8, verbose=0, callbacks=[watch])
    rows = {}
    for report in watch.reports:
        rows.update(found(report))
    assert rows[("fc/kernel", "not_trained")] == 12 and rows[("fc/bias", "not_trained")] == 4
    assert rows[("fc/kernel", "trainable_changed_after_compile")] == 12
    assert not any(name.startswith("out/") for name, _ in rows)


@RECORDS
def test_a_layer_frozen_after_compile_that_still_trains_is_reported_as_a_change_without_effect():
    model = make()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(X, Y, verbose=0)
    model.get_layer("fc").trainable = False
    assert set(found(trainable_changes(model))) == {("fc/kernel", "trainable_changed_after_compile"),
                                                    ("fc/bias", "trainable_changed_after_compile")}
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")  # the fix: the change takes effect
    assert len(trainable_changes(model)) == 0


@pytest.mark.parametrize("rate", [0.0, 1e-12])
def test_a_zero_or_tiny_learning_rate_is_named(rate):
    model = make(kernel_initializer="ones")
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="mse")
    rows = watched(model)
    assert rows[("fc/kernel", "learning_rate")] == 12
    if rate == 0.0:
        assert rows[("out/bias", "learning_rate")] == 1
    else:  # a zero bias moves by 1e-12: float32 has room for it
        assert ("fc/bias", "learning_rate") not in rows


def test_an_update_below_a_bfloat16_weights_resolution_is_named():
    model = make(kernel_initializer="ones", dtype="bfloat16")
    # beta_2=0.99: with the default 0.999, which bfloat16 rounds to 1, Keras' bias correction is 0 and nothing moves
    model.compile(optimizer=keras.optimizers.Adam(1e-3, beta_2=0.99), loss="mse")
    rows = watched(model)
    assert rows[("fc/kernel", "below_resolution")] == 12  # spacing at 1.0 is 2**-7; Adam's step is about 1e-3
    assert ("fc/bias", "below_resolution") not in rows  # zeros: fine spacing, they move
    assert not any(cause == "learning_rate" for _, cause in rows)


def test_a_mask_that_freezes_entries_is_named():
    model = make()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.01))
    model.compile(optimizer=opt, loss="mse")
    opt.set_mask(model.get_layer("fc").kernel, [[True, True, False, False]])
    rows = watched(model)
    assert rows == {("fc/kernel", "mask"): 6}


def test_a_variable_the_loss_does_not_reach_is_named_no_gradient():
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,))
    side = keras.layers.Dense(1, name="side")(inp)
    out = keras.layers.Add()([keras.layers.Dense(1, name="out")(inp), keras.ops.multiply(side, 0.0)])
    model = keras.Model(inp, out, name="net")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    before = snapshot(model)
    model.fit(X, Y, batch_size=8, verbose=0)
    rows = {(row.variable, row.cause): row.entries for row in find_stalls(model, before)}
    assert rows == {("side/kernel", "no_gradient"): 3, ("side/bias", "no_gradient"): 1}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_clean_run_of_the_study_cnn_reports_nothing(optimizer):
    from study.models import deep_mnist_cnn

    keras.utils.set_random_seed(0)
    model = deep_mnist_cnn()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    x = RNG.uniform(size=(32, 28, 28, 1)).astype("float32")
    y = RNG.integers(0, 10, size=32)
    watch = StallWatch(window=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[watch])
    assert watch.reports == []


def test_a_clean_masked_run_with_nothing_frozen_reports_nothing():
    model = make()
    model.compile(optimizer=MaskedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    assert watched(model, epochs=2) == {}
