"""Study 02: freezing the Deep MNIST CNN with SGD, momentum, Adam and AdamW, measured on real digits.

1. ``finetune_study``: pretrain on digits 0-4, freeze ``conv1``/``conv2``, fine-tune ``fc1``/``fc2`` on
   digits 5-9 with the same optimizer (its state carries over, as when a run is frozen midway). Methods:
   a ``var_list`` by scope, ``trainable=False`` with and without recompiling (Keras' trap), a ``gate``
   on the features, and ``MaskedOptimizer(hold)``.
2. ``mask_study``: a fresh random per-element mask every step, a fraction ``p`` trainable; the naive
   stop_gradient mask against ``MaskedOptimizer`` ``hold`` and ``reset``.
3. ``block_study``: block-coordinate training, one layer at a time in turn every ``k`` steps.

Every loop is a ``tf.function`` that calls the library; drift is audited in-graph every step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import changed_bits, frozen_change
from study.data import ACCEPTED_FORMS, MnistSplits
from freezing.masked_optimizer import MaskedOptimizer
from study.models import deep_mnist_cnn
from study.optimizers import OPTIMIZERS, make_optimizer
from study.reporting import format_mean_std
from freezing.selection import select_variables, variable_path
from study.training import LOSS, accuracy, batch_indices, forward, median_ms, restore, snapshot
from freezing.validation import check_choices, check_int_list, check_positive_int, check_range

FINETUNE_METHODS = ("var_list", "trainable_recompile", "trainable_no_recompile", "gate", "masked_hold")
MASK_METHODS = ("naive", "hold", "reset")
BLOCKS = ("conv1", "conv2", "fc1", "fc2")
DEFAULT_LEARNING_RATES = {"sgd": 0.05, "momentum": 0.01, "nesterov": 0.01, "adam": 1e-3, "adamw": 1e-3,
                          "amsgrad": 1e-3, "adamax": 2e-3, "nadam": 1e-3, "rmsprop": 1e-3, "lion": 1e-4}
_POLICY = {"naive": "none", "hold": "hold", "reset": "reset"}


@dataclass(frozen=True)
class CnnStudyConfig:
    """Parameters of study 02, validated on construction. ``CnnStudyConfig(seeds=[0])``"""

    data_path: str | None = None
    allow_download: bool = False
    train_limit: int | None = None
    seeds: Sequence[int] = (0, 1, 2)
    batch: int = 32
    learning_rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LEARNING_RATES))
    finetune_optimizers: Sequence[str] = ("sgd", "momentum", "adam", "adamw")
    finetune_methods: Sequence[str] = FINETUNE_METHODS
    pretrain_steps: int = 80
    finetune_steps: int = 50
    mask_optimizers: Sequence[str] = ("sgd", "momentum", "adam")
    mask_methods: Sequence[str] = MASK_METHODS
    p_values: Sequence[float] = (0.1, 0.5, 0.9)
    mask_steps: int = 50
    block_optimizers: Sequence[str] = ("sgd", "adam")
    block_every: int = 10
    block_steps: int = 80
    eval_every: int = 25
    eval_samples: int = 500

    def __post_init__(self) -> None:
        if self.data_path is not None:
            if not isinstance(self.data_path, str) or not Path(self.data_path).expanduser().exists():
                raise ValueError(f"data_path: {self.data_path!r} does not exist; expected None (the offline default) "
                                 f"or {ACCEPTED_FORMS}")
        if not isinstance(self.allow_download, bool):
            raise ValueError(f"allow_download: expected true or false; got {self.allow_download!r}")
        if self.train_limit is not None:
            check_positive_int("train_limit", self.train_limit)
        check_int_list("seeds", self.seeds, minimum=0)
        for name in ("batch", "pretrain_steps", "finetune_steps", "mask_steps", "block_every", "block_steps",
                     "eval_every", "eval_samples"):
            check_positive_int(name, getattr(self, name))
        for name in ("finetune_optimizers", "mask_optimizers", "block_optimizers"):
            check_choices(name, getattr(self, name), OPTIMIZERS)
        check_choices("finetune_methods", self.finetune_methods, FINETUNE_METHODS)
        check_choices("mask_methods", self.mask_methods, MASK_METHODS)
        if isinstance(self.p_values, str) or not isinstance(self.p_values, Sequence) or not self.p_values:
            raise ValueError(f"p_values: expected a non-empty list of numbers in [0, 1]; got {self.p_values!r}")
        for p in self.p_values:
            check_range("p_values", p, 0.0, 1.0)
        if not isinstance(self.learning_rates, dict):
            raise ValueError(f"learning_rates: expected a mapping optimizer: rate; got {self.learning_rates!r}")
        used = {*self.finetune_optimizers, *self.mask_optimizers, *self.block_optimizers}
        missing = sorted(used - set(self.learning_rates))
        if missing:
            raise ValueError(f"learning_rates: no rate for {missing}; give one for each optimizer used")
        for name, lr in self.learning_rates.items():
            check_range(f"learning_rates[{name}]", lr, 0.0, 10.0, low_open=True)


def _init_weights(seed: int) -> list[np.ndarray]:
    keras.utils.set_random_seed(seed)
    return deep_mnist_cnn().get_weights()


def _dataset(x: np.ndarray, y: np.ndarray, batch: int, seed: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=seed).repeat().batch(batch)


class _BatchTimer(keras.callbacks.Callback):
    """Wall time of every training batch of ``model.fit``."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.times.append(time.perf_counter() - self._start)


