"""Study 02: freezing the Deep MNIST CNN with SGD and Adam (any optimizer of study.optimizers by parameter), on real digits.

1. ``finetune_study``: pretrain on digits 0-4, freeze ``conv1``/``conv2``, fine-tune ``fc1``/``fc2`` on
   digits 5-9 with the same optimizer (its state carries over, as when a run is frozen midway). Methods:
   a ``var_list`` by scope, ``trainable=False`` with and without recompiling (Keras' trap), a ``gate``
   on the features, and ``MaskedOptimizer(hold)``.
2. ``mask_study``: a fresh random per-element mask every step, a fraction ``p`` trainable; the naive
   stop_gradient mask against ``MaskedOptimizer`` ``hold`` and ``reset``.
3. ``block_study``: block-coordinate training, one layer at a time in turn every ``k`` steps.

Every loop is a ``tf.function`` that calls the library; drift is audited in-graph every step, with one
definition across the study: *changed entries* (bit for bit, ``freezing.audit``) and *max |ΔW|*.

Reproducibility: every seeded run starts with ``freezing.enable_determinism(seed)`` and restarts the
model's dropout generator at that seed (``training.reseed``); batches come from ``batch_indices(seed)``,
the data split from ``config.data_seed``. Within one run every method of a comparison sees the same
initial weights, the same batches in the same order and the same dropout masks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import changed_bits, frozen_change
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.selection import select_variables, variable_path
from freezing.validation import check_choices, check_int_list, check_positive_int, check_range
from study.data import ACCEPTED_FORMS, MnistSplits
from study.models import deep_mnist_cnn
from study.optimizers import OPTIMIZERS, make_optimizer
from study.reporting import format_mean_std
from study.training import LOSS, StepTimer, accuracy, batch_indices, forward, median_ms, reseed, restore, snapshot

FINETUNE_METHODS = ("var_list", "trainable_recompile", "trainable_no_recompile", "gate", "masked_hold")
EXACT_FINETUNE_METHODS = ("var_list", "trainable_recompile", "masked_hold")
"""The fine-tuning methods that promise frozen conv layers under every optimizer."""
MASK_METHODS = ("naive", "hold", "reset")
BLOCKS = ("conv1", "conv2", "fc1", "fc2")
DEFAULT_LEARNING_RATES = {"sgd": 0.05, "momentum": 0.01, "nesterov": 0.01, "adam": 1e-3, "adamw": 1e-3,
                          "amsgrad": 1e-3, "adamax": 2e-3, "nadam": 1e-3, "rmsprop": 1e-3, "lion": 1e-4}
_POLICY = {"naive": "none", "hold": "hold", "reset": "reset"}


@dataclass(frozen=True)
class CnnStudyConfig:
    """Parameters of study 02 and their defaults (the only place they live), validated on construction.

    ``CnnStudyConfig(seeds=[0])``; from notebook parameters: ``CnnStudyConfig.from_parameters(globals())``.
    """

    data_path: str | None = None
    allow_download: bool = False
    train_limit: int | None = None
    data_seed: int = 0
    seeds: Sequence[int] = (0, 1, 2)
    batch: int = 32
    learning_rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LEARNING_RATES))
    finetune_optimizers: Sequence[str] = ("sgd", "adam")
    finetune_methods: Sequence[str] = FINETUNE_METHODS
    pretrain_steps: int = 60
    finetune_steps: int = 40
    mask_optimizers: Sequence[str] = ("adam",)
    mask_methods: Sequence[str] = MASK_METHODS
    p_values: Sequence[float] = (0.1, 0.5, 0.9)
    mask_steps: int = 40
    block_optimizers: Sequence[str] = ("sgd", "adam")
    block_every: int = 5
    block_steps: int = 40
    eval_every: int = 40
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
        if isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0:
            raise ValueError(f"data_seed: expected an integer >= 0; got {self.data_seed!r}")
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

    @classmethod
    def parameter_names(cls) -> list[str]:
        """The names a notebook's parameters cell declares, in order. ``"seeds" in CnnStudyConfig.parameter_names()``"""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any]) -> CnnStudyConfig:
        """The config from notebook parameters: every field name in ``values`` that is not None; defaults otherwise.

        ``CnnStudyConfig.from_parameters({"seeds": [0], "batch": None, "other": 1}).batch == 32``
        """
        names = set(cls.parameter_names())
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def plain(self) -> dict[str, Any]:
        """The resolved parameters as plain data (for metrics.json). ``CnnStudyConfig().plain()["seeds"] == [0, 1, 2]``"""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _start_run(seed: int, *models: keras.Model) -> None:
    """Every seeded run starts here: seeds and op determinism, and the models' dropout restarted at ``seed``."""
    enable_determinism(seed)
    for model in models:
        reseed(model, seed)


