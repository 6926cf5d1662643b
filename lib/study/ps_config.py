"""Downpour SGD, the job: ``DownpourConfig`` (validated parameters) and ``"module:function"`` hooks."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from freezing.validation import check_choice, check_positive_int, check_range


OPTIMIZERS = ("sgd", "adagrad")


def load_callable(spec: str, name: str) -> Callable[..., Any]:
    """Import ``"module:function"`` and return the function, else a clear ``ValueError``.

    ``load_callable("study.models:deep_mnist_cnn", "model")``
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"{name}: expected 'module:function' (an importable callable); got {spec!r}")
    module, _, attr = spec.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{name}: cannot import {module!r} ({e})") from None
    fn = getattr(loaded, attr, None)
    if not callable(fn):
        raise ValueError(f"{name}: {module!r} has no callable {attr!r}")
    return fn


@dataclass(frozen=True)
class DownpourConfig:
    """One asynchronous training job; every field is plain data, so a job is a JSON object.

    ``DownpourConfig(workers=2, n_fetch=4, n_push=4, steps_per_function=8)``

    Counts: a *step* is one minibatch on one worker; an *update* is one push applied on the ps (the version
    counter). ``kill_*_at`` and ``eval_every``/``checkpoint_every`` count updates. ``data``: an ``.npz`` with
    ``x_train, y_train, x_test, y_test`` (images 28x28x1 in [0, 1]); None: ``study.data.load_mnist(seed=seed)``.
    """

    model: str = "study.models:deep_mnist_cnn"
    model_kwargs: dict = field(default_factory=dict)
    from_logits: bool = True
    workers: int = 1
    ps: int = 1
    steps: int = 200
    n_fetch: int = 1
    n_push: int = 1
    steps_per_function: int = 4
    batch: int = 50
    learning_rate: float = 0.05
    optimizer: str = "sgd"
    adagrad_initial: float = 0.1
    transform: str | None = None
    transform_kwargs: dict = field(default_factory=dict)
    shard_min_bytes: int = 256 * 1024
    seed: int = 0
    data: str | None = None
    eval_every: int = 0
    eval_samples: int = 1000
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    kill_worker_at: int | None = None
    kill_ps_at: int | None = None
    kill_chief_at: int | None = None
    warmup_functions: int | None = None
    start_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("workers", "ps", "steps", "n_fetch", "n_push", "steps_per_function", "batch",
                     "shard_min_bytes", "eval_samples"):
            check_positive_int(name, getattr(self, name))
        for name in ("eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected an integer >= 0 (0 = never); got {value!r}")
        cycle = math.lcm(self.n_fetch, self.n_push)
        if self.steps_per_function % cycle:
            raise ValueError(f"steps_per_function: must be a multiple of n_fetch={self.n_fetch} and "
                             f"n_push={self.n_push} (of {cycle}); got {self.steps_per_function}")
        if self.steps_per_function > 64:
            raise ValueError(f"steps_per_function: at most 64 (the loop is unrolled); got {self.steps_per_function}")
        check_range("learning_rate", self.learning_rate, 0.0, 10.0, low_open=True)
        check_range("adagrad_initial", self.adagrad_initial, 0.0, 1e6, low_open=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_range("start_timeout", self.start_timeout, 0.0, 3600.0, low_open=True)
        for name in ("model_kwargs", "transform_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name}: expected a mapping of keyword arguments; got {getattr(self, name)!r}")
        load_callable(self.model, "model")
        if self.transform is not None:
            load_callable(self.transform, "transform")
        if self.warmup_functions is not None:
            check_positive_int("warmup_functions", self.warmup_functions)
        for name in ("kill_worker_at", "kill_ps_at", "kill_chief_at"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.kill_worker_at is not None and self.workers < 2:
            raise ValueError("kill_worker_at: needs workers >= 2, so that training can go on without one")
        for name in ("kill_ps_at", "kill_chief_at"):
            if getattr(self, name) is not None and not self.checkpoint_every:
                raise ValueError(f"{name}: needs checkpoint_every > 0, so that the job can come back from a checkpoint")

    @property
    def functions(self) -> int:
        """Scheduled functions: ``steps`` rounded up to whole functions."""
        return -(-self.steps // self.steps_per_function)

    @property
    def pushes_per_function(self) -> int:
        """Updates one scheduled function pushes."""
        return self.steps_per_function // self.n_push
