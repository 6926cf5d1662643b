"""The other direction: weights meant to train that did not move, and why.

``diagnose`` asks what can move an entry believed frozen. ``find_stalls`` asks the opposite: which entries of
the model's trainable variables did not change a bit over a window of steps, and names the cause where it can
tell. ``StallWatch`` is the callback that asks at every window of ``fit`` and warns.

Causes, in the order they are tried for each entry that did not move:

* ``not_trained`` -- the optimizer was built without the variable, so the traced step never updates it: a layer
  made trainable after ``compile`` (Keras 3.15 meant to warn of it in ``Trainer._warn_if_trainable_state_changed``,
  but the call sits after a ``raise`` in ``_assert_compile_called`` and never runs);
* ``mask`` -- a ``MaskedOptimizer`` mask freezes the entry;
* ``learning_rate`` -- the learning rate is zero, or so small that a step of that size does not change a
  float32 weight of the entry's magnitude (below half its spacing);
* ``below_resolution`` -- the weight's own dtype (float16, bfloat16) is too coarse for a step of the learning
  rate's size, which float32 would have kept (mixed precision's underflow of updates);
* ``no_gradient`` -- every entry of the variable stayed, and none of the above explains it: its gradient is zero
  or missing (a ``stop_gradient``, a branch the loss does not reach). Entries that stayed while the rest of their
  variable moved are not reported without a cause: a dead ReLU unit is a normal part of training.

The step-size test takes the learning rate as the size of a step, which it is for adaptive optimizers (Adam's
step is at most about the learning rate); a plain SGD step is the learning rate times the gradient.

``trainable_changed_after_compile`` rows name each weight of a layer whose ``trainable`` changed after
``compile`` when the change cannot take effect: the model's train step is already traced (or the optimizer built),
so the step goes on updating what it updated at ``compile``. ``StallWatch`` reports them before the first step.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from freezing import _keras_api
from freezing.audit import changed_bits
from freezing.diagnose import Cause, Diagnosis, _chain
from freezing.selection import variable_path

STALL_CAUSES = ("not_trained", "trainable_changed_after_compile", "mask", "learning_rate", "below_resolution",
                "no_gradient")
"""Every cause ``find_stalls`` can report, in the order rows are listed for one variable."""

STALL_FIXES = {
    "not_trained": "The optimizer was built without this variable (its layer was made trainable after compile), "
                   "so the traced step never updates it: recompile with a fresh optimizer, or keep the layer "
                   "trainable and freeze it with freezing.MaskedOptimizer masks (set_mask(layer, False), then None).",
    "trainable_changed_after_compile": "Its layer's trainable flag changed after compile, and the traced train step "
                                       "still does what it did at compile: recompile (model.compile(...)), or use "
                                       "freezing.MaskedOptimizer masks, which change without a recompile.",
    "mask": "A MaskedOptimizer mask freezes these entries: opt.set_mask(target, None) lets them train.",
    "learning_rate": "The learning rate is zero, or smaller than half the float32 spacing at these weights: raise it "
                     "(check the schedule's value at this step).",
    "below_resolution": "A step of the learning rate's size is below half the spacing of the weight's own dtype "
                        "(float16/bfloat16) here, so every update rounds away: keep float32 variables "
                        "(a mixed_* dtype policy), or raise the learning rate.",
    "no_gradient": "No entry of this variable moved: its gradient is zero or missing (a stop_gradient, a branch the "
                   "loss does not reach, an output multiplied by zero).",
}
"""One fix per cause, as shown in the ``fix`` column."""

_MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}
_MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}  # of the smallest normal


def snapshot(model: Any) -> dict[int, np.ndarray]:
    """The values of the model's trainable variables, to compare with later (``find_stalls``'s ``before``).

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> [a.shape for a in snapshot(model).values()]
    [(2, 1), (1,)]
    """
    return {id(v): np.array(v.numpy(), copy=True) for v in model.trainable_variables}


def half_spacing(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half the distance from each value to the next float of ``dtype`` away from zero: a smaller step rounds away.

    >>> half_spacing(np.array([1.0, 256.0]), "bfloat16").tolist()
    [0.00390625, 1.0]
    >>> half_spacing(np.array([0.0]), "float16").tolist()  # the smallest subnormal's half
    [2.9802322387695312e-08]
    """
    bits = _MANTISSA.get(str(dtype))
    if bits is None:
        return np.zeros(np.shape(values))
    magnitude = np.abs(np.asarray(values, np.float64))
    _, exponent = np.frexp(magnitude)  # |x| = m * 2**e, m in [0.5, 1)
    lowest = _MIN_EXPONENT[str(dtype)] + 1
    exponent = np.where(magnitude == 0, lowest, np.maximum(exponent, lowest))  # subnormals, zero: a fixed spacing
    return np.ldexp(1.0, exponent - 1 - bits) / 2


