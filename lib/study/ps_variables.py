"""Downpour SGD, the model's variables on the ps tasks (``PsVariables``), the Downpour worker loop
(``worker_function``), and the model, data and evaluation every task builds the same way."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from study.ps_config import DownpourConfig, load_callable


def _short_device(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1``."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return f"{parts.get('job', '?')}:{parts.get('task', '?')}" if "job" in parts else (device or "local")


class PsVariables:
    """The model's values as ``tf.Variable`` s on the ps (or locally, with ``strategy=None``), with fetch and push.

    ``fetch()`` returns ``(version, trainable values, non-trainable values)``; ``push(grads, non_trainable)``
    applies the (already transformed) gradients next to each shard and returns the new version. Keras seed
    generator states (``Dropout``) are not shared: each worker makes its own (``local_state``).
    """

    def __init__(self, model: Any, config: DownpourConfig, strategy: Any = None):
        import tensorflow as tf

        self.config = config
        self.paths = [v.path for v in model.trainable_variables]
        self.state_paths = [v.path for v in model.non_trainable_variables]
        self.seed_slots = [i for i, v in enumerate(model.non_trainable_variables) if "seed_generator_state" in v.path]
        scope = (lambda: strategy.scope()) if strategy is not None else contextlib.nullcontext
        with scope():
            self.trainable = [tf.Variable(v.numpy(), name=_name(v.path)) for v in model.trainable_variables]
            self.shared_state = [tf.Variable(v.numpy(), name=_name(v.path), trainable=False)
                                 for i, v in enumerate(model.non_trainable_variables) if i not in self.seed_slots]
            self.version = tf.Variable(0, dtype=tf.int64, trainable=False, name="version")
        self.shards = [list(v.variables) if hasattr(v, "variables") and not isinstance(v, tf.Variable) else [v]
                       for v in self.trainable]
        self.accumulators: list[list[Any]] = []
        if config.optimizer == "adagrad":  # DistBelief's per-parameter Adagrad: one sum of g^2 next to each shard
            with scope():
                for shards in self.shards:
                    row = []
                    for shard in shards:
                        with (strategy.extended.colocate_vars_with(shard) if strategy is not None
                              else contextlib.nullcontext()):
                            row.append(tf.Variable(tf.fill(shard.shape, config.adagrad_initial), trainable=False,
                                                   name=f"{shard.name.split(':')[0]}_adagrad"))
                    self.accumulators.append(row)
        self.initial_seed_state = [model.non_trainable_variables[i].numpy() for i in self.seed_slots]

    def checkpoint(self) -> Any:
        """A ``tf.train.Checkpoint`` of everything the ps holds (parameters, Adagrad sums, version)."""
        import tensorflow as tf

        return tf.train.Checkpoint(trainable=self.trainable, shared_state=self.shared_state, version=self.version,
                                   accumulators=[a for row in self.accumulators for a in row])

    def fetch(self) -> tuple[Any, list[Any], list[Any]]:
        """Read the version, then every parameter (one network read per shard), as tensors on the caller's device."""
        import tensorflow as tf

        version = self.version.read_value()
        with tf.control_dependencies([version]):
            weights = [tf.concat([s.read_value() for s in shards], 0) if len(shards) > 1 else shards[0].read_value()
                       for shards in self.shards]
            state = [v.read_value() for v in self.shared_state]
        return version, weights, state

    def push(self, grads: list[Any], state: list[Any]) -> Any:
        """Apply ``grads`` on the ps, store ``state``, bump the version; returns the new version.

        SGD: ``v -= lr*g``; Adagrad: ``v -= lr*g/sqrt(sum of g^2)``.
        """
        import tensorflow as tf

        from freezing import gradients

        updates = []
        for i, (g, shards) in enumerate(zip(grads, self.shards)):
            pieces = tf.split(g, [s.shape[0] for s in shards], axis=0) if len(shards) > 1 else [g]
            for k, (piece, shard) in enumerate(zip(pieces, shards)):
                with tf.device(shard.device):  # the update runs on the ps that holds the shard
                    if self.config.optimizer == "adagrad":
                        total = self.accumulators[i][k].assign_add(piece * piece)
                        updates.append(shard.assign_sub(self.config.learning_rate * piece * tf.math.rsqrt(total)))
                    else:
                        gradients.apply([piece], [shard], learning_rate=self.config.learning_rate)
                        updates.append(shard.read_value())
        for variable, value in zip(self.shared_state, state):  # e.g. BatchNorm statistics: last writer wins
            updates.append(variable.assign(value))
        with tf.control_dependencies(updates):
            return self.version.assign_add(1)

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
                         "shards": [{"task": _short_device(s.device), "shape": [int(d) for d in s.shape],
                                     "bytes": _bytes(s)} for s in shards]})
        for path, v in zip([p for i, p in enumerate(self.state_paths) if i not in self.seed_slots], self.shared_state):
            rows.append({"variable": path, "shape": [int(d) for d in v.shape], "bytes": _bytes(v),
                         "shards": [{"task": _short_device(v.device), "shape": [int(d) for d in v.shape],
                                     "bytes": _bytes(v)}]})
        rows.append({"variable": "version (update counter)", "shape": [], "bytes": 8,
                     "shards": [{"task": _short_device(self.version.device), "shape": [], "bytes": 8}]})
        return rows

    def snapshot(self) -> tuple[int, list[Any], list[Any]]:
        """``(version, trainable, shared state)`` as NumPy arrays, read from the ps by the chief."""
        import tensorflow as tf

        version = int(self.version.numpy())
        return (version, [tf.convert_to_tensor(v).numpy() for v in self.trainable],
                [v.numpy() for v in self.shared_state])


