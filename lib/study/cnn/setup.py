"""Study 02, shared set-up: the methods, the parameters (``CnnStudyConfig``) and how every seeded run starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing.determinism import enable_determinism
from study.data import ACCEPTED_FORMS
from study.models import deep_mnist_cnn
from study.optimizers import OPTIMIZERS
from study.training import batch_indices, reseed
from study.validation import check_choices, check_int_list, check_positive_int, check_range

FINETUNE_METHODS = ("var_list", "trainable_recompile", "trainable_no_recompile", "gate", "masked_hold", "masked_skip")
EXACT_FINETUNE_METHODS = ("var_list", "trainable_recompile", "masked_hold", "masked_skip")
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
        """The resolved parameters as plain data (for metrics.json).
        ``CnnStudyConfig().plain()["seeds"] == [0, 1, 2]``"""
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
              "MaskedOptimizer(Adam): the same mask given to MaskedOptimizer.apply_gradients(trainable_masks=...)",
    "step": "training step, counted from 1; each step draws a fresh mask",
    "frozen entries": "entries of the CNN frozen in this step (count)",
    "of them trainable in the step before": "entries frozen in this step that were trainable in the step before "
                                            "(count; 0 in step 1)",
    "of them with m ≠ 0 before the step": "entries frozen in this step whose Adam first moment m was non-zero "
                                          "before it, i.e. that had a non-zero gradient in an earlier step (count)",
    "frozen entries changed in the step": "entries frozen in this step whose bits changed during it (count)",
    "max |ΔW| of a frozen entry": "max |ΔW| over the entries frozen in this step, during it (weight units)",
}
"""Columns of the notebook's one-masked-step demonstration table."""


def one_step_audit(before: Sequence[np.ndarray], after: Sequence[np.ndarray], keeps: Sequence[np.ndarray],
                   previous: Sequence[np.ndarray] | None, moment_nonzero: Sequence[np.ndarray]) -> dict[str, Any]:
    """One masked step's counts for ``ONE_STEP_COLUMNS``, from the weights before and after it, its masks (True =
    trains), the previous step's masks (None in step 1) and where Adam's ``m`` was non-zero before it.

    ``one_step_audit([w0], [w1], [keep], None, [m != 0])``
    """
    from freezing.audit import changed_bits

    frozen = [~np.asarray(k, bool) for k in keeps]
    trained_before = [np.zeros_like(f) for f in frozen] if previous is None else [np.asarray(p, bool) for p in previous]
    return {
        "frozen entries": sum(int(f.sum()) for f in frozen),
        "of them trainable in the step before": sum(int((f & t).sum()) for f, t in zip(frozen, trained_before)),
        "of them with m ≠ 0 before the step": sum(int((f & m).sum()) for f, m in zip(frozen, moment_nonzero)),
        "frozen entries changed in the step": sum(int((changed_bits(b, a) & f).sum())
                                                  for b, a, f in zip(before, after, frozen)),
        "max |ΔW| of a frozen entry": max(float(np.abs(a - b)[f].max(initial=0.0))
                                          for b, a, f in zip(before, after, frozen)),
    }
