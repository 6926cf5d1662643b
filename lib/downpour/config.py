"""The job: ``DownpourConfig``, plain data that every process of a job reads the same way, and its hooks.

A job is a JSON object of ``DownpourConfig`` fields (``read_job`` reads it from text or a file). Code enters a
job only by name, ``"module:function"`` (``load_callable``), so that every process can import it: the model
builder, the dataset function, the loss, the gradient transform and the mask function.

``DownpourConfig(model="downpour.examples.tabular.model:build", data="downpour.examples.tabular.data:dataset",
data_kwargs={"folder": "build/tabular"}, optimizer="adam", learning_rate=1e-3, freeze=["encoder"])``
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from downpour.checks import check_choice, check_positive_int, check_range

DOWNPOUR_OPTIMIZERS = ("sgd", "adagrad")
"""Downpour's own update rules, applied next to each shard: ``v -= lr*T(g)`` and DistBelief's Adagrad."""
KERAS_OPTIMIZERS = ("adadelta", "adafactor", "adam", "adamax", "adamw", "ftrl", "lion", "nadam", "rmsprop")
"""Keras optimizer names a job can give directly (any Keras optimizer, also ``SGD`` and ``Adagrad``: a config
dict ``{"class_name": "SGD", "config": {"momentum": 0.9}}``)."""
MASK_POLICIES = ("hold", "reset", "none")
"""``freezing.MaskedOptimizer``'s policies (``"hold"``: frozen entries and their optimizer state keep their bits)."""
FAULT_FIELDS = ("kill_worker_at", "kill_ps_at", "kill_chief_at")
"""Fault injection is not part of a job: ``run_downpour(job, faults=Faults(...))`` (``downpour.launcher``)."""


