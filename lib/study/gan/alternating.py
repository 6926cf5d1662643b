"""Study 03: alternating GAN training, five ways to keep the other network fixed, and random gates, under SGD and Adam.

Each iteration is a D step, then a G step. Ways to keep the other network fixed:

1. ``two_optimizers``      one optimizer per network, each with its ``var_list`` selected by scope (TF-GAN's way);
2. ``shared_optimizer``    one optimizer for both subsets, built for all first (Keras 3's "Unknown variable" fix);
3. ``zeroed_gradients``    one optimizer over every variable, the other network's gradients zeroed (naive);
4. ``trainable_flag``      the Keras recipe: ``discriminator.trainable = False`` inside a compiled combined model;
5. ``stop_gradient``       ``tf.stop_gradient(G(z))`` in front of D for the D step.

Random gates, which keep the other network fixed by ``var_list`` and train a random part of their own:

6. ``random_gate``         ``gate(x, do)`` on hidden activations with ``do`` drawn at random each step, so a random
                           part of the trained network learns;
7. ``random_gate_masked``  the same with ``MaskedOptimizer(hold)``, which keeps the untrained part exactly still.

Two diagnostic variants of ``random_gate_masked`` find out why the random gates collapse to one class:
``gate_d_only`` draws the gate for D's step only (G trains whole), ``gate_g_only`` for G's step only. They
consume the same random draws as ``random_gate_masked``, so they see the same batches and latent vectors.

Every step is audited in-graph with the study-wide names: ``*_changed_entries_*`` counts entries that should
have stayed frozen and whose bits changed (summed over iterations per run), ``*_max_abs_dW_*`` is the largest
one-step |ΔW| of such an entry. Sample quality is measured with a fixed MNIST classifier (the judge): its mean
confidence on generated digits, how many of the ten classes it sees, and the entropy of its predicted classes.
Each run starts with ``freezing.enable_determinism(seed)``, so the same parameters give the same bits.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import frozen_change
from freezing.determinism import enable_determinism
from freezing.gates import gate
from freezing.masked_optimizer import MaskedOptimizer
from freezing.selection import select_variables
from study.data import ACCEPTED_FORMS, MnistSplits
from study.models import deep_mnist_cnn
from study.processes import map_in_processes
from study.training import LOSS, accuracy, median_ms, restore, snapshot
from study.validation import check_choices, check_int_list, check_positive_int, check_range

METHODS = ("two_optimizers", "shared_optimizer", "zeroed_gradients", "trainable_flag", "stop_gradient",
           "random_gate", "random_gate_masked", "gate_d_only", "gate_g_only")
GATED = ("random_gate", "random_gate_masked", "gate_d_only", "gate_g_only")
DIAGNOSTICS = ("gate_d_only", "gate_g_only")
"""Run only under ``GanStudyConfig.diagnostic_optimizers`` (Adam by default), to keep the study's time."""
"""Methods that draw a random gate each iteration; all but ``random_gate`` mask with ``MaskedOptimizer(hold)``."""
EXACT = ("two_optimizers", "shared_optimizer", "trainable_flag", "stop_gradient", "random_gate_masked",
         "gate_d_only", "gate_g_only")
"""Methods that promise the other network (and, for the masked gates, the gated-off part) stays exactly still."""
GAN_OPTIMIZERS = {"sgd": lambda lr: keras.optimizers.SGD(lr),
                  "adam": lambda lr: keras.optimizers.Adam(lr, beta_1=0.5)}
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
Z_DIM = 64


