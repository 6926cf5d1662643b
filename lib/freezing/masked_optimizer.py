"""``MaskedOptimizer``: per-element freezing that any Keras 3 optimizer honours exactly.

A stop_gradient mask freezes entries under SGD but not under Adam, momentum or weight decay: the
optimizer still moves an entry whose gradient is zero. ``MaskedOptimizer`` fixes that at the one
place every Keras optimizer writes its state, the ``assign``/``assign_add``/``assign_sub`` calls
of ``update_step``. For the duration of one ``apply_gradients`` call those three methods of the
wrapped optimizer are intercepted, and every write to a masked variable or to one of its slots is
turned into a write that leaves the frozen entries alone:

* ``assign(t, new)``     -> ``assign(t, where(keep, new, t))``
* ``assign_add(t, d)``   -> ``assign_add(t, where(keep, d, -0.0))``   (x + -0.0 == x, bit for bit)
* ``assign_sub(t, d)``   -> ``assign_sub(t, where(keep, d, +0.0))``   (x - +0.0 == x, bit for bit)

so the frozen entries keep their value and their moments bit for bit ("hold"), or keep their
value while their moments go back to the initial value ("reset"). No copy of any variable or
slot is kept between steps or made within one: the wrapper's only persistent state is one Python
float per slot, its initial value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing.selection import variable_path
from freezing.slots import slot_initial_value, slots
from freezing.validation import check_choice

POLICIES = ("hold", "reset", "none")
"""hold: frozen values and moments unchanged; reset: values unchanged, moments re-initialised;
none: the inner optimizer runs on gated gradients (the drifting baseline)."""


class _Target:
    """What an intercepted write touches: a masked variable's value or one of its slots."""

    __slots__ = ("keep", "reset_to", "name")

    def __init__(self, keep: tf.Tensor, reset_to: float | None, name: str):
        self.keep, self.reset_to, self.name = keep, reset_to, name


