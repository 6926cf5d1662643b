"""What set_mask, get_mask and clear_mask accept: a variable, a layer, a path (or a unique end of one), None.

Each case failed at 53e6206 (a layer or swapped arguments: AttributeError '_unique_id'; a wrong shape known at
set_mask: accepted until fit; None: "has dtype object"; get_mask of an unknown path: None before build, an error
after; masks on an optimizer the model was not compiled with: silently nothing).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from freezing import MaskedOptimizer, MaskSchedule

X, Y = np.random.default_rng(0).normal(size=(16, 3)).astype("float32"), np.ones((16, 1), "float32")


def make(name: str | None = None) -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="fc"), keras.layers.Dense(1, name="out")],
                            name=name)


def values(layer: keras.layers.Layer) -> list[np.ndarray]:
    return [w.numpy().copy() for w in layer.weights]


@pytest.mark.parametrize("built", [False, True])
def test_a_layer_freezes_its_weights_whole_before_and_after_build(built):
    model = make()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    model.compile(optimizer=opt, loss="mse")
    if built:
        opt.build(model.trainable_variables)
    fc, out = model.get_layer("fc"), model.get_layer("out")
    opt.set_mask(fc, False)
    assert {path.split("/", 1)[1]: m.tolist() for path, m in opt.get_mask(fc).items()} == {
        "fc/kernel": [[False] * 4] * 3, "fc/bias": [False] * 4}
    before, head = values(fc), values(out)
    model.fit(X, Y, epochs=2, verbose=0)
    assert all((a == b).all() for a, b in zip(before, values(fc)))
    assert all((a != b).any() for a, b in zip(head, values(out)))
    opt.clear_mask(fc)
    assert opt.get_mask(fc) == {w.path: None for w in fc.weights}


def test_swapped_arguments_are_named_as_swapped():
    model = make()
    opt = MaskedOptimizer("adam")
    kernel = model.get_layer("fc").kernel
    with pytest.raises(TypeError, match=r"set_mask\(target, mask\): the arguments are swapped: the target is "
                                        r"a NumPy array of shape \(3, 4\) and the mask is variable '.*fc/kernel'"):
        opt.set_mask(np.ones((3, 4)), kernel)
    opt.build(model.trainable_variables)
    with pytest.raises(TypeError,
                       match=r"the arguments are swapped: the target is bool False and the mask is layer 'fc'"):
        opt.set_mask(False, model.get_layer("fc"))


@pytest.mark.parametrize("call, message", [
    (lambda opt: opt.set_mask(3, True), r"set_mask\(target, mask\): the target is int 3; allowed: a variable, a keras "
                                        r"layer \(its weights that the optimizer updates\), or a variable path string"),
    (lambda opt: opt.get_mask(None), r"MaskedOptimizer.get_mask: the target is NoneType None; allowed: a variable"),
    (lambda opt: opt.clear_mask(1.5), r"MaskedOptimizer.clear_mask: the target is float 1.5; allowed"),
    (lambda opt: opt.set_mask("fc/kernel", "abc"), r"the mask is str 'abc'; allowed: None \(no mask\), a bool, or an "
                                                   r"array of 0/1"),
    (lambda opt: opt.set_mask("fc/kernel", {"a": 1}), r"the mask is dict \{'a': 1\}; allowed: None"),
])
def test_a_target_or_mask_of_the_wrong_kind_is_a_type_error_naming_it(call, message):
    opt = MaskedOptimizer("adam")
    with pytest.raises(TypeError, match=message):
        call(opt)
    assert opt._pending == {}


def test_a_wrong_shape_is_refused_at_set_mask_when_the_variable_is_known():
    model = make()
    opt = MaskedOptimizer("adam")
    kernel = model.get_layer("fc").kernel
    with pytest.raises(ValueError, match=r"the mask \(set_mask\) for '.*fc/kernel' has shape \(5, 5\); expected a "
                                         r"scalar or a shape broadcastable to the variable's \(3, 4\)"):
        opt.set_mask(kernel, np.ones((5, 5)))
    with pytest.raises(ValueError, match=r"for '.*fc/bias' has shape \(3, 4\)"):  # a layer: every weight, before any
        opt.set_mask(model.get_layer("fc"), np.ones((3, 4)))
    assert opt._pending == {}
    with pytest.raises(ValueError, match=r"the mask \(set_mask\) for '.*fc/kernel' has dtype object"):
        opt.set_mask(kernel, np.array([object()] * 4))


def test_a_refused_layer_mask_changes_no_mask_after_build():
    model = make()
    opt = MaskedOptimizer("adam", policy="reset")
    opt.build(model.trainable_variables)
    fc = model.get_layer("fc")
    opt.set_mask(fc.kernel, [[True, False, True, False]])
    state = [v.numpy().copy() for v in opt.variables]
    with pytest.raises(ValueError, match=r"for '.*fc/bias' has shape \(3, 4\)"):
        opt.set_mask(fc, np.eye(3, 4))  # fits the kernel, not the bias
    assert all((a == b.numpy()).all() for a, b in zip(state, opt.variables))


@pytest.mark.parametrize("built", [False, True])
def test_none_clears_the_mask(built):
    model = make()
    opt = MaskedOptimizer("adam")
    kernel = model.get_layer("fc").kernel
    if built:
        opt.build(model.trainable_variables)
    opt.set_mask(kernel, [[1, 0, 1, 0]])
    opt.set_mask(kernel, None)
    assert opt.get_mask(kernel) is None


def test_get_mask_of_an_unknown_path_raises_before_and_after_build():
    model = make()
    opt = MaskedOptimizer("adam")
    opt.set_mask("fc/kernel", [[1, 0, 1, 0]])
    with pytest.raises(ValueError, match=r"MaskedOptimizer.get_mask: no variable with path 'fc/kernal'"):
        opt.get_mask("fc/kernal")
    with pytest.raises(ValueError, match=r"MaskedOptimizer.clear_mask: no variable with path 'fc/kernal'"):
        opt.clear_mask("fc/kernal")
    assert opt.get_mask("fc/kernel").tolist() == [[True, False, True, False]]
    opt.build(model.trainable_variables)
    with pytest.raises(ValueError, match=r"MaskedOptimizer.get_mask: no variable with path 'fc/kernal'.*close matches"):
        opt.get_mask("fc/kernal")
    assert opt.get_mask("fc/kernel").tolist() == [[True, False, True, False]] * 3


def test_a_path_is_found_by_its_end_and_across_automatic_model_names():
    make()  # takes the first automatic name
    model = make()
    assert model.name != "sequential"
    opt = MaskedOptimizer("adam")
    opt.set_mask("sequential/out/kernel", [[True], [False], [True], [False]])  # as written for the first model
    opt.set_mask("fc/bias", False)
    opt.build(model.trainable_variables)
    assert opt.get_mask(model.get_layer("out").kernel).ravel().tolist() == [True, False, True, False]
    assert opt.get_mask(f"{model.name}/fc/bias").tolist() == [False] * 4
    with pytest.raises(ValueError, match=r"the path 'kernel' matches 2 variables: \['.*fc/kernel', '.*out/kernel'\]; "
                                         r"give more of the path, or the variable itself"):
        opt.set_mask("kernel", False)


def test_a_pending_path_gets_its_shape_checked_at_build_with_the_same_message():
    model = make()
    opt = MaskedOptimizer("adam")
    opt.set_mask("fc/kernel", np.ones((5, 5)))  # no variable known yet: values checked now, the shape at build
    with pytest.raises(ValueError, match=r"the mask \(set_mask\) for '.*fc/kernel' has shape \(5, 5\).*clear it "
                                         r"with opt.clear_mask\('fc/kernel'\)"):
        opt.build(model.trainable_variables)
    assert not opt.built and "fc/kernel" in opt._pending


def test_masks_on_an_optimizer_the_model_was_not_compiled_with_raise_before_a_frozen_entry_moves():
    model = make()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    fc = model.get_layer("fc")
    opt.set_mask(fc, False)
    model.compile(optimizer="adam", loss="mse")
    before = values(fc)
    with pytest.raises(RuntimeError, match=r"'.*fc/kernel' has a mask in a MaskedOptimizer that is not the optimizer "
                                           r"updating it .*model.compile\(optimizer=opt"):
        model.fit(X, Y, epochs=1, verbose=0)
    assert all((a == b).all() for a, b in zip(before, values(fc)))
    model.compile(optimizer=opt, loss="mse")  # the right optimizer: the masks apply, nothing is left behind
    model.fit(X, Y, epochs=1, verbose=0)
    assert all((a == b).all() for a, b in zip(before, values(fc)))
    assert fc.kernel.constraint is None and fc.bias.constraint is None


def test_the_watch_keeps_a_constraint_and_goes_with_clear_mask():
    layer = keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg(), name="d")
    model = keras.Sequential([keras.Input((3,)), layer])
    opt = MaskedOptimizer("adam")
    opt.set_mask(layer.kernel, [[True, False]])
    opt.clear_mask(layer)
    assert isinstance(layer.kernel.constraint, keras.constraints.NonNeg) and layer.bias.constraint is None
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, np.ones((16, 2)), epochs=1, verbose=0)  # no mask anywhere: trains


def test_mask_schedule_takes_paths_and_layers_like_set_mask():
    model = make()
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    model.compile(optimizer=opt, loss="mse")
    fc, out = model.get_layer("fc"), model.get_layer("out")
    before, head = values(fc), out.kernel.numpy().copy()
    model.fit(X, Y, epochs=1, verbose=0, callbacks=[MaskSchedule({0: {"out/kernel": False, fc: False}})])
    assert all((a == b).all() for a, b in zip(before, values(fc))) and (out.kernel.numpy() == head).all()
    model.fit(X, Y, epochs=2, initial_epoch=1, verbose=0, callbacks=[MaskSchedule({1: {"out/kernel": None, fc: None}})])
    assert (fc.kernel.numpy() != before[0]).any() and (out.kernel.numpy() != head).any()


def test_freeze_audit_takes_a_layer_and_reads_the_stored_masks_as_set_mask_means_them():
    import tensorflow as tf

    from freezing import FreezeAudit

    model = make()
    fc = model.get_layer("fc")
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    opt.build(model.trainable_variables)
    opt.set_mask(fc, [True, False, True, False])  # columns 1 and 3 frozen
    audit = FreezeAudit([fc], optimizer=opt)
    for _ in range(2):
        with audit.step():
            opt.apply_gradients([(tf.ones_like(w), w) for w in fc.trainable_weights])
    assert {(r.tensor.split("/", 1)[1], r.frozen, r.changed) for r in audit.records if ":" not in r.tensor} == {
        ("fc/kernel", 6, 0), ("fc/bias", 2, 0)}
    with pytest.raises(ValueError, match=r"FreezeAudit.step: with no frozen masks, the audit reads a MaskedOptimizer's "
                                         r"stored masks, and its optimizer is Adam"):
        with FreezeAudit([fc], optimizer=keras.optimizers.Adam()).step():
            pass
