"""Study 05, shared set-up: the parameters, the column glossary, the MLP, the constraint recipe, the
pretrained models and the helpers every recipe uses (seeded ``fit`` steps, bit digests, moved-entry counts)."""

from __future__ import annotations

import hashlib
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
from freezing.slots import slots
from study.data import ACCEPTED_FORMS, MnistSplits
from study.optimizers import OPTIMIZERS, make_optimizer
from study.training import LOSS, StepTimer, accuracy, batch_indices, median_ms, restore, snapshot
from study.validation import check_choice, check_choices, check_int_list, check_positive_int, check_range

OLD_CLASSES = 5
"""Digits 0-4 are the old task, 5-9 the new one."""
NEW_COLUMN_METHODS = ("gradient_mask", "constraint", "exact")
PRUNE_METHODS = ("gradient_mask", "constraint", "exact")
UNFREEZE_METHODS = ("mask_schedule", "skip_frozen", "recompile_fresh", "recompile_same", "trainable_flip")
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
    "acc_old_before": "test accuracy on digits 0-4 of the model with its head extended to 10 classes, 10-way, just "
                      "before fine-tuning (fraction)",
    "acc_old_pretrained": "test accuracy on digits 0-4 of the pretrained 5-class model, before its head was extended "
                          "(fraction)",
    "acc_dense": "test accuracy of the dense CNN before pruning, first prune_eval_samples test images (fraction)",
    "acc_pruned": "test accuracy just after pruning, before fine-tuning (fraction)",
    "acc_finetuned": "test accuracy after fine-tuning the pruned CNN (fraction)",
    "accuracy": "test accuracy (fraction): on digits 5-9 in the unfreezing curves, on all digits elsewhere",
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
    "momentum_changed": "pruned entries whose first moment (momentum) changed its bits during fine-tuning (count)",
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
    "frozen": "entries frozen: summed over steps in a run's row (entry-steps), in that step in a per-step row",
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
    "entries": "diagnose table: frozen entries that the cause can move (count); selection table: entries of the "
               "variable",
    "fix": "freezing.diagnose's one-sentence fix",
    "selected": "entries FISH selected in this variable (count)",
    "share": "selected / entries (fraction)",
    "task": "the job", "guarantee": "what the method guarantees", "time per step": "measured cost per step",
    "memory": "state the method adds", "evidence": "where the numbers come from (study and run)",
    "scenario": "what was done to layer a, in order", "layer a should": "what the user meant",
    "layer a did": "what layer a did in the last fit", "entries of a changed": "changed entries of a's kernel",
    "as expected": "did == should (bool)",
    "keras warned": "Keras emitted a warning that mentions trainable during the last fit (bool)",
    "stage": "stage of gradual unfreezing, counted from 1 (stage s trains the top s layers)",
    "reference": "the method the ratio divides by (recompile_fresh: a fresh optimizer per stage)",
    "ratio_median": "median over seeds of the method's median step time in the stage / the reference's (ratio)",
    "ratio_min": "smallest over seeds of that ratio", "ratio_max": "largest over seeds of that ratio",
    "diagnose names": "causes freezing.diagnose named before the last fit ((none): it found none; (not asked): a "
                      "should train and the optimizer knows it)",
}
"""Meaning and unit of every column this study's tables have (``reporting.save_table(..., columns=COLUMNS)``)."""
for _stage in range(1, 10):  # stages count from 1 wherever the report names one
    COLUMNS[f"step_ms_stage{_stage}"] = (f"median wall time of a training step in stage {_stage}, its first step "
                                         "(which may trace) left out (ms)")
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
        """A config from papermill's values, where None means "the
        default". ``RecipesConfig.from_overrides({"seeds": [0]})``"""
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
    whose first columns are overwritten by the old ones.
    ``extend_head(old.get_weights(), new.layers[-1].get_weights())``
    """
    *body, kernel, bias = [np.asarray(w) for w in weights]
    new_kernel, new_bias = (np.array(w, copy=True) for w in new_head)
    if new_kernel.shape[0] != kernel.shape[0] or new_kernel.shape[1] < kernel.shape[1]:
        raise ValueError(f"extend_head: new head {new_kernel.shape} cannot extend the old head {kernel.shape}")
    new_kernel[:, : kernel.shape[1]] = kernel
    new_bias[: bias.shape[0]] = bias
    return [*body, new_kernel, new_bias]


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
        """Bytes the constraint stores: the mask, plus the copy of
        the values. ``CopyBack(np.ones(4)).state_bytes() == 4``"""
        size = int(np.prod(self.keep.shape)) * self.keep.dtype.size
        return size + (0 if self.values is None else int(np.prod(self.values.shape)) * self.values.dtype.size)

    def __call__(self, w: Any) -> tf.Tensor:
        old = tf.zeros((), w.dtype) if self.values is None else tf.cast(self.values, w.dtype)
        return tf.where(self.keep, w, old)


class StepAudit(StepTimer):
    """Per step: how many entries frozen *in that step* by
    ``mask_fn`` changed their bits (timed apart from the audit)."""

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
    """``(x_old, y_old), (x_new, y_new)``: digits 0-4 and 5-9.
    ``(xo, yo), (xn, yn) = old_new(data.x_train, data.y_train)``"""
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


def _momentum(optimizer: Any, variable: Any) -> np.ndarray:
    """A copy of ``variable``'s first moment (momentum) in ``optimizer``."""
    return slots(optimizer, variable)["momentum"].numpy().copy()


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
    """Per seed: train ``mlp(5)`` on digits 0-4 with Adam, and
    extend its head to 10 classes. ``pretrain_mlps(cfg, data)``"""
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
