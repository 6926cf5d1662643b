"""Asynchronous Downpour SGD (Dean et al. 2012) for any Keras model, on TensorFlow's parameter-server runtime.

The model stays a Keras model; its variables become plain ``tf.Variable`` s on the ps tasks (large ones split
over them by a ``MinSizePartitioner``), and workers run it with ``keras.Model.stateless_call`` on values. The
chief (a ``ClusterCoordinator``) schedules the Downpour worker loop (``worker_function``) on the workers:

* fetch: read every parameter from the ps into a local copy, every ``n_fetch`` steps;
* compute: the gradients of one minibatch of the worker's own shard of the data, on the local copy;
  take the local step ``w -= lr * g`` and add ``g`` to an accumulator;
* transform and push, every ``n_push`` steps: ``T(sum g)`` (any ``"module:function"``) goes to the ps, which
  applies it as ``v -= lr * T(g)`` (``freezing.gradients.apply``) or with per-parameter Adagrad, next to the
  variable, and bumps a version counter.

Staleness of a push = updates the other workers applied between this worker's fetch and this push. Every
task is ``python -m study.ps_roles`` with a ``TF_CONFIG`` (``study.ps_roles``); ``run_downpour(config)`` starts
them on this machine with ``LocalCluster``, runs the chief, injects faults (a killed worker, ps task or
chief), restarts what was killed, and returns the chief's measurements.

``DownpourConfig(n_fetch=1, n_push=1)`` is the plain asynchronous SGD of the earlier version of this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
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


# ----------------------------------------------------------------------------------------------------------
# The model's variables on the ps, and the Downpour worker loop


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


def accuracy(model: Any, trainable: list[Any], state: list[Any], seed_state: list[Any], ps_layout: PsVariables,
             x: Any, y: Any, batch: int = 500) -> float:
    """Test accuracy of the model with these values (inference mode). ``accuracy(model, w, s, seeds, ps, x, y)``"""
    import numpy as np
    import tensorflow as tf

    full = ps_layout.full_state([tf.constant(s) for s in seed_state], [tf.constant(s) for s in state])
    weights = [tf.constant(w) for w in trainable]
    correct = 0
    for start in range(0, len(y), batch):
        logits, _ = model.stateless_call(weights, full, tf.constant(x[start:start + batch]), training=False)
        correct += int(np.sum(np.argmax(logits.numpy(), 1) == y[start:start + batch]))
    return correct / len(y)


# ----------------------------------------------------------------------------------------------------------
# The chief


def _is_ps_failure(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return "/job:ps" in text or "PSUnavailableError" in text


def _write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def run_chief(config: DownpourConfig, cluster: dict[str, list[str]], out: str | None = None,
              resume: bool = False) -> int:
    """The coordinator's whole job (``python -m study.ps_roles`` as chief); returns the exit code."""
    from study import ps_roles
    from study.cluster import check_parameter_server_cluster, wait_for_tasks

    try:
        check_parameter_server_cluster(cluster)
    except ValueError as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return ps_roles.EXIT_BAD_INPUT
    config = dataclasses.replace(config, workers=len(cluster["worker"]), ps=len(cluster["ps"]))
    if config.checkpoint_every and not config.checkpoint_dir:
        print("study.ps_roles: checkpoint_every needs checkpoint_dir (a folder the chief can write)", file=sys.stderr)
        return ps_roles.EXIT_BAD_INPUT
    try:
        wait_for_tasks(cluster, timeout=config.start_timeout)
    except TimeoutError as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return ps_roles.EXIT_UNREACHABLE
    progress = f"{out}.progress.json" if out else None
    trainer = _Chief(config, cluster, progress)
    try:
        result = trainer.train(resume)
    except Exception as e:  # noqa: BLE001 - a lost ps is an expected fault; anything else is re-raised
        if not _is_ps_failure(e):
            raise
        failure = trainer.record_failure(e)
        print(f"study.ps_roles: a ps task was lost ({failure['error'][:200]}); restart it, then the chief with "
              f"--resume to continue from the checkpoint of update {failure['checkpoint_version']}", file=sys.stderr)
        return ps_roles.EXIT_PS_LOST
    if out:
        _write_json(out, result)
    print(f"chief: done, {result['applied_updates']} updates in {result['seconds']:.1f} s", flush=True)
    return 0


