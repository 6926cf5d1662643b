"""The optimizer on the ps: Downpour's own update rules, or any Keras optimizer, optionally with frozen entries.

``PsOptimizer.apply(pieces)`` runs inside the scheduled worker function and applies one push, one gradient
piece per shard, on the ps task that holds each shard:

* ``"sgd"``: ``v -= lr * T(g)`` (``freezing.gradients.apply``); ``"adagrad"``: DistBelief's per-parameter
  Adagrad, ``v -= lr * g / sqrt(sum of g^2)``, its sums next to their shard. Both under ``tf.device(shard)``.
* any Keras optimizer: built over the shards inside the strategy's scope, where Keras' TensorFlow optimizer
  creates every slot next to its shard (``colocate_vars_with``); applied inside ``strategy.run``, because a Keras 3
  optimizer needs a replica context (outside it, ``merge_call`` fails), and ``ParameterServerStrategy.update``
  then runs each shard's ``update_step`` on that shard's task.
* with ``freeze`` or ``masks``: ``freezing.MaskedOptimizer`` around the Keras optimizer, one stored mask per
  shard; frozen entries, and their slots under ``"hold"``, keep their bits whichever worker pushes.

``resolve_masks(config, model)`` turns a job's ``freeze`` and ``masks`` into ``{variable path: keep}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from study.ps.config import DOWNPOUR_OPTIMIZERS, DownpourConfig, load_callable


def resolve_masks(config: DownpourConfig, model: Any) -> dict[str, np.ndarray]:
    """``{path: keep}`` (bool, broadcastable to the variable; True = trains) from ``freeze`` and ``masks``.

    A ``freeze`` entry matches a trainable variable's path exactly or as a run of whole path segments (a layer's
    name matches every variable of that layer). ``masks`` names a function ``fn(model, **masks_kwargs)``
    returning ``{variable or path: keep}``. Both combine with AND. Unknown names are a ``ValueError`` listing the
    paths.
    """
    paths = {v.path: v for v in model.trainable_variables}
    keep: dict[str, np.ndarray] = {}

    def add(path: str, mask: Any, where: str) -> None:
        shape = tuple(paths[path].shape)
        mask = np.asarray(mask).astype(bool)
        try:
            np.broadcast_to(mask, shape)
        except ValueError:
            raise ValueError(f"{where}: the mask of {path!r} has shape {mask.shape}, which does not broadcast to "
                             f"the variable's {shape}") from None
        keep[path] = np.logical_and(keep[path], mask) if path in keep else mask

    for entry in config.freeze:
        hits = [p for p in paths if p == entry or f"/{entry.strip('/')}/" in f"/{p}/"]
        if not hits:
            raise ValueError(f"freeze: {entry!r} matches no trainable variable; paths: {sorted(paths)}")
        for p in hits:
            add(p, False, "freeze")
    if config.masks is not None:
        given = load_callable(config.masks, "masks")(model, **config.masks_kwargs)
        if not isinstance(given, dict):
            raise ValueError(f"masks: {config.masks} must return a dict {{variable or path: keep}}; got "
                             f"{type(given).__name__}")
        for key, mask in given.items():
            path = key if isinstance(key, str) else getattr(key, "path", None)
            if path not in paths:
                raise ValueError(f"masks: {key!r} is not a trainable variable of the model; paths: {sorted(paths)}")
            add(path, mask, "masks")
    return keep


def split_mask(keep: np.ndarray, shards: Sequence[Any], full_shape: Sequence[int]) -> list[np.ndarray]:
    """One piece of ``keep`` per shard (shards split axis 0); a mask that broadcasts along axis 0 is shared."""
    if len(shards) == 1 or keep.ndim < len(full_shape) or keep.shape[0] == 1:
        return [keep] * len(shards)
    bounds = np.cumsum([0] + [int(s.shape[0]) for s in shards])
    return [keep[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class PsOptimizer:
    """Applies pushes to the shards on the ps with the job's optimizer; see the module docstring.

    ``shards[i]`` are the pieces of trainable variable ``i`` (axis 0 split over ps tasks); ``masks`` maps a
    variable index to its keep mask (only with a Keras optimizer). ``strategy`` None: local variables (the
    single-process baseline and unit tests).
    """

    def __init__(self, config: DownpourConfig, shards: list[list[Any]], strategy: Any = None,
                 masks: dict[int, np.ndarray] | None = None):
        import tensorflow as tf

        self.config, self.shards, self.strategy = config, shards, strategy
        self.flat = [s for row in shards for s in row]
        self.downpour = isinstance(config.optimizer, str) and config.optimizer in DOWNPOUR_OPTIMIZERS
        self.masks = dict(masks or {})
        self.accumulators: list[list[Any]] = []
        self.optimizer: Any = None
        self.mask_placement = None
        scope = strategy.scope if strategy is not None else contextlib.nullcontext
        if self.downpour:
            if self.masks:
                raise ValueError("masks: need a Keras optimizer on the ps; Downpour's own sgd/adagrad take none")
            if config.optimizer == "adagrad":  # one sum of g^2 next to each shard
                with scope():
                    for row in shards:
                        self.accumulators.append([self._colocated(shard, lambda s=shard: tf.Variable(
                            tf.fill(s.shape, config.adagrad_initial), trainable=False,
                            name=f"{s.name.split(':')[0]}_adagrad")) for shard in row])
            return
        with scope():
            inner = keras_optimizer(config)
        if not self.masks:
            with scope():
                inner.build(self.flat)
            self.optimizer = inner
            return
        self.optimizer = self._masked(inner, scope)
        for i, keep in self.masks.items():
            full = [sum(int(s.shape[0]) for s in shards[i]), *shards[i][0].shape[1:]] if shards[i][0].shape else []
            for shard, piece in zip(shards[i], split_mask(keep, shards[i], full)):
                self.optimizer.set_mask(shard, piece)

    def _colocated(self, shard: Any, make: Any) -> Any:
        if self.strategy is None:
            return make()
        with self.strategy.extended.colocate_vars_with(shard):
            return make()

    def _masked(self, inner: Any, scope: Any) -> Any:
        """``MaskedOptimizer(inner)`` built over the shards, its masks on the ps."""
        import tensorflow as tf

        from freezing import MaskedOptimizer

        try:
            with scope():
                masked = MaskedOptimizer(inner, policy=self.config.mask_policy)
                masked.build(self.flat)
            self.mask_placement = "with the strategy's placement"
            return masked
        except ValueError:
            if self.strategy is None:
                raise
        # Today's MaskedOptimizer refuses to be built under a tf.distribute strategy (issue 16, part 1). Build the
        # Keras optimizer (and so its slots) in the scope, then the wrapper outside it, its masks on the first
        # shard's ps task: the masked writes still run next to each shard, reading the masks from that task.
        with scope():
            inner.build(self.flat)
        masked = MaskedOptimizer(inner, policy=self.config.mask_policy)
        with tf.device(self.flat[0].device):
            masked.build(self.flat)
        self.mask_placement = f"masks on {self.flat[0].device} (MaskedOptimizer is built outside the strategy)"
        return masked

    @property
    def variables(self) -> list[Any]:
        """Every variable of the optimizer's state (slots, step counter, masks), for checkpoints."""
        if self.downpour:
            return [a for row in self.accumulators for a in row]
        return list(self.optimizer.variables)

    def apply(self, pieces: Sequence[Any]) -> list[Any]:
        """Apply one push (one gradient per shard, in ``self.flat`` order) on the ps; returns reads of every shard
        that run after its write (for the version bump's control dependencies)."""
        import tensorflow as tf

        from freezing import gradients

        lr = self.config.learning_rate
        if self.downpour:
            reads, k = [], 0
            for i, row in enumerate(self.shards):
                for j, shard in enumerate(row):
                    piece = pieces[k]
                    k += 1
                    with tf.device(shard.device):  # the update runs on the ps that holds the shard
                        if self.accumulators:
                            total = self.accumulators[i][j].assign_add(piece * piece)
                            reads.append(shard.assign_sub(lr * piece * tf.math.rsqrt(total)))
                        else:
                            gradients.apply([piece], [shard], learning_rate=lr)
                            reads.append(shard.read_value())
            return reads

        def step(grads: list[Any]) -> None:
            # Keras 3 all-reduces the gradients to the device each one is on; under ParameterServerStrategy a
            # tensor with no device has no destination ("destinations can not be empty"), so name the worker's CPU
            with tf.device("/device:CPU:0"):
                grads = [tf.identity(g) for g in grads]
            self.optimizer.apply_gradients(zip(grads, self.flat))

        if self.strategy is not None:
            self.strategy.run(step, args=(list(pieces),))
        else:
            step(list(pieces))
        return [v.read_value() for v in self.flat]


def keras_optimizer(config: DownpourConfig) -> Any:
    """A new Keras optimizer from the job's ``optimizer`` (a name gets ``learning_rate``). ``keras_optimizer(job)``"""
    import keras

    if isinstance(config.optimizer, str):
        return keras.optimizers.get({"class_name": config.optimizer, "config": {"learning_rate": config.learning_rate}})
    spec = {"class_name": config.optimizer["class_name"], "config": dict(config.optimizer.get("config", {}))}
    spec["config"].setdefault("learning_rate", config.learning_rate)
    return keras.optimizers.get(spec)