# -- 1. fine-tuning with frozen feature layers -----------------------------------------------------
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
                masked.apply_gradients(zip(grads, variables), masks=masks)
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
    """Pretrain on 0-4, freeze conv1/conv2, fine-tune on 5-9; one row per optimizer x method x seed. ``finetune_study(cfg, data)``"""
    old, new = data.y_train < 5, data.y_train >= 5
    test_old, test_new = data.y_test < 5, data.y_test >= 5
    rows = []
    for name in config.finetune_optimizers:
        lr = config.learning_rates[name]
        work = deep_mnist_cnn()
        work_opt = make_optimizer(name, lr)
        work_opt.build(work.trainable_variables)
        custom = [m for m in config.finetune_methods if not m.startswith("trainable")]
        steps = {m: _finetune_step(work, work_opt, m) for m in custom}
        for seed in config.seeds:
            keras.utils.set_random_seed(seed)
            pre, pre_opt = deep_mnist_cnn(), make_optimizer(name, lr)
            pre.compile(pre_opt, loss=LOSS)
            pre.fit(_dataset(data.x_train[old], data.y_train[old], config.batch, seed),
                    steps_per_epoch=config.pretrain_steps, epochs=1, verbose=0, shuffle=False)
            weights, opt_state = pre.get_weights(), snapshot(pre_opt.variables)
            conv0 = snapshot(select_variables(pre, pattern=r"/conv\d/", trainable_only=False))
            base = {"optimizer": name, "seed": seed,
                    "pretrain_acc_old": accuracy(pre, data.x_test[test_old], data.y_test[test_old])}
            xs, ys = data.x_train[new], data.y_train[new]

            def record(method: str, model: keras.Model, times: Sequence[float]) -> None:
                drift, changed = _conv_drift(model, conv0)
                rows.append({**base, "method": method,
                             "acc_new": accuracy(model, data.x_test[test_new], data.y_test[test_new]),
                             "acc_old": accuracy(model, data.x_test[test_old], data.y_test[test_old]),
                             "conv_max_drift": drift, "conv_changed": changed, "ms_per_step": median_ms(times)})

            for method in custom:
                work.set_weights(weights)
                restore(work_opt.variables, opt_state)
                times = []
                for idx in batch_indices(len(ys), config.batch, config.finetune_steps, seed):
                    start = time.perf_counter()
                    steps[method](xs[idx], ys[idx]).numpy()
                    times.append(time.perf_counter() - start)
                record(method, work, times)
            finetune_data = _dataset(xs, ys, config.batch, seed)
            if "trainable_recompile" in config.finetune_methods:
                clone, clone_opt = deep_mnist_cnn(), make_optimizer(name, lr)
                clone.set_weights(weights)
                clone_opt.build(clone.trainable_variables)
                restore(clone_opt.variables, opt_state)
                for layer in ("conv1", "conv2"):
                    clone.get_layer(layer).trainable = False
                clone.compile(clone_opt, loss=LOSS)  # recompiled after freezing: the documented way
                timer = _BatchTimer()
                clone.fit(finetune_data, steps_per_epoch=config.finetune_steps, epochs=1, verbose=0, shuffle=False,
                          callbacks=[timer])
                record("trainable_recompile", clone, timer.times)
            if "trainable_no_recompile" in config.finetune_methods:
                for layer in ("conv1", "conv2"):
                    pre.get_layer(layer).trainable = False  # the trap: fit() keeps its traced train step
                timer = _BatchTimer()
                pre.fit(finetune_data, steps_per_epoch=config.finetune_steps, epochs=1, verbose=0, shuffle=False,
                          callbacks=[timer])
                record("trainable_no_recompile", pre, timer.times)
        if progress:
            done = pd.DataFrame(rows).query("optimizer == @name")
            drift = done.groupby("method")["conv_max_drift"].max()
            print(f"fine-tune: {name:<9} conv drift " + ", ".join(f"{m}={drift[m]:.1e}" for m in drift.index),
                  flush=True)
    return pd.DataFrame(rows)


