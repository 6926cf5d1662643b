"""Masks that nothing applies: a variable masked on a ``MaskedOptimizer`` but updated by another optimizer.

``opt.set_mask(layer, False)`` then ``model.compile(optimizer="adam")``: the masks wait in ``opt``, which ``fit``
never calls, and the "frozen" weights train. Keras has no hook that says which optimizer updates a variable,
except one that every Keras 3 optimizer calls for every variable it updates: the variable's ``constraint``
(public, ``keras.Variable.constraint``), called in ``Optimizer.apply`` just after the update. While a
``MaskedOptimizer`` holds masks it has not built (the silent case: a built one applies its masks to what it
updates), each masked ``keras.Variable`` gets a constraint that raises, wrapping any constraint it had. A step
in a ``tf.function`` (``fit``, a compiled custom loop) runs the constraint when it is traced, so the error comes
before any step runs: no frozen entry moves. An eager step (``run_eagerly=True``, a custom loop without
``tf.function``) raises after that one update. ``build`` takes the constraint off (its step applies the masks),
and so does ``clear_mask``; the constraint holds the optimizer weakly.

Not watched: a mask set on a path string before ``build`` (no variable is known yet), and a ``tf.Variable``
(its constraint cannot be set). ``freezing.diagnose`` names both cases ("not_masked" / "gradient").
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import keras

from freezing import _keras_api
from freezing.selection import variable_path


class Unapplied(keras.constraints.Constraint):  # Keras 3.5 accepts only a Constraint here
    """A variable's constraint while an unbuilt ``MaskedOptimizer`` holds a mask for it: raises when called.

    >>> import keras; from freezing import MaskedOptimizer
    >>> v = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("adam"); opt.set_mask(v, [1, 0])
    >>> _ = keras.optimizers.SGD(0.1).apply([keras.ops.ones(2)], [v])
    Traceback (most recent call last):
    ...
    RuntimeError: freezing: 'w' has a mask in a MaskedOptimizer that is not the optimizer updating it (a model
    compiled with another optimizer, or a loop that applies another one): the mask would hold nothing. Use that
    MaskedOptimizer: model.compile(optimizer=opt, ...), or opt.apply_gradients in the loop; or call
    opt.clear_mask(...) to train the variable without a mask
    """

    def __init__(self, owner: Any, original: Any):
        self._owner = weakref.ref(owner)
        self.original = original

    def owned_by(self, owner: Any) -> bool:
        return self._owner() is owner

    def __call__(self, value: Any) -> Any:
        owner = self._owner()
        if owner is not None and not owner.built:
            raise RuntimeError(
                f"freezing: {variable_path(value)!r} has a mask in a MaskedOptimizer that is not the optimizer "
                "updating it (a model compiled with another optimizer, or a loop that applies another one): the mask "
                "would hold nothing. Use that MaskedOptimizer: model.compile(optimizer=opt, ...), or "
                "opt.apply_gradients in the loop; or call opt.clear_mask(...) to train the variable without a mask"
            )
        return value if self.original is None else self.original(value)


def watch(owner: Any, variables: Iterable[Any]) -> None:
    """Put an ``Unapplied`` constraint on each ``keras.Variable`` of ``variables`` that has none from ``owner``."""
    for v in variables:
        if _keras_api.is_keras_variable(v) and not _watched_by(v, owner):
            v.constraint = Unapplied(owner, v.constraint)


def unwatch(owner: Any, variables: Iterable[Any]) -> None:
    """Take ``owner``'s ``Unapplied`` constraint off each variable (any constraint it wrapped goes back)."""
    for v in variables:
        if not _keras_api.is_keras_variable(v):
            continue
        if isinstance(v.constraint, Unapplied) and v.constraint.owned_by(owner):
            v.constraint = v.constraint.original


def _watched_by(variable: Any, owner: Any) -> bool:
    constraint = variable.constraint
    return isinstance(constraint, Unapplied) and constraint.owned_by(owner)


def own_constraint(variable: Any) -> Any:
    """The variable's constraint as its user set it (what an ``Unapplied`` wraps), or None.

    >>> import keras; own_constraint(keras.Variable([1.0])) is None
    True
    """
    constraint = getattr(variable, "constraint", None)
    while isinstance(constraint, Unapplied):
        constraint = constraint.original
    return constraint
