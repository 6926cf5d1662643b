"""``MaskSchedule``: staged or block-coordinate freezing inside one ``model.fit`` call.

A Keras callback that changes a ``MaskedOptimizer``'s stored masks at epoch boundaries. Nothing is
recompiled and no optimizer is replaced, so the moments of every entry are kept across stages (with
``policy="hold"`` a frozen entry resumes from the moments it had when it was frozen). This is the
answer to Keras' ``trainable`` trap: flipping ``layer.trainable`` after ``compile`` does nothing until
you recompile, and recompiling with the same optimizer raises "Unknown variable". With ``freezing.SkipFrozen()``
in the same ``callbacks`` (before or after the schedule), a layer a stage freezes whole is also left out of the
gradient computation: one retrace per stage, the state kept as here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from freezing import _keras_api
from freezing._wrappers import wrapper_chain
from freezing.masked_optimizer import MaskedOptimizer

Stage = Mapping[Any, Any]
"""``{target: keep}``, as ``MaskedOptimizer.set_mask(target, keep)`` takes them: a target is a variable, its path
(or a unique end of it), or a layer (its weights the optimizer updates); ``keep`` is bool-like and broadcastable
(1 = train), or None to clear the mask."""


def _find_masked(optimizer: Any) -> MaskedOptimizer:
    """The MaskedOptimizer inside ``optimizer`` (compile may wrap it in a LossScaleOptimizer)."""
    seen = next((o for o in wrapper_chain(optimizer) if isinstance(o, MaskedOptimizer)), None)
    if seen is None:
        raise ValueError(
            f"MaskSchedule: the model's optimizer is {type(optimizer).__name__}; compile the model with "
            "optimizer=freezing.MaskedOptimizer(...) to schedule masks"
        )
    return seen


def _layer_weights(optimizer: MaskedOptimizer, layer: Any) -> list[Any]:
    """The layer's weights the optimizer updates: not ``layer.trainable_weights``, which leaves out what ``SkipFrozen``
    skips (so a stage that unfreezes a skipped layer would find nothing to unfreeze)."""
    if not optimizer.built:
        return list(layer.trainable_weights)
    known = {_keras_api.key(v) for v in _keras_api.trainable_variables(optimizer)}
    return [w for w in layer.weights if _keras_api.key(w) in known]


class MaskSchedule(keras.callbacks.Callback):
    """Set masks at the start of chosen epochs, inside one ``fit`` call.

    Args:
        stages: ``{first_epoch: {target: keep}}`` (0-based epochs; a stage lasts until the next), or a
            function ``epoch -> {target: keep} or None`` called at every epoch's start.
        optimizer: the ``MaskedOptimizer`` to drive (default: the one the model was compiled with).

    Returns:
        A ``keras.callbacks.Callback`` for ``model.fit(..., callbacks=[schedule])``.

    Raises:
        ValueError: a negative epoch, or a model not compiled with a ``MaskedOptimizer``.

    Example: train only ``fc2`` for 2 epochs, then everything, in one ``fit`` call.

    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="fc1"),
    ...                           keras.layers.Dense(1, name="fc2")])
    >>> model.compile(optimizer=MaskedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    >>> fc1 = model.get_layer("fc1")
    >>> schedule = MaskSchedule({0: {fc1: False}, 2: {fc1: None}})
    >>> w0 = fc1.kernel.numpy().copy()
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=2, verbose=0, callbacks=[schedule])
    >>> bool((fc1.kernel.numpy() == w0).all())
    True
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=3, initial_epoch=2, verbose=0, callbacks=[schedule])
    >>> bool((fc1.kernel.numpy() == w0).all())
    False
    """

    def __init__(self, stages: Mapping[int, Stage] | Callable[[int], Stage | None],
                 optimizer: MaskedOptimizer | None = None):
        super().__init__()
        if not callable(stages):
            stages = dict(stages)
            bad = [e for e in stages if not isinstance(e, int) or isinstance(e, bool) or e < 0]
            if bad:
                raise ValueError(f"MaskSchedule: stage epochs must be integers >= 0; got {bad}")
        self.stages = stages
        self.optimizer = optimizer
        self.applied: list[tuple[int, int | None]] = []  # (epoch, stage start) for every change made

    @classmethod
    def gradual_unfreezing(cls, layers: Sequence[Any], every: int) -> MaskSchedule:
        """Top layer first, then one more layer every ``every`` epochs (ULMFiT's gradual unfreezing).

        Args:
            layers: the layers to schedule, from the input side to the output side.
            every: epochs between two unfreezings (>= 1).

        Returns:
            A ``MaskSchedule`` whose stage at epoch ``k*every`` unfreezes the ``k+1`` top layers.

        >>> import keras
        >>> a, b, c = (keras.layers.Dense(1, name=n) for n in "abc")
        >>> sorted(MaskSchedule.gradual_unfreezing([a, b, c], every=2).stages)
        [0, 2, 4]
        """
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"MaskSchedule.gradual_unfreezing: every must be an integer >= 1; got {every!r}")
        layers = list(layers)
        stages: dict[int, dict[Any, Any]] = {0: {layer: False for layer in layers[:-1]}}
        for k, layer in enumerate(reversed(layers[:-1]), start=1):
            stages[k * every] = {layer: None}
        return cls(stages)

    def _stage_for(self, epoch: int) -> tuple[int | None, Stage | None]:
        if callable(self.stages):
            return epoch, self.stages(epoch)
        starts = [e for e in self.stages if e <= epoch]
        if not starts:
            return None, None
        start = max(starts)
        if any(s == start for _, s in self.applied[-1:]):
            return None, None  # this stage is already in force
        # entering a stage mid-way (initial_epoch > 0): apply every earlier stage in order first
        for earlier in sorted(e for e in starts if e < start and not any(s == e for _, s in self.applied)):
            self._apply(self.stages[earlier])
        return start, self.stages[start]

    def _apply(self, stage: Stage) -> None:
        optimizer = self.optimizer or _find_masked(self.model.optimizer)
        for target, keep in stage.items():
            optimizer.set_mask(target, keep)  # a variable, a path or a layer; None clears

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        """Apply the stage that starts at (or is in force at) ``epoch``."""
        start, stage = self._stage_for(epoch)
        if stage is None:
            return
        self._apply(stage)
        self.applied.append((epoch, start))
