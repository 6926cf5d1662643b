"""Skip the gradient of a tensor frozen whole: ``SkipFrozen`` for ``fit``, ``variables_to_differentiate`` for custom
loops.

A ``MaskedOptimizer`` keeps every bit of a frozen entry, but the model still computes the gradient of a variable
whose every entry is frozen, and throws it away. Leaving that variable out of the gradient computation, as
``trainable=False`` leaves it out, saves what not training it saves (backpropagation stops at the first
variable that trains), while everything the masks give is kept: the variable's optimizer state (moments, EMA
average, accumulators) and every bit of it, ``iterations`` and the learning-rate schedule, and unfreezing it
later resumes from its kept state. The stored masks are the only fact: which variables are skipped is read off
them, never stored beside them.

Each change of the wholly frozen set costs one retrace of the train step and nothing else (under XLA, one
compile). A mask that freezes part of a variable changes nothing here: that variable is still differentiated.
If every variable is wholly frozen, the last one the model trains is still differentiated (its bits are
still held by its mask), so that the optimizer's step runs and ``iterations`` counts it.

Keras' own traps (Keras 3.15): the TensorFlow trainer reads ``model.trainable_weights`` only when it traces
the train step, so a ``trainable`` flip after the first step does nothing until the train function is rebuilt
(``model.make_train_function(force=True)``, or ``compile`` again). The warning Keras has for this,
``_warn_if_trainable_state_changed``, is called in ``keras/src/trainers/trainer.py`` after the ``raise`` of
``_assert_compile_called`` and can never fire. Recompiling with the same optimizer after unfreezing raises
"Unknown variable", and recompiling with a fresh one loses the optimizer's state. ``SkipFrozen`` is the route
round all three.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import keras

from freezing import _keras_api, _masks, _skip_flags
from freezing._wrappers import wrapper_chain
from freezing.masked_optimizer import MaskedOptimizer
from freezing.selection import variable_path


def _masked(optimizer: Any, who: str, built: bool = True) -> MaskedOptimizer:
    """The ``MaskedOptimizer`` in ``optimizer``'s wrapper chain (mixed precision wraps it in a LossScaleOptimizer)."""
    found = next((o for o in wrapper_chain(optimizer) if isinstance(o, MaskedOptimizer)), None)
    if found is None:
        raise ValueError(
            f"{who}: the optimizer is {type(optimizer).__name__}, which holds no masks; allowed: a "
            "freezing.MaskedOptimizer (or a LossScaleOptimizer around one, as compile makes under mixed precision)"
        )
    if built and not found.built:
        raise ValueError(f"{who}: the MaskedOptimizer is not built yet; build it with every variable it will ever "
                         "update first: opt.build(model.trainable_variables)")
    return found


def _check_known(masked: MaskedOptimizer, variables: Sequence[Any], who: str) -> None:
    unknown = [v for v in variables if _keras_api.key(v) not in masked._mask_index]
    if unknown:
        names = [variable_path(v) for v in unknown[:5]]
        raise ValueError(
            f"{who}: {len(unknown)} variable(s) the optimizer was not built with: {names}"
            f"{' ...' if len(unknown) > 5 else ''}; allowed: the {len(_keras_api.trainable_variables(masked))} "
            "variables it was built with. Build it with every variable it will ever update, before the first step: "
            "opt.build(model.trainable_variables)"
        )


def wholly_frozen(masked: MaskedOptimizer, variable: Any) -> bool:
    """Whether ``variable``'s stored mask freezes every entry (read off the mask; sparse state never counts)."""
    if masked._sparse.holds(variable):
        return False
    stored = masked._masks.keep[masked._mask_index[_keras_api.key(variable)]]
    return _masks.stored_mode(stored) == _masks.FROZEN


def _to_differentiate(masked: MaskedOptimizer, variables: list[Any]) -> list[Any]:
    kept = [v for v in variables if not wholly_frozen(masked, v)]
    return kept if kept or not variables else variables[-1:]


