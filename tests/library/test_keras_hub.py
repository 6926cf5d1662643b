"""MaskedOptimizer on keras-hub task models: fit, LoRA factors, mixed precision, save and resume.

Tiny configs, random weights, ``preprocessor=None`` (token ids and images given directly): nothing is
downloaded and ``tensorflow-text`` is not needed (``requirements-keras-hub.txt`` installs keras-hub without
it, next to ``tensorflow-cpu``). keras-hub tasks override ``compile``, so ``keras.saving.load_model``
gives them back with the task's default optimizer; ``freezing.load_model`` restores the saved one.
"""

import importlib.metadata
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from packaging.version import Version

if Version(keras.__version__) < Version("3.15"):
    pytest.skip("keras-hub 0.32 needs Keras >= 3.15; not installed on the oldest pair", allow_module_level=True)

import keras_hub  # noqa: E402  (make venv installs it: requirements-keras-hub.txt)

import freezing  # noqa: E402
from freezing import MaskedOptimizer, slots  # noqa: E402
from freezing.audit import changed_bits  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
B, T = 8, 8  # batch, sequence length


def _bert(dtype=None):
    backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=T, dropout=0.0, dtype=dtype)
    task = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None, dropout=0.0)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 50, (B, T)), "segment_ids": np.zeros((B, T), "int32"),
         "padding_mask": np.ones((B, T), bool)}
    return task, x, rng.integers(0, 2, B)


def _gpt2(dtype=None):
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=T, dropout=0.0, dtype=dtype)
    task = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 50, (B, T)), "padding_mask": np.ones((B, T), bool)}
    return task, x, rng.integers(0, 50, (B, T))


def _gemma(dtype=None):
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=50, num_layers=1, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
                                              dtype=dtype)
    task = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 50, (B, T)), "padding_mask": np.ones((B, T), bool)}
    return task, x, rng.integers(0, 50, (B, T))


def _vit(dtype=None):
    backbone = keras_hub.models.ViTBackbone(image_shape=(8, 8, 3), patch_size=4, num_layers=1, num_heads=2,
                                            hidden_dim=8, mlp_dim=16, dtype=dtype)
    task = keras_hub.models.ViTImageClassifier(backbone, num_classes=3, preprocessor=None)
    rng = np.random.default_rng(0)
    return task, rng.random((B, 8, 8, 3)).astype("float32"), rng.integers(0, 3, B)


TASKS = {"bert": _bert, "gpt2": _gpt2, "gemma": _gemma, "vit": _vit}


def _make(name, dtype=None):
    keras.utils.set_random_seed(0)
    return TASKS[name](dtype)


def _fit(task, x, y, epochs=1):
    task.fit(x, y, epochs=epochs, batch_size=4, shuffle=False, verbose=0)


def _half_masks(opt, variables, seed=1):
    """A random half of every variable frozen; returns the masks by path (True trains)."""
    rng = np.random.default_rng(seed)
    masks = {v.path: rng.random(tuple(v.shape)) < 0.5 for v in variables}
    for v in variables:
        opt.set_mask(v, masks[v.path])
    return masks


def _snapshot(opt, variables):
    """Every variable's value and every slot of it, by (path, slot name)."""
    out = {}
    for v in variables:
        out[v.path, "value"] = (v, np.array(v.numpy()))
        for name, slot in slots(opt.inner, v).items():
            out[v.path, name] = (slot, np.array(slot.numpy()))
    return out


def _frozen_moved(snapshot, masks):
    """How many frozen entries of the variables and their slots changed any bit since ``snapshot``."""
    return sum(int((changed_bits(before, var.numpy()) & ~masks[path]).sum())
               for (path, _), (var, before) in snapshot.items())


def _bits(variables):
    return [np.array(v.numpy()) for v in variables]


def _differing(a, b):
    return sum(int(changed_bits(x, y).sum()) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TASKS))
