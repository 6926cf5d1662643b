"""Study 05: freezing recipes in ``model.fit``, each measured against the way people do it today.

Five jobs people bring to this repository, each done the exact way (``MaskedOptimizer``, ``mask_fn``,
``MaskSchedule``) and the ways in use today, over several seeds:

1. ``new_columns_study``: extend a digits-0-4 classifier to 10 classes and train only the new output
   columns under AdamW: a gradient mask, a constraint that copies the old values back, the exact mask.
2. ``pruning_study``: magnitude-prune ``fc1`` of the Deep MNIST CNN and fine-tune with the Adam/AdamW
   state of dense training: a gradient mask, a re-zeroing constraint, the exact mask.
3. ``unfreezing_study``: gradual unfreezing (top layer first) in one ``fit`` with ``MaskSchedule``,
   against recompiling per stage (a fresh optimizer, or the same one) and flipping ``trainable``.
4. ``sparse_study``: fine-tune a fixed 1-5 % of entries picked by accumulated squared gradients
   (FISH-style), against full and last-layer fine-tuning.
5. ``subnetwork_study``: a random half of every layer's units trains at each step through ``mask_fn``,
   the naive gate against the exact mask.

"Moved" always means: the entry's bits changed (``freezing.audit.changed_bits``) although it was meant to
stay fixed. Every run starts with ``freezing.determinism.enable_determinism(seed)``, and a compiled model
is reused across seeds by assigning its weights and optimizer state, so reruns give bit-identical numbers.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

import freezing
from freezing.audit import changed_bits
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.schedule import MaskSchedule
from freezing.slots import slots
from freezing.validation import check_choice, check_choices, check_int_list, check_positive_int, check_range
from study.data import ACCEPTED_FORMS, MnistSplits
from study.models import deep_mnist_cnn
from study.optimizers import OPTIMIZERS, make_optimizer
from study.reporting import format_mean_std
from study.training import LOSS, StepTimer, accuracy, batch_indices, median_ms, restore, snapshot

OLD_CLASSES = 5
"""Digits 0-4 are the old task, 5-9 the new one."""
NEW_COLUMN_METHODS = ("gradient_mask", "constraint", "exact")
PRUNE_METHODS = ("gradient_mask", "constraint", "exact")
UNFREEZE_METHODS = ("mask_schedule", "recompile_fresh", "recompile_same", "trainable_flip")
SPARSE_METHODS = ("full", "last_layer", "sparse")
SUBNET_METHODS = ("naive_gate", "exact")
PRUNED_LAYER = "fc1"
"""The Deep MNIST CNN layer that is pruned: 3,212,288 of its 3,274,634 parameters."""
_POLICY = {"gradient_mask": "none", "naive_gate": "none", "exact": "hold"}

COLUMNS = {
    "method": "how the entries are frozen (see the notebook's section for the recipe)",
    "variant": "method, with the share of entries FISH may change",
    "optimizer": "the optimizer that fine-tunes (Keras defaults; AdamW with weight decay 0.05)",
    "seed": "random seed of the run (weights, batches, masks)",
    "sparsity": "target share of fc1's kernel pruned to zero (fraction)",
    "fraction": "share of all entries the FISH selection may change (fraction; empty for other methods)",
    "acc_new": "test accuracy on digits 5-9, 10-way (fraction)",
    "acc_old": "test accuracy on digits 0-4, 10-way (fraction)",
    "acc_old_among_old": "test accuracy on digits 0-4, argmax over the 5 old logits only (fraction)",
    "acc_old_before": "test accuracy on digits 0-4 before fine-tuning (fraction)",
    "acc_dense": "test accuracy of the dense CNN before pruning, first prune_eval_samples test images (fraction)",
    "acc_pruned": "test accuracy just after pruning, before fine-tuning (fraction)",
    "acc_finetuned": "test accuracy after fine-tuning the pruned CNN (fraction)",
    "accuracy": "test accuracy on all digits (fraction)",
    "old_moved": "old-column kernel and bias entries whose bits changed (count)",
    "old_entries": "old-column kernel and bias entries that had to stay fixed (count)",
    "old_max_relative_change": "largest |change| of an old entry over the largest |old entry| (fraction)",
    "new_changed": "new-column kernel and bias entries whose bits changed (count)",
    "frozen_momentum_nonzero": "frozen entries whose first moment (momentum) is not exactly 0 at the end (count)",
    "extra_state_bytes": "state the method adds: masks, or the constraint's mask and copy of values (bytes)",
    "step_time_ms": "median wall time of a training step, first (tracing) step left out (ms)",
    "same_weights_as_exact": "all weights bit-identical to the exact mask's run with the same seed (bool)",
    "pruned": "entries of fc1's kernel pruned to zero (count)",
    "moved": "entries that changed their bits while they had to stay fixed (count; recipe 5: entry-steps)",
    "sparsity_kept": "share of fc1's kernel exactly zero after fine-tuning (fraction)",
    "momentum_nonzero_at_start": "pruned entries whose carried-over momentum is not 0 when fine-tuning starts (count)",
    "finished": "the run finished without an error (bool)",
    "error": "the error that stopped the run (first sentence)",
    "frozen_moved": "entries of still-frozen layers that changed before their stage (count)",
    "unfrozen_trained": "every layer changed after its stage began (bool)",
    "state_kept": "the head's Adam momentum and step counter unchanged across every stage boundary (bool)",
    "boundaries": "stage boundaries observed (count)",
    "momentum_norm_lost": "sum over boundaries of the momentum L2 norm lost (norm units)",
    "iterations_at_end": "optimizer steps counted at the end (count)",
    "trained_entries": "entries the method allows to change (count)",
    "total_entries": "entries of the model (count)",
    "changed": "entries whose bits changed during fine-tuning (count)",
    "changed_outside_selection": "entries outside the allowed set whose bits changed (count)",
    "forgetting": "acc_old_before - acc_old: accuracy lost on digits 0-4 (fraction)",
    "p": "probability that a unit trains in a step (fraction)",
    "frozen": "entries frozen in a step, summed over steps (entry-steps)",
    "step": "training step (1-based)",
    "cumulative_moved": "moved entries summed up to this step (entry-steps)",
    "epoch": "epoch (0-based)",
    "when": "begin or end of the epoch",
    "iterations": "the optimizer's step counter",
    "momentum_norm": "L2 norm of the head kernel's Adam momentum",
    "norm_before": "momentum L2 norm at the end of a stage",
    "norm_after": "momentum L2 norm at the start of the next stage (0 = state lost)",
    "iterations_before": "optimizer step counter at the end of a stage",
    "iterations_after": "optimizer step counter at the start of the next stage (0 = restarted)",
    "kept": "momentum and step counter bit-identical across the boundary (bool)",
    "recipe": "the recipe (section of the notebook)",
    "variable": "variable path",
    "cause": "what freezing.diagnose says can move the frozen entries",
    "entries": "frozen entries that cause can move (count); selection table: entries of the variable",
    "fix": "freezing.diagnose's one-sentence fix",
    "selected": "entries FISH selected in this variable (count)",
    "share": "selected / entries (fraction)",
    "task": "the job", "guarantee": "what the method guarantees", "time per step": "measured cost per step",
    "memory": "state the method adds", "evidence": "where the numbers come from (study and run)",
    "scenario": "what was done to layer a, in order", "layer a should": "what the user meant",
    "layer a did": "what layer a did in the last fit", "entries of a changed": "changed entries of a's kernel",
    "as expected": "did == should (bool)", "diagnose names": "causes freezing.diagnose named before the last fit",
}
"""Meaning and unit of every column this study's tables have (``reporting.save_table(..., columns=COLUMNS)``)."""
for _layer in ("head", *(f"fc{i}" for i in range(1, 9))):
    COLUMNS[f"{_layer}_changed"] = f"entries of {_layer} (kernel and bias) whose bits changed since the start (count)"
    COLUMNS[f"{_layer}_entries"] = f"entries of {_layer}, kernel and bias (count)"
COLUMNS.update({f"{name}_{stat}": f"{label} over seeds of: {meaning}" for name, meaning in list(COLUMNS.items())
                for stat, label in (("mean", "mean"), ("std", "standard deviation"), ("min", "smallest"),
                                    ("max", "largest"))})
COLUMNS["seeds"] = "seeds in the group (count)"