def variables_to_differentiate(optimizer: Any, variables: Sequence[Any]) -> list[Any]:
    """The variables of ``variables`` whose stored mask trains at least one entry: the ones to differentiate.

    For a custom training loop: differentiate and apply only these. A variable left out keeps every bit, and
    so does its optimizer state; ``iterations`` counts every ``apply``. If all of them are wholly frozen,
    the last one is returned (its mask still holds it), so that ``apply`` runs and counts the step. A mask
    passed per call (``trainable_masks=``) or made by ``mask_fn`` is not read here: only the stored masks.

    When the set changes (after ``set_mask``, ``clear_mask``, a restore), build the step again from the new
    list: a ``tf.function`` closed over the list traces once per list (one retrace per change).

    Args:
        optimizer: a built ``MaskedOptimizer``, or a ``LossScaleOptimizer`` around one.
        variables: the candidates, usually ``model.trainable_variables``; every one must be a variable the
            optimizer was built with.

    Returns:
        A new list, in the order given.

    Raises:
        ValueError: an optimizer that is not a built ``MaskedOptimizer``, or a variable it was not built with
            (nothing is changed).

    >>> import keras, numpy as np, tensorflow as tf
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="fc1"),
    ...                           keras.layers.Dense(1, name="fc2")])
    >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.01)); opt.build(model.trainable_variables)
    >>> for v in model.get_layer("fc1").trainable_weights: opt.set_mask(v, False)
    >>> train = variables_to_differentiate(opt, model.trainable_variables)
    >>> [v.path.split("/", 1)[1] for v in train]
    ['fc2/kernel', 'fc2/bias']
    >>> def make_step(train):  # build again when the set changes: one retrace
    ...     @tf.function
    ...     def step(x, y):
    ...         with tf.GradientTape() as tape:
    ...             loss = keras.ops.mean((model(x) - y) ** 2)
    ...         opt.apply(tape.gradient(loss, train), train)
    ...     return step
    >>> step = make_step(train)
    >>> w0 = model.get_layer("fc1").kernel.numpy().copy()
    >>> step(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"))
    >>> bool((model.get_layer("fc1").kernel.numpy() == w0).all()), int(opt.iterations)
    (True, 1)
    """
    who = "freezing.variables_to_differentiate"
    masked = _masked(optimizer, who)
    if isinstance(variables, (str, bytes)) or not isinstance(variables, Sequence):
        raise ValueError(f"{who}: variables must be a list of variables (model.trainable_variables); "
                         f"got {type(variables).__name__}")
    variables = list(variables)
    _check_known(masked, variables, who)
    return _to_differentiate(masked, variables)


