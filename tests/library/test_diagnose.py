"""``freezing.diagnose``: each cause on a tiny model built to have it, checked against what Keras does."""

import warnings

import keras
import keras_features
import numpy as np
import pytest

import freezing.masked_optimizer as masked_module
from freezing.diagnose import CAUSES, FIXES, Cause, Diagnosis, diagnose

X = np.random.RandomState(0).randn(16, 3).astype("float32")
Y = np.random.RandomState(1).randn(16, 1).astype("float32")
K = keras.optimizers

def make(bn=False, constraint=None):
    """Input(3) -> Dense a (3x4) [-> BatchNormalization bn] -> Dense b (4x1)."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,))
    h = keras.layers.Dense(4, name="a", kernel_constraint=constraint)(inp)
    if bn:
        h = keras.layers.BatchNormalization(name="bn")(h)
    return keras.Model(inp, keras.layers.Dense(1, name="b")(h))


def fit(model, epochs=1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, Y, batch_size=8, epochs=epochs, verbose=0, shuffle=False)


def snapshot(model):
    values = [v.numpy().copy() for v in model.variables]
    if model.optimizer is not None:
        values += [v.numpy().copy() for v in model.optimizer.variables]
    return values


def found(diagnosis):
    return {(row.variable, row.cause): row.entries for row in diagnosis}


def test_clean_freeze_reports_nothing_and_nothing_moves():
    model = make()
    model.get_layer("a").trainable = False
    model.compile(optimizer=K.Adam(0.1), loss="mse")
    fit(model)
    d = diagnose(model, [model.get_layer("a")])
    assert len(d) == 0 and d.causes == set() and d.rows() == []
    assert str(d) == "no cause can move the frozen entries"
    before = model.get_layer("a").kernel.numpy().copy()
    fit(model)
    np.testing.assert_array_equal(before, model.get_layer("a").kernel.numpy())


def test_trainable_variable_reports_gradient():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    d = diagnose(model, masks={"a/kernel": ~np.eye(3, 4, dtype=bool)})
    assert found(d) == {("a/kernel", "gradient"): 3}


def test_diagnose_runs_no_step_and_writes_nothing():
    model = make(bn=True, constraint=keras.constraints.NonNeg())
    model.compile(optimizer=K.AdamW(0.1, use_ema=True, ema_overwrite_frequency=2), loss="mse")
    fit(model)
    model.get_layer("a").trainable = False
    before, steps = snapshot(model), int(model.optimizer.iterations.numpy())
    assert diagnose(model, [model.get_layer("a"), model.get_layer("bn"), "b/kernel"])
    assert int(model.optimizer.iterations.numpy()) == steps
    for old, new in zip(before, snapshot(model)):
        np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda: K.SGD(0.1),
        lambda: K.SGD(0.1, momentum=0.9),
        lambda: K.RMSprop(0.1),
        lambda: K.RMSprop(0.1, momentum=0.9),
        lambda: K.RMSprop(0.1, centered=True),
        lambda: K.Adagrad(0.1),
        lambda: K.Adadelta(1.0),
        lambda: K.Adafactor(0.1),
        lambda: K.Adam(0.1),
        lambda: K.Adam(0.1, amsgrad=True),
        lambda: K.AdamW(0.1, weight_decay=0.0),
        lambda: K.Adamax(0.1),
        lambda: K.Nadam(0.1),
        lambda: K.Lion(0.1),
        lambda: K.Lamb(0.1),
        lambda: K.Ftrl(0.1),
    ],
    ids=["sgd", "sgd-momentum", "rmsprop", "rmsprop-momentum", "rmsprop-centered", "adagrad", "adadelta",
         "adafactor", "adam", "amsgrad", "adamw-no-decay", "adamax", "nadam", "lion", "lamb", "ftrl"],
)
def test_moments_match_what_a_zero_gradient_step_moves(make_opt):
    model = make()  # trained in a custom loop: the optimizer is not model.optimizer
    v = model.get_layer("a").kernel
    v.assign(np.arange(1, 13, dtype="float32").reshape(3, 4) / 10)
    opt = make_opt()
    grads = np.random.RandomState(0).randn(3, 4).astype("float32")
    grads[0, :2] = 0  # these entries never get a gradient: their momentum stays at its initial value
    for _ in range(3):
        opt.apply_gradients([(keras.ops.convert_to_tensor(grads), v)])
    frozen = np.zeros((3, 4), bool)
    frozen[0] = frozen[1, 1] = True
    d = diagnose(model, masks=[(v, ~frozen)], optimizer=opt)
    before = v.numpy()
    opt.apply_gradients([(keras.ops.convert_to_tensor(np.where(frozen, 0, grads).astype("float32")), v)])
    moved = int(np.count_nonzero(frozen & (before != v.numpy())))
    if isinstance(opt, K.Ftrl):  # recomputes entries from its state: every frozen entry is at risk
        assert moved <= found(d)[("a/kernel", "moments")] == frozen.sum()
    else:  # exact: the entries a zero-gradient step moves are the ones reported
        assert found(d).get(("a/kernel", "moments"), 0) == moved
    assert d.causes <= {"gradient", "moments"}


def test_fresh_momentum_moves_nothing_and_ftrl_does():
    model = make()
    model.compile(optimizer=K.Adam(0.1), loss="mse")
    assert diagnose(model, ["a/kernel"]).causes == {"gradient"}
    model.compile(optimizer=K.Ftrl(0.1), loss="mse")
    assert found(diagnose(model, ["a/kernel"]))[("a/kernel", "moments")] == 12


def test_moments_through_loss_scale_optimizer():
    model = make()
    model.compile(optimizer=K.LossScaleOptimizer(K.Adam(0.1)), loss="mse")
    fit(model)
    assert found(diagnose(model, masks={"a/kernel": False}))[("a/kernel", "moments")] == 12


def test_weight_decay_counts_nonzero_entries_and_respects_exclusion():
    model = make()
    kernel = model.get_layer("a").kernel
    kernel.assign(np.where(np.eye(3, 4) > 0, 0.0, kernel.numpy()))
    model.compile(optimizer=K.AdamW(0.1, weight_decay=0.1), loss="mse")
    assert found(diagnose(model, ["a/kernel"]))[("a/kernel", "weight_decay")] == 12 - 3
    opt = K.AdamW(0.1, weight_decay=0.1)
    opt.exclude_from_weight_decay(var_list=[kernel])
    model.compile(optimizer=opt, loss="mse")
    assert "weight_decay" not in diagnose(model, ["a/kernel"]).causes


def test_constraint():
    model = make(constraint=keras.constraints.NonNeg())
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    assert found(diagnose(model, masks={"a/kernel": np.array([False, True, True, True])}))[
        ("a/kernel", "constraint")] == 3


def test_ema_on_trained_and_on_built_but_frozen_variables():
    model = make()
    model.compile(optimizer=K.SGD(0.1, use_ema=True), loss="mse")  # averages written at the end of fit
    assert ("a/kernel", "ema") in found(diagnose(model, ["a/kernel"]))
    # frozen and recompiled, but the optimizer was built with it and overwrites every 2 steps
    opt = K.SGD(0.1, use_ema=True, ema_overwrite_frequency=2)
    opt.build(model.trainable_variables)
    model.get_layer("a").trainable = False
    model.compile(optimizer=opt, loss="mse")
    assert diagnose(model, [model.get_layer("a")]).causes == {"ema"}
    model.compile(optimizer=K.SGD(0.1, use_ema=True), loss="mse")  # a fresh optimizer never sees it
    assert len(diagnose(model, [model.get_layer("a")])) == 0


def test_trainable_changed_after_compile_and_the_fix():
    model = make()
    model.compile(optimizer=K.Adam(0.1), loss="mse")
    fit(model)
    layer = model.get_layer("a")
    layer.trainable = False  # fit already traced its train step with layer a in it
    d = diagnose(model, [layer])
    assert found(d) == {
        ("a/kernel", "trainable_changed_after_compile"): 12, ("a/kernel", "moments"): 12,
        ("a/bias", "trainable_changed_after_compile"): 4, ("a/bias", "moments"): 4,
    }
    before = layer.kernel.numpy().copy()
    fit(model)  # Keras' trap, shown: the cached train step still trains the non-trainable layer
    assert np.any(before != layer.kernel.numpy())
    model.compile(optimizer=K.Adam(0.1), loss="mse")  # the fix
    assert len(diagnose(model, [layer])) == 0


def test_trainable_changed_is_harmless_when_run_eagerly():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse", run_eagerly=True)
    fit(model)
    layer = model.get_layer("a")
    layer.trainable = False
    assert len(diagnose(model, [layer])) == 0
    before = layer.kernel.numpy().copy()
    fit(model)
    np.testing.assert_array_equal(before, layer.kernel.numpy())


def test_batchnorm_statistics():
    model = make(bn=True)
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    bn = model.get_layer("bn")
    d = diagnose(model, ["bn/moving_mean", "bn/moving_variance"])
    assert found(d) == {("bn/moving_mean", "batchnorm_statistics"): 4,
                        ("bn/moving_variance", "batchnorm_statistics"): 4}
    fit(model)
    bn.trainable = False  # the cached train step still runs BN in training mode
    assert found(diagnose(model, [bn]))[("bn/moving_mean", "batchnorm_statistics")] == 4
    before = bn.moving_mean.numpy().copy()
    fit(model)
    assert np.any(before != bn.moving_mean.numpy())
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    assert len(diagnose(model, [bn])) == 0
    before = bn.moving_mean.numpy().copy()
    fit(model)
    np.testing.assert_array_equal(before, bn.moving_mean.numpy())


def test_unknown_to_optimizer():
    model = make()
    layer = model.get_layer("a")
    layer.trainable = False
    model.compile(optimizer=K.Adam(0.1), loss="mse")
    fit(model)
    layer.trainable = True  # "frozen" only because the built optimizer does not know it
    assert diagnose(model, [layer]).causes == {"unknown_to_optimizer"}
    model.compile(optimizer=model.optimizer, loss="mse")
    with pytest.raises(ValueError, match="Unknown variable"):
        fit(model)


def test_target_forms_merge_and_resolve():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    kernel = model.get_layer("a").kernel
    row0, row1 = np.zeros((3, 4), bool), np.zeros((3, 4), bool)
    row0[0], row1[1] = True, True
    assert found(diagnose(model, masks=[(kernel, ~row0), ("a/kernel", ~row1)])) == {("a/kernel", "gradient"): 8}
    assert found(diagnose(model, masks={model.get_layer("b"): False})) == {("b/kernel", "gradient"): 4,
                                                                          ("b/bias", "gradient"): 1}
    assert found(diagnose(model, kernel)) == {("a/kernel", "gradient"): 12}
    assert len(diagnose(model, masks={"a/kernel": True})) == 0
    with pytest.raises(TypeError):
        {kernel: True}  # Keras variables are unhashable: key a dict by path or pass (variable, mask) pairs


def test_unknown_path_lists_close_matches():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    with pytest.raises(ValueError, match=r"no variable with path 'a/kernal'.*'a/kernel'"):
        diagnose(model, ["a/kernal"])


def test_wrong_mask_shape_names_variable_and_shapes():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    with pytest.raises(ValueError, match=r"'a/kernel' has shape \(2, 4\).*\(3, 4\)"):
        diagnose(model, masks={"a/kernel": np.ones((2, 4), bool)})


def test_uncompiled_model_needs_an_optimizer():
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        diagnose(make(), ["a/kernel"])


def test_rendering():
    d = Diagnosis([Cause("a/kernel", "moments", 12, FIXES["moments"]), Cause("a/bias", "ema", 4, FIXES["ema"])])
    lines = str(d).splitlines()
    assert lines[0].split()[:4] == ["variable", "cause", "entries", "fix"]
    assert lines[2].split()[:3] == ["a/kernel", "moments", "12"] and lines[3].split()[:3] == ["a/bias", "ema", "4"]
    assert d._repr_markdown_().splitlines()[2].startswith("| a/kernel | moments | 12 |")
    assert d.rows()[1] == {"variable": "a/bias", "cause": "ema", "entries": 4, "fix": FIXES["ema"]}
    assert [c.cause for c in d] == ["moments", "ema"] and d[0].entries == 12
    assert set(FIXES) == set(CAUSES)


class _FakeMasked(keras.optimizers.Optimizer):
    """Stands in for the MaskedOptimizer contract: inner, policy, get_mask (True = trains)."""

    def __init__(self, inner, policy, masks):
        super().__init__(learning_rate=0.1)
        self.inner, self.policy, self._masks = inner, policy, masks

    def get_mask(self, variable):
        return self._masks.get(variable.path)


def _trained_adamw(model):
    inner = K.AdamW(0.1, weight_decay=0.1)
    variables = model.trainable_variables
    inner.apply_gradients(zip([keras.ops.ones(v.shape) for v in variables], variables))
    return inner


@pytest.mark.parametrize("policy", ["hold", "reset", "none"])
def test_masked_optimizer_contract(monkeypatch, policy):
    monkeypatch.setattr(masked_module, "MaskedOptimizer", _FakeMasked)
    model = make()
    keep = np.ones((3, 4), bool)
    keep[0] = False  # the mask freezes row 0; the user believes rows 0 and 1 frozen
    opt = _FakeMasked(_trained_adamw(model), policy, {"a/kernel": keep})
    trains = {"a/kernel": np.arange(3)[:, None] >= 2, "b/kernel": False}
    d = found(diagnose(model, masks=trains, optimizer=K.LossScaleOptimizer(opt)))
    exposed = 4 if policy != "none" else 8
    assert d == {
        ("a/kernel", "not_masked"): 4, ("a/kernel", "moments"): exposed, ("a/kernel", "weight_decay"): exposed,
        ("b/kernel", "not_masked"): 4, ("b/kernel", "moments"): 4, ("b/kernel", "weight_decay"): 4,
    }


@pytest.mark.parametrize("policy", ["hold", "none"])
def test_real_masked_optimizer(policy):
    model = make()
    kernel = model.get_layer("a").kernel
    keep = np.ones((3, 4), bool)
    keep[0] = False
    opt = masked_module.MaskedOptimizer(_trained_adamw(model), policy=policy)
    opt.set_mask(kernel, keep)
    np.testing.assert_array_equal(opt.get_mask(kernel), keep)
    trains = {"a/kernel": np.arange(3)[:, None] >= 2}
    for wrapped in (opt, K.LossScaleOptimizer(opt)):
        d = found(diagnose(model, masks=trains, optimizer=wrapped))
        exposed = 4 if policy == "hold" else 8
        assert d == {("a/kernel", "not_masked"): 4, ("a/kernel", "moments"): exposed,
                     ("a/kernel", "weight_decay"): exposed}


@keras_features.needs("MultiOptimizer", "OptimizerMap")
def test_multi_optimizer_uses_each_variables_own_optimizer():
    model = make()
    optimizer_map = K.OptimizerMap(default_optimizer=K.SGD(0.1), optimizer_map={"a/.*": K.AdamW(0.1, weight_decay=0.1)})
    model.compile(optimizer=K.MultiOptimizer(optimizer_map), loss="mse")
    fit(model)
    d = found(diagnose(model, ["a/kernel", "b/kernel"]))
    assert d == {("a/kernel", "gradient"): 12, ("a/kernel", "moments"): 12, ("a/kernel", "weight_decay"): 12,
                 ("b/kernel", "gradient"): 4}


def test_real_masked_optimizer_clean_diagnosis_means_nothing_moves():
    model = make(constraint=keras.constraints.NonNeg())
    inner = K.AdamW(0.1, weight_decay=0.1, use_ema=True, ema_overwrite_frequency=2)
    opt = masked_module.MaskedOptimizer(inner, policy="hold")
    model.compile(optimizer=opt, loss="mse")
    keep = np.ones((3, 4), bool)
    keep[0] = False
    opt.set_mask("a/kernel", keep)
    fit(model)  # moments, decay, EMA averages all non-trivial now
    kernel = model.get_layer("a").kernel
    assert len(diagnose(model, masks={"a/kernel": keep})) == 0
    assert diagnose(model, ["a/kernel"]).causes == {"not_masked", "moments", "weight_decay", "constraint", "ema"}
    before = kernel.numpy().copy()
    fit(model, epochs=2)
    np.testing.assert_array_equal(before[0], kernel.numpy()[0])


def test_real_masked_optimizer_holds_entries_even_after_trainable_changed():
    model = make()
    opt = masked_module.MaskedOptimizer(K.Adam(0.1), policy="hold")
    model.compile(optimizer=opt, loss="mse")
    keep = np.ones((3, 4), bool)
    keep[0] = False
    opt.set_mask("a/kernel", keep)
    fit(model)
    layer = model.get_layer("a")
    layer.trainable = False  # the cached step still trains a/kernel, through the mask
    d = found(diagnose(model, ["a/kernel"]))
    assert d == {("a/kernel", "trainable_changed_after_compile"): 8, ("a/kernel", "moments"): 8}
    before = layer.kernel.numpy().copy()
    fit(model)
    after = layer.kernel.numpy()
    np.testing.assert_array_equal(before[0], after[0])
    assert np.all(before[1:] != after[1:])


def test_following_the_printed_reset_slots_fix_with_ema_keeps_frozen_entries_through_fit():
    """The moments and ema rows advise reset_slots after every step; done inside fit (a gate on the kernel and
    a callback), no frozen entry moves, fit's final EMA overwrite included, and the moments row is gone."""
    import tensorflow as tf

    from freezing import gate, reset_slots

    frozen = np.zeros((3, 4), bool)
    frozen[:, 1] = frozen[0, :] = True
    keep = (~frozen).astype("float32")

    class GatedDense(keras.layers.Layer):
        def build(self, shape):
            self.kernel = self.add_weight(shape=(shape[-1], 4), name="kernel", initializer="glorot_uniform")
            self.gated = self.add_weight(shape=(shape[-1], 4), name="gated", initializer="ones", trainable=False)

        def call(self, x):
            return tf.matmul(x, gate(self.kernel, self.gated))

    keras.utils.set_random_seed(0)
    inp = keras.Input((3,))
    layer = GatedDense(name="a")
    model = keras.Model(inp, keras.layers.Dense(1, name="b")(layer(inp)))
    opt = K.Adam(0.1, use_ema=True)
    model.compile(optimizer=opt, loss="mse")
    fit(model)  # trains everywhere first (the gate is all ones): moments and averages away from their start
    kernel = layer.kernel
    rows = {row.cause: row.fix for row in diagnose(model, masks={kernel.path: ~frozen})}
    assert "freezing.reset_slots(opt, v, where=frozen) after every step" in rows["moments"]
    assert "freezing.reset_slots(opt, v, where=frozen) after every step" in rows["ema"]

    layer.gated.assign(keep)  # the gate: zero gradient where frozen; then the printed fix, after every step
    reset_slots(opt, kernel, where=frozen)
    before = kernel.numpy().copy()
    after_each = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: reset_slots(opt, kernel, where=frozen))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, Y, batch_size=8, epochs=3, verbose=0, shuffle=False, callbacks=[after_each])  # ends by finalize
    assert (kernel.numpy()[frozen] == before[frozen]).all()
    assert (kernel.numpy()[~frozen] != before[~frozen]).all()
    assert "moments" not in diagnose(model, masks={kernel.path: ~frozen}).causes


