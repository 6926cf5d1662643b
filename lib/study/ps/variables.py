"""The model's values on the ps tasks (``PsVariables``): fetch, push, placement, snapshots and checkpoints.

The chief builds the job's Keras model once and copies its values into plain ``tf.Variable`` s created in the
strategy's scope, so that they live on the ps tasks; a ``MinSizePartitioner`` splits the large ones along axis 0.
Workers fetch values and push gradients inside the scheduled function (``study.ps.worker``); nothing else moves.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from study.ps.config import DownpourConfig
from study.ps.optimizer import PsOptimizer, resolve_masks

INT64_MAX = 2 ** 63 - 1


def short_device(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` (``local`` without a job)."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return f"{parts.get('job', '?')}:{parts.get('task', '?')}" if "job" in parts else (device or "local")


class PsVariables:
    """The model's values as ``tf.Variable`` s on the ps (or locally, with ``strategy=None``), with fetch and push.

    ``fetch()`` returns ``(version, trainable values, non-trainable values, keep masks)``; ``push(grads, state)``
    applies the (already transformed) gradients with the job's optimizer next to each shard and returns the
    push's version, exactly. Keras seed-generator states (``Dropout``) are not shared: each worker makes its own.
    """

    def __init__(self, model: Any, config: DownpourConfig, strategy: Any = None):
        import tensorflow as tf

        self.config = config
        self.paths = [v.path for v in model.trainable_variables]
        self.state_paths = [v.path for v in model.non_trainable_variables]
        self.seed_slots = [i for i, v in enumerate(model.non_trainable_variables) if "seed_generator_state" in v.path]
        scope = strategy.scope if strategy is not None else contextlib.nullcontext
        with scope():
            self.trainable = [tf.Variable(v.numpy(), name=_name(v.path)) for v in model.trainable_variables]
            self.shared_state = [tf.Variable(v.numpy(), name=_name(v.path), trainable=False)
                                 for i, v in enumerate(model.non_trainable_variables) if i not in self.seed_slots]
            self.version = tf.Variable(0, dtype=tf.int64, trainable=False, name="version")
        self.shards = [list(v.variables) if hasattr(v, "variables") and not isinstance(v, tf.Variable) else [v]
                       for v in self.trainable]
        masks = resolve_masks(config, model)
        self.masks = {self.paths.index(p): keep for p, keep in masks.items()}
        self.optimizer = PsOptimizer(config, self.shards, strategy, self.masks)
        # each masked variable's keep mask, next to its first shard: the workers' local steps leave frozen entries
        self.local_keep: dict[int, Any] = {}
        for i, keep in sorted(self.masks.items()):
            with contextlib.ExitStack() as stack:
                stack.enter_context(scope())
                if strategy is not None:
                    stack.enter_context(strategy.extended.colocate_vars_with(self.shards[i][0]))
                self.local_keep[i] = tf.Variable(keep, trainable=False, name=f"{_name(self.paths[i])}_keep")
        self.initial_seed_state = [model.non_trainable_variables[i].numpy() for i in self.seed_slots]

    def checkpoint(self) -> Any:
        """A ``tf.train.Checkpoint`` of everything the ps holds (parameters, optimizer state, masks, version)."""
        import tensorflow as tf

        return tf.train.Checkpoint(trainable=self.trainable, shared_state=self.shared_state, version=self.version,
                                   optimizer=self.optimizer.variables, local_keep=list(self.local_keep.values()))

    def fetch(self) -> tuple[Any, list[Any], list[Any], dict[int, Any]]:
        """Read the version, then every parameter (one network read per shard) and the keep masks."""
        import tensorflow as tf

        version = self.version.read_value()
        with tf.control_dependencies([version]):
            weights = [tf.concat([s.read_value() for s in shards], 0) if len(shards) > 1 else shards[0].read_value()
                       for shards in self.shards]
            state = [v.read_value() for v in self.shared_state]
            keep = {i: v.read_value() for i, v in self.local_keep.items()}
        return version, weights, state, keep

    def push(self, grads: list[Any], state: list[Any]) -> Any:
        """Apply ``grads`` on the ps, store ``state``, count the update; returns this push's version.

        The version is the counter's value right after this push's increment, taken by one atomic
        fetch-and-increment (``ResourceCountUpTo``) after every write of the push: two concurrent pushes never
        get the same version.
        """
        import tensorflow as tf

        pieces = []
        for g, shards in zip(grads, self.shards):
            pieces += tf.split(g, [s.shape[0] for s in shards], axis=0) if len(shards) > 1 else [g]
        done = self.optimizer.apply(pieces)
        for variable, value in zip(self.shared_state, state):  # e.g. BatchNorm statistics: last writer wins
            done.append(variable.assign(value))
        return count_update(self.version, after=done)

    def full_state(self, local_seeds: list[Any], state: list[Any]) -> list[Any]:
        """The model's non-trainable values in its order: shared ones from ``state``, seeds from ``local_seeds``."""
        out, shared, seeds = [], iter(state), iter(local_seeds)
        for i in range(len(self.state_paths)):
            out.append(next(seeds) if i in self.seed_slots else next(shared))
        return out

    def split_state(self, full: list[Any]) -> tuple[list[Any], list[Any]]:
        """Inverse of ``full_state``: (seed states, shared states)."""
        seeds = [v for i, v in enumerate(full) if i in self.seed_slots]
        return seeds, [v for i, v in enumerate(full) if i not in self.seed_slots]

    def placement(self) -> list[dict[str, Any]]:
        """Where each variable lives: path, shape, bytes, and its shards as ``ps:k`` with their shapes."""
        rows = []
        for path, shards in zip(self.paths, self.shards):
            rows.append({"variable": path, "shape": [int(d) for d in _full_shape(shards)],
                         "bytes": int(sum(_bytes(s) for s in shards)),
                         "shards": [{"task": short_device(s.device), "shape": [int(d) for d in s.shape],
                                     "bytes": _bytes(s)} for s in shards]})
        for path, v in zip([p for i, p in enumerate(self.state_paths) if i not in self.seed_slots], self.shared_state):
            rows.append({"variable": path, "shape": [int(d) for d in v.shape], "bytes": _bytes(v),
                         "shards": [{"task": short_device(v.device), "shape": [int(d) for d in v.shape],
                                     "bytes": _bytes(v)}]})
        rows.append({"variable": "version (update counter)", "shape": [], "bytes": 8,
                     "shards": [{"task": short_device(self.version.device), "shape": [], "bytes": 8}]})
        return rows

    def optimizer_placement(self) -> dict[str, int]:
        """Bytes of optimizer state (slots, sums, masks) per task: ``{"ps:0": ..., "ps:1": ...}``."""
        out: dict[str, int] = {}
        import tensorflow as tf

        for v in self.optimizer.variables:
            device = (v if isinstance(v, tf.Variable) else v.value).device  # a Keras variable wraps a tf.Variable
            task = short_device(device) if device else "chief"  # a wrapper's own counters, unused by pushes
            out[task] = out.get(task, 0) + _bytes(v)
        return out

    def snapshot(self) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
        """``(version, trainable, shared state)`` as NumPy arrays, read from the ps by the chief."""
        import tensorflow as tf

        version = int(self.version.numpy())
        return (version, [tf.convert_to_tensor(v).numpy() for v in self.trainable],
                [v.numpy() for v in self.shared_state])


def count_update(version: Any, after: list[Any] | None = None) -> Any:
    """Add 1 to the int64 counter ``version`` after the ops ``after``; returns the value right after *this* increment.

    One atomic fetch-and-increment (``ResourceCountUpTo``, under the variable's lock): concurrent callers never
    get the same value. (``assign_add`` followed by its read can return another caller's increment.)
    """
    import tensorflow as tf

    with tf.control_dependencies(after or []):
        before = tf.raw_ops.ResourceCountUpTo(resource=version.handle, limit=INT64_MAX, T=tf.int64)
    return before + 1


def _name(path: str) -> str:
    return path.replace("/", "_")


def _bytes(v: Any) -> int:
    import tensorflow as tf

    shape = tf.TensorShape(v.shape)
    count = math.prod(int(d) for d in shape) if shape.rank is not None else int(np.size(v.numpy()))
    return int(count) * tf.as_dtype(v.dtype).size


def _full_shape(shards: list[Any]) -> list[int]:
    first = list(shards[0].shape)
    if first:
        first[0] = sum(int(s.shape[0]) for s in shards)
    return first
