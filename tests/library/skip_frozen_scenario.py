"""A staged fine-tuning run with and without ``freezing.SkipFrozen``, shared by the tests and their child processes.

``python tests/library/skip_frozen_scenario.py OUT.json``: the same run under ``MirroredStrategy`` over two
logical CPU devices (set before TensorFlow starts, hence a child process), results as JSON.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if __name__ == "__main__":  # only as a child; pytest imports it for the in-process runs
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import freezing  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 5)).astype("float32")
Y = RNG.normal(size=(64, 2)).astype("float32")
EDGE = np.array([1e-40, -0.0, 3e-39, -1e-45], "float32")  # subnormals and -0.0: copied, never recomputed


def build(strategy=None, jit: bool = False, inner=None, seed: int = 0, mixed: bool = False):
    """A three-layer MLP compiled with a MaskedOptimizer; fc1's kernel starts with subnormals and -0.0."""
    keras.utils.set_random_seed(seed)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        before = keras.config.dtype_policy()
        keras.config.set_dtype_policy("mixed_float16" if mixed else before)
        try:
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, name="fc1", activation="tanh"),
                                      keras.layers.Dense(6, name="fc2", activation="tanh"),
                                      keras.layers.Dense(2, name="out")])
        finally:
            keras.config.set_dtype_policy(before)
        kernel = model.get_layer("fc1").kernel
        kernel.assign(np.concatenate([EDGE, kernel.numpy().ravel()[4:]]).reshape(kernel.shape))
        opt = freezing.MaskedOptimizer(inner() if inner else keras.optimizers.Adam(0.01))
        model.compile(optimizer=opt, loss="mse", jit_compile=jit)
    return model, opt


class TraceCounter(keras.callbacks.Callback):
    """Counts the traces of ``train_step`` and the variables each
    trace differentiates (Python runs only when tracing)."""

    def __init__(self):
        super().__init__()
        self.traced: list[list[str]] = []

    def set_model(self, model):
        super().set_model(model)
        if getattr(model, "_counted", None) is self:
            return
        step = type(model).train_step

        def counted(data):
            self.traced.append([v.path.split("/", 1)[1] for v in model.trainable_weights])
            return step(model, data)
        model.train_step = counted
        model._counted = self


def stages(model) -> dict:
    fc1, fc2 = model.get_layer("fc1"), model.get_layer("fc2")
    return {1: {fc1: False, fc2: False}, 3: {fc2: None}, 5: {fc1: None}}


def run(skip: bool, strategy=None, jit: bool = False, epochs: int = 6, skip_first: bool = True,
        mixed: bool = False) -> dict:
    """Train everything for an epoch, then fc1 and fc2 frozen whole, then fc2 back, then fc1 back."""
    model, opt = build(strategy, jit, mixed=mixed)
    counter = TraceCounter()
    callbacks = [counter, freezing.MaskSchedule(stages(model))]
    if skip:
        callbacks.insert(1 if skip_first else 2, freezing.SkipFrozen())
    snapshots = {}

    class Snap(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            snapshots[epoch] = {v.path: v.numpy().copy() for v in model.weights}

    model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks + [Snap()])
    return {"model": model, "opt": opt, "traced": counter.traced, "snapshots": snapshots,
            "weights": {v.path: v.numpy() for v in model.weights},
            "state": {f"{i}:{getattr(v, 'path', v.name)}": v.numpy() for i, v in enumerate(opt.variables)},
            "flags": {v.path: bool(v.trainable) for v in model.weights}}


def _bits(d: dict) -> dict:
    return {k: np.asarray(v).tobytes().hex() for k, v in d.items()}


if __name__ == "__main__":
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {}
    for name, skip in (("False", False), ("True", True)):
        r = run(skip, strategy)
        frozen_moved = any((r["snapshots"][e][p] != r["snapshots"][0][p]).any() for e in (1, 2)
                           for p in r["snapshots"][0] if "fc1" in p)
        out[name] = {"traced": r["traced"], "weights": _bits(r["weights"]), "state": _bits(r["state"]),
                          "flags": r["flags"], "frozen_moved": bool(frozen_moved),
                          "iterations": int(r["opt"].iterations.numpy())}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
