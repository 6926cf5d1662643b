"""The model's values on the ps tasks (``PsVariables``): fetch, push, placement, snapshots and checkpoints.

The chief builds the job's Keras model once and copies its values into plain ``tf.Variable`` s, each created under
``tf.device`` of the ps task that holds it, with no ``tf.distribute`` strategy in force (the strategy only
schedules the workers' functions and their datasets). A variable of at least ``shard_min_bytes`` is split along
axis 0 over the ps tasks (``MinSizePartitioner``'s count; shard ``j`` on task ``j``); smaller ones go round
robin. Workers fetch values and push gradients inside the scheduled function (``downpour.worker``); nothing else
moves.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from downpour import sparse as sp
from downpour.config import DownpourConfig
from downpour.optimizer import PsOptimizer, resolve_masks, short

INT64_MAX = 2 ** 63 - 1


def short_device(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` (``local`` without a job)."""
    return short(device)


def ps_devices(ps: int) -> list[str]:
    """The CPU device of every ps task. ``ps_devices(2)[1] == "/job:ps/replica:0/task:1/device:CPU:0"``"""
    return [f"/job:ps/replica:0/task:{k}/device:CPU:0" for k in range(ps)]


def shard_rows(shape: tuple[int, ...], dtype: Any, config: DownpourConfig) -> list[int]:
    """Rows of each shard of a variable: ``MinSizePartitioner``'s count along axis 0 (at most ``config.ps``), the
    rows spread as evenly as ``np.array_split`` does. ``shard_rows((1000, 64), tf.float32, job)``"""
    import tensorflow as tf

    if not shape or config.ps == 1:
        return [shape[0]] if shape else []
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=config.shard_min_bytes, max_shards=config.ps)
    n = min(int(partitioner(tf.TensorShape(shape), tf.as_dtype(dtype))[0]), shape[0])
    return [len(part) for part in np.array_split(np.arange(shape[0]), max(1, n))]