COLUMNS = {
    "method": "how the other network is kept fixed (see the module docstring)",
    "optimizer": "sgd or adam (beta_1 = 0.5)",
    "seed": "seed of the run: initial weights, batches, latent vectors, gate draws",
    "iteration": "iteration (one D step, then one G step)",
    "g_changed_entries_in_d_step": "G's entries whose bits changed during D steps, summed over iterations (count; "
                                   "summary: mean over seeds)",
    "g_max_abs_dW_in_d_step": "largest one-step |ΔW| of a G entry during a D step (W units; summary: max over seeds)",
    "d_changed_entries_in_g_step": "D's entries whose bits changed during G steps, summed over iterations (count; "
                                   "summary: mean over seeds)",
    "d_max_abs_dW_in_g_step": "largest one-step |ΔW| of a D entry during a G step (W units; summary: max over seeds)",
    "gated_changed_entries": "gated-off entries of the trained network whose bits changed, summed over iterations "
                             "(count; summary: mean over seeds)",
    "gated_max_abs_dW": "largest one-step |ΔW| of a gated-off entry (W units; summary: max over seeds)",
    "time_per_iteration_ms": "median wall time of one iteration, first (tracing) one excluded (ms)",
    "confidence": "the judge's mean top-class probability on generated digits (0-1)",
    "coverage_entropy": "entropy of the judged class histogram over ln 10 (0 = one class, 1 = all ten equally)",
    "classes_seen": "classes the judge assigns to at least one generated digit (of 10)",
    "final_d_loss": "D's loss, mean of the last three logged iterations (nats)",
    "final_g_loss": "G's loss, mean of the last three logged iterations (nats)",
    "single_class_runs": "runs whose samples the judge puts all in one class (count)",
    "seeds": "seeds averaged (count)",
    "d_loss": "D's binary cross-entropy, real plus fake (nats)",
    "g_loss": "G's binary cross-entropy (nats)",
    "d_iterations": "D's optimizer's iterations counter after the iteration",
    "g_iterations": "G's optimizer's iterations counter after the iteration (shared_optimizer: the one counter)",
    "g_iterations_shared": "the shared optimizer's counter after the G step (2 per iteration)",
    "g_iterations_own": "G's own optimizer's counter after the G step (1 per iteration)",
    "correction_shared": "Adam's bias correction sqrt(1-b2^t)/(1-b1^t) at the G step, shared counter",
    "correction_own": "the same with G's own counter",
    "ratio": "correction_shared / correction_own: G's bias-correction factor (step-size multiplier) relative to that "
             "of its own optimizer; the steps themselves also depend on m and v",
    "one optimizer for D then G": "how the single Keras optimizer was built",
    "outcome": "what applying D's then G's gradients did",
}
"""Meaning and unit of every column of the study's tables (``reporting.save_table(..., columns=COLUMNS)``)."""
for _k in list(COLUMNS):
    if _k.startswith(("confidence", "coverage_entropy", "classes_seen", "time_per_iteration_ms", "final_")):
        COLUMNS[f"{_k}_mean"] = f"{COLUMNS[_k]}, mean over seeds"
        COLUMNS[f"{_k}_std"] = f"std over seeds of {_k}"


@dataclass(frozen=True)
class GanStudyConfig:
    """Parameters of study 03 and their defaults (the one place they live), validated on construction.

    ``GanStudyConfig(iterations=100)``; ``GanStudyConfig.from_parameters(iterations=None)`` keeps the default.
    """

    methods: Sequence[str] = METHODS
    optimizers: Sequence[str] = ("sgd", "adam")
    learning_rates: dict[str, float] = field(default_factory=lambda: {"sgd": 0.05, "adam": 1e-3})
    iterations: int = 600
    batch: int = 64
    seeds: Sequence[int] = (0, 1, 2)
    generator_scope: str = "generator/"
    discriminator_scope: str = "discriminator/"
    gate_probability: float = 0.5
    classifier_steps: int = 150
    quality_samples: int = 500
    log_every: int = 10
    data_path: str | None = None
    diagnostic_optimizers: Sequence[str] = ("adam",)
    processes: int = 2

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choices("optimizers", self.optimizers, GAN_OPTIMIZERS)
        check_choices("diagnostic_optimizers", self.diagnostic_optimizers, GAN_OPTIMIZERS)
        for name in ("iterations", "batch", "classifier_steps", "quality_samples", "log_every", "processes"):
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

    @classmethod
    def from_parameters(cls, **parameters: Any) -> "GanStudyConfig":
        """The config with the notebook's parameters that are not None; None keeps the default here."""
        return cls(**{k: v for k, v in parameters.items() if v is not None})


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
    """Forward through an MLP, gating the output of activation
    ``act<i>`` with ``keep[i-1]``. ``gated_forward(g, z, [1., 0.])``"""
    i = 0
    for layer in model.layers:
        x = layer(x)
        if keep is not None and layer.name.startswith("act"):
            x = gate(x, keep[i])
            i += 1
    return x


