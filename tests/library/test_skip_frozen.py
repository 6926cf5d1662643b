"""``freezing.SkipFrozen`` and ``variables_to_differentiate``: a variable frozen whole is not differentiated, nothing
else changes.

The reference is the same run with masks only: skipping must give every bit of every weight and of the optimizer's
state that run gives, differentiate only what trains, cost one trace per change of the wholly frozen set, and put
back every ``trainable`` flag it turned off, whatever happens (a ``fit`` that raises, a save mid-stage).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import freezing
from freezing import MaskedOptimizer, MaskSchedule, SkipFrozen, variables_to_differentiate

sys.path.insert(0, str(Path(__file__).parent))
import skip_frozen_scenario as scenario  # noqa: E402

EVERYTHING = ["fc1/kernel", "fc1/bias", "fc2/kernel", "fc2/bias", "out/kernel", "out/bias"]
STAGES_TRACED = [EVERYTHING, ["out/kernel", "out/bias"], EVERYTHING[2:], EVERYTHING]  # 1 trace + 1 per change


def _same_bits(a: dict, b: dict) -> list[str]:
    """The entries whose bits differ (the dicts are in the same order; model names differ between builds)."""
    assert len(a) == len(b)
    return [k for (k, x), y in zip(a.items(), b.values()) if np.asarray(x).tobytes() != np.asarray(y).tobytes()]


@pytest.fixture(scope="module")
def masks_only() -> dict:
    return scenario.run(skip=False)


@pytest.mark.parametrize("skip_first", [True, False], ids=["SkipFrozen-before-MaskSchedule", "after"])
def test_skipping_gives_the_bits_of_masks_only_and_differentiates_only_what_trains(masks_only, skip_first):
    skipped = scenario.run(skip=True, skip_first=skip_first)
    assert _same_bits(masks_only["weights"], skipped["weights"]) == []
    assert _same_bits(masks_only["state"], skipped["state"]) == []  # moments, masks, iterations
    assert skipped["traced"] == STAGES_TRACED  # each of the 3 changes costs exactly one trace
    assert int(skipped["opt"].iterations) == 6 * 4  # every step counted, frozen or not
    assert all(skipped["flags"].values())  # every flag back on at the end


def test_frozen_bits_kept_while_skipped_and_unfrozen_layers_train_again():
    model, opt = scenario.build()  # fc1's kernel starts with subnormals and -0.0
    fc1 = model.get_layer("fc1")
    for v in fc1.weights:
        opt.set_mask(v, False)
    before = [v.numpy().copy() for v in fc1.weights]
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=2, verbose=0, callbacks=[SkipFrozen()])
    assert [v.numpy().tobytes() for v in fc1.weights] == [b.tobytes() for b in before]
    head = fc1.kernel.numpy().ravel()[:4]
    assert head[0] == np.float32(1e-40) and np.signbit(head[1]) and head[1] == 0 and head[3] != 0  # not flushed
    for v in fc1.weights:
        opt.clear_mask(v)
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[SkipFrozen()])
    assert all((v.numpy() != b).all() for v, b in zip(fc1.weights, before))


@pytest.mark.parametrize("setting", [pytest.param("xla", marks=pytest.mark.slow), "mixed_float16"])
def test_xla_and_mixed_precision_give_the_bits_of_masks_only(setting):
    kw = {"jit": True} if setting == "xla" else {"mixed": True}
    reference, skipped = scenario.run(skip=False, **kw), scenario.run(skip=True, **kw)
    if setting == "mixed_float16":
        assert isinstance(skipped["model"].optimizer, keras.optimizers.LossScaleOptimizer)
    assert _same_bits(reference["weights"], skipped["weights"]) == []
    assert _same_bits(reference["state"], skipped["state"]) == []
    assert skipped["traced"] == STAGES_TRACED


def test_a_mask_set_mid_epoch_from_a_callback_costs_one_trace_from_the_next_step():
    model, opt = scenario.build()
    counter = scenario.TraceCounter()
    fc2 = model.get_layer("fc2")
    seen = {}

    class FreezeAtBatch2(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                seen["before"] = fc2.kernel.numpy().copy()
                for v in fc2.weights:
                    opt.set_mask(v, False)

    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[counter, SkipFrozen(), FreezeAtBatch2()])
    assert counter.traced == [EVERYTHING, ["fc1/kernel", "fc1/bias", "out/kernel", "out/bias"]]
    assert fc2.kernel.numpy().tobytes() == seen["before"].tobytes()


def test_every_variable_frozen_still_counts_the_steps_and_keeps_every_bit():
    model, opt = scenario.build()
    for v in model.trainable_variables:
        opt.set_mask(v, False)
    counter = scenario.TraceCounter()
    before = [v.numpy().copy() for v in model.weights]
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=2, verbose=0, callbacks=[counter, SkipFrozen()])
    assert counter.traced == [["out/bias"]]  # the last one is still differentiated so that the step runs
    assert int(opt.iterations) == 8
    assert all(v.numpy().tobytes() == b.tobytes() for v, b in zip(model.weights, before))


# -- the trainable flags: only ours, always put back -------------------------------------------------------------

def test_a_flag_the_user_turned_off_stays_off_and_ours_come_back():
    model, opt = scenario.build()
    opt.build(model.trainable_variables)
    bias = model.get_layer("out").bias
    bias.trainable = False  # the user's own choice, after build
    for v in model.get_layer("fc1").weights:
        opt.set_mask(v, False)
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[SkipFrozen()])
    assert bias.trainable is False
    assert all(v.trainable for v in model.get_layer("fc1").weights)


def test_after_a_fit_that_raises_unfreezing_turns_the_flag_back_on_and_a_plain_fit_trains_it():
    model, opt = scenario.build()
    fc1 = model.get_layer("fc1")

    class Boom(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    for v in fc1.weights:
        opt.set_mask(v, False)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(scenario.X, scenario.Y, batch_size=16, epochs=2, verbose=0, callbacks=[SkipFrozen(), Boom()])
    assert not fc1.kernel.trainable  # fit raised: on_train_end never ran (documented)
    for v in fc1.weights:
        opt.clear_mask(v)
    assert fc1.kernel.trainable and fc1.bias.trainable  # at once, in clear_mask
    before = fc1.kernel.numpy().copy()
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0)  # no SkipFrozen: the stale step is gone
    assert (fc1.kernel.numpy() != before).all()


def test_the_next_plain_fit_after_a_skipping_fit_trains_what_was_unfrozen_in_between():
    model, opt = scenario.build()
    fc1 = model.get_layer("fc1")
    for v in fc1.weights:
        opt.set_mask(v, False)
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[SkipFrozen()])
    for v in fc1.weights:
        opt.clear_mask(v)
    before = fc1.kernel.numpy().copy()
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0)
    assert (fc1.kernel.numpy() != before).all()


def test_a_model_saved_mid_stage_loads_with_every_flag_on_and_its_masks(tmp_path):
    model, opt = scenario.build()
    path = tmp_path / "mid.keras"

    class SaveAtEpoch2(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                assert not self.model.get_layer("fc1").kernel.trainable  # skipped right now
                self.model.save(path)

    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=3, verbose=0,
              callbacks=[MaskSchedule(scenario.stages(model)), SkipFrozen(), SaveAtEpoch2()])
    loaded = freezing.load_model(path)
    assert all(v.trainable for v in loaded.weights)
    assert isinstance(loaded.optimizer, MaskedOptimizer)
    assert not loaded.optimizer.get_mask(loaded.get_layer("fc1").kernel).any()  # the stage's masks came back


# -- save and restore mid-stage: training continues bit-identically --------------------------------------------

def _staged_fit(model, opt, initial_epoch: int, epochs: int) -> None:
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=[MaskSchedule(scenario.stages(model)), SkipFrozen()])


@pytest.mark.parametrize("route", ["keras_file", "tf_checkpoint"])
def test_restored_mid_stage_training_continues_bit_identically(tmp_path, route):
    model, opt = scenario.build()
    _staged_fit(model, opt, 0, 6)
    uninterrupted = [v.numpy() for v in model.weights] + [v.numpy() for v in opt.variables]

    model, opt = scenario.build()
    _staged_fit(model, opt, 0, 2)  # stops in the stage that freezes fc1 and fc2
    if route == "keras_file":
        model.save(tmp_path / "mid.keras")
        model = freezing.load_model(tmp_path / "mid.keras")
        opt = model.optimizer
    else:
        prefix = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
        model, opt = scenario.build(seed=1)  # other initial weights: the checkpoint must bring everything back
        opt.build(model.trainable_variables)
        tf.train.Checkpoint(model=model, optimizer=opt).restore(prefix).assert_consumed()
    _staged_fit(model, opt, 2, 6)
    resumed = [v.numpy() for v in model.weights] + [v.numpy() for v in opt.variables]
    assert len(resumed) == len(uninterrupted)
    assert [i for i, (a, b) in enumerate(zip(uninterrupted, resumed)) if a.tobytes() != b.tobytes()] == []


# -- bad input: one clear error, nothing changed ------------------------------------------------------------------

def _flags(model) -> list[bool]:
    return [bool(v.trainable) for v in model.weights]


def test_a_model_compiled_with_a_plain_optimizer_is_refused_unchanged():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2, name="fc")])
    model.compile(optimizer="adam", loss="mse")
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(ValueError, match="Adam, which holds no masks; allowed: a freezing.MaskedOptimizer"):
        model.fit(scenario.X, scenario.Y, epochs=1, verbose=0, callbacks=[SkipFrozen()])
    assert _flags(model) == [True, True] and all((v.numpy() == b).all() for v, b in zip(model.weights, before))


def test_another_optimizer_than_the_compiled_one_is_refused():
    model, _ = scenario.build()
    with pytest.raises(ValueError, match="compiled with another optimizer"):
        model.fit(scenario.X, scenario.Y, epochs=1, verbose=0,
                  callbacks=[SkipFrozen(MaskedOptimizer(keras.optimizers.Adam()))])
    with pytest.raises(ValueError, match="must be a freezing.MaskedOptimizer or None; got str"):
        SkipFrozen("adam")


def test_a_trainable_variable_the_optimizer_was_not_built_with_is_refused_unchanged():
    model, opt = scenario.build()
    out = model.get_layer("out")
    out.trainable = False
    opt.build(model.trainable_variables)  # built without out's weights
    out.trainable = True
    for v in model.get_layer("fc1").weights:
        opt.set_mask(v, False)
    state = [v.numpy().copy() for v in opt.variables]
    with pytest.raises(ValueError,
                       match=r"2 variable\(s\) the optimizer was not built with: \['sequential\w*/out/kernel'"):
        model.fit(scenario.X, scenario.Y, epochs=1, verbose=0, callbacks=[SkipFrozen()])
    assert all(_flags(model)) and all((v.numpy() == s).all() for v, s in zip(opt.variables, state))


def test_variables_to_differentiate_refuses_what_it_cannot_read():
    model, opt = scenario.build()
    with pytest.raises(ValueError, match="not built yet"):
        variables_to_differentiate(opt, model.trainable_variables)
    opt.build(model.trainable_variables[:2])
    with pytest.raises(ValueError, match=r"4 variable\(s\) the optimizer was not built with"):
        variables_to_differentiate(opt, model.trainable_variables)
    with pytest.raises(ValueError, match="SGD, which holds no masks"):
        variables_to_differentiate(keras.optimizers.SGD(), model.trainable_variables)
    with pytest.raises(ValueError, match="must be a list of variables"):
        variables_to_differentiate(opt, "fc1")


def test_variables_to_differentiate_in_a_custom_loop_retraces_once_per_change():
    model, opt = scenario.build()
    opt.build(model.trainable_variables)
    traces = []

    def make_step(train):
        @tf.function
        def step(x, y):
            traces.append([v.path.split("/", 1)[1] for v in train])
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((model(x) - y) ** 2)
            opt.apply(tape.gradient(loss, train), train)
        return step

    fc1 = model.get_layer("fc1")
    for v in fc1.weights:
        opt.set_mask(v, False)
    step = make_step(variables_to_differentiate(opt, model.trainable_variables))
    before = fc1.kernel.numpy().copy()
    for _ in range(3):
        step(scenario.X[:16], scenario.Y[:16])
    assert fc1.kernel.numpy().tobytes() == before.tobytes()
    for v in fc1.weights:
        opt.clear_mask(v)
    step = make_step(variables_to_differentiate(opt, model.trainable_variables))
    for _ in range(3):
        step(scenario.X[:16], scenario.Y[:16])
    assert traces == [EVERYTHING[2:], EVERYTHING] and int(opt.iterations) == 6
    assert (fc1.kernel.numpy() != before).all()


# -- MirroredStrategy (two logical CPU devices: a child process) -------------------------------------------------

@pytest.mark.slow
def test_mirrored_strategy_gives_the_bits_of_masks_only(tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(Path(scenario.__file__)), str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ})
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(out.read_text())
    skip, masks = r["True"], r["False"]  # the models' names differ between the two builds: compare in order
    assert list(skip["weights"].values()) == list(masks["weights"].values())
    assert list(skip["state"].values()) == list(masks["state"].values())
    assert skip["traced"][::2] == skip["traced"][1::2] == STAGES_TRACED  # each trace runs both replicas' step
    assert not skip["frozen_moved"]
    assert all(r["True"]["flags"].values()) and r["True"]["iterations"] == 24


def test_fit_after_fit_with_the_same_frozen_set_does_not_retrace_and_compile_in_between_does():
    model, opt = scenario.build()
    counter = scenario.TraceCounter()
    for v in model.get_layer("fc1").weights:
        opt.set_mask(v, False)
    for _ in range(3):
        model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[counter, SkipFrozen()])
        assert all(v.trainable for v in model.weights)
    assert counter.traced == [EVERYTHING[2:]]
    model.compile(optimizer=opt, loss="mse")  # a new train function: the parked one is not taken back
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[counter, SkipFrozen()])
    assert counter.traced == [EVERYTHING[2:]] * 2
    model.get_layer("out").bias.trainable = False  # the user's flag changed: another set trains, so it traces
    model.fit(scenario.X, scenario.Y, batch_size=16, epochs=1, verbose=0, callbacks=[counter, SkipFrozen()])
    assert counter.traced == [EVERYTHING[2:]] * 2 + [["fc2/kernel", "fc2/bias", "out/kernel"]]


def test_unfreezing_by_set_weights_after_a_fit_that_raised_turns_the_flag_back_on():
    model, opt = scenario.build()
    opt.build(model.trainable_variables)
    saved = opt.get_weights()  # no mask yet
    fc1 = model.get_layer("fc1")

    class Boom(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    for v in fc1.weights:
        opt.set_mask(v, False)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(scenario.X, scenario.Y, batch_size=16, epochs=2, verbose=0, callbacks=[SkipFrozen(), Boom()])
    assert not fc1.kernel.trainable
    opt.set_weights(saved)  # the masks written back as they were: fc1 trains again
    assert fc1.kernel.trainable and fc1.bias.trainable