def load_callable(spec: str, name: str) -> Callable[..., Any]:
    """Import ``"module:function"`` and return the function, else a ``ValueError`` naming ``name``.

    ``load_callable("downpour.examples:mnist_mlp", "model")``
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"{name}: expected 'module:function' (an importable callable); got {spec!r}")
    module, _, attr = spec.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{name}: cannot import {module!r} ({e}); is its folder on PYTHONPATH?") from None
    fn = getattr(loaded, attr, None)
    if not callable(fn):
        raise ValueError(f"{name}: {module!r} has no callable {attr!r}")
    return fn


def read_job(text: str) -> dict[str, Any]:
    """The job as a dict, from JSON text or a path to a JSON file. ``read_job('{"steps": 80}')``"""
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--job: {text!r} is neither a JSON object nor a file")
        text = path.read_text()
    try:
        job = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--job: not a JSON object or a path to one ({e})") from None
    if not isinstance(job, dict):
        raise ValueError(f"--job: expected a JSON object of DownpourConfig fields; got {type(job).__name__}")
    return job


def job_from_dict(fields: dict[str, Any]) -> DownpourConfig:
    """``DownpourConfig(**fields)``, with a ``ValueError`` naming unknown fields and every allowed one."""
    import dataclasses

    allowed = [f.name for f in dataclasses.fields(DownpourConfig)]
    injected = sorted(set(fields) & set(FAULT_FIELDS))
    if injected:
        raise ValueError(f"--job: {', '.join(injected)} injects faults for experiments and is not a job field; "
                         "from Python: run_downpour(job, faults=Faults(worker_at=..., ps_at=..., chief_at=...))")
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise ValueError(f"--job: unknown field{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(allowed)}")
    return DownpourConfig(**fields)


def optimizer_label(optimizer: str | dict) -> str:
    """A short name for a job's optimizer: ``"adam"``, ``"sgd"``, or a config dict's class name."""
    return optimizer if isinstance(optimizer, str) else str(optimizer.get("class_name", "?")).lower()


@dataclass(frozen=True)
class DownpourConfig:
    """One asynchronous training job; every field is plain data, so a job is a JSON object.

    ``DownpourConfig(workers=2, n_fetch=4, n_push=4, steps_per_function=8)``

    Counts: a *step* is one minibatch on one worker; an *update* is one push applied on the ps (the version
    counter). ``eval_every`` and ``checkpoint_every`` count updates.

    What is trained:

    * ``model``: a builder ``"module:function"`` (called with ``model_kwargs``) returning a Keras model; built
      on the dataset's input shape when it is not built yet.
    * ``data``: a dataset function ``"module:function"`` called as ``fn(split, **data_kwargs)`` with ``split``
      ``"train"`` or ``"test"``, returning an unbatched ``tf.data.Dataset`` of ``(x, y)`` that reads its files
      when it runs (``FixedLengthRecordDataset``, ``TFRecordDataset``, ``CsvDataset``...), so that each worker
      reads them from its own disk. ``x`` and ``y`` may be tensors or dicts / lists of tensors (a model with
      several inputs or outputs); they are checked against the model's inputs before training. When it also takes
      ``worker`` and ``workers`` it shards the training data itself; else every worker keeps every ``workers``-th
      element. A job must name one; ``downpour.data:idx`` reads MNIST's IDX files (``data_kwargs={"folder": ...}``).
    * ``loss``: None (sparse categorical cross-entropy, ``from_logits``), a Keras loss name or config dict, or a
      ``"module:function"`` of ``(y_true, y_pred)``.
    * ``optimizer`` on the ps: ``"sgd"`` (Downpour's ``v -= lr*T(g)``, the default) or ``"adagrad"`` (DistBelief's
      per-parameter Adagrad), both next to each shard; or any Keras optimizer: a name in ``KERAS_OPTIMIZERS``
      (built with ``learning_rate``) or a config dict ``{"class_name": ..., "config": {...}}``; its slots live
      with their variables.
    * ``freeze`` (variable paths or path prefixes such as a layer's name) and ``masks`` (``"module:function"``
      returning ``{path: keep}`` for the built model, ``masks_kwargs``): stored masks of
      ``freezing.MaskedOptimizer`` around the Keras optimizer, with ``mask_policy``; frozen entries do not move.
    * ``local_learning_rate``: the workers' local SGD steps between fetches (None: ``learning_rate``).
    * ``sparse_push``: a gradient that arrives as ``tf.IndexedSlices`` (an ``Embedding``'s) is pushed as the rows
      it touches, each once (True, default), or as a dense tensor (False, for comparison).
    * ``sparse_fetch``: an ``Embedding`` fed directly by a model input is fetched as the rows the next ``n_fetch``
      batches look up (True, default; the worker reads those batches first), or whole (False, for comparison); a
      table whose rows cannot be known from the inputs is fetched whole, and the result says why.

    Faults for experiments are not part of a job: ``run_downpour(job, faults=Faults(...))``.
    """

    model: str = "downpour.examples:mnist_mlp"
    model_kwargs: dict = field(default_factory=dict)
    data: str | None = None
    data_kwargs: dict = field(default_factory=dict)
    loss: str | dict | None = None
    from_logits: bool = True
    workers: int = 1
    ps: int = 1
    steps: int = 200
    n_fetch: int = 1
    n_push: int = 1
    steps_per_function: int = 4
    batch: int = 50
    shuffle_buffer: int = 10_000
    learning_rate: float = 0.05
    local_learning_rate: float | None = None
    optimizer: str | dict = "sgd"
    adagrad_initial: float = 0.1
    freeze: list = field(default_factory=list)
    masks: str | None = None
    masks_kwargs: dict = field(default_factory=dict)
    mask_policy: str = "hold"
    transform: str | None = None
    transform_kwargs: dict = field(default_factory=dict)
    sparse_push: bool = True
    sparse_fetch: bool = True
    shard_min_bytes: int = 256 * 1024
    seed: int = 0
    eval_every: int = 0
    eval_samples: int = 1000
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 2
    warmup_functions: int | None = None
    start_timeout: float = 120.0

    def __post_init__(self) -> None:
        for name in ("workers", "ps", "steps", "n_fetch", "n_push", "steps_per_function", "batch",
                     "shuffle_buffer", "shard_min_bytes", "eval_samples", "keep_checkpoints"):
            check_positive_int(name, getattr(self, name))
        for name in ("eval_every", "checkpoint_every", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected an integer >= 0{' (0 = never)' * (name != 'seed')}; got {value!r}")
        cycle = math.lcm(self.n_fetch, self.n_push)
        if self.steps_per_function % cycle:
            raise ValueError(f"steps_per_function: must be a multiple of n_fetch={self.n_fetch} and "
                             f"n_push={self.n_push} (of {cycle}); got {self.steps_per_function}")
        if self.steps_per_function > 64:
            raise ValueError(f"steps_per_function: at most 64 (the loop is unrolled); got {self.steps_per_function}")
        check_range("learning_rate", self.learning_rate, 0.0, 10.0, low_open=True)
        if self.local_learning_rate is not None:
            check_range("local_learning_rate", self.local_learning_rate, 0.0, 10.0)
        check_range("adagrad_initial", self.adagrad_initial, 0.0, 1e6, low_open=True)
        check_range("start_timeout", self.start_timeout, 0.0, 3600.0, low_open=True)
        for name in ("model_kwargs", "data_kwargs", "transform_kwargs", "masks_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name}: expected a mapping of keyword arguments; got {getattr(self, name)!r}")
        load_callable(self.model, "model")
        if self.data is not None:
            load_callable(self.data, "data")
        if self.transform is not None:
            load_callable(self.transform, "transform")
        if self.masks is not None:
            load_callable(self.masks, "masks")
        self._check_loss()
        self._check_optimizer()
        if not isinstance(self.freeze, (list, tuple)) or not all(isinstance(p, str) and p for p in self.freeze):
            raise ValueError(f"freeze: expected a list of variable paths or path prefixes (e.g. a layer's name); "
                             f"got {self.freeze!r}")
        check_choice("mask_policy", self.mask_policy, MASK_POLICIES)
        if (self.freeze or self.masks) and self.optimizer in DOWNPOUR_OPTIMIZERS:
            raise ValueError(f"freeze/masks: need a Keras optimizer on the ps (freezing.MaskedOptimizer wraps it), "
                             f"e.g. 'adam' or {{'class_name': 'SGD'}}; Downpour's own {self.optimizer!r} takes no "
                             f"masks")
        if not isinstance(self.sparse_push, bool):
            raise ValueError(f"sparse_push: expected true or false; got {self.sparse_push!r}")
        if not isinstance(self.sparse_fetch, bool):
            raise ValueError(f"sparse_fetch: expected true or false; got {self.sparse_fetch!r}")
        if self.warmup_functions is not None:
            check_positive_int("warmup_functions", self.warmup_functions)

    def _check_optimizer(self) -> None:
        allowed = (f"{', '.join(map(repr, DOWNPOUR_OPTIMIZERS))} (Downpour's), a Keras optimizer name "
                   f"({', '.join(map(repr, KERAS_OPTIMIZERS))}) or a Keras config dict "
                   "{'class_name': 'SGD', 'config': {'momentum': 0.9}}")
        if isinstance(self.optimizer, str):
            if self.optimizer not in DOWNPOUR_OPTIMIZERS + KERAS_OPTIMIZERS:
                raise ValueError(f"optimizer: got {self.optimizer!r}; allowed: {allowed}")
            return
        if not isinstance(self.optimizer, dict) or not isinstance(self.optimizer.get("class_name"), str):
            raise ValueError(f"optimizer: got {self.optimizer!r}; allowed: {allowed}")
        import keras

        try:
            keras.optimizers.get(dict(self.optimizer))
        except (ValueError, TypeError) as e:
            raise ValueError(f"optimizer: {self.optimizer!r} is not a Keras optimizer config ({str(e)[:200]}); "
                             f"allowed: {allowed}") from None

    def _check_loss(self) -> None:
        if self.loss is None or (isinstance(self.loss, str) and ":" in self.loss):
            if self.loss is not None:
                load_callable(self.loss, "loss")
            return
        import keras

        try:
            keras.losses.get(self.loss)
        except (ValueError, TypeError) as e:
            raise ValueError(f"loss: {self.loss!r} is not a Keras loss ({str(e)[:200]}); allowed: None "
                             f"(sparse categorical cross-entropy), a Keras loss name or config dict, or "
                             f"'module:function' of (y_true, y_pred)") from None

    @property
    def functions(self) -> int:
        """Scheduled functions: ``steps`` rounded up to whole functions."""
        return -(-self.steps // self.steps_per_function)

    @property
    def pushes_per_function(self) -> int:
        """Updates one scheduled function pushes."""
        return self.steps_per_function // self.n_push

    @property
    def masked(self) -> bool:
        """Whether the ps optimizer is a ``freezing.MaskedOptimizer`` (``freeze`` or ``masks`` given)."""
        return bool(self.freeze or self.masks)

    @property
    def local_lr(self) -> float:
        """The learning rate of the workers' local steps."""
        return self.learning_rate if self.local_learning_rate is None else self.local_learning_rate
