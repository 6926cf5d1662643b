"""Child process for tests/test_masked_optimizer_distribute.py: MaskedOptimizer under tf.distribute.

``python tests/distribute_child.py mirrored OUT.json``: two logical CPU devices (set before TensorFlow
starts, hence a child process), every MirroredStrategy check, results as JSON.
``python tests/distribute_child.py worker OUT.json`` (with ``TF_CONFIG``): one worker of a
two-process MultiWorkerMirroredStrategy: a custom loop with per-call and stored masks, then plain
Keras ``fit`` (which fails upstream, keras#20585).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if __name__ == "__main__" and sys.argv[1:2] == ["mirrored"]:  # only as a child; pytest imports it for doctests
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from freezing import MaskedOptimizer, MaskSchedule, _keras_api, _write_path, diagnose, slots  # noqa: E402
from freezing._tuning import WriteTuning  # noqa: E402
from freezing.audit import changed_bits  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 4)).astype("float32")
Y = RNG.normal(size=(32, 2)).astype("float32")
KEEP = RNG.random((4, 6)) < 0.5


def model_and_optimizer(strategy, inner=lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1), seed=0, **kw):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, name="fc1"),
                                  keras.layers.Dense(2, name="fc2")])
        opt = MaskedOptimizer(inner(), **kw)
        model.compile(optimizer=opt, loss="mse")
    return model, opt


def replicas(variable) -> list[np.ndarray]:
    """Every replica's copy of a (mirrored) variable."""
    return [np.array(c.numpy()) for c in _keras_api.components(variable)]


def tensors(opt, variable) -> list:
    """The variable and its slots shaped like it."""
    out = [variable]
    out += [s for s in slots(opt, variable).values() if tuple(s.shape) == tuple(variable.shape)]
    return out


def snapshot(opt, variable) -> list[list[np.ndarray]]:
    return [replicas(t) for t in tensors(opt, variable)]


def frozen_changed(before, after, keep) -> int:
    """Frozen entries whose bits changed on any replica, over the variable and its slots."""
    n = 0
    for b_t, a_t in zip(before, after):
        for b, a in zip(b_t, a_t):
            n += int(np.count_nonzero(changed_bits(b, a) & ~np.broadcast_to(keep, b.shape)))
    return n


def fused_functions(variable) -> int:
    """The XLA-compiled masked writes the guard made for a variable, over its replicas' copies."""
    return sum(len(c.assign.fused) for c in _keras_api.components(variable) if hasattr(c.assign, "fused"))


def replicas_identical(opt, variable) -> bool:
    return all(all(r.tobytes() == reps[0].tobytes() for r in reps) for reps in snapshot(opt, variable))