def frozen_by_gates(model: keras.Sequential, keep: Sequence[Any]) -> list[Any]:
    """Per variable, True when the gates block its gradient (a
    0 at or after its layer). ``frozen_by_gates(g, [1, 0])``"""
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
        if method in GATED and method != "random_gate":
            self.opt_d, self.opt_g = MaskedOptimizer(self.opt_d, "hold"), MaskedOptimizer(self.opt_g, "hold")
            self.opt_d.build(d_vars)  # now, so that the snapshot below holds all of their state
            self.opt_g.build(g_vars)
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
        # The audit around train_on_batch, traced once: copies and bitwise comparisons stay in TensorFlow.
        g_vars, d_vars = self.g_vars, self.d_vars
        self._generate = tf.function(lambda z: g(z, training=False))
        self._copy_g = tf.function(lambda: [tf.identity(v) for v in g_vars])
        self._copy_d = tf.function(lambda: [tf.identity(v) for v in d_vars])
        self._change_g = tf.function(lambda before: _drift(before, g_vars))
        self._change_d = tf.function(lambda before: _drift(before, d_vars))

    def reset(self, weights: list[np.ndarray]) -> None:
        """Start a seed: fresh weights, optimizer state back to its initial values (not for the Keras recipe)."""
        if self.initial is None:
            raise ValueError("the trainable_flag recipe compiles its models; make a new runner per seed")
        self.gan.set_weights(weights)
        for o, values in zip(self.optimizers, self.initial):
            restore(o.variables, values)

    def _iteration(self, real: tf.Tensor, z_d: tf.Tensor, z_g: tf.Tensor, do_d: tf.Tensor, do_g: tf.Tensor) -> dict:
        g, d, method = self.gan.generator, self.gan.discriminator, self.method
        gated = method in GATED
        masked = gated and method != "random_gate"
        # -- D step: G must not move ------------------------------------------------------------------
        with tf.GradientTape() as tape:
            fake = g(z_d)
            if method == "stop_gradient":
                fake = tf.stop_gradient(fake)
            d_out = (lambda x: gated_forward(d, x, [do_d[0], do_d[1]])) if gated else d
            d_loss = _d_loss(d_out(real), d_out(fake))
        g_before = [tf.identity(v) for v in self.g_vars]
        d_before = [tf.identity(v) for v in self.d_vars] if gated else []  # copies only of what is audited
        d_frozen_part = frozen_by_gates(d, [do_d[0], do_d[1]]) if gated else None
        if method == "zeroed_gradients":
            grads = tape.gradient(d_loss, self.d_vars + self.g_vars)
            zeroed = [gr if i < len(self.d_vars) else tf.zeros_like(gr) for i, gr in enumerate(grads)]
            self.opt_d.apply_gradients(zip(zeroed, self.d_vars + self.g_vars))
        elif method == "stop_gradient":  # G's gradients are None: Keras skips them
            grads = tape.gradient(d_loss, self.d_vars + self.g_vars)
            with warnings.catch_warnings():  # Keras warns that G's gradients do not exist: that is the method
                warnings.filterwarnings("ignore", message="Gradients do not exist", category=UserWarning)
                self.opt_d.apply_gradients(zip(grads, self.d_vars + self.g_vars))
        elif masked:
            grads = tape.gradient(d_loss, self.d_vars)
            self.opt_d.apply_gradients(zip(grads, self.d_vars), trainable_masks=[~f for f in d_frozen_part])
        else:
            grads = tape.gradient(d_loss, self.d_vars)
            self.opt_d.apply_gradients(zip(grads, self.d_vars))
        other_d = _drift(g_before, self.g_vars)
        part_d = _drift(d_before, self.d_vars, d_frozen_part) if gated else (tf.constant(0, tf.int64), tf.constant(0.0))
        # -- G step: D must not move ------------------------------------------------------------------
        with tf.GradientTape() as tape:
            g_out = gated_forward(g, z_g, [do_g[0], do_g[1]]) if gated else g(z_g)
            g_loss = _g_loss(d(g_out))
        g_before = [tf.identity(v) for v in self.g_vars] if gated else []
        d_before = [tf.identity(v) for v in self.d_vars]
        g_frozen_part = frozen_by_gates(g, [do_g[0], do_g[1]]) if gated else None
        if method == "zeroed_gradients":
            grads = tape.gradient(g_loss, self.d_vars + self.g_vars)
            zeroed = [tf.zeros_like(gr) if i < len(self.d_vars) else gr for i, gr in enumerate(grads)]
            self.opt_g.apply_gradients(zip(zeroed, self.d_vars + self.g_vars))
        elif masked:
            grads = tape.gradient(g_loss, self.g_vars)
            self.opt_g.apply_gradients(zip(grads, self.g_vars), trainable_masks=[~f for f in g_frozen_part])
        else:
            grads = tape.gradient(g_loss, self.g_vars)
            self.opt_g.apply_gradients(zip(grads, self.g_vars))
        other_g = _drift(d_before, self.d_vars)
        part_g = _drift(g_before, self.g_vars, g_frozen_part) if gated else (tf.constant(0, tf.int64), tf.constant(0.0))
        return {"d_loss": d_loss, "g_loss": g_loss,
                "g_changed_entries_in_d_step": other_d[0], "g_max_abs_dW_in_d_step": other_d[1],
                "d_changed_entries_in_g_step": other_g[0], "d_max_abs_dW_in_g_step": other_g[1],
                "gated_changed_entries": part_d[0] + part_g[0], "gated_max_abs_dW": tf.maximum(part_d[1], part_g[1]),
                "d_iterations": tf.cast(self.opt_d.iterations, tf.int64),
                "g_iterations": tf.cast(self.opt_g.iterations, tf.int64)}

    def keras_iteration(self, real: np.ndarray, z_d: np.ndarray, z_g: np.ndarray) -> dict:
        """The Keras recipe's iteration: D.train_on_batch, then the combined model with D frozen."""
        d = self.gan.discriminator
        fake = self._generate(z_d).numpy()
        g_before = self._copy_g()
        d.trainable = True  # the toggles of the classic recipe; see the notebook for what Keras makes of them
        d_loss = d.train_on_batch(np.concatenate([real, fake]),
                                  np.concatenate([np.ones((len(real), 1)), np.zeros((len(fake), 1))]))
        d.trainable = False
        gc, gm = (x.numpy() for x in self._change_g(g_before))
        d_before = self._copy_d()
        g_loss = self.combined.train_on_batch(z_g, np.ones((len(z_g), 1)))
        dc, dm = (x.numpy() for x in self._change_d(d_before))
        # train_on_batch reports the mean over the concatenated real + fake batch, half the sum of the two
        # losses that the other methods report: doubled here, so that every method's D loss is the same quantity.
        return {"d_loss": 2 * float(np.asarray(d_loss).reshape(-1)[0]),
                "g_loss": float(np.asarray(g_loss).reshape(-1)[0]),
                "g_changed_entries_in_d_step": int(gc), "g_max_abs_dW_in_d_step": float(gm),
                "d_changed_entries_in_g_step": int(dc), "d_max_abs_dW_in_g_step": float(dm),
                "gated_changed_entries": 0, "gated_max_abs_dW": 0.0,
                "d_iterations": int(self.opt_d.iterations.numpy()), "g_iterations": int(self.opt_g.iterations.numpy())}


