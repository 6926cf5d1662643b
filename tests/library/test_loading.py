"""freezing.load_model on plain Keras models: one whose class overrides compile (as keras-hub tasks do), one that does
not.

No keras-hub here, so these run on the oldest Keras too; tests/library/test_keras_hub.py runs the tasks themselves.
"""

import keras
import numpy as np
import pytest

import freezing
from freezing import MaskedOptimizer
from freezing.audit import changed_bits


@keras.saving.register_keras_serializable(package="freezing_tests")
class CustomCompile(keras.Model):
    """Overrides compile to supply defaults, the way keras-hub tasks do."""

    def compile(self, optimizer="adam", loss="mse", **kwargs):
        super().compile(optimizer=optimizer, loss=loss, **kwargs)


def _model(cls):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3, name="out")(keras.layers.Dense(6, name="fc")(inputs))
    return cls(inputs, outputs)


def _data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 3)).astype("float32")


def _train(model, x, y):
    model.fit(x, y, epochs=1, batch_size=4, shuffle=False, verbose=0)


@pytest.mark.parametrize("cls", [CustomCompile, keras.Model], ids=["compile overridden", "plain Model"])
def test_load_model_resumes_the_job_bit_for_bit(cls, tmp_path):
    model = _model(cls)
    opt = MaskedOptimizer(keras.optimizers.AdamW(0.05, weight_decay=0.1))
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    rng = np.random.default_rng(2)
    masks = {v.path: rng.random(tuple(v.shape)) < 0.5 for v in model.trainable_variables}
    for v in model.trainable_variables:
        opt.set_mask(v, masks[v.path])
    x, y = _data()
    _train(model, x, y)
    model.save(tmp_path / "m.keras")
    _train(model, x, y)
    reference = [v.numpy() for v in model.trainable_variables]

    loaded = freezing.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, MaskedOptimizer)
    assert int(loaded.optimizer.iterations.numpy()) == 4
    before = [v.numpy() for v in loaded.trainable_variables]
    _train(loaded, x, y)
    for v, ref, old in zip(loaded.trainable_variables, reference, before):
        assert not changed_bits(ref, v.numpy()).any(), v.path
        assert not (changed_bits(old, v.numpy()) & ~masks[v.path]).any(), v.path


def test_keras_alone_loses_the_optimizer_of_a_model_that_overrides_compile(tmp_path):
    """What load_model is for. When this fails, Keras restores such models itself and the README can say so."""
    model = _model(CustomCompile)
    model.compile(optimizer=MaskedOptimizer("adam"))
    _train(model, *_data())
    model.save(tmp_path / "m.keras")
    with pytest.warns(UserWarning, match="was not called as part of model loading"):
        plain = keras.saving.load_model(tmp_path / "m.keras")
    assert not isinstance(getattr(plain, "optimizer", None), MaskedOptimizer)