class _Chief:
    """Build, schedule, poll, checkpoint, evaluate: the chief's side of one job (runs in the chief process)."""

    def __init__(self, config: DownpourConfig, cluster: dict[str, list[str]], progress: str | None):
        self.config, self.cluster, self.progress_path = config, cluster, progress
        self.state: dict[str, Any] = {"functions_done": 0, "records": [], "curve": [], "elapsed": 0.0,
                                      "attempts": [], "checkpoints": [], "samples": {}}
        self.last_version = 0
        self.checkpoint_version = None
        self.ps: PsVariables | None = None

    def write_progress(self, **extra: Any) -> None:
        if self.progress_path:
            _write_json(self.progress_path, {
                "version": self.last_version, "functions_done": self.state["functions_done"],
                "checkpoint_version": self.checkpoint_version,
                "version_task": _short_device(self.ps.version.device) if self.ps else None, **extra})

    def record_failure(self, error: BaseException) -> dict[str, Any]:
        at_failure = None
        try:  # exact when the counter lives on a ps task that is still alive
            at_failure = int(self.ps.version.numpy())
        except Exception:  # noqa: BLE001
            pass
        failure = {"error": f"{type(error).__name__}: {error}".splitlines()[0], "version_at_failure": at_failure,
                   "last_polled_version": self.last_version, "checkpoint_version": self.checkpoint_version}
        self.write_progress(failure=failure)
        return failure

    def train(self, resume: bool) -> dict[str, Any]:
        born = time.perf_counter()
        import tensorflow as tf

        def log(what: str) -> None:
            print(f"chief: {what} ({time.perf_counter() - born:.1f} s)", flush=True)

        config, cluster = self.config, self.cluster
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=config.shard_min_bytes, max_shards=config.ps)
        strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        log("connected")
        model = build_model(config)
        self.ps = ps = PsVariables(model, config, strategy)
        log("variables on the ps")
        checkpoint = ps.checkpoint()
        manager = (tf.train.CheckpointManager(checkpoint, config.checkpoint_dir, max_to_keep=2)
                   if config.checkpoint_every else None)
        # the chief reads and writes every checkpoint file itself (by default each ps task would write its own
        # shard on its own disk), so checkpoint_dir has to exist only where the chief runs
        io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
        restored = None
        if resume and manager is not None and manager.latest_checkpoint:
            checkpoint.restore(manager.latest_checkpoint, options=io).assert_existing_objects_matched()
            self.state = json.loads(Path(f"{manager.latest_checkpoint}.state.json").read_text())
            restored = int(ps.version.numpy())
        self.checkpoint_version = restored if restored is not None else 0
        self.last_version = int(ps.version.numpy())
        self.state["attempts"].append({
            "resumed": restored is not None, "restored_version": restored,
            "restored_functions": self.state["functions_done"] if restored is not None else 0})
        self.write_progress()

        x_train, y_train, x_test, y_test = load_data(config)
        x_test, y_test = x_test[:config.eval_samples], y_test[:config.eval_samples]
        workers = config.workers
        iterator = iter(coordinator.create_per_worker_dataset(
            lambda: make_dataset(x_train, y_train, config, workers,
                                 tf.distribute.coordinator.experimental_get_current_worker_index())))
        fn = worker_function(model, ps, config, tf.distribute.coordinator.experimental_get_current_worker_index)
        log("data on the workers")

        snapshots = []
        if not self.state["curve"] and config.eval_every:
            snapshots.append((0.0, *ps.snapshot()))
        functions = config.functions
        per_checkpoint = (max(1, -(-config.checkpoint_every // config.pushes_per_function))
                          if config.checkpoint_every else functions)
        warmup = config.warmup_functions if config.warmup_functions is not None else min(functions, 2 * workers)
        clock = time.perf_counter() - self.state["elapsed"]
        steady_from = None
        next_eval = (self.last_version // config.eval_every + 1) * config.eval_every if config.eval_every else None
        done = self.state["functions_done"]
        while done < functions:
            end = min(functions, (done // per_checkpoint + 1) * per_checkpoint)
            if done < warmup and steady_from is None and not restored:
                end = min(end, warmup)
            scheduled = [coordinator.schedule(fn, args=(iterator,)) for _ in range(done, end)]
            while not coordinator.done():
                time.sleep(0.1)
                self.last_version = int(ps.version.numpy())
                self.write_progress(in_flight=end - done, steady=steady_from is not None)
                if next_eval is not None and self.last_version >= next_eval:
                    snapshots.append((time.perf_counter() - clock, *ps.snapshot()))
                    next_eval = (self.last_version // config.eval_every + 1) * config.eval_every
            coordinator.join()
            log(f"{end} functions done")
            for value in scheduled:
                self._record(value.fetch(), time.perf_counter() - clock)
            done = self.state["functions_done"] = end
            self.last_version = int(ps.version.numpy())
            if steady_from is None and (done >= warmup or restored):
                steady_from = (time.perf_counter(), done, self.last_version)
                self.write_progress(steady=True)
            if manager is not None and (done % per_checkpoint == 0 or done == functions):
                self.state["elapsed"] = time.perf_counter() - clock
                self._evaluate_into_curve(snapshots, model, x_test, y_test)
                snapshots = []
                path = manager.save(checkpoint_number=self.last_version, options=io)
                self.checkpoint_version = self.last_version
                self.state["checkpoints"].append({"version": self.last_version, "functions": done,
                                                  "seconds": self.state["elapsed"]})
                _write_json(f"{path}.state.json", self.state)
            self.write_progress(steady=steady_from is not None)
        elapsed = time.perf_counter() - clock
        self.write_progress(steady=steady_from is not None, finished=True)
        final = ps.snapshot()
        snapshots.append((elapsed, *final))
        self._evaluate_into_curve(snapshots, model, x_test, y_test)
        return self._result(elapsed, steady_from, final[0], ps)

    def _record(self, value: dict[str, Any], seconds: float) -> None:
        import numpy as np

        worker = int(value["worker"])
        samples = self.state["samples"].setdefault(str(worker), [])
        samples.extend(np.unique(np.asarray(value["samples"])).tolist())
        self.state["samples"][str(worker)] = sorted(set(samples))
        self.state["records"].append({
            "worker": worker, "versions": np.asarray(value["versions"]).tolist(),
            "staleness": np.asarray(value["staleness"]).tolist(), "loss": np.asarray(value["loss"]).tolist(),
            "started": float(value["started"]), "ended": float(value["ended"]), "returned_s": seconds})

    def _evaluate_into_curve(self, snapshots: list[tuple], model: Any, x: Any, y: Any) -> None:
        seeds = [s for s in self.ps.initial_seed_state]
        for seconds, version, trainable, state in snapshots:
            if self.state["curve"] and self.state["curve"][-1]["applied_updates"] == version:
                continue
            self.state["curve"].append({"applied_updates": version, "seconds": seconds,
                                        "accuracy": accuracy(model, trainable, state, seeds, self.ps, x, y)})

    def _result(self, elapsed: float, steady_from: tuple | None, final_version: int, ps: PsVariables) -> dict[str, Any]:
        import numpy as np

        config, records = self.config, self.state["records"]
        steady: dict[str, Any] = {}
        if steady_from is not None:
            t0, f0, v0 = steady_from
            window = time.perf_counter() - t0
            steps = (len(records) - f0) * config.steps_per_function
            steady = {"steady_seconds": window, "steady_steps": steps, "steady_updates": final_version - v0,
                      "steps_per_s": steps / window if window > 0 else float("nan"),
                      "updates_per_s": (final_version - v0) / window if window > 0 else float("nan")}
            intervals = [(r["started"], r["ended"]) for r in records[f0:]]
            if intervals:
                span = max(b for _, b in intervals) - min(a for a, _ in intervals)
                steady["busy_workers_mean"] = sum(b - a for a, b in intervals) / span if span > 0 else float("nan")
        samples = {w: set(v) for w, v in self.state["samples"].items()}
        overlap = sum(len(samples[a] & samples[b]) for a in samples for b in samples if a < b)
        layout = ps.placement()
        per_task: dict[str, int] = {}
        for row in layout:
            for shard in row["shards"]:
                per_task[shard["task"]] = per_task.get(shard["task"], 0) + shard["bytes"]
        staleness = [s for r in records for s in r["staleness"]]
        returned_pushes = sum(len(r["versions"]) for r in records)
        return {
            "config": asdict(config),
            "scheduled_functions": config.functions, "returned_functions": len(records),
            "scheduled_steps": config.functions * config.steps_per_function,
            "returned_steps": len(records) * config.steps_per_function,
            "returned_updates": returned_pushes, "applied_updates": final_version,
            "seconds": elapsed, **steady,
            "staleness": staleness, "curve": self.state["curve"],
            "steady_from_function": steady_from[1] if steady_from is not None else None,
            "function_times": [[r["worker"], r["started"], r["ended"]] for r in records],
            "final_accuracy": self.state["curve"][-1]["accuracy"] if self.state["curve"] else None,
            "loss_first": float(np.mean(records[0]["loss"])) if records else None,
            "loss_last": float(np.mean(records[-1]["loss"])) if records else None,
            "functions_per_worker": {str(w): sum(r["worker"] == w for r in records)
                                     for w in sorted({r["worker"] for r in records})},
            "samples_per_worker": {w: len(v) for w, v in samples.items()}, "samples_shared_between_workers": overlap,
            "placement": layout, "bytes_per_task": per_task,
            "attempts": self.state["attempts"], "checkpoints": self.state["checkpoints"],
            "parameters": int(sum(math.prod(r["shape"]) for r in layout[:len(ps.paths)])),
        }


# ----------------------------------------------------------------------------------------------------------
# The launcher: a LocalCluster, the chief, faults and restarts


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


_MNIST: dict[int, Any] = {}


def _mnist_npz(seed: int, path: Path) -> str:
    """Write this process's ``load_mnist(seed=seed)`` (loaded once) as the job's ``data`` file."""
    import numpy as np

    if seed not in _MNIST:
        from study.data import load_mnist

        _MNIST[seed] = load_mnist(seed=seed)
    d = _MNIST[seed]
    np.savez(path, x_train=d.x_train, y_train=d.y_train, x_test=d.x_test, y_test=d.y_test)
    return str(path)


def run_downpour(config: DownpourConfig, cluster: Any = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one job on a ``LocalCluster`` (a new one, or ``cluster`` with enough tasks) and return its measurements.

    The chief is ``python -m study.ps_roles`` with the chief's ``TF_CONFIG`` (the job's first ``ps`` and
    ``workers`` tasks). Faults: ``kill_worker_at`` kills worker 0; ``kill_ps_at`` kills a ps task (one that does
    not hold the version counter, when there are two), restarts it, and restarts the chief with ``--resume``;
    ``kill_chief_at`` kills the chief and restarts it with ``--resume``. Tasks found dead are restarted before a job.
    ``run_downpour(DownpourConfig(workers=2, steps=200))``
    """
    from study.cluster import LocalCluster

    if cluster is None:
        with LocalCluster(config.workers, config.ps, start_timeout=config.start_timeout) as own:
            result = _launch(config, own, timeout_s)
        result["pids"] = own.pids
        return result
    return _launch(config, cluster, timeout_s)


def _launch(config: DownpourConfig, cluster: Any, timeout_s: float) -> dict[str, Any]:
    from study import ps_roles

    if len(cluster.spec["worker"]) < config.workers or len(cluster.spec["ps"]) < config.ps:
        raise ValueError(f"run_downpour: the cluster has {len(cluster.spec['worker'])} worker and "
                         f"{len(cluster.spec['ps'])} ps tasks; the job needs {config.workers} and {config.ps}")
    for job, count in (("ps", config.ps), ("worker", config.workers)):
        for i in range(count):
            if cluster.processes[(job, i)].poll() is not None:
                cluster.restart(job, i)
    spec = {"chief": cluster.spec["chief"], "ps": cluster.spec["ps"][:config.ps],
            "worker": cluster.spec["worker"][:config.workers]}
    tasks = {f"{job}:{i}": cluster.processes[(job, i)].pid for job in ("ps", "worker") for i in range(len(spec[job]))}
    with tempfile.TemporaryDirectory(prefix="freezing-downpour-") as tmp:
        data = config.data or _mnist_npz(config.seed, Path(tmp) / "data.npz")  # the chief skips loading MNIST
        job = asdict(dataclasses.replace(config, data=data,
                                         checkpoint_dir=config.checkpoint_dir or str(Path(tmp) / "checkpoints")))
        job_path, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        progress = Path(f"{out}.progress.json")
        job_path.write_text(json.dumps(job))
        cpu_before = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
        args = ("--job", str(job_path), "--out", str(out))
        chief = cluster.start_chief(args, spec=spec)
        started = time.monotonic()
        faults = [f for f in (("worker", 0, config.kill_worker_at), ("ps", None, config.kill_ps_at),
                              ("chief", 0, config.kill_chief_at)) if f[2] is not None]
        events: list[dict[str, Any]] = []
        ps_down: tuple[int, float] | None = None
        cpu_steady: dict[str, float | None] | None = None
        cpu_finished: dict[str, float | None] | None = None
        while True:
            code = chief.poll()
            state = _read_json(progress)
            if cpu_steady is None and state.get("steady") and not events:
                cpu_steady = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
            if cpu_finished is None and state.get("finished") and not events:
                cpu_finished = {name: _cpu_seconds(pid) for name, pid in tasks.items()}
            if code is None:
                for fault in list(faults):
                    job_name, index, at = fault
                    if state.get("version", 0) < at:
                        continue
                    faults.remove(fault)
                    if job_name == "ps":
                        holder = state.get("version_task") or "ps:0"
                        index = next((i for i in range(config.ps) if f"ps:{i}" != holder), 0)
                    event = {"killed": f"{job_name}:{index}", "version_seen": state.get("version"),
                             "checkpoint_version": state.get("checkpoint_version"),
                             "seconds": time.monotonic() - started}
                    if job_name == "chief":
                        cluster.kill("chief", 0)
                        event["restarted"] = "chief --resume"
                        events.append(event)
                        chief = cluster.start_chief(args + ("--resume",), spec=spec)
                    elif job_name == "worker":  # a supervisor starts it again; the coordinator reconnects to it
                        cluster.kill("worker", index)
                        cluster.restart("worker", index, wait=False)
                        event["restarted"] = "worker:0 (the coordinator reconnects when it listens)"
                        events.append(event)
                    else:
                        cluster.kill(job_name, index)
                        events.append(event)
                        ps_down = (index, time.monotonic())
                    break
                if ps_down is not None and time.monotonic() - ps_down[1] > 90:
                    cluster.kill("chief", 0)  # it did not notice the lost ps in time; treat it as lost anyway
                    continue
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"run_downpour: the job did not finish within {timeout_s:g} s; "
                                       f"chief log: {cluster.log_tail('chief', 0)}")
                time.sleep(0.1)
                continue
            if code == 0:
                break
            if ps_down is not None and code in (ps_roles.EXIT_PS_LOST, -9):
                index, _ = ps_down
                failure = state.get("failure", {})
                events[-1].update({"chief_exit": code, **{k: failure.get(k) for k in (
                    "version_at_failure", "last_polled_version", "checkpoint_version", "error")}})
                cluster.restart("ps", index)
                events[-1]["restarted"] = f"ps:{index}, then chief --resume"
                ps_down = None
                chief = cluster.start_chief(args + ("--resume",), spec=spec)
                continue
            raise RuntimeError(f"run_downpour: the chief failed (exit {code}): {cluster.log_tail('chief', 0, 1500)}")
        result = json.loads(out.read_text())
    result["faults"] = events
    cpu_after = {name: _cpu_seconds(pid) for name, pid in tasks.items()}

    def used(start: dict[str, float | None] | None, end: dict[str, float | None] | None) -> dict[str, float | None]:
        return {name: (None if not start or not end or start[name] is None or end[name] is None
                       else end[name] - start[name]) for name in tasks}

    result["task_cpu_s"] = used(cpu_before, cpu_after)  # CPU seconds of each server task during the job
    result["steady_task_cpu_s"] = used(cpu_steady, cpu_finished)  # ... during the timed (steady) window
    result["pids"] = cluster.pids
    result["worker_limits"] = (f"each worker: intra_op_parallelism_threads={cluster.worker_threads}"
                               + (", pinned to one core (os.sched_setaffinity)" if cluster.pin_workers
                                  and cluster.worker_threads == 1 and hasattr(os, "sched_setaffinity") else ""))
    return result


# ----------------------------------------------------------------------------------------------------------
# The same worker loop without a cluster: the baseline of the overhead measurement


def local_steps_per_s(config: DownpourConfig, functions: int = 8, repeats: int = 3, threads: int = 1,
                      core: int | None = 0) -> dict[str, Any]:
    """Run ``worker_function`` in this process on local variables (no ps, no network); steps/s per repeat.

    The process is limited like a worker: ``threads`` intra-op threads and, with ``core``, pinned to that core
    (call it in a fresh process: TensorFlow's thread pools are fixed once it has run an op).
    ``local_steps_per_s(DownpourConfig(n_fetch=4, n_push=4, steps_per_function=8))``
    """
    limits = f"intra_op_parallelism_threads={threads}"
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[core % len(os.sched_getaffinity(0))]})
        limits += f", pinned to core {core}"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(4)
    x_train, y_train, _, _ = load_data(config)
    model = build_model(config)
    ps = PsVariables(model, config)
    fn = worker_function(model, ps, config, lambda: tf.constant(0, tf.int64))
    iterator = iter(make_dataset(x_train, y_train, config, 1, 0))
    for _ in range(2):  # trace and warm up
        out = fn(iterator)
    int(out["versions"][-1])
    rates, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(functions):
            out = fn(iterator)
        int(out["versions"][-1])
        steps = functions * config.steps_per_function
        rates.append(steps / (time.perf_counter() - start))
        cpu.append((time.process_time() - start_cpu) / steps)
    return {"steps_per_s": rates, "cpu_s_per_step": cpu, "limits": limits, "final_version": int(ps.version.numpy())}