def _init_weights(seed: int) -> list[np.ndarray]:
    enable_determinism(seed)
    return deep_mnist_cnn().get_weights()


def _batches(x: np.ndarray, y: np.ndarray, batch: int, steps: int, seed: int) -> tf.data.Dataset:
    """The minibatches of ``batch_indices(seed)``, in order, as a dataset for ``fit``: the custom loops' batches."""
    idx = np.concatenate(list(batch_indices(len(y), batch, steps, seed)))
    return tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(batch)


ONE_STEP_COLUMNS = {
    "method": "gate + Adam: the seed's stop-gradient mask (freezing.gate) with plain Adam; "
              "MaskedOptimizer(Adam): the same mask given to MaskedOptimizer.apply_gradients(masks=...)",
    "step": "training step, counted from 1; each step draws a fresh mask",
    "frozen entries": "entries of the CNN frozen in this step (count)",
    "frozen entries changed in the step": "entries frozen in this step whose bits changed during it (count)",
    "max |ΔW| of a frozen entry": "max |ΔW| over the entries frozen in this step, during it (weight units)",
}
"""Columns of the notebook's one-masked-step demonstration table."""


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
    """Pretrain on 0-4, freeze conv1/conv2, fine-tune on 5-9; one row per optimizer x method x seed. ``finetune_study(cfg, data)``

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
        custom = [m for m in config.finetune_methods if not m.startswith("trainable")]
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
                             "step_time_ms": median_ms(times)})

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
            changed = done.groupby("method", sort=False)["conv_changed_entries"].mean()
            print(f"fine-tune: {name:<9} conv entries changed (mean over {len(config.seeds)} seeds): "
                  + ", ".join(f"{m} {c:,.0f}" for m, c in changed.items()), flush=True)
    return pd.DataFrame(rows)


TRAP_COLUMNS = {
    "scenario": "what was done to layer 'a' of a two-layer Dense model, in order",
    "layer 'a' should": "what a user means by it: stay (frozen) or train",
    "layer 'a' moved by": "max |ΔW| of layer a's kernel over one fit epoch (weight units; empty if fit raised)",
    "trained": "whether layer a's kernel changed (empty if fit raised)",
    "error": "the first sentence of the error fit raised, if any",
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
        opt.apply_gradients(zip(grads, variables), masks=keeps)
        frozen = [tf.broadcast_to(~k, tf.shape(v)) for k, v in zip(keeps, variables)]
        changed, max_abs, _ = zip(*[frozen_change(b, tf.convert_to_tensor(v), f)
                                    for b, v, f in zip(before, variables, frozen)])
        count = tf.add_n([tf.reduce_sum(tf.cast(f, tf.int64)) for f in frozen])
        return loss, count, tf.add_n(changed), tf.reduce_max(tf.stack(max_abs))

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


def run_keys(table: pd.DataFrame) -> list[str]:
    """The columns that identify one training run of a steps table (``p`` only where the study has it)."""
    return [c for c in ("optimizer", "method", "seed", "p") if c in table.columns]


def _masked_runs(config: CnnStudyConfig, data: MnistSplits, *, experiment: str, optimizers: Sequence[str],
                 masks_for: Callable, p_values: Sequence[float] | None, steps: int, progress: bool) -> pd.DataFrame:
    """Train from scratch under changing masks; one row per step of every optimizer x method x seed (x p)."""
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
                for p in (p_values if p_values is not None else [None]):
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
                        rows.append(row)
            if progress:  # per p where there is one: an average over p would mean nothing
                done = pd.DataFrame(rows).query("optimizer == @name and method == @method")
                per_run = done.groupby(run_keys(done), dropna=False).agg(accuracy=("accuracy", "last"),
                                                                         changed=("frozen_changed", "sum"))
                parts = per_run.groupby(level="p") if "p" in done.columns else [(None, per_run)]
                print(f"{experiment}: {name:<9} {method:<6} " + "; ".join(
                    (f"p={p:g}: " if p is not None else "") + f"final accuracy {g['accuracy'].mean():.3f}, "
                    f"frozen entries changed {g['changed'].mean():,.0f}" for p, g in parts)
                    + f"  (per run, summed over {steps} steps; means over {len(config.seeds)} seeds)", flush=True)
    return pd.DataFrame(rows)


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


# -- summaries ----------------------------------------------------------------------------------------
FINETUNE_SUMMARY_COLUMNS = {
    "optimizer": FINETUNE_RUN_COLUMNS["optimizer"],
    "method": FINETUNE_RUN_COLUMNS["method"],
    **{f"{value}_{stat}": f"{'mean' if stat == 'mean' else 'standard deviation'} over seeds of {value}: "
       f"{FINETUNE_RUN_COLUMNS[value]}"
       for value in ("acc_new", "acc_old", "conv_max_abs_delta", "conv_changed_entries", "step_time_ms")
       for stat in ("mean", "std")},
    "seeds": "number of seeds (runs) averaged (count)",
}


def finetune_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per optimizer x method. ``finetune_summary(finetune_study(cfg, data))``"""
    values = ("acc_new", "acc_old", "conv_max_abs_delta", "conv_changed_entries", "step_time_ms")
    aggs = {f"{v}_{stat}": (v, stat) for v in values for stat in ("mean", "std")}
    return rows.groupby(["optimizer", "method"], sort=False).agg(**aggs, seeds=("seed", "nunique")).reset_index()