class PsVariables:
    """The model's values as ``tf.Variable`` s on the ps tasks (or locally, with ``devices=None``), with fetch and push.

    ``fetch()`` returns ``(version, trainable values, non-trainable values)``; ``push(grads, state)`` applies the
    (already transformed) gradients, dense or ``IndexedSlices``, with the job's optimizer next to each shard and
    returns ``(the push's version, exactly; the bytes of gradient it sent)``. Keras seed-generator states
    (``Dropout``) are not shared: each worker makes its own. ``devices``: one device per ps task
    (``ps_devices(config.ps)``).
    """

    def __init__(self, model: Any, config: DownpourConfig, devices: list[str] | None = None):
        import tensorflow as tf

        self.config = config
        self.paths = [v.path for v in model.trainable_variables]
        self.state_paths = [v.path for v in model.non_trainable_variables]
        self.seed_slots = [i for i, v in enumerate(model.non_trainable_variables) if "seed_generator_state" in v.path]
        devices = list(devices) if devices else [""]
        turn = itertools.count()

        def next_device() -> str:  # round robin over the tasks, for variables that are not split
            return devices[next(turn) % len(devices)]

        self.shards: list[list[Any]] = []
        for v in model.trainable_variables:
            value = v.numpy()
            rows = shard_rows(value.shape, value.dtype, self.config) if len(devices) > 1 else \
                ([value.shape[0]] if value.shape else [])
            if len(rows) > 1:
                bounds = np.cumsum([0] + rows)
                row = []
                for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                    with tf.device(devices[j] or None):
                        row.append(tf.Variable(value[a:b], name=f"{_name(v.path)}_part_{j}"))
                self.shards.append(row)
            else:
                with tf.device(next_device() or None):
                    self.shards.append([tf.Variable(value, name=_name(v.path))])
        self.shared_state = []
        for i, v in enumerate(model.non_trainable_variables):
            if i not in self.seed_slots:
                with tf.device(next_device() or None):
                    self.shared_state.append(tf.Variable(v.numpy(), name=_name(v.path), trainable=False))
        with tf.device(devices[0] or None):
            self.version = tf.Variable(0, dtype=tf.int64, trainable=False, name="version")
        masks = resolve_masks(config, model)
        self.masks = {self.paths.index(p): keep for p, keep in masks.items()}
        self.optimizer = PsOptimizer(config, self.shards, self.masks)
        self.initial_seed_state = [model.non_trainable_variables[i].numpy() for i in self.seed_slots]
        self.sparse: list[bool] = [False] * len(self.paths)  # per variable: an IndexedSlices gradient (prepare)

    def checkpoint(self) -> Any:
        """A ``tf.train.Checkpoint`` of everything the ps holds (parameters, optimizer state and masks, version)."""
        import tensorflow as tf

        return tf.train.Checkpoint(trainable=self.shards, shared_state=self.shared_state, version=self.version,
                                   optimizer=self.optimizer.variables)

    def fetch(self) -> tuple[Any, list[Any], list[Any]]:
        """Read the version, then every parameter (one network read per shard), then the shared state."""
        return self.fetch_rows()[:3]

    def fetch_rows(self, rows: dict[int, Any] | None = None) -> tuple[Any, list[Any], list[Any], Any]:
        """``fetch``, but a variable ``i`` in ``rows`` only at the rows ``rows[i]`` (unique int64 ids), each gathered on
        its shard (``sparse.gather_rows``: zeros elsewhere); also returns the parameter bytes that came over."""
        import tensorflow as tf

        rows = rows or {}
        version = self.version.read_value()
        moved = tf.constant(0, tf.int64)
        weights = []
        with tf.control_dependencies([version]):
            for i, shards in enumerate(self.shards):
                if i in rows:
                    table, size = sp.gather_rows(shards, rows[i])
                    weights.append(table)
                    moved += size
                    continue
                weights.append(tf.concat([s.read_value() for s in shards], 0) if len(shards) > 1
                               else shards[0].read_value())
                moved += sum(_bytes(s) for s in shards)
            state = [v.read_value() for v in self.shared_state]
        return version, weights, state, moved

    def prepare(self, sparse: list[bool]) -> None:
        """Say which variables' gradients are ``IndexedSlices`` (per variable) and trace the ps updates for them;
        the chief calls it outside the strategy, before tracing the worker function."""
        self.sparse = [bool(s) for s in sparse]
        self.optimizer.prepare([bool(s) and self.config.sparse_push for s in sparse])

    def push(self, grads: list[Any], state: list[Any]) -> tuple[Any, Any]:
        """Apply ``grads`` on the ps, store ``state``, count the update; returns ``(version, bytes pushed)``.

        An ``IndexedSlices`` gradient is sent as its rows (each once) to the shards that hold them, unless the job
        says ``sparse_push=False``. The version is the counter's value right after this push's increment, taken by
        one atomic fetch-and-increment (``ResourceCountUpTo``) after every write of the push: two concurrent
        pushes never get the same version.
        """
        pieces = []
        for g, shards in zip(grads, self.shards):
            g = sp.dedupe(g) if sp.is_sparse(g) and self.config.sparse_push else sp.dense(g) if sp.is_sparse(g) else g
            pieces += sp.split_rows(g, [int(s.shape[0]) for s in shards]) if len(shards) > 1 else [g]
        kinds = self.optimizer.kinds()
        if kinds is not None:  # what the traced updates expect
            pieces = [p if kind or not sp.is_sparse(p) else sp.dense(p) for p, kind in zip(pieces, kinds)]
        done = self.optimizer.apply(pieces)
        for variable, value in zip(self.shared_state, state):  # e.g. BatchNorm statistics: last writer wins
            done.append(variable.assign(value))
        return count_update(self.version, after=done), sp.payload_bytes(pieces)

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
        """Bytes of optimizer state (slots, sums, step counters, masks) per task: ``{"ps:0": ..., "ps:1": ...}``."""
        out: dict[str, int] = {}
        import tensorflow as tf

        for v in self.optimizer.variables:
            device = (v if isinstance(v, tf.Variable) else v.value).device  # a Keras variable wraps a tf.Variable
            task = short_device(device)
            out[task] = out.get(task, 0) + _bytes(v)
        return out

    def values(self) -> list[np.ndarray]:
        """Every trainable variable's value (its shards joined), read by the chief."""
        return [np.concatenate([s.numpy() for s in shards]) if len(shards) > 1 else shards[0].numpy()
                for shards in self.shards]

    def snapshot(self) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
        """``(version, trainable, shared state)`` as NumPy arrays, read from the ps by the chief."""
        version = int(self.version.numpy())
        return version, self.values(), [v.numpy() for v in self.shared_state]


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