def _rate_of(optimizer: Any) -> float | None:
    try:
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    except (AttributeError, TypeError, ValueError):
        return None


def trainable_changes(model: Any, optimizer: Any = None) -> Diagnosis:
    """One row per weight of a layer whose ``trainable`` changed after ``compile`` without taking effect.

    The change takes effect only if the train step is traced again with a fresh optimizer (``compile``); once
    ``fit`` has traced it or the optimizer is built, the step keeps doing what it did at ``compile``. It reads the
    flags Keras records at ``compile`` (Keras 3.15 does; Keras 3.5 records none, and then nothing is reported).

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")], name="m")
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    >>> model.get_layer("d").trainable = False
    >>> [(row.variable, row.cause) for row in trainable_changes(model)]
    [('m/d/kernel', 'trainable_changed_after_compile'), ('m/d/bias', 'trainable_changed_after_compile')]
    """
    state = _keras_api.compiled_trainable_state(model)
    optimizer = getattr(model, "optimizer", None) if optimizer is None else optimizer
    traced = getattr(model, "train_function", None) is not None or bool(getattr(optimizer, "built", False))
    rows, seen = [], set()
    if not _keras_api.records_compiled_trainable_state():
        return Diagnosis(rows, empty=f"Keras {keras.__version__} records no layer's trainable flag at compile: a "
                         "trainable change after compile cannot be told here (Keras 3.15 records it)")
    if state is None or not traced:
        return Diagnosis(rows, empty="no trainable change after compile is left without effect")
    for layer in _keras_api.flatten_layers(model):
        if layer in state and state[layer] != layer.trainable:
            built = bool(getattr(optimizer, "built", False))
            weights = layer.trainable_weights if layer.trainable else [
                w for w in layer.weights if not built or _keras_api.knows(optimizer, w)]  # what the step still trains
            for w in weights:
                if id(w) not in seen:
                    seen.add(id(w))
                    rows.append(Cause(variable_path(w), "trainable_changed_after_compile", int(np.prod(w.shape)),
                                      STALL_FIXES["trainable_changed_after_compile"]))
    return Diagnosis(rows, empty="no trainable change after compile is left without effect")


