"""The Downpour worker loop (``worker_function``), and the same loop in one process (``local_steps_per_s``).

A scheduled function runs ``steps_per_function`` steps on one worker:

* fetch: every ``n_fetch`` steps, read every parameter from the ps into a local copy;
* compute: the gradients of one minibatch of the worker's own shard (``x`` a tensor, or a dict or list of them
  for a model with several inputs), on the local copy, with ``keras.Model.stateless_call``; take the local step
  ``w -= local_lr * g`` (a scatter for an ``Embedding``'s ``IndexedSlices``; frozen entries stay, their masks
  travel once with the function) and add ``g`` to an accumulator;
* transform and push: every ``n_push`` steps, ``T(sum g)`` goes to the ps, which applies it with the job's
  optimizer next to each shard (``PsVariables.push``) and returns the push's version; an ``IndexedSlices``
  gradient goes as the rows it touched, each once.

Staleness of a push = updates that other workers applied between this worker's fetch and this push.
``gradient_kinds`` says, before anything is traced under the strategy, which variables get ``IndexedSlices``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from downpour.config import DownpourConfig, load_callable
from downpour.model import make_loss, row_inputs
from downpour.variables import PsVariables


def gradient_kinds(model: Any, ps: PsVariables, config: DownpourConfig, element_spec: Any) -> list[bool]:
    """Per trainable variable, whether its gradient is a ``tf.IndexedSlices`` (an ``Embedding``'s): found by tracing
    the loss's gradient once on ``element_spec``, the data's unbatched ``(x, y)`` spec; nothing runs."""
    import tensorflow as tf

    loss_fn = make_loss(config)
    kinds: list[bool] = []
    batched = tf.nest.map_structure(lambda s: tf.TensorSpec((None, *s.shape), s.dtype), element_spec[:2])
    values = [v.numpy() for v in model.non_trainable_variables]

    def trace(x: Any, y: Any) -> Any:
        weights = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]
        state = [tf.constant(v) for v in values]
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss = loss_fn(y, model.stateless_call(weights, state, x, training=True)[0])
        kinds.extend(isinstance(g, tf.IndexedSlices) for g in tape.gradient(loss, weights))
        return loss

    tf.function(trace).get_concrete_function(*batched)
    return kinds


def worker_function(model: Any, ps: PsVariables, config: DownpourConfig, worker_index: Callable[[], Any],
                    timestamps: bool = True) -> Any:
    """The Downpour worker loop as a ``tf.function`` of a data iterator (``steps_per_function`` steps).

    Returns per push: the version, the staleness and the bytes of gradient it sent; per step: the loss; the
    number of samples the function read from another worker's shard (0 when the shards are disjoint; -1 when the
    dataset function shards itself, which this cannot check); and the worker's index with the function's start
    and end time (``tf.timestamp``) on the worker. ``timestamps=False`` gives 0 for both instead: ``tf.timestamp``
    fails in a process where ``tf.config.experimental.enable_op_determinism`` was called (the local loop).
    """
    import tensorflow as tf

    from downpour import sparse as sp

    loss_fn = make_loss(config)
    transform = None
    if config.transform is not None:
        hook = load_callable(config.transform, "transform")
        kwargs = dict(config.transform_kwargs)
        transform = (lambda g: hook(g, **kwargs)) if kwargs else hook
    lr = config.local_lr
    from downpour.data import shards_itself

    check_shards = not shards_itself(config)
    masks = {i: keep for i, keep in ps.masks.items()}  # constants of the function: sent once with it
    rows_of = row_inputs(model, ps.paths, ps.sparse)[0] if config.sparse_fetch else {}

    @tf.function
    def run(iterator: Any) -> dict[str, Any]:
        worker = worker_index()
        started = tf.timestamp() if timestamps else tf.constant(0.0, tf.float64)
        versions, staleness, losses, sent, fetched = [], [], [], [], []
        foreign = tf.constant(0, tf.int64)
        keep = {i: tf.constant(k) for i, k in masks.items()}
        for step in range(config.steps_per_function):
            if step % config.n_fetch == 0:  # fetch: a fresh local copy of the parameters
                ids = {}
                if rows_of:  # an Embedding's rows: those the next n_fetch batches look up, read first
                    ahead = [next(iterator) for _ in range(config.n_fetch)]
                    ids = {i: tf.unique(tf.concat([tf.reshape(tf.cast(tf.nest.flatten(b[0])[k], tf.int64), [-1])
                                                   for b in ahead], 0))[0] for i, k in rows_of.items()}
                with tf.control_dependencies([started]):
                    fetched_at, weights, state, moved = ps.fetch_rows(ids)
                fetched.append(moved)
                own_pushes = 0
                seeds = [tf.stack([tf.cast(s[0], tf.int64) + 1000 * (tf.cast(worker, tf.int64) + 1),
                                   fetched_at * 64 + step]) for s in ps.initial_seed_state]
            if step % config.n_push == 0:
                accumulated = [None] * len(weights)
            x, y, index = ahead[step % config.n_fetch] if rows_of else next(iterator)
            with tf.GradientTape() as tape:  # compute, on the local copy
                tape.watch(weights)
                out, new_state = model.stateless_call(weights, ps.full_state(seeds, state), x, training=True)
                loss = loss_fn(y, out)
            grads = tape.gradient(loss, weights)
            seeds, state = ps.split_state(new_state)
            weights = [sp.local_step(w, g, lr, keep.get(i)) for i, (w, g) in enumerate(zip(weights, grads))]
            accumulated = [g if a is None else sp.add(a, g) for a, g in zip(accumulated, grads)]
            losses.append(loss)
            if check_shards:
                foreign += tf.reduce_sum(tf.cast(tf.math.floormod(index, config.workers)
                                                 != tf.cast(worker, tf.int64), tf.int64))
            if (step + 1) % config.n_push == 0:  # transform, then push: the ps applies it
                version, size = ps.push([sp.map_values(transform, g) for g in accumulated], state)
                staleness.append(version - 1 - fetched_at - own_pushes)
                versions.append(version)
                sent.append(size)
                own_pushes += 1
        with tf.control_dependencies([version]):  # the clock stops after the last push
            ended = tf.timestamp() if timestamps else tf.identity(started)
        return {"versions": tf.stack(versions), "staleness": tf.stack(staleness), "loss": tf.stack(losses),
                "pushed_bytes": tf.stack(sent), "fetched_bytes": tf.stack(fetched),
                "samples": tf.constant(config.steps_per_function * config.batch, tf.int64),
                "foreign_samples": foreign if check_shards else tf.constant(-1, tf.int64),
                "worker": worker, "started": started, "ended": ended}

    return run


def local_steps_per_s(config: DownpourConfig, functions: int = 8, repeats: int = 3, threads: int = 1,
                      core: int | None = 0) -> dict[str, Any]:
    """Run ``worker_function`` in this process on local variables (no ps, no network); steps/s per repeat.

    The process is limited like a worker: ``threads`` intra-op threads and, with ``core``, pinned to that core
    (call it in a fresh process: TensorFlow's thread pools are fixed once it has run an op).
    ``local_steps_per_s(DownpourConfig(n_fetch=4, n_push=4, steps_per_function=8, data=...))``
    """
    limits = f"intra_op_parallelism_threads={threads}"
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[core % len(os.sched_getaffinity(0))]})
        limits += f", pinned to core {core}"
    import tensorflow as tf

    from downpour.data import element_spec, train_dataset
    from downpour.model import build_model

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(4)
    model = build_model(config)
    ps = PsVariables(model, config)
    dataset = train_dataset(config)(0, 1)
    ps.prepare(gradient_kinds(model, ps, config, element_spec(config)))
    fn = worker_function(model, ps, config, lambda: tf.constant(0, tf.int32), timestamps=False)
    iterator = iter(dataset)
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