def mirrored() -> dict:
    out = {}
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out["replicas"] = strategy.num_replicas_in_sync

    # 1. compile + fit with a stored mask, the masked writes as TensorFlow ops and as fused XLA passes
    for tag, dispatch, fused in (("", False, False), ("dispatch_", True, False), ("fused_", True, True)):
        _write_path.DEFAULT_TUNING = WriteTuning(  # every variable dispatches on its mode, or none; fused or not
            dispatch_above=1 if dispatch else 1 << 40, fuse_above=1 if fused else 1 << 40)
        model, opt = model_and_optimizer(strategy)
        kernel = model.get_layer("fc1").kernel
        opt.set_mask(kernel, KEEP)
        model.fit(X, Y, epochs=1, batch_size=8, verbose=0, shuffle=False)  # state to drift with
        before = snapshot(opt, kernel)
        model.fit(X, Y, epochs=2, batch_size=8, verbose=0, shuffle=False)
        after = snapshot(opt, kernel)
        out[f"{tag}fit_frozen_changed"] = frozen_changed(before, after, KEEP)
        out[f"{tag}fit_trainable_moved"] = bool(np.all(after[0][0][KEEP] != before[0][0][KEEP]))
        out[f"{tag}fit_replicas_identical"] = replicas_identical(opt, kernel)
        out[f"{tag}fit_functions"] = fused_functions(kernel)
        out[f"{tag}fit_bits"] = hashlib.sha256(after[0][0].tobytes()).hexdigest()
    _write_path.DEFAULT_TUNING = WriteTuning(dispatch_above=1)  # the rest: every variable dispatching on its mode
    out["fit_mirrored_variables"] = type(_keras_api.tf_variable(kernel)).__name__
    out["fit_copies_checked"] = len(replicas(kernel))  # every check below reads both replicas' copies

    # 1b. special values in frozen entries, copied and never recomputed: subnormals and -0.0 in the weights (finite:
    # the forward pass reads them), NaN and inf in the frozen entries of the slots; and a constraint applied by each
    # replica to its own copy, with its own mask
    model, opt = model_and_optimizer(strategy)
    with strategy.scope():
        opt.build(model.trainable_variables)
    kernel = model.get_layer("fc1").kernel
    kernel.constraint = keras.constraints.NonNeg()
    keep = np.ones((4, 6), bool)
    keep[:, :2] = False
    value = kernel.numpy()
    value[:, 0] = [1e-40, -1e-39, -0.0, 1e-45]
    kernel.assign(value)
    for slot in slots(opt, kernel).values():
        slot.assign(np.where(keep, slot.numpy(), np.array([np.nan, np.inf, -np.inf, 1e-40, -0.0, 2.0], np.float32)))
    opt.set_mask(kernel, keep)
    before = snapshot(opt, kernel)
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    after = snapshot(opt, kernel)
    out["special_frozen_changed"] = frozen_changed(before, after, keep)
    out["special_constraint_applied"] = bool(np.all(after[0][0][keep] >= 0))
    out["special_replicas_identical"] = replicas_identical(opt, kernel)

    # 2. set_mask from a callback between batches: a new mask every batch, no retrace
    traces = []

    def count(step, variable):  # runs in Python only while the step is traced
        traces.append(1)
        return None

    model, opt = model_and_optimizer(strategy, mask_fn=count)
    kernel = model.get_layer("fc1").kernel
    rng = np.random.default_rng(1)
    violations = []

    class FlipMasks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.keep = rng.random((4, 6)) < 0.5
            if batch % 3 == 2:
                self.keep[:] = False  # the wholly frozen mode
            opt.set_mask(kernel, self.keep)
            self.before = snapshot(opt, kernel)

        def on_train_batch_end(self, batch, logs=None):
            violations.append(frozen_changed(self.before, snapshot(opt, kernel), self.keep))

    model.fit(X, Y, epochs=2, batch_size=8, verbose=0, shuffle=False, callbacks=[FlipMasks()])
    out["callback_batches"] = len(violations)
    out["callback_frozen_changed"] = int(sum(violations))
    out["callback_traces"] = len(traces)
    out["callback_replicas_identical"] = replicas_identical(opt, kernel)

    # 3. MaskSchedule: fc1 frozen in epochs 1-2, trains again in epoch 3
    model, opt = model_and_optimizer(strategy)
    fc1 = model.get_layer("fc1")
    seen = {}

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen[epoch] = snapshot(opt, fc1.kernel)

    model.fit(X, Y, epochs=4, batch_size=8, verbose=0, shuffle=False,
              callbacks=[MaskSchedule({0: {fc1: True}, 1: {fc1: False}, 3: {fc1: None}}), Record()])
    out["schedule_frozen_changed"] = frozen_changed(seen[0], seen[2], np.zeros((4, 6), bool))
    out["schedule_trains_again"] = bool(np.any(seen[3][0][0] != seen[2][0][0]))
    out["schedule_replicas_identical"] = replicas_identical(opt, fc1.kernel)

    # 4. .keras save and load inside the scope, then fit on
    model, opt = model_and_optimizer(strategy)
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    with strategy.scope():
        model.save(path)
        loaded = keras.saving.load_model(path)
    lopt, lkernel = loaded.optimizer, loaded.get_layer("fc1").kernel
    out["load_is_masked"] = type(lopt).__name__
    out["load_mask_equal"] = bool(np.array_equal(lopt.get_mask(lkernel), KEEP))
    out["load_state_equal"] = all(a.numpy().tobytes() == b.numpy().tobytes()
                                  for a, b in zip(opt.variables, lopt.variables))
    before = snapshot(lopt, lkernel)
    loaded.fit(X, Y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    out["load_frozen_changed"] = frozen_changed(before, snapshot(lopt, lkernel), KEEP)
    out["load_replicas_identical"] = replicas_identical(lopt, lkernel)
    out["load_variables_mirrored"] = type(_keras_api.tf_variable(lkernel)).__name__

    # 5. a custom loop: strategy.run with per-call masks
    model, opt = model_and_optimizer(strategy)
    with strategy.scope():
        opt.build(model.trainable_variables)
    kernel = model.get_layer("fc1").kernel
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((X, Y)).batch(8))

    @tf.function
    def step(x, y, keep):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((model(x) - y) ** 2) / 8.0
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables), trainable_masks=[keep])
        strategy.run(replica, args=(x, y))

    changed = 0
    for i, (x, y) in enumerate(data):
        keep = np.random.default_rng(10 + i).random((4, 6)) < 0.5
        before = snapshot(opt, kernel)
        step(x, y, tf.constant(keep))
        changed += frozen_changed(before, snapshot(opt, kernel), keep)
    out["loop_frozen_changed"] = changed
    out["loop_traces"] = step.experimental_get_tracing_count()
    out["loop_replicas_identical"] = replicas_identical(opt, kernel)

    # 5b. the same loop run eagerly (the snapshot-and-select construction), with the replica ids a second worker of a
    # MultiWorkerMirroredStrategy with two devices per worker sees (2 and 3: global, while it holds two copies)
    model, opt = model_and_optimizer(strategy)
    with strategy.scope():
        opt.build(model.trainable_variables)
    kernel = model.get_layer("fc1").kernel
    real_replica_id = _keras_api.replica_id
    _keras_api.replica_id = lambda: real_replica_id() + 2
    changed = 0
    try:
        for i, (x, y) in enumerate(data):
            keep = np.random.default_rng(20 + i).random((4, 6)) < 0.5

            def replica(x, y, keep=keep):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum((model(x) - y) ** 2) / 8.0
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables), trainable_masks=[keep])

            before = snapshot(opt, kernel)
            strategy.run(replica, args=(x, y))
            changed += frozen_changed(before, snapshot(opt, kernel), keep)
        out["eager_global_ids_error"] = None
    except Exception as e:  # noqa: BLE001 - recorded for the test to show
        out["eager_global_ids_error"] = f"{type(e).__name__}: {e}"
    finally:
        _keras_api.replica_id = real_replica_id
    out["eager_global_ids_frozen_changed"] = changed
    out["eager_global_ids_replicas_identical"] = replicas_identical(opt, kernel)

    # 6. bits against the single-device run: one device equal; two devices sum two half-batch gradients
    def trained(strategy):
        model, opt = model_and_optimizer(strategy, seed=3)
        opt.set_mask(model.get_layer("fc1").kernel, KEEP)
        model.fit(X, Y, epochs=2, batch_size=8, verbose=0, shuffle=False)
        return np.concatenate([replicas(w)[0].ravel() for w in model.weights])

    single = trained(tf.distribute.get_strategy())
    one = trained(tf.distribute.MirroredStrategy(["/cpu:0"]))
    two = trained(strategy)
    out["one_device_bits_equal_single"] = single.tobytes() == one.tobytes()
    out["two_devices_bits_equal_single"] = single.tobytes() == two.tobytes()
    out["two_devices_max_abs_diff"] = float(np.max(np.abs(single - two)))

    # 7. diagnose on a model built under the strategy
    model, opt = model_and_optimizer(strategy, inner=lambda: keras.optimizers.Adam(0.05))
    kernel = model.get_layer("fc1").kernel
    opt.set_mask(kernel, KEEP)
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)
    out["diagnose_masked_frozen"] = [(r.cause, r.entries) for r in diagnose(model, masks={kernel.path: KEEP})]
    out["diagnose_unmasked"] = sorted({r.cause
                                       for r in diagnose(model, masks={model.get_layer("fc2").kernel.path: False})})

    # 8. what is refused, and where
    refusals = {}
    for name, make in (
        ("ema", lambda: model_and_optimizer(strategy, inner=lambda: keras.optimizers.Adam(use_ema=True))),
        ("accumulation", lambda: model_and_optimizer(
            strategy, inner=lambda: keras.optimizers.Adam(gradient_accumulation_steps=2))),
        ("sparse", lambda: model_and_optimizer(strategy, state="sparse")),
    ):
        try:
            m, o = make()
            before = [w.numpy().copy() for w in m.weights]
            m.fit(X, Y, epochs=1, batch_size=8, verbose=0)
            refusals[name] = "accepted"
        except ValueError as e:
            refusals[name] = str(e).splitlines()[0][:300]
    outside = MaskedOptimizer(keras.optimizers.Adam())
    with strategy.scope():
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        m.compile(optimizer=outside, loss="mse")
    before = [w.numpy().copy() for w in m.weights]
    try:
        m.fit(X, Y[:, :2], epochs=1, batch_size=8, verbose=0)
        refusals["outside_scope"] = "accepted"
    except ValueError as e:
        refusals["outside_scope"] = str(e).splitlines()[0][:300]
    refusals["outside_scope_unchanged"] = all(np.array_equal(a, w.numpy()) for a, w in zip(before, m.weights))
    out["refusals"] = refusals
    return out