# -- the study --------------------------------------------------------------------------------------
def unknown_variable_trap(optimizer: str = "adam") -> pd.DataFrame:
    """One Keras 3 optimizer for D and then G: raises unless
    built for all variables first. ``unknown_variable_trap()``"""
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
        except ValueError as e:  # the message's variable repr (values and all) shortened to its path
            text = re.sub(r"<Variable path=([^,>]+)[^>]*>", r"\1", str(e), flags=re.S)
            outcome = ". ".join(text.split(". ")[:2]) + "."
        rows.append({"one optimizer for D then G": "optimizer.build(d_vars + g_vars) first" if build_all
                     else "built on first use (D's variables)", "outcome": outcome})
    return pd.DataFrame(rows)


def train_classifier(data: MnistSplits, steps: int, seed: int = 0) -> tuple[keras.Model, float]:
    """The fixed judge of sample quality: the Deep MNIST CNN, and its test accuracy. ``train_classifier(data, 300)``

    Starts with ``enable_determinism(seed)``: the same data, steps and seed give the same judge, bit for bit.
    """
    enable_determinism(seed)
    model = deep_mnist_cnn()
    model.compile(keras.optimizers.Adam(1e-3), loss=LOSS)
    dataset = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shuffle(len(data.y_train), seed=seed)
    model.fit(dataset.repeat().batch(50), steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
    return model, accuracy(model, data.x_test, data.y_test)


def sample_quality(classifier: keras.Model, images: np.ndarray) -> dict[str, float]:
    """Mean classifier confidence and class-coverage entropy (0..1)
    of generated digits in [-1, 1]. ``sample_quality(c, x)``"""
    probs = tf.nn.softmax(classifier((images.reshape(-1, 28, 28, 1) + 1) / 2, training=False)).numpy()
    counts = np.bincount(probs.argmax(axis=1), minlength=10) / len(probs)
    nonzero = counts[counts > 0]
    return {"confidence": float(probs.max(axis=1).mean()),
            "coverage_entropy": float(max(0.0, -(nonzero * np.log(nonzero)).sum() / np.log(10))),
            "classes_seen": int((counts > 0).sum())}


def _latents(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, Z_DIM)).astype(np.float32)