_RUN_VALUES = {
    "accuracy": "test accuracy after the last step (fraction of the first eval_samples test images, 0-1)",
    "frozen_changed_total": "frozen entries changed, summed over all steps of the run (count of entry-steps)",
    "frozen_entries_total": "entries frozen, summed over all steps of the run (count of entry-steps)",
    "frozen_max_abs_delta": "max over the run's steps of the max |ΔW| of an entry frozen in that step (weight units)",
    "step_time_ms": "median wall time of one step, step 1 (tracing) left out (ms)",
}
MASKED_SUMMARY_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "method": STEP_COLUMNS["method"],
    "p": STEP_COLUMNS["p"],
    **{f"{value}_{stat}": f"{'mean' if stat == 'mean' else 'standard deviation'} over seeds of: {text}"
       for value, text in _RUN_VALUES.items() for stat in ("mean", "std")},
    "seeds": "number of seeds (runs) averaged (count)",
}


def masked_runs(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a steps table: final accuracy, frozen entries changed over all steps, worst |ΔW|, step time."""
    keys = run_keys(table)
    if table.empty:
        return pd.DataFrame(columns=[*keys, *_RUN_VALUES])
    runs = table.groupby(keys, sort=False, dropna=False)  # rows are in step order within each run
    later = table[table["step"] > 1].groupby(keys, sort=False, dropna=False)["step_time_ms"].median()
    out = pd.DataFrame({
        "accuracy": runs["accuracy"].last(),  # last evaluated step, which is always the final step
        "frozen_changed_total": runs["frozen_changed"].sum(),
        "frozen_entries_total": runs["frozen_entries"].sum(),
        "frozen_max_abs_delta": runs["frozen_max_abs_delta"].max(),
        "step_time_ms": later.reindex(runs.size().index).fillna(runs["step_time_ms"].median()),
    })
    return out.reset_index()


def masked_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer x method (x p): each run value's mean and std over seeds. ``masked_summary(mask_study(...))``

    Grouping never drops a group (``dropna=False``), and a study without ``p`` (blocks) has no ``p`` column.
    """
    runs = masked_runs(table)
    keys = [k for k in run_keys(table) if k != "seed"]
    aggs = {f"{v}_{stat}": (v, stat) for v in _RUN_VALUES for stat in ("mean", "std")}
    out = runs.groupby(keys, sort=False, dropna=False).agg(**aggs, seeds=("seed", "nunique")).reset_index()
    order = [k for k in ("optimizer", "p", "method") if k in out.columns]  # optimizer, then p, then method
    rank = {k: {v: i for i, v in enumerate(dict.fromkeys(out[k]))} for k in ("optimizer", "method")}
    return out.sort_values(order, key=lambda c: c.map(rank[c.name]) if c.name in rank else c,
                           kind="stable").reset_index(drop=True)


def format_count(mean: float, std: float) -> str:
    """A count as ``mean ± std`` with thousands separators. ``format_count(52094.7, 1.2) == "52,095 ± 1"``"""
    if std != std:
        return f"{mean:,.0f}"
    return f"{mean:,.0f} ± {std:,.0f}"


def display_table(summary: pd.DataFrame, values: Sequence[str], index: Sequence[str],
                  counts: Sequence[str] = (), names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A readable 'mean ± std' table from a summary with ``<value>_mean``/``<value>_std`` columns, in ``values`` order.

    ``display_table(s, ["acc_new", "conv_changed_entries"], ["optimizer", "method"], counts=["conv_changed_entries"],
    names={"acc_new": "accuracy"})``; the values named in ``counts`` are shown as whole numbers with separators.
    """
    out = summary[list(index)].copy()
    for value in values:
        pairs = zip(summary[f"{value}_mean"], summary[f"{value}_std"])
        out[value] = [format_count(m, s) for m, s in pairs] if value in counts else [format_mean_std(m, s) for m, s in pairs]
    return out.set_index(list(index)).rename(columns=dict(names or {}))


def formatted(table: pd.DataFrame, formats: Mapping[str, str], index: Sequence[str] = ()) -> pd.DataFrame:
    """``table`` with the columns in ``formats`` as text (``"{:+.3f}"`` style), for display. ``formatted(t, {"a": "{:.1f}"})``"""
    out = table.copy()
    for column, spec in formats.items():
        out[column] = [spec.format(v) if v == v else "" for v in out[column]]
    return out.set_index(list(index)) if index else out


def config_table(config: CnnStudyConfig) -> pd.DataFrame:
    """The resolved parameters, one row each, as text; learning rates only of the optimizers used. ``config_table(cfg)``"""
    values = config.plain()
    used = {*config.finetune_optimizers, *config.mask_optimizers, *config.block_optimizers}
    values["learning_rates"] = {k: v for k, v in config.learning_rates.items() if k in used}

    def text(v: Any) -> str:
        if isinstance(v, dict):
            return ", ".join(f"{k} {x:g}" for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
        return str(v)

    return pd.DataFrame({"value": [text(v) for v in values.values()]}, index=pd.Index(list(values), name="parameter"))


def workload(config: CnnStudyConfig) -> pd.DataFrame:
    """Training runs and steps of each experiment: the work the study does, whatever the machine. ``workload(cfg)``"""
    n = len(config.seeds)
    rows = [("pretraining (fit, digits 0-4)", len(config.finetune_optimizers) * n, config.pretrain_steps),
            ("1. fine-tuning", len(config.finetune_optimizers) * len(config.finetune_methods) * n, config.finetune_steps),
            ("2. per-element masks", len(config.mask_optimizers) * len(config.mask_methods) * len(config.p_values) * n,
             config.mask_steps),
            ("3. blocks", len(config.block_optimizers) * len(config.mask_methods) * n, config.block_steps)]
    table = pd.DataFrame(rows, columns=["experiment", "runs", "steps per run"])
    table["steps"] = table["runs"] * table["steps per run"]
    total = pd.DataFrame([{"experiment": "total", "runs": table["runs"].sum(), "steps per run": "",
                           "steps": table["steps"].sum()}])
    return pd.concat([table, total], ignore_index=True).set_index("experiment")


HOLD_VS_RESET_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "p": STEP_COLUMNS["p"],
    "hold": "final test accuracy with policy hold, mean over seeds (fraction, 0-1)",
    "reset": "final test accuracy with policy reset, mean over seeds (fraction, 0-1)",
    "difference": "hold minus reset (fraction, -1 to 1)",
    "spread": "the larger of the two standard deviations over seeds (fraction)",
    "differs": "whether |difference| > 2 x spread (empty with fewer than 2 seeds)",
}


def hold_vs_reset(summary: pd.DataFrame) -> pd.DataFrame:
    """Accuracy of hold minus reset per optimizer and p, with the seeds' spread. ``hold_vs_reset(masked_summary(t))``"""
    index = [k for k in ("optimizer", "p") if k in summary.columns]
    pivot = summary.pivot_table(index=index, columns="method",
                                values=["accuracy_mean", "accuracy_std", "seeds"], dropna=False)
    if "hold" not in pivot["accuracy_mean"] or "reset" not in pivot["accuracy_mean"]:
        return pd.DataFrame(columns=[*index, *list(HOLD_VS_RESET_COLUMNS)[2:]])
    out = pd.DataFrame({
        "hold": pivot["accuracy_mean"]["hold"], "reset": pivot["accuracy_mean"]["reset"],
        "difference": pivot["accuracy_mean"]["hold"] - pivot["accuracy_mean"]["reset"],
        "spread": np.maximum(pivot["accuracy_std"]["hold"], pivot["accuracy_std"]["reset"]),
    })
    enough = pivot["seeds"][["hold", "reset"]].min(axis=1) >= 2  # a spread needs two seeds at least
    out["differs"] = (out["difference"].abs() > 2 * out["spread"]).where(enough)
    return out.reset_index()


NAIVE_VS_EXACT_COLUMNS = {
    "optimizer": STEP_COLUMNS["optimizer"],
    "p": STEP_COLUMNS["p"],
    "naive accuracy": "final test accuracy of the naive mask, mean ± std over seeds (fraction, 0-1)",
    "hold accuracy": "final test accuracy with MaskedOptimizer(hold), mean ± std over seeds (fraction, 0-1)",
    "naive minus hold": "difference of the means (fraction, -1 to 1); positive: the drifting mask scored higher",
    "frozen entries the naive mask moved": "frozen entries changed / entries frozen, summed over all steps "
                                           "(fraction, 0-1; mean over seeds)",
    "naive step time (ms)": "median wall time of one naive step, mean over seeds (ms)",
    "hold step time (ms)": "median wall time of one hold step, mean over seeds (ms)",
}


def naive_vs_exact(summary: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer and p: what the drifting naive mask gains in accuracy, how much it moved, what exactness costs.

    ``naive_vs_exact(masked_summary(mask_study(cfg, data)))``; columns as ``NAIVE_VS_EXACT_COLUMNS``.
    """
    rows = []
    index = [k for k in ("optimizer", "p") if k in summary.columns]
    for key, group in summary.groupby(index, sort=False, dropna=False):
        by = group.set_index("method")
        if not {"naive", "hold"} <= set(by.index):
            continue
        naive, hold = by.loc["naive"], by.loc["hold"]
        row = dict(zip(index, key if isinstance(key, tuple) else (key,)))
        row.update({
            "naive accuracy": format_mean_std(naive["accuracy_mean"], naive["accuracy_std"]),
            "hold accuracy": format_mean_std(hold["accuracy_mean"], hold["accuracy_std"]),
            "naive minus hold": naive["accuracy_mean"] - hold["accuracy_mean"],
            "frozen entries the naive mask moved": naive["frozen_changed_total_mean"]
            / max(naive["frozen_entries_total_mean"], 1.0),
            "naive step time (ms)": naive["step_time_ms_mean"],
            "hold step time (ms)": hold["step_time_ms_mean"],
        })
        rows.append(row)
    return pd.DataFrame(rows, columns=[*index, *list(NAIVE_VS_EXACT_COLUMNS)[2:]])


def headline(config: CnnStudyConfig, finetune: pd.DataFrame, traps: pd.DataFrame, masks: pd.DataFrame,
             blocks: pd.DataFrame, source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows: every section, every optimizer and method, mean ± std over seeds.

    ``headline(cfg, finetune_summary(f), traps, masked_summary(m), masked_summary(b), data.source)``. Keys name
    their units; step times sit under keys containing "time" (left out when reruns are compared).
    """
    seeds = len(config.seeds)
    out = {"data": source, "seeds per row": str(seeds)}
    for r in finetune.itertuples():
        out[f"fine-tune {r.optimizer}/{r.method}: test accuracy on digits 5-9 (fraction) / "
            f"frozen conv entries changed at the end (count)"] = \
            f"{format_mean_std(r.acc_new_mean, r.acc_new_std)} / {format_count(r.conv_changed_entries_mean, r.conv_changed_entries_std)}"
    for name, group in finetune.groupby("optimizer", sort=False):
        out[f"fine-tune {name}: step time (ms), " + " / ".join(group["method"])] = \
            " / ".join(f"{t:.1f}" for t in group["step_time_ms_mean"])
    if len(traps):
        wrong = int(((traps["trained"] == True) & (traps["layer 'a' should"] == "stay")).sum()  # noqa: E712
                    + ((traps["trained"] == False) & (traps["layer 'a' should"] == "train")).sum()  # noqa: E712
                    + (traps["error"] != "").sum())
        out[f"Keras trainable traps: scenarios that did not do what the flag says (of {len(traps)})"] = str(wrong)
    for r in masks.itertuples():
        out[f"masks p={r.p:g} {r.optimizer}/{r.method}: final test accuracy (fraction) / frozen entries "
            f"changed, summed over {config.mask_steps} steps (count)"] = \
            f"{format_mean_std(r.accuracy_mean, r.accuracy_std)} / {format_count(r.frozen_changed_total_mean, r.frozen_changed_total_std)}"
    for name, group in masks.groupby("optimizer", sort=False):
        methods = list(dict.fromkeys(group["method"]))
        times = group.groupby("method", sort=False)["step_time_ms_mean"].mean()
        out[f"masks {name}: step time (ms), " + " / ".join(methods)] = " / ".join(f"{times[m]:.1f}" for m in methods)
    for r in blocks.itertuples():
        out[f"blocks {r.optimizer}/{r.method}: final test accuracy (fraction) / resting entries changed, "
            f"summed over {config.block_steps} steps (count)"] = \
            f"{format_mean_std(r.accuracy_mean, r.accuracy_std)} / {format_count(r.frozen_changed_total_mean, r.frozen_changed_total_std)}"
    return out