def _name(path: str) -> str:
    return path.replace("/", "_")


def _bytes(v: Any) -> int:
    return int(math.prod(v.shape)) * v.dtype.size


def _full_shape(shards: list[Any]) -> list[int]:
    first = list(shards[0].shape)
    if first:
        first[0] = sum(int(s.shape[0]) for s in shards)
    return first


def worker_function(model: Any, ps: PsVariables, config: DownpourConfig, worker_index: Callable[[], Any]) -> Any:
    """The Downpour worker loop as a ``tf.function`` of a data iterator (``steps_per_function`` steps).

    Returns per push: the new version and the staleness; per step: the loss and the sample indices; and the
    worker's index with the function's start and end time (``tf.timestamp``) on the worker.
    """
    import keras
    import tensorflow as tf

    from freezing import gradients

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=config.from_logits)
    transform = None
    if config.transform is not None:
        hook = load_callable(config.transform, "transform")
        kwargs = dict(config.transform_kwargs)
        transform = (lambda g: hook(g, **kwargs)) if kwargs else hook
    lr = config.learning_rate

    @tf.function
    def run(iterator: Any) -> dict[str, Any]:
        worker = worker_index()
        started = tf.timestamp()
        versions, staleness, losses, samples = [], [], [], []
        for step in range(config.steps_per_function):
            if step % config.n_fetch == 0:  # fetch: a fresh local copy of the parameters
                with tf.control_dependencies([started]):
                    fetched_at, weights, state = ps.fetch()
                own_pushes = 0
                seeds = [tf.stack([tf.cast(s[0], tf.int64) + 1000 * (worker + 1), fetched_at * 64 + step])
                         for s in ps.initial_seed_state]
            if step % config.n_push == 0:
                accumulated = [tf.zeros_like(w) for w in weights]
            x, y, index = next(iterator)
            with tf.GradientTape() as tape:  # compute, on the local copy
                tape.watch(weights)
                logits, new_state = model.stateless_call(weights, ps.full_state(seeds, state), x, training=True)
                loss = loss_fn(y, logits)
            grads = tape.gradient(loss, weights)
            seeds, state = ps.split_state(new_state)
            weights = [w - lr * g for w, g in zip(weights, grads)]  # the local step
            accumulated = [a + g for a, g in zip(accumulated, grads)]
            losses.append(loss)
            samples.append(index)
            if (step + 1) % config.n_push == 0:  # transform, then push: the ps applies it
                version = ps.push(gradients.transform(accumulated, transform), state)
                staleness.append(version - 1 - fetched_at - own_pushes)
                versions.append(version)
                own_pushes += 1
        with tf.control_dependencies([version]):  # the clock stops after the last push
            ended = tf.timestamp()
        return {"versions": tf.stack(versions), "staleness": tf.stack(staleness), "loss": tf.stack(losses),
                "samples": tf.concat(samples, 0), "worker": worker, "started": started, "ended": ended}

    return run


def build_model(config: DownpourConfig) -> Any:
    """The job's Keras model, seeded with ``config.seed``. ``build_model(DownpourConfig())``"""
    import keras

    keras.utils.set_random_seed(config.seed)
    model = load_callable(config.model, "model")(**config.model_kwargs)
    if not getattr(model, "built", False):
        model.build((None, 28, 28, 1))
    return model


def load_data(config: DownpourConfig) -> tuple[Any, Any, Any, Any]:
    """``(x_train, y_train, x_test, y_test)`` from ``config.data`` or ``load_mnist(seed=config.seed)``."""
    import numpy as np

    if config.data is not None:
        with np.load(config.data) as arrays:
            return tuple(arrays[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    from study.data import load_mnist

    data = load_mnist(seed=config.seed)
    return data.x_train, data.y_train, data.x_test, data.y_test


def make_dataset(x: Any, y: Any, config: DownpourConfig, workers: int, worker: Any) -> Any:
    """Worker ``worker``'s disjoint shard of the training set: shuffled, repeated, batched, with sample indices."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y, tf.range(len(y), dtype=tf.int32)))
    return (ds.shard(workers, worker).shuffle(len(y) // workers + 1, seed=config.seed)
            .repeat().batch(config.batch, drop_remainder=True).prefetch(2))


def with_values(model: Any, trainable: list[Any], state: list[Any], seed_state: list[Any],
                ps_layout: PsVariables) -> Callable[..., Any]:
    """``model`` as a function of a batch, with these values (stateless): what ``training.accuracy`` calls.

    ``training.accuracy(with_values(model, w, s, seeds, ps), x, y)``
    """
    import tensorflow as tf

    full = ps_layout.full_state([tf.constant(s) for s in seed_state], [tf.constant(s) for s in state])
    weights = [tf.constant(w) for w in trainable]

    def logits(x: Any, training: bool = False) -> Any:
        return model.stateless_call(weights, full, tf.constant(x), training=training)[0]

    return logits
