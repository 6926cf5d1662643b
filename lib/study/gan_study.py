"""Study 03: alternating GAN training, six ways to keep the other network fixed, under SGD and Adam.

Each iteration is a D step, then a G step. Methods:

1. ``two_optimizers``      one optimizer per network, each with its ``var_list`` selected by scope (TF-GAN's way);
2. ``shared_optimizer``    one optimizer for both subsets, built for all first (Keras 3's "Unknown variable" fix);
3. ``zeroed_gradients``    one optimizer over every variable, the other network's gradients zeroed (naive);
4. ``trainable_flag``      the Keras recipe: ``discriminator.trainable = False`` inside a compiled combined model;
5. ``stop_gradient``       ``tf.stop_gradient(G(z))`` in front of D for the D step;
6. ``random_gate``         ``gate(x, do)`` on hidden activations with ``do`` drawn at random each step, so a random
                           part of the trained network learns; ``random_gate_masked`` adds ``MaskedOptimizer(hold)``,
                           which keeps the untrained part exactly still.

Drift of whatever should be frozen is audited in-graph at every step. Sample quality is measured with a
fixed MNIST classifier: its mean confidence on generated digits and the entropy of its predicted classes.
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
from freezing.gates import gate
from freezing.masked_optimizer import MaskedOptimizer
from study.models import deep_mnist_cnn
from study.reporting import format_mean_std
from freezing.selection import select_variables
from study.training import LOSS, accuracy, median_ms, restore, snapshot
from freezing.validation import check_choices, check_int_list, check_positive_int, check_range

METHODS = ("two_optimizers", "shared_optimizer", "zeroed_gradients", "trainable_flag", "stop_gradient",
           "random_gate", "random_gate_masked")
GAN_OPTIMIZERS = {"sgd": lambda lr: keras.optimizers.SGD(lr),
                  "adam": lambda lr: keras.optimizers.Adam(lr, beta_1=0.5)}
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
Z_DIM = 64


@dataclass(frozen=True)
class GanStudyConfig:
    """Parameters of study 03, validated on construction. ``GanStudyConfig(iterations=100)``"""

    methods: Sequence[str] = METHODS
    optimizers: Sequence[str] = ("sgd", "adam")
    learning_rates: dict[str, float] = field(default_factory=lambda: {"sgd": 0.05, "adam": 1e-3})
    iterations: int = 600
    batch: int = 64
    seeds: Sequence[int] = (0, 1, 2)
    generator_scope: str = "generator/"
    discriminator_scope: str = "discriminator/"
    gate_probability: float = 0.5
    classifier_steps: int = 300
    quality_samples: int = 500
    log_every: int = 10
    data_path: str | None = None

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choices("optimizers", self.optimizers, GAN_OPTIMIZERS)
        for name in ("iterations", "batch", "classifier_steps", "quality_samples", "log_every"):
            check_positive_int(name, getattr(self, name))
        check_int_list("seeds", self.seeds, minimum=0)
        check_range("gate_probability", self.gate_probability, 0.0, 1.0)
        if not isinstance(self.learning_rates, dict) or sorted(set(self.optimizers) - set(self.learning_rates)):
            raise ValueError(f"learning_rates: expected a rate for each of {list(self.optimizers)}; got "
                             f"{self.learning_rates!r}")
        for name, lr in self.learning_rates.items():
            check_range(f"learning_rates[{name}]", lr, 0.0, 10.0, low_open=True)
        for name in ("generator_scope", "discriminator_scope"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip("/"):
                raise ValueError(f"{name}: expected a variable scope such as 'generator/'; got {getattr(self, name)!r}")
        if self.data_path is not None and not Path(str(self.data_path)).expanduser().exists():
            raise ValueError(f"data_path: {self.data_path!r} does not exist; expected None or {ACCEPTED_FORMS}")


class Gan(keras.Model):
    """An MLP GAN whose variables live under ``generator/`` and ``discriminator/``. ``Gan().generator``"""

    def __init__(self, hidden: tuple[int, int] = (128, 256)):
        super().__init__(name="gan")
        self.generator = keras.Sequential([
            keras.Input((Z_DIM,)),
            keras.layers.Dense(hidden[0], name="dense1"), keras.layers.LeakyReLU(0.2, name="act1"),
            keras.layers.Dense(hidden[1], name="dense2"), keras.layers.LeakyReLU(0.2, name="act2"),
            keras.layers.Dense(784, activation="tanh", name="out"),
        ], name="generator")
        self.discriminator = keras.Sequential([
            keras.Input((784,)),
            keras.layers.Dense(hidden[1], name="dense1"), keras.layers.LeakyReLU(0.2, name="act1"),
            keras.layers.Dense(hidden[0], name="dense2"), keras.layers.LeakyReLU(0.2, name="act2"),
            keras.layers.Dense(1, name="out"),
        ], name="discriminator")

    def call(self, z: Any) -> Any:
        return self.discriminator(self.generator(z))


def gated_forward(model: keras.Sequential, x: Any, keep: Sequence[Any] | None = None) -> tf.Tensor:
    """Forward through an MLP, gating the output of activation ``act<i>`` with ``keep[i-1]``. ``gated_forward(g, z, [1., 0.])``"""
    i = 0
    for layer in model.layers:
        x = layer(x)
        if keep is not None and layer.name.startswith("act"):
            x = gate(x, keep[i])
            i += 1
    return x


def frozen_by_gates(model: keras.Sequential, keep: Sequence[Any]) -> list[Any]:
    """Per variable, True when the gates block its gradient (a 0 at or after its layer). ``frozen_by_gates(g, [1, 0])``"""
    out = []
    for v in model.trainable_variables:
        layer = int(v.path.split("/")[-2][-1]) if "/dense" in f"/{v.path}" else len(keep) + 1
        blocked = tf.constant(False)
        for k in range(layer - 1, len(keep)):
            blocked = blocked | tf.logical_not(tf.cast(keep[k], tf.bool))
        out.append(blocked)
    return out


def _d_loss(real_logits: Any, fake_logits: Any) -> tf.Tensor:
    return BCE(tf.ones_like(real_logits), real_logits) + BCE(tf.zeros_like(fake_logits), fake_logits)


def _g_loss(fake_logits: Any) -> tf.Tensor:
    return BCE(tf.ones_like(fake_logits), fake_logits)


def _drift(before: Sequence[Any], variables: Sequence[Any], frozen: Sequence[Any] | None = None) -> tuple:
    if not variables:
        return tf.constant(0, tf.int64), tf.constant(0.0)
    frozen = frozen if frozen is not None else [tf.constant(True)] * len(variables)
    parts = [frozen_change(b, tf.convert_to_tensor(v), f) for b, v, f in zip(before, variables, frozen)]
    return tf.add_n([p[0] for p in parts]), tf.reduce_max(tf.stack([p[1] for p in parts]))


class _Runner:
    """One (method, optimizer) pairing: its optimizers and its traced iteration, reused across seeds."""

    def __init__(self, method: str, optimizer: str, lr: float, config: GanStudyConfig):
        self.method, self.config = method, config
        self.gan = Gan()
        make = GAN_OPTIMIZERS[optimizer]
        g_vars = select_variables(self.gan, scope=config.generator_scope)
        d_vars = select_variables(self.gan, scope=config.discriminator_scope)
        self.g_vars, self.d_vars = g_vars, d_vars
        if method == "trainable_flag":
            self._keras_recipe(make, lr)
            return
        if method in ("shared_optimizer", "zeroed_gradients"):
            self.opt_d = self.opt_g = make(lr)
            self.opt_d.build(d_vars + g_vars)  # build for all, else the second subset raises "Unknown variable"
        else:
            self.opt_d, self.opt_g = make(lr), make(lr)
            self.opt_d.build(d_vars + g_vars if method == "stop_gradient" else d_vars)
            self.opt_g.build(g_vars)
        if method == "random_gate_masked":
            self.opt_d, self.opt_g = MaskedOptimizer(self.opt_d, "hold"), MaskedOptimizer(self.opt_g, "hold")
        self.optimizers = list({id(o): o for o in (self.opt_d, self.opt_g)}.values())
        self.initial = [snapshot(o.variables) for o in self.optimizers]
        self.iteration = tf.function(self._iteration)

    def _keras_recipe(self, make: Callable, lr: float) -> None:
        d, g = self.gan.discriminator, self.gan.generator
        self.opt_d, self.opt_g = make(lr), make(lr)
        d.compile(self.opt_d, loss=BCE)
        d.trainable = False  # frozen inside the combined model, compiled after this line
        z = keras.Input((Z_DIM,))
        self.combined = keras.Model(z, d(g(z)), name="combined")
        self.combined.compile(self.opt_g, loss=BCE)
        self.optimizers = [self.opt_d, self.opt_g]
        self.initial = None

    def reset(self, weights: list[np.ndarray]) -> None:
        """Start a seed: fresh weights, optimizer state back to its initial values (not for the Keras recipe)."""
        if self.initial is None:
            raise ValueError("the trainable_flag recipe compiles its models; make a new runner per seed")
        self.gan.set_weights(weights)
        for o, values in zip(self.optimizers, self.initial):
            restore(o.variables, values)

    def _iteration(self, real: tf.Tensor, z_d: tf.Tensor, z_g: tf.Tensor, do_d: tf.Tensor, do_g: tf.Tensor) -> dict:
        g, d, method = self.gan.generator, self.gan.discriminator, self.method
        gated = method.startswith("random_gate")
        # -- D step: G must not move ------------------------------------------------------------------
        with tf.GradientTape() as tape:
            fake = g(z_d)
            if method == "stop_gradient":
                fake = tf.stop_gradient(fake)
            d_out = (lambda x: gated_forward(d, x, [do_d[0], do_d[1]])) if gated else d
            d_loss = _d_loss(d_out(real), d_out(fake))
        g_before = [tf.identity(v) for v in self.g_vars]
        d_before = [tf.identity(v) for v in self.d_vars]
        d_frozen_part = frozen_by_gates(d, [do_d[0], do_d[1]]) if gated else None
        if method == "zeroed_gradients":
            grads = tape.gradient(d_loss, self.d_vars + self.g_vars)
            zeroed = [gr if i < len(self.d_vars) else tf.zeros_like(gr) for i, gr in enumerate(grads)]
            self.opt_d.apply_gradients(zip(zeroed, self.d_vars + self.g_vars))
        elif method == "stop_gradient":  # G's gradients are None: Keras skips them
            grads = tape.gradient(d_loss, self.d_vars + self.g_vars)
            self.opt_d.apply_gradients(zip(grads, self.d_vars + self.g_vars))
        elif method == "random_gate_masked":
            grads = tape.gradient(d_loss, self.d_vars)
            self.opt_d.apply_gradients(zip(grads, self.d_vars), masks=[~f for f in d_frozen_part])
        else:
            grads = tape.gradient(d_loss, self.d_vars)
            self.opt_d.apply_gradients(zip(grads, self.d_vars))
        other_d = _drift(g_before, self.g_vars)
        part_d = _drift(d_before, self.d_vars, d_frozen_part) if gated else (tf.constant(0, tf.int64), tf.constant(0.0))
        # -- G step: D must not move ------------------------------------------------------------------
        with tf.GradientTape() as tape:
            g_out = gated_forward(g, z_g, [do_g[0], do_g[1]]) if gated else g(z_g)
            g_loss = _g_loss(d(g_out))
        g_before = [tf.identity(v) for v in self.g_vars]
        d_before = [tf.identity(v) for v in self.d_vars]
        g_frozen_part = frozen_by_gates(g, [do_g[0], do_g[1]]) if gated else None
        if method == "zeroed_gradients":
            grads = tape.gradient(g_loss, self.d_vars + self.g_vars)
            zeroed = [tf.zeros_like(gr) if i < len(self.d_vars) else gr for i, gr in enumerate(grads)]
            self.opt_g.apply_gradients(zip(zeroed, self.d_vars + self.g_vars))
        elif method == "random_gate_masked":
            grads = tape.gradient(g_loss, self.g_vars)
            self.opt_g.apply_gradients(zip(grads, self.g_vars), masks=[~f for f in g_frozen_part])
        else:
            grads = tape.gradient(g_loss, self.g_vars)
            self.opt_g.apply_gradients(zip(grads, self.g_vars))
        other_g = _drift(d_before, self.d_vars)
        part_g = _drift(g_before, self.g_vars, g_frozen_part) if gated else (tf.constant(0, tf.int64), tf.constant(0.0))
        return {"d_loss": d_loss, "g_loss": g_loss,
                "g_changed_in_d_step": other_d[0], "g_max_drift_in_d_step": other_d[1],
                "d_changed_in_g_step": other_g[0], "d_max_drift_in_g_step": other_g[1],
                "gated_changed": part_d[0] + part_g[0], "gated_max_drift": tf.maximum(part_d[1], part_g[1]),
                "d_iterations": tf.cast(self.opt_d.iterations, tf.int64),
                "g_iterations": tf.cast(self.opt_g.iterations, tf.int64)}

    def keras_iteration(self, real: np.ndarray, z_d: np.ndarray, z_g: np.ndarray) -> dict:
        """The Keras recipe's iteration: D.train_on_batch, then the combined model with D frozen."""
        g, d = self.gan.generator, self.gan.discriminator
        fake = g(z_d, training=False).numpy()
        g_before = snapshot(self.g_vars)
        d.trainable = True  # the toggles of the classic recipe; see the notebook for what Keras makes of them
        d_loss = d.train_on_batch(np.concatenate([real, fake]),
                                  np.concatenate([np.ones((len(real), 1)), np.zeros((len(fake), 1))]))
        d.trainable = False
        g_after = snapshot(self.g_vars)
        d_before = snapshot(self.d_vars)
        g_loss = self.combined.train_on_batch(z_g, np.ones((len(z_g), 1)))
        d_after = snapshot(self.d_vars)

        def change(before: list, after: list) -> tuple[int, float]:
            changed = sum(int(changed_bits(b, a).sum()) for a, b in zip(after, before))
            return changed, max(float(np.abs(a - b).max()) for a, b in zip(after, before))

        (gc, gm), (dc, dm) = change(g_before, g_after), change(d_before, d_after)
        return {"d_loss": float(np.asarray(d_loss).reshape(-1)[0]), "g_loss": float(np.asarray(g_loss).reshape(-1)[0]),
                "g_changed_in_d_step": gc, "g_max_drift_in_d_step": gm, "d_changed_in_g_step": dc,
                "d_max_drift_in_g_step": dm, "gated_changed": 0, "gated_max_drift": 0.0,
                "d_iterations": int(self.opt_d.iterations.numpy()), "g_iterations": int(self.opt_g.iterations.numpy())}


