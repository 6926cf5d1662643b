"""The optimizer on the ps: Downpour's own update rules, or any Keras optimizer, optionally with frozen entries.

``PsOptimizer.apply(pieces)`` runs inside the scheduled worker function and applies one push, one gradient
piece per shard (a dense tensor, or a ``tf.IndexedSlices`` of the rows it touches), on the ps task that holds
each shard:

* ``"sgd"``: ``v -= lr * T(g)``; ``"adagrad"``: DistBelief's per-parameter Adagrad, ``v -= lr * g / sqrt(sum of
  g^2)``, its sums next to their shard. Both under ``tf.device(shard)``; a sparse piece is a scatter.
* any Keras optimizer: **one optimizer per ps task**, over that task's shards, created and built under
  ``tf.device(task)`` with no ``tf.distribute`` strategy in force, so its slots and step counter live on that
  task. With ``freeze`` or ``masks`` it is a ``freezing.MaskedOptimizer`` with that task's pieces of the masks
  stored in it (``set_mask``): every masked write reads its mask on the task that writes. Each task's update is a
  ``tf.function`` traced once outside the strategy (``prepare``), and the worker function calls it: a Keras
  optimizer applies there exactly as in a custom loop on one machine, nothing of the library is bypassed, and
  ``freezing.MaskedOptimizer``'s own refusal of ``ParameterServerStrategy`` stays in force.

``resolve_masks(config, model)`` turns a job's ``freeze`` and ``masks`` into ``{variable path: keep}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from downpour.config import DOWNPOUR_OPTIMIZERS, DownpourConfig, load_callable


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

    ``shards[i]`` are the pieces of trainable variable ``i`` (axis 0 split over ps tasks; each a ``tf.Variable``
    placed on its task, or local); ``masks`` maps a variable index to its keep mask (only with a Keras optimizer).
    """

    def __init__(self, config: DownpourConfig, shards: list[list[Any]], masks: dict[int, np.ndarray] | None = None):
        import tensorflow as tf

        self.config, self.shards = config, shards
        self.flat = [s for row in shards for s in row]
        self.owner = [i for i, row in enumerate(shards) for _ in row]  # flat index -> variable index
        self.downpour = isinstance(config.optimizer, str) and config.optimizer in DOWNPOUR_OPTIMIZERS
        self.masks = dict(masks or {})
        self.accumulators: list[Any] = []
        self.tasks: dict[str, list[int]] = {}  # device of a ps task ("" locally) -> flat indices of its shards
        for k, shard in enumerate(self.flat):
            self.tasks.setdefault(shard.device, []).append(k)
        self.optimizers: dict[str, Any] = {}
        self._updates: dict[str, Any] = {}
        self._sparse: list[bool] | None = None
        if self.downpour:
            if self.masks:
                raise ValueError("masks: need a Keras optimizer on the ps; Downpour's own sgd/adagrad take none")
            if config.optimizer == "adagrad":  # one sum of g^2 next to each shard
                for shard in self.flat:
                    with tf.device(shard.device):
                        self.accumulators.append(tf.Variable(tf.fill(shard.shape, config.adagrad_initial),
                                                             trainable=False,
                                                             name=f"{shard.name.split(':')[0]}_adagrad"))
            return
        pieces: dict[int, np.ndarray] = {}
        for i, keep in self.masks.items():
            members = [k for k, owner in enumerate(self.owner) if owner == i]
            full = [sum(int(self.flat[k].shape[0]) for k in members), *self.flat[members[0]].shape[1:]] \
                if self.flat[members[0]].shape else []
            pieces.update(zip(members, split_mask(keep, [self.flat[k] for k in members], full)))
        for device, members in self.tasks.items():
            with tf.device(device or None):
                optimizer = keras_optimizer(config)
                if self.masks:
                    from freezing import MaskedOptimizer

                    optimizer = MaskedOptimizer(optimizer, config.mask_policy)
                optimizer.build([self.flat[k] for k in members])
                for k in members:
                    if k in pieces:
                        optimizer.set_mask(self.flat[k], pieces[k])
            self.optimizers[device] = optimizer

    @property
    def mask_placement(self) -> str | None:
        """Where the masks live: one ``MaskedOptimizer`` per ps task, each holding its own shards' masks."""
        if not self.masks or self.downpour:
            return None
        counts = {short(d): sum(self.owner[k] in self.masks for k in members) for d, members in self.tasks.items()}
        return ("one MaskedOptimizer per ps task, each with the masks of its own shards: "
                + ", ".join(f"{task} {n} masked shard{'s' * (n != 1)}" for task, n in counts.items()))

    @property
    def variables(self) -> list[Any]:
        """Every variable of the optimizer's state (slots, step counters, masks), for checkpoints."""
        if self.downpour:
            return list(self.accumulators)
        return [v for device in self.tasks for v in self.optimizers[device].variables]

    def prepare(self, sparse: Sequence[bool]) -> None:
        """Trace each ps task's update once, for gradients that are ``IndexedSlices`` where ``sparse[i]`` (per
        variable) and dense tensors elsewhere. Call it with no ``tf.distribute`` strategy in force (the chief does,
        before it traces the worker function); a push traces it itself when it runs outside a strategy."""
        import tensorflow as tf

        from downpour import sparse as sp

        self._sparse = [bool(sparse[i]) for i in self.owner]
        if self.downpour:
            return
        for device, members in self.tasks.items():
            specs = [sp.spec(self.flat[k].shape, self.flat[k].dtype, self._sparse[k]) for k in members]
            self._updates[device] = tf.function(self._task_update(device, members)).get_concrete_function(specs)

    def _task_update(self, device: str, members: list[int]) -> Any:
        import tensorflow as tf

        optimizer, variables = self.optimizers[device], [self.flat[k] for k in members]

        def update(grads: list[Any]) -> Any:
            from freezing import gradients

            with tf.device(device or None):
                gradients.apply(grads, variables, optimizer)  # apply_gradients, as in a custom loop
                return tf.constant(True)  # a flag, not the values: the caller only waits for it

        return update

    def kinds(self) -> list[bool] | None:
        """Per shard (flat order): whether ``prepare`` expects an ``IndexedSlices`` for it; None before ``prepare``."""
        return None if self._sparse is None else list(self._sparse)

    def apply(self, pieces: Sequence[Any]) -> list[Any]:
        """Apply one push (one gradient per shard, in ``self.flat`` order) on the ps; returns tensors that exist once
        every write of the push is done (for the version bump's control dependencies)."""
        import tensorflow as tf

        from downpour import sparse as sp

        if self.downpour:
            return [self._downpour(k, piece) for k, piece in enumerate(pieces)]
        if not self._updates:
            if tf.distribute.has_strategy():
                raise RuntimeError("PsOptimizer: call prepare(sparse) before tracing a push under a tf.distribute "
                                   "strategy (a Keras optimizer must be traced outside it)")
            self.prepare([any(sp.is_sparse(pieces[k]) for k, o in enumerate(self.owner) if o == i)
                          for i in range(len(self.shards))])
        done = []
        for device, members in self.tasks.items():
            done.append(self._updates[device]([pieces[k] for k in members]))
        return done

    def _downpour(self, k: int, piece: Any) -> Any:
        import tensorflow as tf

        from downpour import sparse as sp
        from freezing import gradients

        shard, lr = self.flat[k], self.config.learning_rate
        with tf.device(shard.device):  # the update runs on the ps that holds the shard
            if not sp.is_sparse(piece):
                if self.accumulators:
                    total = self.accumulators[k].assign_add(piece * piece)
                    return shard.assign_sub(lr * piece * tf.math.rsqrt(total))
                gradients.apply([piece], [shard], learning_rate=lr)  # the library's exact v -= lr * g
                return shard.read_value()
            rows = tf.IndexedSlices(piece.values * piece.values, piece.indices)
            if self.accumulators:
                total = tf.gather(self.accumulators[k].scatter_add(rows), piece.indices)
                return shard.scatter_sub(tf.IndexedSlices(lr * piece.values * tf.math.rsqrt(total), piece.indices))
            return shard.scatter_sub(tf.IndexedSlices(lr * piece.values, piece.indices))


def short(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` (``local`` without a job)."""
    parts = dict(p.split(":", 1) for p in device.strip("/").split("/") if ":" in p)
    return f"{parts.get('job', '?')}:{parts.get('task', '?')}" if "job" in parts else (device or "local")


def keras_optimizer(config: DownpourConfig) -> Any:
    """A new Keras optimizer from the job's ``optimizer`` (a name gets ``learning_rate``). ``keras_optimizer(job)``"""
    import keras

    if isinstance(config.optimizer, str):
        return keras.optimizers.get({"class_name": config.optimizer, "config": {"learning_rate": config.learning_rate}})
    spec = {"class_name": config.optimizer["class_name"], "config": dict(config.optimizer.get("config", {}))}
    spec["config"].setdefault("learning_rate", config.learning_rate)
    return keras.optimizers.get(spec)