class MaskedOptimizer:
    """Wrap a Keras 3 optimizer so that ``apply_gradients(..., masks=...)`` freezes entries exactly.

    ``opt = MaskedOptimizer(keras.optimizers.Adam(1e-3)); opt.build(model.trainable_variables);
    opt.apply_gradients(zip(grads, variables), masks=[keep_kernel, None])``
    """

    def __init__(self, inner: keras.optimizers.Optimizer, policy: str = "hold"):
        if not isinstance(inner, keras.optimizers.Optimizer):
            raise TypeError(f"MaskedOptimizer: inner must be a Keras 3 optimizer; got {type(inner).__name__}")
        self.policy = check_choice("MaskedOptimizer policy", policy, POLICIES)
        if policy != "none" and (inner.use_ema or inner.gradient_accumulation_steps):
            raise ValueError(
                "MaskedOptimizer: use_ema and gradient_accumulation_steps write variables outside "
                "update_step and cannot be masked; allowed with policy='none' only"
            )
        self.inner = inner
        self._initial: dict[int, float] = {}  # slot key -> initial value, read at build

    # -- the Keras optimizer surface -------------------------------------------------------------
    @property
    def iterations(self) -> Any:
        """The inner optimizer's step counter. ``opt.iterations.numpy()``"""
        return self.inner.iterations

    @property
    def learning_rate(self) -> Any:
        """The inner optimizer's learning rate. ``opt.learning_rate``"""
        return self.inner.learning_rate

    @property
    def variables(self) -> list[Any]:
        """The inner optimizer's variables (no extra state is added). ``len(opt.variables)``"""
        return self.inner.variables

    @property
    def built(self) -> bool:
        """Whether ``build`` has run. ``opt.built``"""
        return self.inner.built

    def build(self, variables: Iterable[Any]) -> None:
        """Build for the full variable list, so any subset may be applied later. ``opt.build(model.trainable_variables)``"""
        variables = list(variables)
        fresh = not self.inner.built
        if fresh:
            self.inner.build(variables)
        else:
            self.inner._check_variables_are_known(variables)
        for v in variables:
            for name, slot in slots(self.inner, v).items():
                key = self.inner._var_key(slot)
                value = np.asarray(slot.numpy()) if fresh and tf.executing_eagerly() else None
                if value is not None and value.size and np.all(value == value.flat[0]):
                    self._initial[key] = float(value.flat[0])
                else:
                    self._initial[key] = slot_initial_value(self.inner, name)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], masks: Sequence[Any] | None = None) -> Any:
        """Apply one step; ``masks[i]`` (None, scalar or broadcastable; 1 = train) gates variable i. ``opt.apply_gradients(gv, masks=[m])``"""
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        if not self.built:
            self.build(variables)
        if masks is None:
            return self.inner.apply_gradients(grads_and_vars)
        masks = list(masks)
        if len(masks) > len(grads_and_vars):
            raise ValueError(
                f"MaskedOptimizer: got {len(masks)} masks for {len(grads_and_vars)} variables; "
                "expected at most one mask per (gradient, variable) pair"
            )
        masks += [None] * (len(grads_and_vars) - len(masks))
        keeps = [_as_keep(m, v, i) for i, (m, v) in enumerate(zip(masks, variables))]
        if self.policy == "none":
            gated = [
                (g if k is None or g is None else tf.where(k, g, tf.zeros_like(g)), v)
                for (g, v), k in zip(grads_and_vars, keeps)
            ]
            return self.inner.apply_gradients(gated)
        targets = self._targets(variables, keeps)
        with self._intercept(targets):
            return self.inner.apply_gradients(grads_and_vars)

    def apply(self, grads: Sequence[Any], variables: Sequence[Any], masks: Sequence[Any] | None = None) -> Any:
        """Keras-3 style ``apply(grads, variables)`` with masks. ``opt.apply(grads, model.trainable_variables, masks)``"""
        return self.apply_gradients(zip(grads, variables), masks=masks)

    # -- the interception ------------------------------------------------------------------------
    def _targets(self, variables: Sequence[Any], keeps: Sequence[tf.Tensor | None]) -> dict[int, _Target]:
        key = self.inner._var_key
        targets: dict[int, _Target] = {}
        for v, keep in zip(variables, keeps):
            if keep is None:
                continue
            path = variable_path(v)
            if getattr(v, "constraint", None) is not None:
                raise ValueError(
                    f"MaskedOptimizer: variable {path!r} has a constraint, which Keras applies after the "
                    "step to every entry; masking it is not supported (remove the constraint or its mask)"
                )
            targets[key(v)] = _Target(keep, None, path)
            for name, slot in slots(self.inner, v).items():
                if keep.shape.rank != 0 and tuple(slot.shape) != tuple(v.shape):
                    raise ValueError(
                        f"MaskedOptimizer: slot {name!r} of {path!r} has shape {tuple(slot.shape)}, not the "
                        f"variable's {tuple(v.shape)} (a factored optimizer such as Adafactor); "
                        "per-element masks need slots shaped like the variable; use a scalar mask"
                    )
                reset_to = self._initial.get(key(slot), 0.0) if self.policy == "reset" else None
                targets[key(slot)] = _Target(keep, reset_to, f"{path}:{name}")
        return targets

    @contextlib.contextmanager
    def _intercept(self, targets: dict[int, _Target]) -> Iterator[None]:
        inner = self.inner
        key = inner._var_key
        assign, assign_add, assign_sub = inner.assign, inner.assign_add, inner.assign_sub
        decay = inner._apply_weight_decay

        def masked_assign(target: Any, value: Any) -> Any:
            t = targets.get(key(target))
            if t is None:
                return assign(target, value)
            value = _dense(value, target)
            old = tf.convert_to_tensor(target) if t.reset_to is None else tf.cast(t.reset_to, target.dtype)
            return assign(target, tf.where(t.keep, value, old))

        def masked_increment(write: Any, pad: float, combine: Any) -> Any:
            """assign_add/assign_sub that leave frozen entries' bits alone (x + -0.0 == x, x - +0.0 == x)."""

            def increment(target: Any, value: Any) -> Any:
                t = targets.get(key(target))
                if t is None:
                    return write(target, value)
                value = _dense(value, target)
                if t.reset_to is None:
                    return write(target, tf.where(t.keep, value, tf.constant(pad, target.dtype)))
                new = combine(tf.convert_to_tensor(target), value)
                return assign(target, tf.where(t.keep, new, tf.cast(t.reset_to, target.dtype)))

            return increment

        masked_add = masked_increment(assign_add, -0.0, tf.add)
        masked_sub = masked_increment(assign_sub, 0.0, tf.subtract)

        def masked_decay(variables: Sequence[Any]) -> None:
            plain = [v for v in variables if key(v) not in targets]
            held = [v for v in variables if key(v) in targets]
            decay(plain)
            if inner.weight_decay is None:
                return
            standard = type(inner)._apply_weight_decay is keras.optimizers.Optimizer._apply_weight_decay
            for v in held:
                if not inner._use_weight_decay(v):
                    continue
                var = v.value if isinstance(v, keras.Variable) else v
                keep = targets[key(v)].keep
                if standard:  # the TF backend's formula, with the frozen entries' decay set to +0
                    lr = tf.cast(inner.learning_rate, var.dtype)
                    wd = tf.cast(inner.weight_decay, var.dtype)
                    var.assign_sub(tf.where(keep, var * wd * lr, tf.zeros_like(var)))
                else:  # an optimizer with its own decay rule: run it, then put frozen entries back
                    before = tf.identity(var)
                    decay([v])
                    var.assign(tf.where(keep, tf.convert_to_tensor(var), before))

        inner.assign, inner.assign_add, inner.assign_sub = masked_assign, masked_add, masked_sub
        inner._apply_weight_decay = masked_decay
        try:
            yield
        finally:
            for name in ("assign", "assign_add", "assign_sub", "_apply_weight_decay"):
                del inner.__dict__[name]


def _dense(value: Any, target: Any) -> tf.Tensor:
    """A sparse or Python value as a dense tensor of the target's dtype."""
    if isinstance(value, tf.IndexedSlices):
        value = tf.convert_to_tensor(value)
    return tf.cast(value, target.dtype)


def _as_keep(mask: Any, variable: Any, index: int) -> tf.Tensor | None:
    """Validate one mask and return it as a boolean tensor (True = train this step)."""
    if mask is None:
        return None
    keep = tf.convert_to_tensor(mask)
    if keep.dtype != tf.bool:
        keep = tf.not_equal(keep, tf.zeros((), keep.dtype))
    shape = tf.TensorShape(variable.shape)
    try:
        broadcast = tf.broadcast_static_shape(keep.shape, shape)
    except ValueError:
        broadcast = None
    if broadcast is None or (broadcast.is_fully_defined() and broadcast != shape) or keep.shape.rank is not None and keep.shape.rank > shape.rank:
        raise ValueError(
            f"MaskedOptimizer: masks[{index}] for {variable_path(variable)!r} has shape {keep.shape}; "
            f"expected None, a scalar, or a shape broadcastable to the variable's {shape}"
        )
    return keep