def test_fit_with_masks_keeps_every_frozen_bit_of_weights_and_slots(name):
    task, x, y = _make(name)
    opt = MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1, clipnorm=1.0))
    task.compile(optimizer=opt)
    _fit(task, x, y)  # unmasked first: every moment is non-zero when the masks come
    masks = _half_masks(opt, task.trainable_variables)
    snapshot = _snapshot(opt, task.trainable_variables)
    _fit(task, x, y, epochs=2)
    assert _frozen_moved(snapshot, masks) == 0
    trained = sum(int((changed_bits(b, v.numpy()) & masks[p]).sum()) for (p, s), (v, b) in snapshot.items()
                  if s == "value")
    assert trained > 0.5 * sum(int(m.sum()) for m in masks.values())  # the trainable entries did train


@pytest.mark.slow
def test_the_frozen_check_sees_drift_when_nothing_holds():
    """The check above can fail: the same run with policy='none' (a stop_gradient mask) moves frozen entries."""
    task, x, y = _make("bert")
    opt = MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1), policy="none")
    task.compile(optimizer=opt)
    _fit(task, x, y)
    masks = _half_masks(opt, task.trainable_variables)
    snapshot = _snapshot(opt, task.trainable_variables)
    _fit(task, x, y)
    assert _frozen_moved(snapshot, masks) > 1000


@pytest.mark.slow
def test_masks_on_lora_factors_hold_and_resume_from_a_checkpoint(tmp_path):
    """LoRA after enable_lora: half of each factor frozen; a tf.train.Checkpoint resumes the job bit for bit."""

    def lora_task():
        task, x, y = _make("gpt2")
        task.backbone.enable_lora(2)
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
        task.compile(optimizer=opt)
        opt.build(task.trainable_variables)
        return task, opt, x, y

    task, opt, x, y = lora_task()
    factors = [v for v in task.trainable_variables if "lora_kernel" in v.path]
    assert len(factors) == 4  # query and value of the one layer, a and b each
    masks = _half_masks(opt, factors)
    # lora_kernel_b starts at zero, so lora_kernel_a's gradient is zero until b moves: train twice.
    _fit(task, x, y, epochs=2)
    snapshot = _snapshot(opt, factors)
    _fit(task, x, y, epochs=2)
    assert _frozen_moved(snapshot, masks) == 0
    assert all(changed_bits(b, v.numpy())[masks[p]].any() for (p, s), (v, b) in snapshot.items() if s == "value")

    checkpoint = tf.train.Checkpoint(model=task, optimizer=opt).save(str(tmp_path / "ckpt"))
    _fit(task, x, y)
    reference = _bits(task.trainable_variables)

    resumed, resumed_opt, _, _ = lora_task()
    tf.train.Checkpoint(model=resumed, optimizer=resumed_opt).restore(checkpoint).assert_consumed()
    assert all(np.array_equal(resumed_opt.get_mask(path), keep) for path, keep in masks.items())
    _fit(resumed, x, y)
    assert _differing(reference, _bits(resumed.trainable_variables)) == 0


@pytest.mark.slow
def test_mixed_float16_fit_holds_frozen_bits_and_resumes_after_save_and_load(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    try:
        task, x, y = _make("vit")
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
        task.compile(optimizer=opt)
        assert isinstance(task.optimizer, keras.optimizers.LossScaleOptimizer)
        assert task.optimizer.inner_optimizer is opt
        opt.build(task.trainable_variables)
        masks = _half_masks(opt, task.trainable_variables)
        snapshot = _snapshot(opt, task.trainable_variables)
        _fit(task, x, y, epochs=2)
        assert _frozen_moved(snapshot, masks) == 0
        _resumes_after_save_and_load(task, opt, x, y, tmp_path / "vit16.keras")
    finally:
        keras.config.set_dtype_policy("float32")


def _resumes_after_save_and_load(task, opt, x, y, path):
    """Save, train on (the reference); load with freezing.load_model, train the same: every bit equal."""
    task.save(path)
    _fit(task, x, y)
    reference = _bits(task.trainable_variables)

    loaded = freezing.load_model(path)
    inner = loaded.optimizer
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        inner = inner.inner_optimizer
    assert isinstance(inner, MaskedOptimizer)
    assert type(inner.inner) is type(opt.inner)
    assert int(inner.iterations.numpy()) == int(opt.iterations.numpy()) - 2  # saved before the last 2 steps
    for v, w in zip(task.trainable_variables, loaded.trainable_variables):
        saved, restored = opt.get_mask(v), inner.get_mask(w)
        assert (saved is None) == (restored is None) and (saved is None or np.array_equal(saved, restored))
    _fit(loaded, x, y)
    assert _differing(reference, _bits(loaded.trainable_variables)) == 0


def test_keras_hub_task_resumes_after_save_and_load_model(tmp_path):
    """The quick one: BERT, masks and Adam state through task.save and freezing.load_model, bit for bit.

    Eager steps (``run_eagerly``, saved with the compile arguments) keep it quick; the slow tests run graphs."""
    task, x, y = _make("bert")
    opt = MaskedOptimizer(keras.optimizers.AdamW(1e-2, weight_decay=0.1))
    task.compile(optimizer=opt, run_eagerly=True)
    opt.build(task.trainable_variables)
    _half_masks(opt, task.trainable_variables)
    _fit(task, x, y)
    _resumes_after_save_and_load(task, opt, x, y, tmp_path / "bert.keras")

    # What freezing.load_model is for: Keras' own loading gives the task its default optimizer back. When
    # this fails, keras-hub restores compile itself and the README's advice can say so.
    with pytest.warns(UserWarning, match="was not called as part of model loading"):
        plain = keras.saving.load_model(tmp_path / "bert.keras")
    assert not isinstance(plain.optimizer, MaskedOptimizer)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "vit"])