class SkipFrozen(keras.callbacks.Callback):
    """A ``fit`` callback: a variable whose stored mask is wholly frozen is not differentiated, as with
    ``trainable=False``.

    The model must be compiled with a ``MaskedOptimizer`` (or a ``LossScaleOptimizer`` around one); ``fit``
    builds it with the model's trainable variables, which must be every variable it will ever update. The
    callback follows the masks wherever they are changed: ``set_mask``/``clear_mask`` between ``fit`` calls or
    from any callback, a ``MaskSchedule`` stage (in either order in ``callbacks``), ``set_weights`` or a ``.keras``
    load: those are seen before the next step. A mask written any other way (a ``tf.train.Checkpoint`` restored
    in the middle of a ``fit``) is seen at the next epoch's first step, where every mask is read.

    How: at a change it turns off the ``trainable`` flag of each newly wholly frozen variable and turns back
    on each one it turned off whose variable trains again, then rebuilds the train function
    (``model.make_train_function(force=True)``): one retrace per change, nothing recompiled, the optimizer
    and its state untouched. It only ever turns back on a flag it turned off itself (a flag you set stays
    as you set it): when a mask lets the variable train again (at once, in ``set_mask``), and at the end of
    ``fit``; the train function of that ``fit`` is put aside, and the next ``fit`` with the same wholly frozen
    set takes it back (no retrace) unless the model was compiled again. Flags are not saved with a model or a
    checkpoint. If ``fit`` raises, the flags stay off until
    the masks that froze them change or the next ``fit`` with a ``SkipFrozen`` starts. While a ``fit`` runs, a
    skipped variable is not in ``layer.trainable_weights`` (nor ``model.trainable_variables``): to unfreeze it from
    a callback, name it by its layer (``set_mask(layer, True)``, as ``MaskSchedule`` does), its path, or through
    ``layer.weights``. A model whose own ``train_step`` differentiates a list of its own, not
    ``self.trainable_weights``, is not skipped (Keras 3.15's ``train_step`` reads ``self.trainable_weights``).

    Args:
        optimizer: the ``MaskedOptimizer`` to read (default: the one the model was compiled with); when
            given, it must be the one the model was compiled with.

    Raises:
        ValueError: at the start of ``fit``, a model not compiled with a ``MaskedOptimizer``, one compiled
            with another optimizer than ``optimizer``, or a trainable variable the optimizer was not built
            with (nothing is changed).

    Example: freeze ``fc1`` whole for one ``fit``; its gradient is not computed, its Adam state is kept.

    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="fc1"),
    ...                           keras.layers.Dense(1, name="fc2")])
    >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.01))
    >>> model.compile(optimizer=opt, loss="mse")
    >>> fc1 = model.get_layer("fc1")
    >>> for v in fc1.trainable_weights: opt.set_mask(v, False)
    >>> w0 = fc1.kernel.numpy().copy()
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=2, verbose=0, callbacks=[SkipFrozen()])
    >>> bool((fc1.kernel.numpy() == w0).all()), fc1.kernel.trainable, int(opt.iterations)
    (True, True, 2)
    >>> for v in fc1.trainable_weights: opt.clear_mask(v)
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=1, verbose=0, callbacks=[SkipFrozen()])
    >>> bool((fc1.kernel.numpy() == w0).all())
    False
    """

    def __init__(self, optimizer: MaskedOptimizer | None = None):
        super().__init__()
        if optimizer is not None and not isinstance(optimizer, MaskedOptimizer):
            raise ValueError(f"SkipFrozen: optimizer must be a freezing.MaskedOptimizer or None; got "
                             f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self._masked: MaskedOptimizer | None = None
        self._seen = -1

    def _resolve(self) -> MaskedOptimizer:
        who = "SkipFrozen"
        compiled = getattr(self.model, "optimizer", None)
        if compiled is None:
            raise ValueError(f"{who}: the model is not compiled; compile it with "
                             "optimizer=freezing.MaskedOptimizer(...)")
        masked = _masked(compiled, who, built=False)
        if self.optimizer is not None and self.optimizer is not masked:
            raise ValueError(
                f"{who}: the model was compiled with another optimizer ({masked.name!r}) than the one given "
                f"({self.optimizer.name!r}); allowed: the MaskedOptimizer passed to compile, or no optimizer"
            )
        if not compiled.built:  # what fit's first step would do, done before a flag is turned off
            with self.model.distribute_strategy.scope():
                compiled.build(self.model.trainable_variables)
        return masked

    def on_train_begin(self, logs: Any = None) -> None:
        """Check the model and optimizer (nothing changed on an error), then skip what the masks freeze whole."""
        masked = self._resolve()
        record = _skip_flags.skips(masked)
        candidates = self._candidates(record)
        _check_known(masked, candidates, "SkipFrozen")
        self._masked = masked
        record.model = weakref.ref(self.model)
        self._sync(full=True)

    def _candidates(self, record: _skip_flags.Skips) -> list[Any]:
        """What the model would differentiate with no flag turned off here: its trainable variables and ours."""
        trainable = list(self.model.trainable_variables)
        keys = {_keras_api.key(v) for v in trainable}
        return trainable + [v for k, v in record.flipped.items() if k not in keys]

    def _sync(self, full: bool) -> None:
        masked = self._masked
        if masked is None:
            return
        record = _skip_flags.skips(masked)
        if not full and record.version == self._seen:
            return
        self._seen = record.version
        order = {_keras_api.key(v): i for i, v in enumerate(self.model.weights)}
        candidates = sorted(self._candidates(record), key=lambda v: order.get(_keras_api.key(v), len(order)))
        train = {_keras_api.key(v) for v in _to_differentiate(masked, candidates)}
        skip = {_keras_api.key(v): v for v in candidates if _keras_api.key(v) not in train}
        if set(skip) == set(record.flipped):
            return
        _skip_flags.restore(record, [k for k in record.flipped if k not in skip])
        for k, v in skip.items():
            if k not in record.flipped:
                v.trainable = False
                record.flipped[k] = v
        parked, record.parked = record.parked, None
        if (parked is not None and parked.skipped == set(skip) and self.model.train_function is parked.placeholder
                and parked.trained == {_keras_api.key(v) for v in self.model.trainable_variables}):
            self.model.train_function = parked.function  # the last fit's step for this very set: no retrace
        else:
            self.model.make_train_function(force=True)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """Follow any mask stored since the last step (a full read at each epoch's first step)."""
        self._sync(full=batch == 0)

    def on_train_end(self, logs: Any = None) -> None:
        """Turn back on every flag turned off here; the next step (of any ``fit``) traces with all of them."""
        if self._masked is None:
            return
        record = _skip_flags.skips(self._masked)
        skipped = frozenset(record.flipped)
        trained = frozenset(_keras_api.key(v) for v in self.model.trainable_variables)
        function = self.model.train_function
        if _skip_flags.restore(record):
            self.model.make_train_function(force=True)
            record.parked = _skip_flags.Parked(skipped, trained, function, self.model.train_function)
        self._masked = None