# -- the study --------------------------------------------------------------------------------------
def unknown_variable_trap(optimizer: str = "adam") -> pd.DataFrame:
    """One Keras 3 optimizer for D and then G: raises unless built for all variables first. ``unknown_variable_trap()``"""
    rows = []
    for build_all in (False, True):
        gan = Gan()
        d, g = select_variables(gan, scope="discriminator/"), select_variables(gan, scope="generator/")
        opt = GAN_OPTIMIZERS[optimizer](1e-3)
        if build_all:
            opt.build(d + g)
        try:
            opt.apply_gradients(zip([tf.zeros_like(v) for v in d], d))
            opt.apply_gradients(zip([tf.zeros_like(v) for v in g], g))
            outcome = "both steps applied"
        except ValueError as e:
            outcome = str(e).split(". ")[0] + ". " + str(e).split(". ")[1]
        rows.append({"one optimizer for D then G": "optimizer.build(d_vars + g_vars) first" if build_all
                     else "built on first use (D's variables)", "outcome": outcome})
    return pd.DataFrame(rows)


def train_classifier(data: MnistSplits, steps: int, seed: int = 0) -> tuple[keras.Model, float]:
    """The fixed judge of sample quality: the Deep MNIST CNN, and its test accuracy. ``train_classifier(data, 300)``"""
    keras.utils.set_random_seed(seed)
    model = deep_mnist_cnn()
    model.compile(keras.optimizers.Adam(1e-3), loss=LOSS)
    dataset = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shuffle(len(data.y_train), seed=seed)
    model.fit(dataset.repeat().batch(50), steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
    return model, accuracy(model, data.x_test, data.y_test)


def sample_quality(classifier: keras.Model, images: np.ndarray) -> dict[str, float]:
    """Mean classifier confidence and class-coverage entropy (0..1) of generated digits in [-1, 1]. ``sample_quality(c, x)``"""
    probs = tf.nn.softmax(classifier((images.reshape(-1, 28, 28, 1) + 1) / 2, training=False)).numpy()
    counts = np.bincount(probs.argmax(axis=1), minlength=10) / len(probs)
    nonzero = counts[counts > 0]
    return {"confidence": float(probs.max(axis=1).mean()),
            "coverage_entropy": float(max(0.0, -(nonzero * np.log(nonzero)).sum() / np.log(10))),
            "classes_seen": int((counts > 0).sum())}


def _latents(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, Z_DIM)).astype(np.float32)