def keras_trainable_traps(seed: int = 0) -> pd.DataFrame:
    """What Keras 3 does with ``layer.trainable`` around ``compile``/``fit``, observed. ``keras_trainable_traps()``"""
    keras.utils.set_random_seed(seed)
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
        except ValueError as e:
            drift, error = float("nan"), str(e).split(".")[0]
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


# -- 2 and 3. masks that change every step -----------------------------------------------------------
def _masked_step(model: keras.Model, opt: MaskedOptimizer, masks_for: Callable) -> Callable:
    variables = model.trainable_variables

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor, step: tf.Tensor, p: tf.Tensor, seed: tf.Tensor) -> tuple:
        keeps = masks_for(variables, step, p, seed)
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        before = [tf.identity(v) for v in variables]
        opt.apply_gradients(zip(grads, variables), masks=keeps)
        changed, max_abs, sum_abs = zip(*[frozen_change(b, tf.convert_to_tensor(v), ~k)
                                          for b, v, k in zip(before, variables, keeps)])
        return loss, tf.add_n(changed), tf.reduce_max(tf.stack(max_abs)), tf.add_n(sum_abs)

    return step


def random_masks(variables: Sequence[Any], step: tf.Tensor, p: tf.Tensor, seed: tf.Tensor) -> list[tf.Tensor]:
    """A fresh per-element mask for every variable, a fraction ``p`` True; same for the same (seed, step). ``random_masks(vs, 3, .5, 0)``"""
    base = tf.cast(step, tf.int64) * len(variables)
    return [tf.random.stateless_uniform(tf.shape(v), seed=tf.stack([tf.cast(seed, tf.int64), base + i])) < p
            for i, v in enumerate(variables)]


def block_masks(every: int) -> Callable:
    """Scalar masks that train one of conv1, conv2, fc1, fc2 at a time, switching every ``every`` steps. ``block_masks(10)``"""

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


def _masked_runs(config: CnnStudyConfig, data: MnistSplits, *, experiment: str, optimizers: Sequence[str],
                 masks_for: Callable, p_values: Sequence[float], steps: int, progress: bool) -> pd.DataFrame:
    """Train from scratch under changing masks; one row per step of every optimizer x method x seed x p."""
    eval_x, eval_y = data.x_test[: config.eval_samples], data.y_test[: config.eval_samples]
    inits = {seed: _init_weights(seed) for seed in config.seeds}
    rows = []
    for name in optimizers:
        for method in config.mask_methods:
            model = deep_mnist_cnn()
            opt = MaskedOptimizer(make_optimizer(name, config.learning_rates[name]), _POLICY[method])
            opt.build(model.trainable_variables)
            opt_init = snapshot(opt.variables)
            step_fn = _masked_step(model, opt, masks_for)
            for seed in config.seeds:
                for p in p_values:
                    model.set_weights(inits[seed])
                    restore(opt.variables, opt_init)
                    for k, idx in enumerate(batch_indices(len(data.y_train), config.batch, steps, seed)):
                        start = time.perf_counter()
                        loss, changed, max_abs, sum_abs = step_fn(
                            data.x_train[idx], data.y_train[idx], tf.constant(k, tf.int64),
                            tf.constant(p, tf.float32), tf.constant(seed, tf.int64))
                        row = {"experiment": experiment, "optimizer": name, "method": method, "seed": seed, "p": p,
                               "step": k + 1, "loss": float(loss), "changed": int(changed),
                               "max_abs_drift": float(max_abs), "sum_abs_drift": float(sum_abs),
                               "ms": 1e3 * (time.perf_counter() - start), "accuracy": np.nan}
                        if (k + 1) % config.eval_every == 0 or k + 1 == steps:
                            row["accuracy"] = accuracy(model, eval_x, eval_y)
                        rows.append(row)
            if progress:
                done = pd.DataFrame(rows).query("optimizer == @name and method == @method")
                final = done[done["step"] == steps]
                print(f"{experiment}: {name:<9} {method:<6} accuracy {final['accuracy'].mean():.3f}, "
                      f"frozen entries changed {int(done['changed'].sum())}, "
                      f"{done['ms'].median():.0f} ms/step", flush=True)
    table = pd.DataFrame(rows)
    table["cumulative_drift"] = table.groupby(["optimizer", "method", "seed", "p"])["sum_abs_drift"].cumsum()
    return table