def find_stalls(model: Any, before: dict[int, np.ndarray], optimizer: Any = None) -> Diagnosis:
    """Name the entries of the model's trainable variables that did not move since ``before``, and why.

    Args:
        model: a Keras 3 model (compiled, or pass ``optimizer``).
        before: ``snapshot(model)`` taken at the start of the window.
        optimizer: the optimizer that trains it; defaults to ``model.optimizer``.

    Returns:
        A ``Diagnosis`` of ``Cause`` rows (``STALL_CAUSES``): the variable, the cause, how many entries did not
        move for it, and the fix. Empty when every stalled entry is explained by nothing worth reporting.

    Example: a learning rate of zero.

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")], name="m")
    >>> model.compile(optimizer=keras.optimizers.Adam(0.0), loss="mse")
    >>> before = snapshot(model)
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0)
    >>> [(row.variable, row.cause, row.entries) for row in find_stalls(model, before)]
    [('m/d/kernel', 'learning_rate', 2), ('m/d/bias', 'learning_rate', 1)]
    """
    optimizer = getattr(model, "optimizer", None) if optimizer is None else optimizer
    leaf, masked = _chain(optimizer) if isinstance(optimizer, keras.optimizers.Optimizer) else (None, None)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    rows: list[Cause] = []
    for v in model.trainable_variables:
        old = before.get(id(v))
        dtype = str(v.dtype)
        if old is None or dtype not in _MANTISSA:
            continue
        now = np.asarray(v.numpy())
        left = ~changed_bits(old, now)  # entries that did not move, not yet explained
        if not left.any():
            continue
        whole = bool(left.all())
        counts: dict[str, int] = {}

        def take(cause: str, where: Any) -> None:
            nonlocal left
            hit = left & np.broadcast_to(np.asarray(where, bool), left.shape)
            if hit.any():
                counts[cause] = counts.get(cause, 0) + int(np.count_nonzero(hit))
                left = left & ~hit

        if optimizer is not None and getattr(optimizer, "built", False) and not _keras_api.knows(optimizer, v):
            take("not_trained", True)
        if masked is not None and masked.built and _keras_api.knows(masked, v):
            keep = masked.get_mask(v)
            if keep is not None:
                take("mask", ~np.asarray(keep, bool))
        opt = _keras_api.multi_optimizer_for(leaf, v) if leaf is not None and multi is not None and isinstance(
            leaf, multi) else leaf
        rate = None if opt is None else _rate_of(opt)
        if rate is not None and left.any():
            magnitude = np.abs(now.astype(np.float64))
            take("learning_rate", rate == 0 or rate < half_spacing(magnitude, "float32"))
            if _MANTISSA[dtype] < _MANTISSA["float32"]:
                take("below_resolution", rate < half_spacing(magnitude, dtype))
        if whole and left.any():
            take("no_gradient", True)
        for cause in STALL_CAUSES:
            if counts.get(cause):
                rows.append(Cause(variable_path(v), cause, counts[cause], STALL_FIXES[cause]))
    return Diagnosis(rows, empty="every entry meant to train moved (or stayed for no reason worth reporting)")


class StallWatch(keras.callbacks.Callback):
    """Warn, during ``fit``, of weights meant to train that stopped moving, with the cause (``find_stalls``).

    Before the first step it reports a layer whose ``trainable`` changed after ``compile`` without effect
    (``trainable_changes``); then, at the end of every ``window`` steps, the entries of the trainable variables
    that did not change a bit in that window, each (variable, cause) warned of once.

    Args:
        window: steps per window (>= 1).
        warn: whether to warn (``UserWarning``); the findings are kept in ``reports`` either way.

    Attributes:
        reports: every non-empty ``Diagnosis`` found, in order (the trainable changes first).

    >>> import warnings
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")], name="m")
    >>> model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    >>> watch = StallWatch(window=2, warn=False)
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=4, verbose=0, callbacks=[watch])
    >>> sorted(watch.reports[0].causes)
    ['learning_rate']
    """

    def __init__(self, window: int = 20, warn: bool = True):
        super().__init__()
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"StallWatch: window must be an integer >= 1; got {window!r}")
        self.window, self.warn = window, warn
        self.reports: list[Diagnosis] = []
        self._said: set[tuple[str, str]] = set()
        self._before: dict[int, np.ndarray] = {}
        self._steps = 0

    def _report(self, found: Diagnosis) -> None:
        if not len(found):
            return
        self.reports.append(found)
        new = [row for row in found if (row.variable, row.cause) not in self._said]
        self._said.update((row.variable, row.cause) for row in new)
        if new and self.warn:
            warnings.warn(f"freezing.StallWatch: weights meant to train that do not:\n{Diagnosis(new)}", stacklevel=2)

    def on_train_begin(self, logs: Any = None) -> None:
        """Report trainable changes that will not take effect, and start the first window."""
        self._report(trainable_changes(self.model))
        self._before, self._steps = snapshot(self.model), 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        """At the end of each window: report what did not move in it, and start the next one."""
        self._steps += 1
        if self._steps % self.window == 0:
            self._report(find_stalls(self.model, self._before))
            self._before = snapshot(self.model)