def test_masks_mean_trains_as_in_set_mask_and_old_frozen_dicts_get_a_clear_error():
    """At 53e6206 diagnose's True meant frozen while set_mask's meant trains; a dict in frozen= now says so."""
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    keep = np.ones((3, 4), bool)
    keep[0] = False
    assert found(diagnose(model, masks={"a/kernel": keep})) == {("a/kernel", "gradient"): 4}
    assert found(diagnose(model, masks=[(model.get_layer("a").kernel, keep)])) == {("a/kernel", "gradient"): 4}
    for old in ({"a/kernel": ~keep}, [("a/kernel", ~keep)]):
        with pytest.raises(TypeError, match=r"frozen= takes the targets believed wholly frozen.*"
                                            r"masks=\{target: keep\}.*"
                                            r"True means trains, as in MaskedOptimizer.set_mask: what was "
                                            r"frozen=\{target: frozen\} is masks=\{target: ~frozen\}"):
            diagnose(model, old)


def test_a_path_end_finds_the_variable_and_an_ambiguous_one_lists_the_matches():
    model = make()
    model.compile(optimizer=K.SGD(0.1), loss="mse")
    assert found(diagnose(model, [f"{model.name}_7/a/kernel"])) == {("a/kernel", "gradient"): 12}
    with pytest.raises(ValueError, match=r"diagnose: the path 'kernel' matches 2 variables"):
        diagnose(model, ["kernel"])