def worker() -> dict:
    """One worker of a two-process MultiWorkerMirroredStrategy."""
    out = {}
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    out["task"], out["replicas"] = task, strategy.num_replicas_in_sync
    # every masked write as one fused XLA pass, in both processes, and every variable dispatching on its mode
    _write_path.DEFAULT_TUNING = WriteTuning(dispatch_above=1, fuse_above=1)
    model, opt = model_and_optimizer(strategy, inner=lambda: keras.optimizers.Adam(0.05))
    with strategy.scope():
        opt.build(model.trainable_variables)
    kernel, bias = model.get_layer("fc1").kernel, model.get_layer("fc2").bias
    opt.set_mask(bias, [True, False])  # a stored mask, next to the per-call masks on the kernel
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)  # the same data on both: shards by data
    data = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(x, y, keep):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((model(x) - y) ** 2) / 8.0
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables), trainable_masks=[keep])
        strategy.run(replica, args=(x, y))

    changed, bias_changed = 0, 0
    for _ in range(2):
        for i, (x, y) in enumerate(data):
            keep = np.random.default_rng(20 + i).random((4, 6)) < 0.5  # the same on both workers
            before, bias_before = snapshot(opt, kernel), snapshot(opt, bias)
            step(x, y, tf.constant(keep))
            changed += frozen_changed(before, snapshot(opt, kernel), keep)
            bias_changed += frozen_changed(bias_before, snapshot(opt, bias), np.array([True, False]))
    out["loop_frozen_changed"] = changed
    out["loop_stored_frozen_changed"] = bias_changed
    out["loop_fused_functions"] = fused_functions(kernel)
    out["loop_traces"] = step.experimental_get_tracing_count()
    out["loop_trained"] = bool(np.any(replicas(kernel)[0] != model_and_optimizer(
        tf.distribute.get_strategy(), inner=lambda: keras.optimizers.Adam(0.05))[0].get_layer("fc1").kernel.numpy()))
    out["weights_sha256"] = hashlib.sha256(b"".join(replicas(w)[0].tobytes() for w in model.weights)).hexdigest()
    out["slots_sha256"] = hashlib.sha256(b"".join(
        replicas(s)[0].tobytes() for v in model.trainable_variables for s in slots(opt, v).values())).hexdigest()

    # plain Keras fit, no MaskedOptimizer: fails upstream (keras#20585, tensorflow#72388)
    with strategy.scope():
        plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        plain.compile(optimizer=keras.optimizers.AdamW(0.05), loss="mse")
    before = [w.numpy().copy() for w in plain.weights]
    try:
        plain.fit(X, Y, epochs=1, batch_size=8, verbose=0)
        out["plain_fit"] = "works"
    except Exception as e:  # noqa: BLE001 - the upstream failure, recorded
        out["plain_fit"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    out["plain_fit_weights_unchanged"] = all(np.array_equal(a, w.numpy()) for a, w in zip(before, plain.weights))
    return out


if __name__ == "__main__":
    result = mirrored() if sys.argv[1] == "mirrored" else worker()
    with open(sys.argv[2], "w") as f:
        json.dump(result, f, default=str)
