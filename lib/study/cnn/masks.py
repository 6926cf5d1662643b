"""Study 02, parts 2 and 3: masks that change every step (a random per-element mask, block-coordinate
training), the naive stop-gradient mask against ``MaskedOptimizer`` ``hold`` and ``reset``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import frozen_change
from freezing.masked_optimizer import MaskedOptimizer
from freezing.selection import variable_path
from study.cnn.setup import _POLICY, BLOCKS, CnnStudyConfig, _init_weights, _start_run
from study.data import MnistSplits
from study.models import deep_mnist_cnn
from study.optimizers import make_optimizer
from study.training import LOSS, accuracy, batch_indices, digest, restore, snapshot

# -- 2 and 3. masks that change every step -----------------------------------------------------------
STEP_COLUMNS = {
    "experiment": "masks (random per-element masks) or blocks (one layer at a time)",
    "optimizer": "optimizer wrapped by MaskedOptimizer",
    "method": "naive (policy 'none': gradients masked, optimizer state not), hold or reset",
    "seed": "training seed of the run (weights, batches, dropout, masks)",
    "p": "fraction of entries trainable in each step (masks only)",
    "step": "training step, counted from 1",
    "loss": "training cross-entropy of this step's batch (nats per example)",
    "frozen_entries": "entries frozen in this step (count)",
    "frozen_changed": "entries frozen in this step whose bits changed during it (count)",
    "frozen_max_abs_delta": "max |ΔW| over the entries frozen in this step, during it (weight units)",
    "step_time_ms": "wall time of this step, in-graph audit included (ms); step 1 includes tracing",
    "accuracy": "test accuracy on the first eval_samples test images after this step (fraction, 0-1); "
                "empty between evaluations",
    "weights_digest": "fingerprint of the model's weights after the run's last step (training.digest: equal digests, "
                      "bit-identical weights); empty before it",
}


def _masked_step(model: keras.Model, opt: MaskedOptimizer, masks_for: Callable) -> Callable:
    variables = model.trainable_variables

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor, step: tf.Tensor, p: tf.Tensor, seed: tf.Tensor) -> tuple:
        keeps = masks_for(variables, step, p, seed)
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        before = [tf.identity(v) for v in variables]
        opt.apply_gradients(zip(grads, variables), trainable_masks=keeps)
        frozen = [tf.broadcast_to(~k, tf.shape(v)) for k, v in zip(keeps, variables)]
        changed, max_abs, _ = zip(*[frozen_change(b, tf.convert_to_tensor(v), f)
                                    for b, v, f in zip(before, variables, frozen)])
        count = tf.add_n([tf.reduce_sum(tf.cast(f, tf.int64)) for f in frozen])
        return loss, count, tf.add_n(changed), tf.reduce_max(tf.stack(max_abs))

    return step


def random_masks(variables: Sequence[Any], step: tf.Tensor, p: tf.Tensor, seed: tf.Tensor) -> list[tf.Tensor]:
    """A fresh per-element mask for every variable, a fraction ``p`` True;
    same for the same (seed, step). ``random_masks(vs, 3, .5, 0)``"""
    base = tf.cast(step, tf.int64) * len(variables)
    return [tf.random.stateless_uniform(tf.shape(v), seed=tf.stack([tf.cast(seed, tf.int64), base + i])) < p
            for i, v in enumerate(variables)]


def block_masks(every: int) -> Callable:
    """Scalar masks that train one of conv1, conv2, fc1, fc2 at a
    time, switching every ``every`` steps. ``block_masks(10)``"""

    def masks_for(variables: Sequence[Any], step: tf.Tensor, p: tf.Tensor, seed: tf.Tensor) -> list[tf.Tensor]:
        active = (tf.cast(step, tf.int64) // every) % len(BLOCKS)
        return [tf.equal(active, _block_of(v)) for v in variables]

    return masks_for


def _block_of(variable: Any) -> int:
    path = variable_path(variable)
    for i, block in enumerate(BLOCKS):
        if f"/{block}/" in f"/{path}":
            return i
    raise ValueError(f"block_masks: variable {path!r} is in none of the blocks {BLOCKS}")


def run_keys(table: pd.DataFrame) -> list[str]:
    """The columns that identify one training run of a steps table (``p`` only where the study has it)."""
    return [c for c in ("optimizer", "method", "seed", "p") if c in table.columns]


def _masked_runs(config: CnnStudyConfig, data: MnistSplits, *, experiment: str, optimizers: Sequence[str],
                 masks_for: Callable, p_values: Sequence[float] | None, steps: int, progress: bool) -> pd.DataFrame:
    """Train from scratch under changing masks; one row per step of every optimizer x method x seed (x p)."""
    eval_x, eval_y = data.x_test[: config.eval_samples], data.y_test[: config.eval_samples]
    inits = {seed: _init_weights(seed) for seed in config.seeds}
    ps = p_values if p_values is not None else [None]
    runs: dict[tuple, list[dict]] = {}  # per (optimizer, method, seed, p): its rows
    for name in optimizers:
        built = {}  # per method: its model, optimizer, the optimizer's initial state and its traced step
        for method in config.mask_methods:
            model = deep_mnist_cnn()
            opt = MaskedOptimizer(make_optimizer(name, config.learning_rates[name]), _POLICY[method])
            opt.build(model.trainable_variables)
            built[method] = (model, opt, snapshot(opt.variables), _masked_step(model, opt, masks_for))
        for seed in config.seeds:  # the methods interleaved: at each (seed, p) one run of each, back to back, so
            for p in ps:  # their step times are paired
                for method, (model, opt, opt_init, step_fn) in built.items():
                    rows = runs[name, method, seed, p] = []
                    _start_run(seed, model)
                    model.set_weights(inits[seed])
                    restore(opt.variables, opt_init)
                    run = {"experiment": experiment, "optimizer": name, "method": method, "seed": seed}
                    if p is not None:
                        run["p"] = p
                    for k, idx in enumerate(batch_indices(len(data.y_train), config.batch, steps, seed)):
                        start = time.perf_counter()
                        loss, frozen, changed, max_abs = step_fn(
                            data.x_train[idx], data.y_train[idx], tf.constant(k, tf.int64),
                            tf.constant(0.0 if p is None else p, tf.float32), tf.constant(seed, tf.int64))
                        row = {**run, "step": k + 1, "loss": float(loss), "frozen_entries": int(frozen),
                               "frozen_changed": int(changed), "frozen_max_abs_delta": float(max_abs),
                               "step_time_ms": 1e3 * (time.perf_counter() - start), "accuracy": np.nan}
                        if (k + 1) % config.eval_every == 0 or k + 1 == steps:
                            row["accuracy"] = accuracy(model, eval_x, eval_y)
                        row["weights_digest"] = digest(model.weights) if k + 1 == steps else ""
                        rows.append(row)
        if progress:  # per method, and per p where there is one: an average over p would mean nothing
            for method in built:
                done = pd.DataFrame([r for sd in config.seeds for p in ps for r in runs[name, method, sd, p]])
                per_run = done.groupby(run_keys(done), dropna=False).agg(accuracy=("accuracy", "last"),
                                                                         changed=("frozen_changed", "sum"))
                parts = per_run.groupby(level="p") if "p" in done.columns else [(None, per_run)]
                print(f"{experiment}: {name:<9} {method:<6} " + "; ".join(
                    (f"p={p:g}: " if p is not None else "") + f"final accuracy {g['accuracy'].mean():.3f}, "
                    f"frozen entries changed {g['changed'].mean():,.0f}" for p, g in parts)
                    + f"  (per run, summed over {steps} steps; means over {len(config.seeds)} seeds)", flush=True)
    return pd.DataFrame([r for name in optimizers for method in config.mask_methods for seed in config.seeds
                         for p in ps for r in runs[name, method, seed, p]])  # the table's order: as run before


def mask_study(config: CnnStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Random per-element masks, a fraction p trainable, redrawn every step. ``mask_study(cfg, data)``"""
    return _masked_runs(config, data, experiment="masks", optimizers=config.mask_optimizers, masks_for=random_masks,
                        p_values=config.p_values, steps=config.mask_steps, progress=progress)


def block_study(config: CnnStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Block-coordinate training: one layer at a time, switching every ``block_every`` steps. ``block_study(cfg, data)``

    The table has no ``p`` column: a block's entries are all trainable or all frozen.
    """
    return _masked_runs(config, data, experiment="blocks", optimizers=config.block_optimizers,
                        masks_for=block_masks(config.block_every), p_values=None,
                        steps=config.block_steps, progress=progress)
