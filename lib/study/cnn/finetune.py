"""Study 02, part 1: fine-tuning the Deep MNIST CNN with frozen feature layers, five ways; and the
``trainable`` traps of Keras."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import changed_bits
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.selection import select_variables
from freezing.skipping import SkipFrozen
from study.cnn.setup import CnnStudyConfig, _batches, _init_weights, _start_run
from study.data import MnistSplits
from study.models import deep_mnist_cnn
from study.optimizers import make_optimizer
from study.training import LOSS, StepTimer, accuracy, batch_indices, digest, forward, median_ms, restore, snapshot

# -- 1. fine-tuning with frozen feature layers -----------------------------------------------------
FINETUNE_RUN_COLUMNS = {
    "optimizer": "optimizer used for pretraining and fine-tuning (its state carries over)",
    "seed": "training seed of the run (weights, batches, dropout)",
    "pretrain_acc_old": "test accuracy on digits 0-4 after pretraining on them (fraction of the first eval_samples "
                        "test images of 0-4, 0-1)",
    "method": "how conv1/conv2 were frozen during fine-tuning",
    "acc_new": "test accuracy on digits 5-9 after fine-tuning (fraction of the first eval_samples test images "
               "of 5-9, 0-1)",
    "acc_old": "test accuracy on digits 0-4 after fine-tuning (fraction of the first eval_samples test images "
               "of 0-4, 0-1); the shared 10-way head forgets them",
    "conv_max_abs_delta": "max |ΔW| over conv1/conv2 entries, fine-tuned vs pretrained weights (weight units)",
    "conv_changed_entries": "conv1/conv2 entries whose bits differ from the pretrained weights at the end (count)",
    "weights_digest": "fingerprint of every weight of the model at the end (training.digest: equal digests, "
                      "bit-identical weights)",
    "step_time_ms": "median wall time of one fine-tuning step, first (tracing) step left out (ms)",
}


def _finetune_step(model: keras.Model, opt: keras.optimizers.Optimizer, method: str) -> Callable:
    conv = select_variables(model, pattern=r"/conv\d/")
    fc = select_variables(model, pattern=r"/fc\d/")
    variables = model.trainable_variables
    masked = MaskedOptimizer(opt, "hold") if method == "masked_hold" else None
    if masked is not None:
        masked.build(variables)
    masks = [0.0 if any(v is c for c in conv) else None for v in variables]

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            if method == "var_list":
                loss = LOSS(y, forward(model, x, training=True))
            else:  # gate and masked_hold: the features' gradient is zero, not None
                loss = LOSS(y, forward(model, x, training=True, feature_keep=0.0))
        if method == "var_list":
            opt.apply_gradients(zip(tape.gradient(loss, fc), fc))
        else:
            grads = tape.gradient(loss, variables)
            if masked is not None:
                masked.apply_gradients(zip(grads, variables), trainable_masks=masks)
            else:
                opt.apply_gradients(zip(grads, variables))
        return loss

    return step


def _conv_drift(model: keras.Model, before: Sequence[np.ndarray]) -> tuple[float, int]:
    after = snapshot(select_variables(model, pattern=r"/conv\d/", trainable_only=False))
    drift = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(after, before))
    changed = sum(int(changed_bits(b, a).sum()) for a, b in zip(after, before))
    return drift, changed


def finetune_study(config: CnnStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Pretrain on 0-4, freeze conv1/conv2, fine-tune on 5-9; one row per optimizer x method x seed.
    ``finetune_study(cfg, data)``

    Every method of one (optimizer, seed) starts from the same pretrained weights and optimizer state and
    sees the same batches and dropout masks; columns as ``FINETUNE_RUN_COLUMNS``.
    """
    old, new = data.y_train < 5, data.y_train >= 5
    n = config.eval_samples  # test images of each half; 500 is all of them with the 5,000 bundled digits
    test_old = data.x_test[data.y_test < 5][:n], data.y_test[data.y_test < 5][:n]
    test_new = data.x_test[data.y_test >= 5][:n], data.y_test[data.y_test >= 5][:n]
    xs, ys = data.x_train[new], data.y_train[new]
    rows = []
    for name in config.finetune_optimizers:
        # One model and optimizer per role, traced once and reset for every seed (tracing dominates short runs).
        lr = config.learning_rates[name]
        work = deep_mnist_cnn()
        work_opt = make_optimizer(name, lr)
        work_opt.build(work.trainable_variables)
        custom = [m for m in config.finetune_methods if m in ("var_list", "gate", "masked_hold")]  # custom loops
        steps = {m: _finetune_step(work, work_opt, m) for m in custom}
        pre, pre_opt = deep_mnist_cnn(), make_optimizer(name, lr)
        pre_opt.build(pre.trainable_variables)
        pre_opt_init = snapshot(pre_opt.variables)
        pre.compile(pre_opt, loss=LOSS)
        clone, clone_opt = deep_mnist_cnn(), make_optimizer(name, lr)
        clone_opt.build(clone.trainable_variables)
        for layer in ("conv1", "conv2"):
            clone.get_layer(layer).trainable = False
        clone.compile(clone_opt, loss=LOSS)  # recompiled after freezing: the documented way
        if "masked_skip" in config.finetune_methods:  # masks freeze conv1/conv2 whole; SkipFrozen skips their gradient
            skip, skip_inner = deep_mnist_cnn(), make_optimizer(name, lr)
            skip_opt = MaskedOptimizer(skip_inner, "hold")
            skip.compile(skip_opt, loss=LOSS)
            skip_opt.build(skip.trainable_variables)
            for v in select_variables(skip, pattern=r"/conv\d/"):
                skip_opt.set_mask(v, False)
        for seed in config.seeds:
            init = _init_weights(seed)
            _start_run(seed, pre)
            for layer in ("conv1", "conv2"):
                pre.get_layer(layer).trainable = True
            pre.set_weights(init)
            restore(pre_opt.variables, pre_opt_init)
            pre.fit(_batches(data.x_train[old], data.y_train[old], config.batch, config.pretrain_steps, seed),
                    steps_per_epoch=config.pretrain_steps, epochs=1, verbose=0, shuffle=False)
            weights, opt_state = pre.get_weights(), snapshot(pre_opt.variables)
            conv0 = snapshot(select_variables(pre, pattern=r"/conv\d/", trainable_only=False))
            base = {"optimizer": name, "seed": seed,
                    "pretrain_acc_old": accuracy(pre, *test_old)}

            def record(method: str, model: keras.Model, times: Sequence[float]) -> None:
                drift, changed = _conv_drift(model, conv0)
                rows.append({**base, "method": method,
                             "acc_new": accuracy(model, *test_new), "acc_old": accuracy(model, *test_old),
                             "conv_max_abs_delta": drift, "conv_changed_entries": changed,
                             "weights_digest": digest(model.weights), "step_time_ms": median_ms(times)})

            for method in custom:
                _start_run(seed, work)
                work.set_weights(weights)
                restore(work_opt.variables, opt_state)
                times = []
                for idx in batch_indices(len(ys), config.batch, config.finetune_steps, seed):
                    start = time.perf_counter()
                    steps[method](xs[idx], ys[idx]).numpy()
                    times.append(time.perf_counter() - start)
                record(method, work, times)
            if "trainable_recompile" in config.finetune_methods:
                _start_run(seed, clone)
                clone.set_weights(weights)
                restore(clone_opt.variables, opt_state)
                timer = StepTimer()
                clone.fit(_batches(xs, ys, config.batch, config.finetune_steps, seed),
                          steps_per_epoch=config.finetune_steps, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
                record("trainable_recompile", clone, timer.times)
            if "masked_skip" in config.finetune_methods:
                _start_run(seed, skip)
                skip.set_weights(weights)
                restore(skip_inner.variables, opt_state)  # the pretrained state; the masks stay as set
                timer = StepTimer()
                skip.fit(_batches(xs, ys, config.batch, config.finetune_steps, seed),
                         steps_per_epoch=config.finetune_steps, epochs=1, verbose=0, shuffle=False,
                         callbacks=[SkipFrozen(), timer])
                record("masked_skip", skip, timer.times)
            if "trainable_no_recompile" in config.finetune_methods:
                _start_run(seed, pre)
                for layer in ("conv1", "conv2"):
                    pre.get_layer(layer).trainable = False  # the trap: fit() keeps its traced train step
                timer = StepTimer()
                pre.fit(_batches(xs, ys, config.batch, config.finetune_steps, seed),
                        steps_per_epoch=config.finetune_steps, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
                record("trainable_no_recompile", pre, timer.times)
        if progress:
            done = pd.DataFrame(rows).query("optimizer == @name")
            changed = done.groupby("method", sort=False)["conv_changed_entries"].agg(["min", "max"])
            print(f"fine-tune: {name:<9} conv entries changed (range over {len(config.seeds)} seeds): "
                  + ", ".join(f"{m} {lo:,.0f}" if lo == hi else f"{m} {lo:,.0f}–{hi:,.0f}"
                              for m, (lo, hi) in changed.iterrows()), flush=True)
    return pd.DataFrame(rows)


TRAP_COLUMNS = {
    "scenario": "what was done to layer 'a' of a two-layer Dense model, in order",
    "layer 'a' should": "what a user means by it: stay (frozen) or train",
    "layer 'a' moved by": "max |ΔW| of layer a's kernel over one fit epoch (weight units; empty if fit raised)",
    "trained": "whether layer a's kernel changed (empty if fit raised)",
    "error": "the first two sentences of the error fit raised, if any (a variable's repr shortened to its path)",
}


def keras_trainable_traps(seed: int = 0) -> pd.DataFrame:
    """What Keras 3 does with ``layer.trainable`` around ``compile``/``fit``, observed. ``keras_trainable_traps()``"""
    enable_determinism(seed)
    rng = np.random.default_rng(seed)
    x, y = rng.random((64, 4)).astype(np.float32), rng.integers(0, 2, 64)

    def model() -> keras.Model:
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"), keras.layers.Dense(2, name="b")])

    def moved(m: keras.Model) -> float:
        before = m.get_layer("a").kernel.numpy().copy()
        m.fit(x, y, epochs=1, verbose=0)
        return float(np.abs(m.get_layer("a").kernel.numpy() - before).max())

    rows = []

    def observe(scenario: str, intent: str, run: Callable[[], float]) -> None:
        try:
            drift, error = run(), ""
        except ValueError as e:  # the message's variable repr (values and all) shortened to its path
            text = re.sub(r"<Variable path=([^,>]+)[^>]*>", r"\1", str(e), flags=re.S)
            drift, error = float("nan"), ". ".join(text.split(". ")[:2]).rstrip(".") + "."
        trained = bool(drift > 0) if drift == drift else None
        rows.append({"scenario": scenario, "layer 'a' should": intent, "layer 'a' moved by": drift,
                     "trained": trained, "error": error})

    m, opt = model(), keras.optimizers.Adam(0.01)
    m.compile(opt, LOSS)
    m.fit(x, y, epochs=1, verbose=0)
    m.get_layer("a").trainable = False
    observe("fit, then trainable=False, fit again (no recompile)", "stay", lambda: moved(m))
    m.compile(opt, LOSS)
    observe("... then compile again, fit", "stay", lambda: moved(m))
    m.get_layer("a").trainable = True
    observe("... then trainable=True, fit (no recompile)", "train", lambda: moved(m))
    m2, opt2 = model(), keras.optimizers.Adam(0.01)
    m2.get_layer("a").trainable = False
    m2.compile(opt2, LOSS)
    m2.fit(x, y, epochs=1, verbose=0)
    m2.get_layer("a").trainable = True

    def recompile_same_optimizer() -> float:
        m2.compile(opt2, LOSS)
        return moved(m2)

    observe("frozen from the start, then unfrozen and recompiled with the same optimizer", "train",
            recompile_same_optimizer)
    return pd.DataFrame(rows)