@dataclass(frozen=True)
class RecipesConfig:
    """Parameters of study 05, validated on construction; the one place their defaults live.

    ``RecipesConfig(seeds=[0, 1])``; ``RecipesConfig.from_overrides({"seeds": None})`` keeps the default.
    """

    data_path: str | None = None
    allow_download: bool = False
    seeds: Sequence[int] = (0, 1, 2)
    batch: int = 64
    learning_rate: float = 1e-3
    hidden: Sequence[int] = (128, 64)
    pretrain_steps: int = 150
    new_columns_optimizer: str = "adamw"
    new_columns_learning_rate: float = 3e-3
    new_columns_steps: int = 100
    prune_optimizers: Sequence[str] = ("adam", "adamw")
    sparsities: Sequence[float] = (0.5, 0.8, 0.9)
    prune_pretrain_steps: int = 40
    prune_steps: int = 10
    prune_batch: int = 32
    prune_eval_samples: int = 500
    unfreeze_every: int = 1
    unfreeze_steps_per_epoch: int = 15
    sparse_fractions: Sequence[float] = (0.01, 0.05)
    fish_batches: int = 10
    sparse_steps: int = 100
    subnet_p: float = 0.5
    subnet_steps: int = 150

    def __post_init__(self) -> None:
        if self.data_path is not None and (not isinstance(self.data_path, str)
                                           or not Path(self.data_path).expanduser().exists()):
            raise ValueError(f"data_path: {self.data_path!r} does not exist; expected None (the offline default) "
                             f"or {ACCEPTED_FORMS}")
        if not isinstance(self.allow_download, bool):
            raise ValueError(f"allow_download: expected true or false; got {self.allow_download!r}")
        check_int_list("seeds", self.seeds, minimum=0)
        check_int_list("hidden", self.hidden, minimum=1)
        for name in ("batch", "pretrain_steps", "new_columns_steps", "prune_pretrain_steps", "prune_steps",
                     "prune_batch", "prune_eval_samples", "unfreeze_every", "unfreeze_steps_per_epoch",
                     "fish_batches", "sparse_steps", "subnet_steps"):
            check_positive_int(name, getattr(self, name))
        check_range("learning_rate", self.learning_rate, 0.0, 1.0, low_open=True)
        check_range("new_columns_learning_rate", self.new_columns_learning_rate, 0.0, 1.0, low_open=True)
        check_choice("new_columns_optimizer", self.new_columns_optimizer, OPTIMIZERS)
        check_choices("prune_optimizers", self.prune_optimizers, ["adam", "adamw"])
        for name, low, high in (("sparsities", 0.0, 0.999), ("sparse_fractions", 1e-4, 1.0)):
            values = getattr(self, name)
            if isinstance(values, str) or not isinstance(values, Sequence) or not values:
                raise ValueError(f"{name}: expected a non-empty list of numbers in [{low}, {high}]; got {values!r}")
            for v in values:
                check_range(name, v, low, high)
        check_range("subnet_p", self.subnet_p, 0.0, 1.0, low_open=True)

    @classmethod
    def names(cls) -> list[str]:
        """The parameter names, in order. ``"seeds" in RecipesConfig.names()``"""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any]) -> RecipesConfig:
        """A config from papermill's values, where None means "the default". ``RecipesConfig.from_overrides({"seeds": [0]})``"""
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise ValueError(f"RecipesConfig: unknown parameter(s) {unknown}; allowed: {cls.names()}")
        return cls(**{k: v for k, v in overrides.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        """Plain values for metrics.json. ``RecipesConfig().as_dict()["seeds"] == [0, 1, 2]``"""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# -- building blocks a reader can reuse ------------------------------------------------------------
def mlp(classes: int, hidden: Sequence[int] = (128, 64), name: str = "mlp") -> keras.Sequential:
    """A small MNIST MLP: flatten, ``fc1``..``fcN`` (ReLU), ``head``. ``mlp(10).count_params() == 109386``"""
    layers: list[Any] = [keras.Input((28, 28, 1)), keras.layers.Flatten(name="flatten")]
    layers += [keras.layers.Dense(h, activation="relu", name=f"fc{i}") for i, h in enumerate(hidden, start=1)]
    layers.append(keras.layers.Dense(classes, name="head"))
    return keras.Sequential(layers, name=name)


def body_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The hidden Dense layers ``fc1``..``fcN`` of ``mlp``, input side first. ``body_layers(mlp(10))``"""
    return [layer for layer in model.layers if layer.name.startswith("fc")]


def extend_head(weights: Sequence[np.ndarray], new_head: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Weights of the wider model: the old body, old head columns first, then the new columns.

    ``weights`` are ``mlp(5).get_weights()``; ``new_head`` is ``[kernel, bias]`` of a fresh ``mlp(10)`` head,
    whose first columns are overwritten by the old ones. ``extend_head(old.get_weights(), new.layers[-1].get_weights())``
    """
    *body, kernel, bias = [np.asarray(w) for w in weights]
    new_kernel, new_bias = (np.array(w, copy=True) for w in new_head)
    if new_kernel.shape[0] != kernel.shape[0] or new_kernel.shape[1] < kernel.shape[1]:
        raise ValueError(f"extend_head: new head {new_kernel.shape} cannot extend the old head {kernel.shape}")
    new_kernel[:, : kernel.shape[1]] = kernel
    new_bias[: bias.shape[0]] = bias
    return [*body, new_kernel, new_bias]


def magnitude_mask(weights: np.ndarray, sparsity: float) -> np.ndarray:
    """Keep-mask of magnitude pruning: False for exactly ``round(sparsity * size)`` smallest ``|w|``.

    ``magnitude_mask(np.array([3., -1., 2., .5]), 0.5).tolist() == [True, False, True, False]``
    """
    check_range("sparsity", sparsity, 0.0, 1.0)
    flat = np.abs(np.asarray(weights)).ravel()
    pruned = int(round(sparsity * flat.size))
    keep = np.ones(flat.size, bool)
    if pruned:
        keep[np.argpartition(flat, pruned - 1)[:pruned]] = False
    return keep.reshape(np.shape(weights))


def fish_masks(scores: Sequence[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Keep-masks of the ``fraction`` of entries with the largest scores, chosen over all tensors together.

    FISH (Sung et al., 2021) scores an entry by its accumulated squared gradient on the new task; exactly
    ``max(1, round(fraction * total))`` entries are kept. ``fish_masks([np.array([1., 5.]), np.array([3.])], 1/3)``
    gives ``[[False, True], [False]]``.
    """
    check_range("fraction", fraction, 0.0, 1.0, low_open=True)
    flat = np.concatenate([np.asarray(s, np.float64).ravel() for s in scores])
    k = max(1, int(round(fraction * flat.size)))
    chosen = np.zeros(flat.size, bool)
    chosen[np.argsort(-flat, kind="stable")[:k]] = True
    out, start = [], 0
    for s in scores:
        size = int(np.size(s))
        out.append(chosen[start: start + size].reshape(np.shape(s)))
        start += size
    return out


def squared_gradients(model: keras.Model, x: np.ndarray, y: np.ndarray, batch: int, batches: int,
                      seed: int) -> list[np.ndarray]:
    """Sum over ``batches`` minibatches of the squared gradient of the loss, per trainable variable.

    ``squared_gradients(model, x_new, y_new, 64, 10, seed=0)`` -> one array per ``model.trainable_variables``.
    The gradient step is traced once per model and reused by later calls.
    """
    variables = model.trainable_variables
    grads = _SQUARED_GRADIENTS.get(model)
    if grads is None:
        @tf.function
        def grads(xb: tf.Tensor, yb: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                loss = LOSS(yb, model(xb, training=False))
            return [tf.square(g) for g in tape.gradient(loss, variables)]

        _SQUARED_GRADIENTS[model] = grads
    total = [np.zeros(v.shape, np.float64) for v in variables]
    for idx in batch_indices(len(y), batch, batches, seed):
        for t, g in zip(total, grads(x[idx], y[idx])):
            t += g.numpy()
    return total


_SQUARED_GRADIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CopyBack(keras.constraints.Constraint):
    """The constraint recipe people use: after every step, put the entries where ``keep`` is False back.

    ``values=None`` re-zeroes them (pruning); otherwise they are reset to ``values`` (a copy of the old
    weights, 4 bytes per entry). ``keep`` and ``values`` live in variables, so ``reset`` changes them
    without retracing. ``layer.kernel.constraint = CopyBack(keep, layer.kernel.numpy())``
    """

    def __init__(self, keep: Any, values: Any = None):
        self.keep = tf.Variable(np.asarray(keep, bool), trainable=False, name="copy_back_keep")
        self.values = None if values is None else tf.Variable(np.asarray(values, np.float32), trainable=False,
                                                               name="copy_back_values")

    def reset(self, keep: Any = None, values: Any = None) -> None:
        """Store a new mask and/or new values to copy back. ``c.reset(values=w.numpy())``"""
        if keep is not None:
            self.keep.assign(np.asarray(keep, bool))
        if values is not None:
            self.values.assign(np.asarray(values, np.float32))

    def state_bytes(self) -> int:
        """Bytes the constraint stores: the mask, plus the copy of the values. ``CopyBack(np.ones(4)).state_bytes() == 4``"""
        size = int(np.prod(self.keep.shape)) * self.keep.dtype.size
        return size + (0 if self.values is None else int(np.prod(self.values.shape)) * self.values.dtype.size)

    def __call__(self, w: Any) -> tf.Tensor:
        old = tf.zeros((), w.dtype) if self.values is None else tf.cast(self.values, w.dtype)
        return tf.where(self.keep, w, old)


class RandomUnits:
    """``mask_fn`` for ``MaskedOptimizer``: at every step each unit (output column) trains with probability ``p``.

    The mask has shape ``[units]``, which broadcasts to a Dense kernel ``(in, units)`` and its bias; it is
    drawn from a stateless RNG keyed by (seed, step, variable), so it is the same whenever it is recomputed.
    ``seed`` is a variable: ``reseed`` changes it without retracing. ``RandomUnits(model.trainable_variables, .5, 0)``
    """

    def __init__(self, variables: Sequence[Any], p: float, seed: int):
        self.index = {v.path: i for i, v in enumerate(variables)}
        self.p = float(p)
        self.seed = tf.Variable(seed, dtype=tf.int64, trainable=False, name="random_units_seed")

    def reseed(self, seed: int) -> None:
        """Draw a different sequence of masks. ``fn.reseed(1)``"""
        self.seed.assign(seed)

    def __call__(self, step: Any, variable: Any) -> tf.Tensor:
        key = tf.cast(step, tf.int64) * len(self.index) + self.index[variable.path]
        draw = tf.random.stateless_uniform([variable.shape[-1]], seed=tf.stack([tf.identity(self.seed), key]))
        return draw < self.p


class StepAudit(StepTimer):
    """Per step: how many entries frozen *in that step* by ``mask_fn`` changed their bits (timed apart from the audit)."""

    def __init__(self, variables: Sequence[Any], mask_fn: Callable, optimizer: Any):
        super().__init__()
        self.variables, self.mask_fn, self.optimizer = list(variables), mask_fn, optimizer
        self.rows: list[dict[str, int]] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._step = int(self.optimizer.iterations.numpy())
        self._before = [v.numpy().copy() for v in self.variables]
        self._keep = [np.broadcast_to(self.mask_fn(self._step, v).numpy(), v.shape) for v in self.variables]
        super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        super().on_train_batch_end(batch, logs)
        moved = sum(int((changed_bits(b, v.numpy()) & ~k).sum())
                    for b, v, k in zip(self._before, self.variables, self._keep))
        frozen = sum(int((~k).sum()) for k in self._keep)
        self.rows.append({"step": self._step + 1, "moved": moved, "frozen": frozen})


# -- shared helpers --------------------------------------------------------------------------------
def _inner(optimizer: Any) -> Any:
    while isinstance(optimizer, MaskedOptimizer):
        optimizer = optimizer.inner
    return optimizer


def _indices(n: int, batch: int, steps: int, seed: int) -> np.ndarray:
    return np.concatenate(list(batch_indices(n, batch, steps, seed)))


def _fit_steps(model: keras.Model, x: np.ndarray, y: np.ndarray, batch: int, steps: int, seed: int,
               callbacks: Sequence[keras.callbacks.Callback] = ()) -> None:
    """Exactly ``steps`` minibatches of ``fit``, in a seeded order."""
    idx = _indices(len(y), batch, steps, seed)
    model.fit(x[idx], y[idx], batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))


def _dataset(x: np.ndarray, y: np.ndarray, batch: int, steps: int, seed: int) -> tf.data.Dataset:
    idx = _indices(len(y), batch, steps, seed)
    return tf.data.Dataset.from_tensor_slices((x[idx], y[idx])).batch(batch)


def old_new(x: np.ndarray, y: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(x_old, y_old), (x_new, y_new)``: digits 0-4 and 5-9. ``(xo, yo), (xn, yn) = old_new(data.x_train, data.y_train)``"""
    old = y < OLD_CLASSES
    return (x[old], y[old]), (x[~old], y[~old])


def _digest(variables: Sequence[Any]) -> str:
    """A fingerprint of the variables' bits: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def _moved(before: np.ndarray, after: np.ndarray, frozen: np.ndarray) -> int:
    return int((changed_bits(before, after) & np.broadcast_to(frozen, before.shape)).sum())


def _momentum_nonzero(optimizer: Any, variable: Any, frozen: np.ndarray) -> int:
    """Frozen entries whose first moment (momentum) is not exactly zero."""
    m = slots(optimizer, variable).get("momentum")
    return 0 if m is None else int(((m.numpy() != 0) & np.broadcast_to(frozen, m.shape)).sum())


def _diagnosis_rows(recipe: str, method: str, diagnosis: freezing.Diagnosis) -> list[dict[str, Any]]:
    rows = [{"recipe": recipe, "method": method, **r} for r in diagnosis.rows()]
    return rows or [{"recipe": recipe, "method": method, "variable": "", "cause": "(none)", "entries": 0,
                     "fix": "no cause can move the frozen entries"}]


@dataclass
class Pretrained:
    """One seed's MLP trained on digits 0-4, and its head extended to 10 classes."""

    seed: int
    weights: list[np.ndarray]
    extended: list[np.ndarray]
    acc_old: float
    step_time_ms: float


def pretrain_mlps(config: RecipesConfig, data: MnistSplits) -> dict[int, Pretrained]:
    """Per seed: train ``mlp(5)`` on digits 0-4 with Adam, and extend its head to 10 classes. ``pretrain_mlps(cfg, data)``"""
    (x_old, y_old), _ = old_new(data.x_train, data.y_train)
    (xt_old, yt_old), _ = old_new(data.x_test, data.y_test)
    model = mlp(OLD_CLASSES, config.hidden)
    opt = make_optimizer("adam", config.learning_rate)
    model.compile(optimizer=opt, loss=LOSS)
    opt.build(model.trainable_variables)
    opt_init = snapshot(opt.variables)
    out = {}
    for seed in config.seeds:
        enable_determinism(seed)
        model.set_weights(mlp(OLD_CLASSES, config.hidden).get_weights())
        wide_head = mlp(10, config.hidden).get_layer("head").get_weights()
        restore(opt.variables, opt_init)
        timer = StepTimer()
        _fit_steps(model, x_old, y_old, config.batch, config.pretrain_steps, seed, [timer])
        weights = model.get_weights()
        out[seed] = Pretrained(seed, weights, extend_head(weights, wide_head),
                               accuracy(model, xt_old, yt_old), median_ms(timer.times))
    return out


def _accuracies(model: keras.Model, data: MnistSplits) -> dict[str, float]:
    (xo, yo), (xn, yn) = old_new(data.x_test, data.y_test)
    logits_old = np.asarray(model(xo, training=False))
    return {"acc_old": accuracy(model, xo, yo), "acc_new": accuracy(model, xn, yn),
            "acc_old_among_old": float(np.mean(np.argmax(logits_old[:, :OLD_CLASSES], -1) == yo))}


# -- 1. train only the new columns --------------------------------------------------------------------
@dataclass
class StudyResult:
    """Rows per run (method x seed ...), plus what a study found along the way."""

    runs: pd.DataFrame
    diagnosis: pd.DataFrame = field(default_factory=pd.DataFrame)
    extra: dict[str, Any] = field(default_factory=dict)


def new_columns_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Train only the 5 new output columns of the extended classifier on digits 5-9; body frozen. ``new_columns_study(cfg, data, pre)``"""
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    keep = np.arange(10) >= OLD_CLASSES  # the new columns train
    rows, diagnosis = [], []
    for method in NEW_COLUMN_METHODS:
        model = mlp(10, config.hidden)
        for layer in body_layers(model):
            layer.trainable = False
        head = model.get_layer("head")
        inner = make_optimizer(config.new_columns_optimizer, config.new_columns_learning_rate)
        constraints = None
        if method == "constraint":
            opt = inner
            constraints = (CopyBack(keep[None, :], head.kernel.numpy()), CopyBack(keep, head.bias.numpy()))
            head.kernel.constraint, head.bias.constraint = constraints
        else:
            opt = MaskedOptimizer(inner, policy=_POLICY[method])
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        if isinstance(opt, MaskedOptimizer):
            opt.set_mask(head.kernel, keep[None, :])
            opt.set_mask(head.bias, keep)
        opt_init = snapshot(opt.variables)
        frozen = {head.kernel.path: ~keep[None, :], head.bias.path: ~keep}
        n_frozen = int(head.kernel.shape[0] * OLD_CLASSES + OLD_CLASSES)
        for seed in config.seeds:
            enable_determinism(seed)
            model.set_weights(pretrained[seed].extended)
            restore(opt.variables, opt_init)
            if constraints is not None:
                constraints[0].reset(values=head.kernel.numpy())
                constraints[1].reset(values=head.bias.numpy())
            before = [head.kernel.numpy().copy(), head.bias.numpy().copy()]
            if seed == config.seeds[0]:
                diagnosis += _diagnosis_rows("1 new columns", method, freezing.diagnose(model, frozen))
            timer = StepTimer()
            _fit_steps(model, x_new, y_new, config.batch, config.new_columns_steps, seed, [timer])
            after = [head.kernel.numpy(), head.bias.numpy()]
            moved = _moved(before[0], after[0], ~keep[None, :]) + _moved(before[1], after[1], ~keep)
            old_a, old_b = (np.concatenate([w[..., :OLD_CLASSES].ravel() for w in ws]) for ws in (after, before))
            largest = float(np.max(np.abs(old_a - old_b)) / np.max(np.abs(old_b)))
            trained = _moved(before[0], after[0], keep[None, :]) + _moved(before[1], after[1], keep)
            slot_moved = sum(_momentum_nonzero(inner, v, f) for v, f in ((head.kernel, ~keep[None, :]),
                                                                          (head.bias, ~keep)))
            extra_bytes = (opt.mask_bytes() if isinstance(opt, MaskedOptimizer)
                           else sum(c.state_bytes() for c in constraints))
            rows.append({"method": method, "optimizer": config.new_columns_optimizer, "seed": seed,
                         "weights": _digest(model.weights),
                         **_accuracies(model, data), "acc_old_before": pretrained[seed].acc_old,
                         "old_moved": moved, "old_entries": n_frozen, "old_max_relative_change": largest,
                         "new_changed": trained,
                         "frozen_momentum_nonzero": slot_moved, "extra_state_bytes": extra_bytes,
                         "step_time_ms": median_ms(timer.times)})
    runs = pd.DataFrame(rows)
    ref = runs[runs["method"] == "exact"].set_index("seed")["weights"]
    runs["same_weights_as_exact"] = [w == ref.get(s) for s, w in zip(runs["seed"], runs["weights"])]
    return StudyResult(runs.drop(columns="weights"), pd.DataFrame(diagnosis))


# -- 2. pruned weights stay zero --------------------------------------------------------------------
@dataclass
class CnnState:
    """The Deep MNIST CNN after dense training with Adam: all its variables and Adam's state."""

    seed: int
    variables: list[np.ndarray]
    slots: dict[str, dict[str, np.ndarray]]
    iterations: int
    accuracy: float
    step_time_ms: float


def _eval_cnn(model: keras.Model, data: MnistSplits, n: int) -> float:
    return accuracy(model, data.x_test[:n], data.y_test[:n])


def pretrain_cnns(config: RecipesConfig, data: MnistSplits) -> dict[int, CnnState]:
    """Per seed: dense training of the Deep MNIST CNN on all digits with Adam; keep weights and Adam state. ``pretrain_cnns(cfg, data)``"""
    model = deep_mnist_cnn()
    opt = make_optimizer("adam", config.learning_rate)
    model.compile(optimizer=opt, loss=LOSS)
    opt.build(model.trainable_variables)
    opt_init = snapshot(opt.variables)
    out = {}
    for seed in config.seeds:
        enable_determinism(seed)
        restore(model.variables, snapshot(deep_mnist_cnn().variables))  # this seed's init and dropout stream
        restore(opt.variables, opt_init)
        timer = StepTimer()
        _fit_steps(model, data.x_train, data.y_train, config.prune_batch, config.prune_pretrain_steps, seed, [timer])
        state = {v.path: {k: s.numpy().copy() for k, s in slots(opt, v).items()} for v in model.trainable_variables}
        out[seed] = CnnState(seed, snapshot(model.variables), state, int(opt.iterations.numpy()),
                             _eval_cnn(model, data, config.prune_eval_samples), median_ms(timer.times))
    return out


def load_cnn_state(model: keras.Model, optimizer: Any, state: CnnState) -> None:
    """Put a ``CnnState`` into a Deep MNIST CNN and a built Adam/AdamW (looked up through wrappers). ``load_cnn_state(m, opt, s)``"""
    restore(model.variables, state.variables)
    inner = _inner(optimizer)
    for v in model.trainable_variables:
        for name, slot in slots(inner, v).items():
            slot.assign(state.slots[v.path][name])
    inner.iterations.assign(state.iterations)


def dense_cnn(state: CnnState, optimizer: str = "adam", learning_rate: float = 1e-3) -> tuple[keras.Model, Any]:
    """A new Deep MNIST CNN and a built optimizer holding the state of dense training. ``model, adam = dense_cnn(s)``"""
    model = deep_mnist_cnn()
    opt = make_optimizer(optimizer, learning_rate)
    opt.build(model.trainable_variables)
    load_cnn_state(model, opt, state)
    return model, opt


def pruning_study(config: RecipesConfig, data: MnistSplits, states: Mapping[int, CnnState]) -> StudyResult:
    """Prune fc1 to each sparsity, fine-tune with the dense run's Adam/AdamW state; one row per run. ``pruning_study(cfg, data, states)``"""
    rows, diagnosis, pruned_acc, acc_by_weights, masks = [], [], {}, {}, {}
    for name in config.prune_optimizers:
        for method in PRUNE_METHODS:
            model = deep_mnist_cnn()
            inner = make_optimizer(name, config.learning_rate)
            fc1 = model.get_layer(PRUNED_LAYER)
            constraint = None
            if method == "constraint":
                opt = inner
                constraint = CopyBack(np.ones(fc1.kernel.shape, bool))  # re-zero
                fc1.kernel.constraint = constraint
            else:
                opt = MaskedOptimizer(inner, policy=_POLICY[method])
            model.compile(optimizer=opt, loss=LOSS)
            opt.build(model.trainable_variables)
            for seed in config.seeds:
                for sparsity in config.sparsities:
                    enable_determinism(seed)
                    load_cnn_state(model, opt, states[seed])
                    key = (seed, sparsity)
                    if key not in masks:  # the same dense weights for every optimizer and method
                        masks[key] = magnitude_mask(fc1.kernel.numpy(), sparsity)
                    keep = masks[key]
                    fc1.kernel.assign(np.where(keep, fc1.kernel.numpy(), np.float32(0)))
                    if constraint is not None:
                        constraint.reset(keep=keep)
                    else:
                        opt.set_mask(fc1.kernel, keep)
                    if key not in pruned_acc:
                        pruned_acc[key] = _eval_cnn(model, data, config.prune_eval_samples)
                    momentum_at_start = _momentum_nonzero(inner, fc1.kernel, ~keep)
                    if seed == config.seeds[0] and sparsity == config.sparsities[0]:
                        diagnosis += _diagnosis_rows(f"2 pruning, {name}", method,
                                                     freezing.diagnose(model, {fc1.kernel.path: ~keep}))
                    before = fc1.kernel.numpy().copy()
                    timer = StepTimer()
                    _fit_steps(model, data.x_train, data.y_train, config.prune_batch, config.prune_steps,
                               seed + 1000, [timer])
                    after = fc1.kernel.numpy()
                    digest = _digest(model.trainable_variables)
                    if digest not in acc_by_weights:  # bit-identical weights have the same accuracy
                        acc_by_weights[digest] = _eval_cnn(model, data, config.prune_eval_samples)
                    extra = opt.mask_bytes() if constraint is None else constraint.state_bytes()
                    rows.append({"optimizer": name, "method": method, "seed": seed, "sparsity": sparsity,
                                 "pruned": int((~keep).sum()), "moved": _moved(before, after, ~keep),
                                 "sparsity_kept": float(np.mean(after == 0)),
                                 "momentum_nonzero_at_start": momentum_at_start,
                                 "acc_dense": states[seed].accuracy, "acc_pruned": pruned_acc[key],
                                 "acc_finetuned": acc_by_weights[digest],
                                 "step_time_ms": median_ms(timer.times), "extra_state_bytes": extra,
                                 "weights": digest})
    runs = pd.DataFrame(rows)
    ref = runs[runs["method"] == "exact"].set_index(["optimizer", "seed", "sparsity"])["weights"]
    runs["same_weights_as_exact"] = [
        w == ref.get((o, s, p)) for o, s, p, w in zip(runs["optimizer"], runs["seed"], runs["sparsity"], runs["weights"])]
    dense_ms = float(np.mean([s.step_time_ms for s in states.values()]))
    return StudyResult(runs.drop(columns="weights"), pd.DataFrame(diagnosis), {"dense_adam_step_time_ms": dense_ms})


# -- 3. staged (gradual) unfreezing ----------------------------------------------------------------
class _EpochProbe(keras.callbacks.Callback):
    """At each epoch's start and end: the head's Adam momentum and step; at the end, accuracy and layer changes.

    ``current()`` returns the (model, optimizer) training now: the recompiling variants switch models between stages.
    """

    def __init__(self, current: Callable[[], tuple[keras.Model, Any]], start: Mapping[str, list[np.ndarray]],
                 eval_x: np.ndarray, eval_y: np.ndarray, log: list[dict[str, Any]]):
        super().__init__()
        self._current, self._start = current, start
        self._eval, self.log = (eval_x, eval_y), log

    def _state(self) -> tuple[np.ndarray, int]:
        model, opt = self._current()
        head = model.get_layer("head").kernel
        return slots(opt, head)["momentum"].numpy().copy(), int(opt.iterations.numpy())

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        momentum, step = self._state()
        self.log.append({"epoch": epoch, "when": "begin", "momentum": momentum, "iterations": step})

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        momentum, step = self._state()
        model = self._current()[0]
        changed = {f"{name}_changed": sum(int(changed_bits(w0, w.numpy()).sum())
                                          for w0, w in zip(start, model.get_layer(name).weights))
                   for name, start in self._start.items()}
        self.log.append({"epoch": epoch, "when": "end", "momentum": momentum, "iterations": step,
                         "accuracy": accuracy(model, *self._eval), **changed})


def _set_stage(layers: Sequence[keras.layers.Layer], stage: int) -> None:
    """Stage s: the top s+1 of ``layers`` train (input side first)."""
    for i, layer in enumerate(layers):
        layer.trainable = i >= len(layers) - 1 - stage


def _unfreezing_layers(model: keras.Model) -> list[keras.layers.Layer]:
    return [*body_layers(model), model.get_layer("head")]


class _Compiled:
    """A model compiled once with a fresh Adam; ``reset`` puts the Adam back to its initial state (a new optimizer)."""

    def __init__(self, config: RecipesConfig, stage: int | None = None, masked: bool = False):
        self.model = mlp(10, config.hidden)
        self.layers = _unfreezing_layers(self.model)
        if stage is not None:
            _set_stage(self.layers, stage)
        adam = make_optimizer("adam", config.learning_rate)
        self.optimizer = MaskedOptimizer(adam, policy="hold") if masked else adam
        self.model.compile(optimizer=self.optimizer, loss=LOSS)
        self.optimizer.build(self.model.trainable_variables)
        self._initial = snapshot(self.optimizer.variables)

    def reset(self, weights: Sequence[np.ndarray]) -> None:
        self.model.set_weights(weights)
        restore(self.optimizer.variables, self._initial)


def unfreezing_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Gradual unfreezing on digits 5-9, top layer first, one more every ``unfreeze_every`` epochs.

    ``mask_schedule``: one ``fit`` with ``MaskSchedule``. ``recompile_fresh``: each stage compiled with its own
    flags and a new Adam (one compiled model per stage, its Adam reset for every seed: the same as compiling anew,
    traced once). ``recompile_same``: compile again with the same Adam (first seed only: it raises). ``trainable_flip``:
    compile once with the first stage's flags, then flip ``trainable`` between ``fit`` calls. ``unfreezing_study(cfg, data, pre)``
    """
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    _, (xt_new, yt_new) = old_new(data.x_test, data.y_test)
    k, spe = config.unfreeze_every, config.unfreeze_steps_per_epoch
    masked = _Compiled(config, masked=True)
    names = [layer.name for layer in masked.layers]
    stages = len(names)
    epochs = stages * k
    per_stage = [_Compiled(config, stage) for stage in range(stages)]
    flip = _Compiled(config, stage=0)
    log_rows, run_rows, diagnosis = [], [], []

    for method in UNFREEZE_METHODS:
        for seed in config.seeds if method != "recompile_same" else config.seeds[:1]:
            enable_determinism(seed)
            weights = pretrained[seed].extended
            start = {n: [np.asarray(w) for w in ws]
                     for n, ws in zip(names, zip(weights[0::2], weights[1::2]))}  # (kernel, bias) per layer
            log: list[dict[str, Any]] = []
            timer = StepTimer()
            data_all = _dataset(x_new, y_new, config.batch, epochs * spe, seed)
            now: dict[str, Any] = {}
            probe = _EpochProbe(lambda: (now["model"], now["opt"]), start, xt_new, yt_new, log)
            error = ""
            if method == "mask_schedule":
                masked.reset(weights)
                now.update(model=masked.model, opt=masked.optimizer)
                schedule = MaskSchedule.gradual_unfreezing(masked.layers, every=k)
                masked.model.fit(data_all, epochs=epochs, steps_per_epoch=spe, verbose=0, shuffle=False,
                                 callbacks=[schedule, probe, timer])
            else:
                if method == "trainable_flip":
                    _set_stage(flip.layers, 0)
                    flip.reset(weights)
                elif method == "recompile_same":
                    same = _Compiled(config, stage=0)
                    same.reset(weights)
                for stage in range(stages):
                    part = data_all.skip(stage * k * spe).take(k * spe)
                    if method == "recompile_fresh":
                        compiled = per_stage[stage]
                        compiled.reset(weights if stage == 0 else now["model"].get_weights())
                    elif method == "trainable_flip":
                        compiled = flip
                        _set_stage(flip.layers, stage)  # the trap: the flags change, nothing is recompiled
                    else:
                        compiled = same
                        if stage > 0:
                            _set_stage(same.layers, stage)
                            same.model.compile(optimizer=same.optimizer, loss=LOSS)  # the same optimizer
                            diagnosis += _diagnosis_rows("3 unfreezing", method,
                                                         freezing.diagnose(same.model, [same.layers[-1 - stage]]))
                    now.update(model=compiled.model, opt=compiled.optimizer)
                    try:
                        compiled.model.fit(part, initial_epoch=stage * k, epochs=(stage + 1) * k, steps_per_epoch=spe,
                                           verbose=0, shuffle=False, callbacks=[probe, timer])
                    except ValueError as e:
                        error = str(e).split(" When working")[0]
                        break
            model = now["model"]
            for row in log:
                row.update(method=method, seed=seed)
            log_rows += log
            ends = [r for r in log if r["when"] == "end"]
            frozen_moved = 0
            for i, n in enumerate(names):
                unfreeze_epoch = (stages - 1 - i) * k
                if unfreeze_epoch > 0 and len(ends) >= unfreeze_epoch:
                    frozen_moved += ends[unfreeze_epoch - 1][f"{n}_changed"]
            boundaries = _boundaries(log, k, stages)
            last = ends[-1] if ends else {}
            run_rows.append({
                "method": method, "seed": seed, "finished": not error, "error": error,
                "acc_new": last.get("accuracy", np.nan) if not error else np.nan,
                "acc_old": accuracy(model, *old_new(data.x_test, data.y_test)[0]) if not error else np.nan,
                **{f"{n}_changed": last.get(f"{n}_changed", 0) for n in names},
                **{f"{n}_entries": sum(int(np.size(w)) for w in start[n]) for n in names},
                "frozen_moved": frozen_moved,
                "unfrozen_trained": all(last.get(f"{n}_changed", 0) > 0 for n in names),
                "state_kept": (bool(len(boundaries)) and all(b["kept"] for b in boundaries)) if not error else None,
                "boundaries": len(boundaries),
                "momentum_norm_lost": float(sum(b["norm_before"] - b["norm_after"] for b in boundaries)),
                "iterations_at_end": last.get("iterations", 0),
                "step_time_ms": median_ms(timer.times) if timer.times else np.nan,
                "extra_state_bytes": masked.optimizer.mask_bytes() if method == "mask_schedule" else 0,
            })
    curves = pd.DataFrame([{k2: v for k2, v in r.items() if k2 != "momentum"}
                           | {"momentum_norm": float(np.linalg.norm(r["momentum"]))} for r in log_rows])
    boundary_rows = []
    for (method, seed), group in pd.DataFrame(log_rows).groupby(["method", "seed"], sort=False):
        for b in _boundaries(group.to_dict("records"), k, stages):
            boundary_rows.append({"method": method, "seed": seed, **b})
    return StudyResult(pd.DataFrame(run_rows), pd.DataFrame(diagnosis),
                       {"curves": curves, "boundaries": pd.DataFrame(boundary_rows),
                        "layers": names, "epochs": epochs, "every": k})


def _boundaries(log: Sequence[Mapping[str, Any]], every: int, stages: int) -> list[dict[str, Any]]:
    """At each stage boundary: the head's momentum at the end of the stage and at the start of the next."""
    out = []
    for stage in range(1, stages):
        epoch = stage * every
        end = [r for r in log if r["when"] == "end" and r["epoch"] == epoch - 1]
        begin = [r for r in log if r["when"] == "begin" and r["epoch"] == epoch]
        if not end or not begin:
            continue
        a, b = end[-1], begin[-1]
        out.append({"epoch": epoch, "norm_before": float(np.linalg.norm(a["momentum"])),
                    "norm_after": float(np.linalg.norm(b["momentum"])), "iterations_before": a["iterations"],
                    "iterations_after": b["iterations"],
                    "kept": bool(not changed_bits(a["momentum"], b["momentum"]).any()
                                 and a["iterations"] == b["iterations"])})
    return out


def trainable_traps(seed: int = 0) -> pd.DataFrame:
    """What Keras 3 does when ``trainable`` changes around ``compile``/``fit``, observed on two-layer models.

    Three models; the rows of one model continue from the row before. Each row records what layer ``a`` did in
    its ``fit`` (its entries changed, or not, or the fit raised), what it should have done, and, where ``a``
    should stay or the optimizer does not know it, the causes ``freezing.diagnose`` names just before that
    ``fit`` for ``a`` believed frozen. Every ``fit`` uses batches of 16 unless the row says otherwise: a new
    batch shape makes ``fit`` retrace its train step. ``trainable_traps(0)``
    """
    enable_determinism(seed)
    rng = np.random.default_rng(seed)
    x, y = rng.random((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
    rows = []

    def start(frozen: bool, first_fit: bool = True) -> keras.Model:
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="a"), keras.layers.Dense(3, name="b")],
                             name="net")
        m.get_layer("a").trainable = not frozen
        m.compile(keras.optimizers.Adam(0.01), LOSS)
        if first_fit:
            m.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
        return m

    def observe(scenario: str, should: str, m: keras.Model, batch: int = 16) -> None:
        opt = m.optimizer
        unknown = opt.built and any(opt._var_key(v) not in opt._trainable_variables_indices for v in m.trainable_variables)
        causes = ""
        if should == "stay" or unknown:
            causes = ", ".join(sorted(freezing.diagnose(m, [m.get_layer("a")]).causes)) or "(none)"
        w0 = m.get_layer("a").kernel.numpy().copy()
        error = ""
        try:
            m.fit(x, y, epochs=1, batch_size=batch, verbose=0, shuffle=False)
        except ValueError as e:
            error = str(e).split(" When working")[0]
        changed = int(changed_bits(w0, m.get_layer("a").kernel.numpy()).sum())
        did = "raised" if error else ("trained" if changed else "stayed")
        rows.append({"scenario": scenario, "layer a should": should, "layer a did": did,
                     "entries of a changed": f"{changed} of {w0.size}",
                     "as expected": did == {"stay": "stayed", "train": "trained"}[should],
                     "diagnose names": causes, "error": error})

    m = start(frozen=False)
    m.get_layer("a").trainable = False
    observe("model 1: compile; fit; a.trainable = False; fit (no recompile)", "stay", m)
    observe("model 1, then: fit with batches of 32 (fit retraces)", "stay", m, batch=32)
    m = start(frozen=False, first_fit=False)
    m.get_layer("a").trainable = False
    observe("model 2: compile; a.trainable = False before the first fit; fit", "stay", m)
    m = start(frozen=True)
    m.get_layer("a").trainable = True
    observe("model 3: a.trainable = False; compile; fit; a.trainable = True; fit (no recompile)", "train", m)
    observe("model 3, then: fit with batches of 32 (fit retraces)", "train", m, batch=32)
    m.compile(m.optimizer, LOSS)
    observe("model 3, then: compile with the same optimizer; fit", "train", m)
    m.compile(keras.optimizers.Adam(0.01), LOSS)
    observe("model 3, then: compile with a new optimizer; fit", "train", m)
    return pd.DataFrame(rows)


# -- 4. sparse fine-tuning -------------------------------------------------------------------------------
def sparse_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Fine-tune on digits 5-9: everything, the head only, or the FISH-selected entries. ``sparse_study(cfg, data, pre)``"""
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    rows, selection = [], []
    for method in SPARSE_METHODS:
        model = mlp(10, config.hidden)
        if method == "last_layer":
            for layer in body_layers(model):
                layer.trainable = False
        inner = make_optimizer("adam", config.learning_rate)
        opt = MaskedOptimizer(inner, policy="hold") if method == "sparse" else inner
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        opt_init = snapshot(opt.variables)
        all_vars = list(model.weights)
        fractions = config.sparse_fractions if method == "sparse" else [np.nan]
        for seed in config.seeds:
            scores = None
            for fraction in fractions:
                enable_determinism(seed)
                model.set_weights(pretrained[seed].extended)
                restore(opt.variables, opt_init)
                acc_before = _accuracies(model, data)
                trained = {v.path: np.ones(v.shape, bool) for v in model.trainable_variables}
                if method == "sparse":
                    if scores is None:
                        scores = squared_gradients(model, x_new, y_new, config.batch, config.fish_batches, seed)
                    for v, m in zip(model.trainable_variables, fish_masks(scores, fraction)):
                        opt.set_mask(v, m)
                        trained[v.path] = m
                        if seed == config.seeds[0]:
                            selection.append({"fraction": fraction, "variable": v.path, "selected": int(m.sum()),
                                              "entries": int(m.size), "share": float(m.mean())})
                before = snapshot(all_vars)
                timer = StepTimer()
                _fit_steps(model, x_new, y_new, config.batch, config.sparse_steps, seed, [timer])
                changed = outside = 0
                for v, b in zip(all_vars, before):
                    diff = changed_bits(b, v.numpy())
                    changed += int(diff.sum())
                    outside += int((diff & ~trained.get(v.path, np.zeros(v.shape, bool))).sum())
                after = _accuracies(model, data)
                variant = method if method != "sparse" else f"sparse {100 * fraction:g} %"
                rows.append({"method": method, "variant": variant, "fraction": fraction, "seed": seed,
                             "trained_entries": int(sum(m.sum() for m in trained.values())),
                             "total_entries": int(sum(np.prod(v.shape) for v in all_vars)),
                             "changed": changed, "changed_outside_selection": outside,
                             "acc_new": after["acc_new"], "acc_old": after["acc_old"],
                             "acc_old_before": acc_before["acc_old"],
                             "forgetting": acc_before["acc_old"] - after["acc_old"],
                             "step_time_ms": median_ms(timer.times),
                             "extra_state_bytes": opt.mask_bytes() if method == "sparse" else 0})
    return StudyResult(pd.DataFrame(rows), extra={"selection": pd.DataFrame(selection)})


# -- 5. random sub-network every step --------------------------------------------------------------------
def subnetwork_study(config: RecipesConfig, data: MnistSplits) -> StudyResult:
    """From scratch on all digits, a random ``subnet_p`` of each layer's units trains at every step. ``subnetwork_study(cfg, data)``"""
    rows, steps, diagnosis = [], [], []
    for method in SUBNET_METHODS:
        model = mlp(10, config.hidden)
        mask_fn = RandomUnits(model.trainable_variables, config.subnet_p, config.seeds[0])
        opt = MaskedOptimizer(make_optimizer("adam", config.learning_rate), policy=_POLICY[method], mask_fn=mask_fn)
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        opt_init = snapshot(opt.variables)
        for seed in config.seeds:
            enable_determinism(seed)
            model.set_weights(mlp(10, config.hidden).get_weights())
            restore(opt.variables, opt_init)
            mask_fn.reseed(seed)
            audit = StepAudit(model.trainable_variables, mask_fn, opt)
            _fit_steps(model, data.x_train, data.y_train, config.batch, config.subnet_steps, seed, [audit])
            if seed == config.seeds[0]:
                step = int(opt.iterations.numpy())
                frozen = {v.path: ~np.broadcast_to(mask_fn(step, v).numpy(), v.shape) for v in model.trainable_variables}
                diagnosis += _diagnosis_rows("5 random units", method, freezing.diagnose(model, frozen))
            for r in audit.rows:
                steps.append({"method": method, "seed": seed, **r})
            rows.append({"method": method, "seed": seed, "p": config.subnet_p,
                         "moved": sum(r["moved"] for r in audit.rows), "frozen": sum(r["frozen"] for r in audit.rows),
                         "accuracy": accuracy(model, data.x_test, data.y_test),
                         "step_time_ms": median_ms(audit.times), "extra_state_bytes": opt.mask_bytes()})
    table = pd.DataFrame(steps)
    table["cumulative_moved"] = table.groupby(["method", "seed"])["moved"].cumsum()
    return StudyResult(pd.DataFrame(rows), pd.DataFrame(diagnosis), {"steps": table})


# -- summaries, tables, headline -------------------------------------------------------------------------
def summarize(runs: pd.DataFrame, by: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean, std, min and max over seeds of ``values`` per group, and the seed count. ``summarize(r, ["method"], ["acc_new"])``"""
    grouped = runs.groupby(list(by), sort=False, dropna=False)
    out = grouped[list(values)].agg(["mean", "std", "min", "max"])
    out.columns = [f"{v}_{stat}" for v, stat in out.columns]
    out["seeds"] = grouped["seed"].nunique()
    return out.reset_index()


def display_table(summary: pd.DataFrame, values: Mapping[str, str], index: Sequence[str],
                  counts: Mapping[str, str] | None = None) -> pd.DataFrame:
    """'mean ± std' columns (``values``: column -> heading) and whole counts shown as 'min-max'. ``display_table(s, {"acc_new": "accuracy"}, ["method"])``"""
    out = summary[list(index)].copy()
    for value, heading in values.items():
        out[heading] = [format_mean_std(m, s) for m, s in zip(summary[f"{value}_mean"], summary[f"{value}_std"])]
    for value, heading in (counts or {}).items():
        lo, hi = summary[f"{value}_min"], summary[f"{value}_max"]
        out[heading] = [f"{int(a):,}" if a == b else f"{int(a):,}-{int(b):,}" for a, b in zip(lo, hi)]
    return out.set_index(list(index))


def _read(results_dir: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((Path(results_dir) / name / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def _get(metrics: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(metrics, Mapping) or key not in metrics:
            return None
        metrics = metrics[key]
    return metrics


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool, not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _first(metrics: Any, *keys: str) -> float | None:
    """The first of ``keys`` in ``metrics`` that holds a number, else None (for renamed keys)."""
    for key in keys:
        value = _number(_get(metrics, key)) if isinstance(metrics, Mapping) else None
        if value is not None:
            return value
    return None


def _n(value: Any) -> str:
    """A count with thousands separators, or "n/a"."""
    return "n/a" if _number(value) is None else f"{value:,}"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.1f} %"


def _ms(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{float(value):.1f} ms"


def method_table(metrics: Mapping[str, Any], results_dir: str | Path) -> pd.DataFrame:
    """Which method for which job, across studies 01-05: what it guarantees, what it costs, and the numbers.

    ``metrics`` is this notebook's metrics (the recipe numbers); studies 01-04 are read from
    ``results_dir/<study>/metrics.json`` when present ("not in results/" otherwise). ``method_table(m, "../results")``
    """
    s01, s02 = _read(results_dir, "01_adam_drift"), _read(results_dir, "02_mnist_cnn_freezing")
    s03, s04 = _read(results_dir, "03_gan_alternating"), _read(results_dir, "04_gradients_and_ps")
    missing = "not in results/"
    r1, r2, r3, r4, r5 = (metrics.get(k, {}) for k in ("new_columns", "pruning", "unfreezing", "sparse", "subnetwork"))
    # Studies 01-04 have renamed keys over time: each number is looked up under its current and its older names.
    ft = _get(s02, "finetune") or {}
    drift01 = _get(s01, "drift") or _get(s01, "drift_final_mean") or {}
    naive01 = {k.split("/")[0]: _number(v if not isinstance(v, Mapping) else _first(v, "changed_entries_sum_mean"))
               for k, v in drift01.items() if k.endswith("/naive")}
    drifting = sorted(k for k, v in naive01.items() if v is not None and v > 0)
    n_opt = len(naive01)

    def ft_cell(method: str) -> str:
        r = ft.get(f"adam/{method}")
        changed = _first(r, "conv_changed_entries_mean", "conv_changed")
        step = _first(r, "step_time_ms_mean", "ms_per_step")
        if changed is None:
            return missing
        return f"02 ({method}): {changed:,.0f} frozen conv entries changed, {_ms(step)}/CNN step (Adam)"

    def ft_time(method: str) -> str:
        step = _first(ft.get(f"adam/{method}"), "step_time_ms_mean", "ms_per_step")
        return missing if step is None else f"02: {_ms(step)}/CNN step ({method}, Adam)"

    hold02 = _first(_get(s02, "masks", "adam/hold/p=0.5"), "frozen_changed_total_mean", "changed_total")
    gan03 = _first(_get(s03, "runs", "zeroed_gradients/adam"), "g_changed_entries_in_d_step", "g_changed_in_d_step")
    eval04 = _number(_get(s04, "fetch_costs", "TF1 graph/g.eval() per variable", "ratio"))
    exact04 = _number(_get(s04, "exact_update_max_error"))

    def recipe(m: Mapping[str, Any], method: str, key: str = "moved_max") -> Any:
        return _get(m, "methods", method, key)

    p = r2.get("headline_optimizer", "adam")
    sparse = next((k for k in r4.get("methods", {}) if k.startswith("sparse")), "sparse")
    rows = [
        ("freeze whole layers for the whole run (fine-tuning)", "layer.trainable = False, then compile (or a var_list)",
         "exact: frozen layers get no gradient and no optimizer state",
         f"cheapest: no gradient for frozen layers; {ft_time('var_list')}", "none",
         ft_cell("trainable_recompile") if ft else missing),
        ("change which layers train during one fit (gradual unfreezing)",
         "MaskedOptimizer(hold) + MaskSchedule.gradual_unfreezing",
         f"exact and optimizer state kept at {_n(recipe(r3, 'mask_schedule', 'boundaries_kept'))} of "
         f"{_n(recipe(r3, 'mask_schedule', 'boundaries'))} stage boundaries",
         f"{_ms(recipe(r3, 'mask_schedule', 'step_time_ms'))}/MLP step vs {_ms(recipe(r3, 'recompile_fresh', 'step_time_ms'))} "
         "recompiling (frozen layers' gradients are still computed)", "1 byte per variable (scalar masks)",
         "05 recipe 3; recompiling loses the state, trainable without recompile trains the wrong layers"),
        ("keep some entries of a tensor fixed, fixed mask (new output columns / embedding rows)",
         "MaskedOptimizer(hold) + set_mask", f"bit-exact: {_n(recipe(r1, 'exact'))} of {r1.get('old_entries', '?')} old entries moved",
         f"{_ms(recipe(r1, 'exact', 'step_time_ms'))}/step vs {_ms(recipe(r1, 'gradient_mask', 'step_time_ms'))} gradient mask",
         f"{_n(recipe(r1, 'exact', 'extra_state_bytes'))} bytes of masks",
         f"05 recipe 1; a gradient mask under {r1.get('optimizer', 'AdamW')} moved {_n(recipe(r1, 'gradient_mask', 'moved_min'))} of "
         f"{r1.get('old_entries', '?')} (weight decay)"),
        ("the same job, another way", "a constraint that copies old values back",
         "values exact; the frozen entries' moments keep changing",
         f"{_ms(recipe(r1, 'constraint', 'step_time_ms'))}/step",
         f"{_n(recipe(r1, 'constraint', 'extra_state_bytes'))} bytes (a copy of the values + mask)", "05 recipe 1"),
        ("pruned weights stay zero while fine-tuning", "MaskedOptimizer(hold) + set_mask(fc1.kernel, keep)",
         f"bit-exact: {_pct(_get(r2, 'pruned_still_zero', 'exact'))} of pruned entries still zero",
         f"{_ms(recipe(r2, 'exact', 'step_time_ms'))}/CNN step vs {_ms(recipe(r2, 'gradient_mask', 'step_time_ms'))} gradient mask, "
         f"{_ms(recipe(r2, 'constraint', 'step_time_ms'))} re-zeroing constraint ({p})",
         "1 byte per fc1 entry", f"05 recipe 2; a gradient mask moved {_n(recipe(r2, 'gradient_mask', 'moved_min'))} or more "
                                 "pruned entries (carried-over moments)"),
        ("fine-tune a fixed 1-5 % of entries (FISH-style)", "MaskedOptimizer(hold) + one set_mask per variable",
         f"exact: {_n(recipe(r4, sparse, 'outside_max'))} entries outside the selection changed",
         f"{_ms(recipe(r4, sparse, 'step_time_ms'))}/step vs {_ms(recipe(r4, 'full', 'step_time_ms'))} full fine-tuning",
         "1 byte per entry", "05 recipe 4"),
        ("masks that change every step (random sub-networks, block-coordinate)", "MaskedOptimizer(hold, mask_fn=...)",
         f"exact: {_n(recipe(r5, 'exact'))} frozen entry-steps moved",
         f"{_ms(recipe(r5, 'exact', 'step_time_ms'))}/step vs {_ms(recipe(r5, 'naive_gate', 'step_time_ms'))} naive gate",
         "nothing stored (computed in the graph)",
         f"05 recipe 5; the naive gate moved {_n(recipe(r5, 'naive_gate', 'moved_min'))} or more; 02: "
         + (f"adam hold changed {hold02:,.0f} entries" if hold02 is not None else missing)),
        ("a zero gradient / stop_gradient mask (what people do today)", "gate(x, keep), tf.where(keep, g, 0)",
         "exact only where the update depends on the current gradient alone (plain SGD, Adagrad, ...)",
         (f"{ft_time('gate')} vs {ft_time('var_list')}: the frozen layers' zero gradients are still computed; "
          f"05 recipe 5: {_ms(recipe(r5, 'naive_gate', 'step_time_ms'))}/step vs "
          f"{_ms(recipe(r5, 'exact', 'step_time_ms'))} exact") if ft else missing, "none",
         f"01: frozen entries drift under {len(drifting)} of {n_opt} optimizers ({', '.join(drifting[:6])}...)"
         if drift01 else missing),
        ("alternating steps of two networks (GAN)", "two optimizers, or var_list per step",
         "exact (0 changed entries in the frozen network)", "not compared here (03 reports each method's time)",
         "one optimizer state per network",
         f"03: zeroed gradients under Adam moved {gan03:,.0f} generator entries (summed over the run's iterations)"
         if gan03 is not None else missing),
        ("transform gradients between compute and apply (parameter server)",
         "freezing.gradients: one tape, transform, apply", "exact update: x_after == x_before - lr*T(g)",
         f"per-variable g.eval() costs {eval04:.1f}x one pass" if eval04 is not None else missing, "none",
         f"04: max error {exact04}" if exact04 is not None else missing),
    ]
    return pd.DataFrame(rows, columns=["task", "method", "guarantee", "time per step", "memory", "evidence"])


def recipe_metrics(r1: StudyResult, r2: StudyResult, r3: StudyResult, r4: StudyResult, r5: StudyResult,
                   traps: pd.DataFrame) -> dict[str, Any]:
    """The numbers metrics.json keeps per recipe (the tests and the method table read these). ``recipe_metrics(...)``"""

    def per_method(runs: pd.DataFrame, moved: str, extra: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        out = {}
        for method, g in runs.groupby("method", sort=False):
            out[method] = {"moved_min": int(g[moved].min()), "moved_max": int(g[moved].max()),
                           "step_time_ms": float(g["step_time_ms"].mean()),
                           "extra_state_bytes": int(g["extra_state_bytes"].max()), "seeds": int(g["seed"].nunique()),
                           **{e: float(g[e].mean()) for e in extra}, **{f"{e}_std": float(g[e].std()) for e in extra}}
        return out

    new = r1.runs
    pr = r2.runs
    un = r3.runs
    sp = r4.runs
    sn = r5.runs
    unfreeze = {}
    for method, g in un.groupby("method", sort=False):
        b = r3.extra["boundaries"]
        b = b[b["method"] == method] if len(b) else b
        unfreeze[method] = {"finished": bool(g["finished"].all()), "error": g["error"].iloc[0],
                            "acc_new": float(g["acc_new"].mean()), "acc_new_std": float(g["acc_new"].std()),
                            "frozen_moved_max": int(g["frozen_moved"].max()),
                            "unfrozen_trained": bool(g["unfrozen_trained"].all()),
                            "state_kept": bool(g["state_kept"].all()) if g["finished"].all() else False,
                            "boundaries": int(len(b) / max(g["seed"].nunique(), 1)),
                            "boundaries_kept": int(b["kept"].sum() / max(g["seed"].nunique(), 1)) if len(b) else 0,
                            "momentum_norm_after_min": float(b["norm_after"].min()) if len(b) else float("nan"),
                            "step_time_ms": float(g["step_time_ms"].mean()), "seeds": int(g["seed"].nunique())}
    return {
        "new_columns": {
            "optimizer": str(new["optimizer"].iloc[0]), "old_entries": int(new["old_entries"].iloc[0]),
            "methods": per_method(new, "old_moved", ["acc_new", "acc_old", "acc_old_among_old", "new_changed",
                                                     "frozen_momentum_nonzero", "old_max_relative_change"]),
            "constraint_same_weights_as_exact": bool(new[new["method"] == "constraint"]["same_weights_as_exact"].all()),
            "diagnose": _causes(r1.diagnosis)},
        "pruning": {
            "headline_optimizer": str(pr["optimizer"].iloc[0]),
            "methods": per_method(pr, "moved", ["acc_finetuned", "sparsity_kept", "momentum_nonzero_at_start"]),
            "by_optimizer": {f"{o}/{m}/{s:g}": {"moved_min": int(g["moved"].min()), "moved_max": int(g["moved"].max()),
                                                "pruned": int(g["pruned"].iloc[0]),
                                                "sparsity_kept_min": float(g["sparsity_kept"].min()),
                                                "acc_finetuned": float(g["acc_finetuned"].mean()),
                                                "acc_finetuned_std": float(g["acc_finetuned"].std()),
                                                "step_time_ms": float(g["step_time_ms"].mean())}
                             for (o, m, s), g in pr.groupby(["optimizer", "method", "sparsity"], sort=False)},
            "pruned_still_zero": {m: float((1 - g["moved"] / g["pruned"]).min())
                                  for m, g in pr.groupby("method", sort=False)},
            "constraint_same_weights_as_exact": bool(pr[pr["method"] == "constraint"]["same_weights_as_exact"].all()),
            "dense_adam_step_time_ms": r2.extra.get("dense_adam_step_time_ms"),
            "diagnose": _causes(r2.diagnosis)},
        "unfreezing": {"methods": unfreeze, "diagnose": _causes(r3.diagnosis)},
        "sparse": {"methods": {
            v: {
                "outside_max": int(g["changed_outside_selection"].max()), "changed_mean": float(g["changed"].mean()),
                "trained_entries": int(g["trained_entries"].iloc[0]), "total_entries": int(g["total_entries"].iloc[0]),
                "acc_new": float(g["acc_new"].mean()), "acc_new_std": float(g["acc_new"].std()),
                "forgetting": float(g["forgetting"].mean()), "forgetting_std": float(g["forgetting"].std()),
                "step_time_ms": float(g["step_time_ms"].mean()), "seeds": int(g["seed"].nunique())}
            for v, g in sp.groupby("variant", sort=False)}},
        "subnetwork": {"methods": per_method(sn, "moved", ["accuracy", "frozen"]), "diagnose": _causes(r5.diagnosis)},
        "traps": traps.to_dict(orient="records"),
    }


def _causes(diagnosis: pd.DataFrame) -> dict[str, list[str]]:
    if not len(diagnosis):
        return {}
    return {m: sorted(set(g["cause"]) - {"(none)"}) for m, g in diagnosis.groupby("method", sort=False)}


def headline(metrics: Mapping[str, Any], source: str) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study, as text. ``headline(metrics, data.source)``"""
    r1, r2, r3, r4, r5 = (metrics[k] for k in ("new_columns", "pruning", "unfreezing", "sparse", "subnetwork"))
    m1, m3, m5 = r1["methods"], r3["methods"], r5["methods"]
    out = {"data": source}
    key = f"1 new columns ({r1['optimizer']}): old entries moved, gradient mask / constraint / exact"
    out[f"{key} (of {r1['old_entries']})"] = " / ".join(str(m1[m]["moved_max"]) for m in NEW_COLUMN_METHODS)
    out["1 new columns, exact: accuracy on digits 5-9 / 0-4 (10-way)"] = \
        f"{format_mean_std(m1['exact']['acc_new'], m1['exact']['acc_new_std'])} / " \
        f"{format_mean_std(m1['exact']['acc_old'], m1['exact']['acc_old_std'])}"
    for key, row in r2["by_optimizer"].items():
        name, method, sparsity = key.split("/")
        if float(sparsity) == max(float(k.split("/")[2]) for k in r2["by_optimizer"]):
            key = f"2 pruning fc1 to {100 * float(sparsity):.0f} %, {name}, {method}"
            out[f"{key}: pruned entries moved (of {row['pruned']:,}) / accuracy / step time (ms)"] = (
                f"{row['moved_max']:,} / {format_mean_std(row['acc_finetuned'], row['acc_finetuned_std'])} / "
                f"{row['step_time_ms']:.0f}")
    for method in ("mask_schedule", "recompile_fresh", "trainable_flip"):
        if method in m3:
            r = m3[method]
            out[f"3 gradual unfreezing, {method}: accuracy on 5-9 / optimizer state kept at stage boundaries"] = \
                f"{format_mean_std(r['acc_new'], r['acc_new_std'])} / {r['boundaries_kept']} of {r['boundaries']}" + \
                ("" if r["unfrozen_trained"] else " (unfrozen layers did not train)")
    if "recompile_same" in m3:
        error = m3["recompile_same"]["error"]
        out["3 gradual unfreezing, recompile with the same optimizer"] = error.split(":")[0] or "no error"
    for key, r in r4["methods"].items():
        out[f"4 {key}: accuracy on 5-9 / forgetting of 0-4 / entries changed (of {r['total_entries']:,})"] = \
            f"{format_mean_std(r['acc_new'], r['acc_new_std'])} / " \
            f"{format_mean_std(r['forgetting'], r['forgetting_std'])} / {r['changed_mean']:,.0f}"
    for method in SUBNET_METHODS:
        r = m5[method]
        out[f"5 random units, adam, {method}: frozen entry-steps moved / accuracy"] = \
            f"{r['moved_max']:,} of {r['frozen']:,.0f} / {format_mean_std(r['accuracy'], r['accuracy_std'])}"
    return out