def run_one(runner: _Runner, images: np.ndarray, config: GanStudyConfig, seed: int) -> tuple[list[dict], dict]:
    """Train one GAN; returns the logged iterations and the totals (drift summed over every step). ``run_one(r, x, cfg, 0)``"""
    rng = np.random.default_rng(seed)
    keras_recipe = runner.method == "trainable_flag"
    log, times = [], []
    totals = {"g_changed_in_d_step": 0, "g_max_drift_in_d_step": 0.0, "d_changed_in_g_step": 0,
              "d_max_drift_in_g_step": 0.0, "gated_changed": 0, "gated_max_drift": 0.0}
    for it in range(1, config.iterations + 1):
        real = images[rng.integers(0, len(images), config.batch)]
        z_d = rng.normal(size=(config.batch, Z_DIM)).astype(np.float32)
        z_g = rng.normal(size=(config.batch, Z_DIM)).astype(np.float32)
        start = time.perf_counter()
        if keras_recipe:
            out = runner.keras_iteration(real, z_d, z_g)
        else:
            do = (rng.random(4) < config.gate_probability).astype(np.float32)
            out = {k: v.numpy() for k, v in runner.iteration(real, z_d, z_g, do[:2], do[2:]).items()}
        times.append(time.perf_counter() - start)
        for k in totals:
            totals[k] = max(totals[k], float(out[k])) if "max" in k else totals[k] + int(out[k])
        if it % config.log_every == 0 or it == 1:
            log.append({"iteration": it, **{k: float(out[k]) for k in ("d_loss", "g_loss")},
                        "d_iterations": int(out["d_iterations"]), "g_iterations": int(out["g_iterations"])})
    totals["ms_per_iteration"] = median_ms(times)
    return log, totals