def mask_study(config: CnnStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Random per-element masks, a fraction p trainable, redrawn every step. ``mask_study(cfg, data)``"""
    return _masked_runs(config, data, experiment="masks", optimizers=config.mask_optimizers, masks_for=random_masks,
                        p_values=config.p_values, steps=config.mask_steps, progress=progress)


def block_study(config: CnnStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Block-coordinate training: one layer at a time, switching every ``block_every`` steps. ``block_study(cfg, data)``"""
    return _masked_runs(config, data, experiment="blocks", optimizers=config.block_optimizers,
                        masks_for=block_masks(config.block_every), p_values=[float("nan")],
                        steps=config.block_steps, progress=progress)


# -- summaries ----------------------------------------------------------------------------------------
def _fmt(table: pd.DataFrame, value: str) -> list[str]:
    return [format_mean_std(m, s) for m, s in zip(table[f"{value}_mean"], table[f"{value}_std"])]


def finetune_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per optimizer x method. ``finetune_summary(finetune_study(cfg, data))``"""
    out = rows.groupby(["optimizer", "method"], sort=False).agg(
        acc_new_mean=("acc_new", "mean"), acc_new_std=("acc_new", "std"),
        acc_old_mean=("acc_old", "mean"), acc_old_std=("acc_old", "std"),
        conv_max_drift_mean=("conv_max_drift", "mean"), conv_max_drift_std=("conv_max_drift", "std"),
        conv_changed_mean=("conv_changed", "mean"), ms_per_step_mean=("ms_per_step", "mean"),
        ms_per_step_std=("ms_per_step", "std"), seeds=("seed", "nunique"),
    ).reset_index()
    return out


def masked_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Final accuracy, cumulative frozen drift and step time, mean ± std over seeds. ``masked_summary(mask_study(...))``"""
    last = table[table["step"] == table["step"].max()]
    per_run = last.merge(
        table.groupby(["optimizer", "method", "seed", "p"], dropna=False)
        .agg(changed_total=("changed", "sum"), ms_median=("ms", "median")).reset_index(),
        on=["optimizer", "method", "seed", "p"])
    return per_run.groupby(["optimizer", "method", "p"], sort=False, dropna=False).agg(
        accuracy_mean=("accuracy", "mean"), accuracy_std=("accuracy", "std"),
        cumulative_drift_mean=("cumulative_drift", "mean"), cumulative_drift_std=("cumulative_drift", "std"),
        changed_total_mean=("changed_total", "mean"), ms_per_step_mean=("ms_median", "mean"),
        ms_per_step_std=("ms_median", "std"), seeds=("seed", "nunique"),
    ).reset_index()


def display_table(summary: pd.DataFrame, values: Sequence[str], index: Sequence[str]) -> pd.DataFrame:
    """A readable 'mean ± std' table from a summary with ``<value>_mean``/``<value>_std`` columns. ``display_table(s, ["acc_new"], ["optimizer", "method"])``"""
    out = summary[list(index)].copy()
    for value in values:
        out[value] = _fmt(summary, value)
    return out.set_index(list(index))


def hold_vs_reset(summary: pd.DataFrame) -> pd.DataFrame:
    """Accuracy of hold minus reset per optimizer and p, with the seeds' spread. ``hold_vs_reset(masked_summary(t))``"""
    pivot = summary.pivot_table(index=["optimizer", "p"], columns="method",
                                values=["accuracy_mean", "accuracy_std", "seeds"], dropna=False)
    if "hold" not in pivot["accuracy_mean"] or "reset" not in pivot["accuracy_mean"]:
        return pd.DataFrame()
    out = pd.DataFrame({
        "hold": pivot["accuracy_mean"]["hold"], "reset": pivot["accuracy_mean"]["reset"],
        "difference": pivot["accuracy_mean"]["hold"] - pivot["accuracy_mean"]["reset"],
        "spread": np.maximum(pivot["accuracy_std"]["hold"], pivot["accuracy_std"]["reset"]),
    })
    enough = pivot["seeds"][["hold", "reset"]].min(axis=1) >= 2  # a spread needs two seeds at least
    out["differs"] = (out["difference"].abs() > 2 * out["spread"]).where(enough)
    return out.reset_index()


def conclusion(finetune: pd.DataFrame, masks: pd.DataFrame, blocks: pd.DataFrame, traps: pd.DataFrame) -> str:
    """A Markdown conclusion computed from the summaries. ``conclusion(f, m, b, traps)``"""
    lines = []
    if len(finetune):
        exact = finetune.groupby("method")["conv_max_drift_mean"].max()
        still = [m for m in exact.index if exact[m] == 0]
        moved = finetune[finetune["conv_max_drift_mean"] > 0]
        lines.append(f"* **Fine-tuning, frozen conv layers exactly still under every optimizer:** "
                     f"{', '.join(still) or 'none'}.")
        if len(moved):
            lines.append("* **Methods that let frozen conv layers move:** " + "; ".join(
                f"{r.method} with {r.optimizer} (max drift {r.conv_max_drift_mean:.1e})" for r in moved.itertuples()) + ".")
        fastest = finetune.groupby("method")["ms_per_step_mean"].mean().sort_values()
        lines.append("* **Time per fine-tuning step** (mean over optimizers): " + ", ".join(
            f"{m} {t:.1f} ms" for m, t in fastest.items()) + ".")
    for name, table in (("per-element masks", masks), ("block-coordinate training", blocks)):
        if not len(table):
            continue
        naive = table[table["method"] == "naive"]
        drifting = sorted(set(naive[naive["changed_total_mean"] > 0]["optimizer"]))
        fixed = table[table["method"] != "naive"]
        lines.append(f"* **{name.capitalize()}:** the naive mask moved frozen entries under "
                     f"{', '.join(drifting) or 'no optimizer'}; hold/reset changed "
                     f"{int(fixed['changed_total_mean'].sum())} frozen entries in total.")
        contrast = hold_vs_reset(table)
        if len(contrast) and contrast["differs"].isna().all():
            lines.append("  Hold vs reset: one seed only, so there is no spread to judge a difference by.")
        elif len(contrast):
            differs = contrast[contrast["differs"] == True]  # noqa: E712
            if len(differs):
                lines.append("  Hold and reset differ in accuracy by more than twice the seeds' spread at: " + "; ".join(
                    f"{r.optimizer}{'' if r.p != r.p else f', p={r.p:g}'} (hold {r.hold:.3f} vs reset {r.reset:.3f})"
                    for r in differs.itertuples()) + ".")
            else:
                lines.append("  Hold and reset are within twice the seeds' spread of each other everywhere.")
    if len(traps):
        wrong = traps[(traps["trained"] == True) & (traps["layer 'a' should"] == "stay")]  # noqa: E712
        silent = traps[(traps["trained"] == False) & (traps["layer 'a' should"] == "train")]  # noqa: E712
        errors = traps[traps["error"] != ""]
        lines.append(f"* **Keras `trainable` traps, observed:** {len(wrong)} scenario(s) trained a frozen layer, "
                     f"{len(silent)} silently did not train an unfrozen one, {len(errors)} raised "
                     f"({'; '.join(errors['error']) or 'none'}).")
    return "\n".join(lines)


def headline(finetune: pd.DataFrame, masks: pd.DataFrame, source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study. ``headline(f, m, data.source)``"""
    out = {"data": source}
    for r in finetune.itertuples():
        if r.optimizer in ("adam", "adamw") and r.method in ("gate", "masked_hold", "trainable_no_recompile", "var_list"):
            out[f"fine-tune, {r.optimizer}, {r.method}: conv drift / test acc (5-9)"] = \
                f"{r.conv_max_drift_mean:.1e} / {format_mean_std(r.acc_new_mean, r.acc_new_std)}"
    for r in masks.itertuples():
        if r.optimizer == "adam":
            out[f"masks p={r.p:g}, adam, {r.method}: acc / frozen entries changed"] = \
                f"{format_mean_std(r.accuracy_mean, r.accuracy_std)} / {r.changed_total_mean:.0f}"
    return out