def test_other_tasks_resume_after_save_and_load_model(name, tmp_path):
    task, x, y = _make(name)
    opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
    task.compile(optimizer=opt)
    opt.build(task.trainable_variables)
    _half_masks(opt, task.trainable_variables)
    _fit(task, x, y)
    _resumes_after_save_and_load(task, opt, x, y, tmp_path / f"{name}.keras")


@pytest.mark.slow
def test_load_model_refuses_a_lora_task_whose_factors_were_merged(tmp_path):
    """.keras saving merges LoRA factors into the kernels: the saved state fits no variable; refused, by name."""
    task, x, y = _make("gpt2")
    task.backbone.enable_lora(2)
    opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
    task.compile(optimizer=opt)
    opt.build(task.trainable_variables)
    _half_masks(opt, task.trainable_variables)
    _fit(task, x, y)
    task.save(tmp_path / "lora.keras")
    with pytest.raises(ValueError, match="enable_lora.*tf.train.Checkpoint"):
        freezing.load_model(tmp_path / "lora.keras")


def test_keras_hub_is_installed_next_to_one_tensorflow():
    """requirements-keras-hub.txt: keras-hub at its pin, no tensorflow-text, one TensorFlow distribution."""
    pins = dict(line.split("==") for line in (REPO / "requirements-keras-hub.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, name
    installed = set()
    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly"):
        try:
            importlib.metadata.version(name)
            installed.add(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    assert len(installed) == 1, installed
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("tensorflow-text")


def test_skip_frozen_on_a_task_with_its_backbone_frozen_differentiates_only_the_head():
    task, x, y = _bert()
    opt = MaskedOptimizer(keras.optimizers.Adam(1e-2))
    task.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    opt.build(task.trainable_variables)
    backbone = {v.path for v in task.backbone.trainable_weights}
    for v in task.backbone.trainable_weights:
        opt.set_mask(v, False)
    traced = []
    step = type(task).train_step

    def counted(data):
        traced.append({v.path for v in task.trainable_weights})
        return step(task, data)
    task.train_step = counted
    before = {v.path: v.numpy().copy() for v in task.weights}
    task.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[freezing.SkipFrozen()])
    assert len(traced) == 1 and traced[0] and not traced[0] & backbone  # the head only
    assert all(v.numpy().tobytes() == before[v.path].tobytes() for v in task.backbone.weights)
    assert any((v.numpy() != before[v.path]).any() for v in task.trainable_weights if v.path not in backbone)
    assert int(opt.iterations) == 4 and all(v.trainable for v in task.backbone.weights)
    for v in task.backbone.trainable_weights:  # unfrozen: the backbone trains from its kept state
        opt.clear_mask(v)
    task.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[freezing.SkipFrozen()])
    assert len(traced) == 2 and backbone <= traced[1]
    assert any((v.numpy() != before[v.path]).any() for v in task.backbone.trainable_weights)