def gan_study(config: GanStudyConfig, data: MnistSplits, classifier: keras.Model,
              progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """Every method x optimizer x seed: (per-run table, loss log, sample grids under Adam at seed 0). ``gan_study(cfg, data, c)``"""
    images = (data.x_train.reshape(-1, 784) * 2 - 1).astype(np.float32)
    inits = {}
    for seed in config.seeds:
        keras.utils.set_random_seed(seed)
        inits[seed] = Gan().get_weights()
    fixed_z = _latents(config.quality_samples, 1234)
    runs, logs, grids = [], [], {}
    for optimizer in config.optimizers:
        lr = config.learning_rates[optimizer]
        for method in config.methods:
            runner = None
            for seed in config.seeds:
                if runner is None or method == "trainable_flag":
                    runner = _Runner(method, optimizer, lr, config)
                if method == "trainable_flag":
                    runner.gan.set_weights(inits[seed])
                else:
                    runner.reset(inits[seed])
                log, totals = run_one(runner, images, config, seed)
                samples = runner.gan.generator(fixed_z, training=False).numpy()
                runs.append({"method": method, "optimizer": optimizer, "seed": seed, **totals,
                             **sample_quality(classifier, samples),
                             "final_d_loss": float(np.mean([r["d_loss"] for r in log[-3:]])),
                             "final_g_loss": float(np.mean([r["g_loss"] for r in log[-3:]]))})
                logs += [{"method": method, "optimizer": optimizer, "seed": seed, **r} for r in log]
                if optimizer == "adam" and seed == config.seeds[0]:
                    grids[method] = samples[:64]
            if progress:
                done = pd.DataFrame(runs).query("method == @method and optimizer == @optimizer")
                print(f"gan: {optimizer:<4} {method:<18} G moved in D steps: {int(done['g_changed_in_d_step'].sum())}, "
                      f"D moved in G steps: {int(done['d_changed_in_g_step'].sum())}, "
                      f"gated-off part moved: {int(done['gated_changed'].sum())}, "
                      f"confidence {done['confidence'].mean():.2f}, {done['ms_per_iteration'].mean():.1f} ms/it",
                      flush=True)
    return pd.DataFrame(runs), pd.DataFrame(logs), grids


def gan_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per method x optimizer. ``gan_summary(runs)``"""
    return runs.groupby(["method", "optimizer"], sort=False).agg(
        g_changed_in_d_step=("g_changed_in_d_step", "mean"), g_max_drift_in_d_step=("g_max_drift_in_d_step", "max"),
        d_changed_in_g_step=("d_changed_in_g_step", "mean"), d_max_drift_in_g_step=("d_max_drift_in_g_step", "max"),
        gated_changed=("gated_changed", "mean"), gated_max_drift=("gated_max_drift", "max"),
        confidence_mean=("confidence", "mean"), confidence_std=("confidence", "std"),
        coverage_entropy_mean=("coverage_entropy", "mean"), coverage_entropy_std=("coverage_entropy", "std"),
        ms_per_iteration_mean=("ms_per_iteration", "mean"), ms_per_iteration_std=("ms_per_iteration", "std"),
        final_d_loss_mean=("final_d_loss", "mean"), final_g_loss_mean=("final_g_loss", "mean"),
        seeds=("seed", "nunique"),
    ).reset_index()


def bias_correction_effect(logs: pd.DataFrame, beta_1: float = 0.5, beta_2: float = 0.999) -> pd.DataFrame:
    """Adam's bias correction sqrt(1-b2^t)/(1-b1^t) at the G step, shared counter vs G's own, from logged counters."""
    shared = logs[(logs["method"] == "shared_optimizer") & (logs["optimizer"] == "adam")]
    own = logs[(logs["method"] == "two_optimizers") & (logs["optimizer"] == "adam")]
    if not len(shared) or not len(own):
        return pd.DataFrame()
    merged = shared.merge(own, on=["seed", "iteration"], suffixes=("_shared", "_own"))

    def correction(t: pd.Series) -> pd.Series:
        return np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)

    out = merged[["seed", "iteration", "g_iterations_shared", "g_iterations_own"]].copy()
    out["correction_shared"] = correction(out["g_iterations_shared"])
    out["correction_own"] = correction(out["g_iterations_own"])
    out["ratio"] = out["correction_shared"] / out["correction_own"]
    return out


PROMISES = {"two_optimizers", "shared_optimizer", "trainable_flag", "stop_gradient", "random_gate_masked"}
"""Methods that promise the other network (and, for random_gate_masked, the gated-off part) stays exactly still."""


def recommendation(summary: pd.DataFrame) -> str:
    """A Markdown recommendation computed from the numbers. ``recommendation(gan_summary(runs))``"""
    s = summary.assign(drift=summary["g_changed_in_d_step"] + summary["d_changed_in_g_step"] + summary["gated_changed"])
    exact = s.groupby("method")["drift"].max()
    still = [m for m in exact.index if exact[m] == 0]
    moved = s[s["drift"] > 0]
    lines = [f"* **The other network stayed exactly still** (every step, every optimizer and seed) with: "
             f"{', '.join(still) or 'none'}."]
    if len(moved):
        lines.append("* **It moved** with: " + "; ".join(
            f"{r.method} under {r.optimizer} ({int(r.drift)} entry changes on average per run)" for r in moved.itertuples()) + ".")
    adam = s[(s["optimizer"] == "adam") & s["method"].isin(still)]
    if len(adam):
        scored = adam.assign(score=adam["confidence_mean"] * adam["coverage_entropy_mean"])
        best = scored[scored["score"] == scored["score"].max()]  # identical updates tie exactly
        fastest = adam.sort_values("ms_per_iteration_mean").iloc[0]
        names = " and ".join(f"`{m}`" for m in best["method"])
        lines.append(f"* **Recommendation:** among the exact methods under Adam, {names} gave the best samples "
                     f"(confidence {best.iloc[0].confidence_mean:.2f}, coverage {best.iloc[0].coverage_entropy_mean:.2f}"
                     f"{'; their updates are identical' if len(best) > 1 else ''}) and "
                     f"`{fastest.method}` the fastest iterations ({fastest.ms_per_iteration_mean:.1f} ms).")
    return "\n".join(lines)


def headline(summary: pd.DataFrame, classifier_accuracy: float, source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study. ``headline(s, 0.97, data.source)``"""
    out = {"data": source, "judge classifier test accuracy": f"{classifier_accuracy:.3f}"}
    for r in summary.itertuples():
        out[f"{r.method}, {r.optimizer}: frozen-network changes (G in D step / D in G step / gated part)"] = \
            f"{r.g_changed_in_d_step:.0f} / {r.d_changed_in_g_step:.0f} / {r.gated_changed:.0f}; confidence " \
            f"{format_mean_std(r.confidence_mean, r.confidence_std, 2)}"
    return out