AUDIT_KEYS = ("g_changed_entries_in_d_step", "g_max_abs_dW_in_d_step", "d_changed_entries_in_g_step",
              "d_max_abs_dW_in_g_step", "gated_changed_entries", "gated_max_abs_dW")
"""Per run: ``*_changed_entries*`` summed over iterations, ``*_max_abs_dW*`` the largest over iterations."""


def iteration_draws(rng: np.random.Generator, n_images: int, config: GanStudyConfig) -> tuple:
    """One iteration's random draws, the same for every method: ``(batch indices, z_d, z_g, do)``.

    ``do`` holds D's two gates, then G's (1 = open), drawn with ``config.gate_probability``. Every method draws
    all four, whether it uses them or not, so that every method's ``rng`` stays in step and each iteration of
    every method sees the same batch and latent vectors. ``iteration_draws(np.random.default_rng(0), 3600, cfg)``
    """
    idx = rng.integers(0, n_images, config.batch)
    z_d = rng.normal(size=(config.batch, Z_DIM)).astype(np.float32)
    z_g = rng.normal(size=(config.batch, Z_DIM)).astype(np.float32)
    do = (rng.random(4) < config.gate_probability).astype(np.float32)
    return idx, z_d, z_g, do


def gates_of(method: str, do: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """D's and G's gates for ``method``: the drawn ones, or open where the method gates the other network only."""
    do = do.copy()
    if method == "gate_g_only":
        do[:2] = 1.0
    elif method == "gate_d_only":
        do[2:] = 1.0
    return do[:2], do[2:]


def run_one(runner: _Runner, images: np.ndarray, config: GanStudyConfig, seed: int) -> tuple[list[dict], dict]:
    """Train one GAN; returns the logged iterations and the run's audit totals (``AUDIT_KEYS``).
    ``run_one(r, x, cfg, 0)``

    The batches, latent vectors and gate draws come from ``iteration_draws`` with ``seed``: the same for every
    method, the Keras recipe (which has no gate) included.
    """
    rng = np.random.default_rng(seed)
    keras_recipe = runner.method == "trainable_flag"
    log, times = [], []
    totals: dict[str, Any] = {k: 0.0 if "max" in k else 0 for k in AUDIT_KEYS}
    for it in range(1, config.iterations + 1):
        idx, z_d, z_g, do = iteration_draws(rng, len(images), config)
        real = images[idx]
        start = time.perf_counter()
        if keras_recipe:
            out = runner.keras_iteration(real, z_d, z_g)
        else:
            do_d, do_g = gates_of(runner.method, do)
            out = {k: v.numpy() for k, v in runner.iteration(real, z_d, z_g, do_d, do_g).items()}
        times.append(time.perf_counter() - start)
        for k in totals:
            totals[k] = max(totals[k], float(out[k])) if "max" in k else totals[k] + int(out[k])
        if it % config.log_every == 0 or it == 1:
            log.append({"iteration": it, **{k: float(out[k]) for k in ("d_loss", "g_loss")},
                        "d_iterations": int(out["d_iterations"]), "g_iterations": int(out["g_iterations"])})
    totals["time_per_iteration_ms"] = median_ms(times)
    return log, totals


def train_pairing(config: GanStudyConfig, images: np.ndarray, inits: Mapping[int, list[np.ndarray]], optimizer: str,
                  method: str) -> list[tuple[int, list[dict], dict, np.ndarray]]:
    """Every seed of one (method, optimizer) pairing: ``(seed, log, audit totals, samples)`` per seed.

    ``samples`` are G's outputs for the fixed latent vectors. Depends only on its arguments (each seed restarts
    ``enable_determinism``), so ``gan_study`` may run pairings in worker processes.
    ``train_pairing(cfg, x, inits, "adam", "stop_gradient")``
    """
    fixed_z = _latents(config.quality_samples, 1234)
    out, runner = [], None
    for seed in config.seeds:
        if runner is None or method == "trainable_flag":
            runner = _Runner(method, optimizer, config.learning_rates[optimizer], config)
        if method == "trainable_flag":
            runner.gan.set_weights(inits[seed])
        else:
            runner.reset(inits[seed])
        enable_determinism(seed)  # each run: the same seed, the same bits
        log, totals = run_one(runner, images, config, seed)
        out.append((seed, log, totals, runner.gan.generator(fixed_z, training=False).numpy()))
    return out


def pairings(config: GanStudyConfig) -> list[tuple[str, str]]:
    """The (optimizer, method) pairings of the sweep, in order; diagnostics only under ``diagnostic_optimizers``."""
    return [(optimizer, method) for optimizer in config.optimizers for method in config.methods
            if method not in DIAGNOSTICS or optimizer in config.diagnostic_optimizers]


def gan_study(config: GanStudyConfig, data: MnistSplits, classifier: keras.Model,
              progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
    """Every method x optimizer x seed: (per-run table, loss log, sample grids at the first seed).
    ``gan_study(cfg, data, c)``

    ``grids`` maps (method, optimizer) to 64 samples from the same fixed latent vectors. The pairings run in
    ``config.processes`` worker processes of one TensorFlow thread each (``study.processes``); the tables are the
    same bits for any number of processes.
    """
    images = (data.x_train.reshape(-1, 784) * 2 - 1).astype(np.float32)
    inits = {}
    for seed in config.seeds:
        keras.utils.set_random_seed(seed)
        inits[seed] = Gan().get_weights()
    jobs = [(config, images, inits, optimizer, method) for optimizer, method in pairings(config)]
    runs, logs, grids = [], [], {}

    def collect(i: int, trained: list[tuple[int, list[dict], dict, np.ndarray]]) -> None:
        optimizer, method = jobs[i][3], jobs[i][4]
        for seed, log, totals, samples in trained:
            runs.append({"method": method, "optimizer": optimizer, "seed": seed, **totals,
                         **sample_quality(classifier, samples),
                         "final_d_loss": float(np.mean([r["d_loss"] for r in log[-3:]])),
                         "final_g_loss": float(np.mean([r["g_loss"] for r in log[-3:]]))})
            logs.extend({"method": method, "optimizer": optimizer, "seed": seed, **r} for r in log)
            if seed == config.seeds[0]:
                grids[(method, optimizer)] = samples[:64]
        if progress:
            done = pd.DataFrame(runs).query("method == @method and optimizer == @optimizer")
            if i == 0:
                print(f"gan: {len(jobs)} pairings in {plural(min(config.processes, len(jobs)), 'process', 'es')}. "
                      f"Per run, mean over {plural(len(config.seeds), 'seed')}: changed entry-steps of frozen G in "
                      f"D steps / D in G steps / gated-off part, summed over {config.iterations} iterations; classes "
                      "the judge sees (of 10); time per iteration", flush=True)
            print(f"gan: {optimizer:<4} {method:<18} {done['g_changed_entries_in_d_step'].mean():,.0f} / "
                  f"{done['d_changed_entries_in_g_step'].mean():,.0f} / {done['gated_changed_entries'].mean():,.0f}; "
                  f"{done['classes_seen'].mean():.2f} classes; {done['time_per_iteration_ms'].mean():.1f} ms",
                  flush=True)

    map_in_processes(train_pairing, jobs, config.processes, threads=1, on_result=collect)
    return pd.DataFrame(runs), pd.DataFrame(logs), grids


def plural(n: int, word: str, suffix: str = "s") -> str:
    """``plural(3, "seed") == "3 seeds"``, ``plural(1, "seed") == "1 seed"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"
