"""``MaskedOptimizer``: per-element freezing that any Keras 3 optimizer honours exactly.

A stop_gradient mask freezes entries under SGD but not under Adam, momentum or weight decay: the
optimizer still moves an entry whose gradient is zero. ``MaskedOptimizer`` is a Keras optimizer that
wraps another one (the pattern of Keras' own ``LossScaleOptimizer``) and fixes that at the places the
wrapped optimizer writes. At ``build`` it installs, once, an interception of the wrapped optimizer's
``assign``/``assign_add``/``assign_sub`` (every ``update_step`` writes through them), of its weight
decay, its EMA update and overwrite, and its gradient-accumulator update and reset. While ``MaskedOptimizer``
applies a step, a write to a masked variable or to one of its slots leaves the frozen entries' bits
alone::

    assign(t, new)    -> assign(t, where(keep, new, t))
    assign_add(t, d)  -> assign_add(t, where(keep, d, -0.0))    # x + -0.0 == x, bit for bit
    assign_sub(t, d)  -> assign_sub(t, where(keep, d, +0.0))    # x - +0.0 == x, bit for bit

Outside such a step the wrapped optimizer behaves exactly as before. No copy of any variable or
slot is made. What is held, per policy:

* ``"hold"``  -- value, moments (every slot), EMA average and gradient accumulator of a frozen entry
  keep their bits; unfrozen later, the entry resumes from the moments it had.
* ``"reset"`` -- value held; moments go back to their initial value (the seed's fix, done in the step).
* ``"none"``  -- the wrapped optimizer runs on gradients whose frozen entries are zero: the drifting
  baseline a ``stop_gradient`` mask gives.

Masks are optimizer state: one boolean variable per trainable variable, scalar ``True`` ("no mask",
1 byte) until ``set_mask`` stores a mask (1 byte per stored entry; a mask broadcastable to the
variable, such as one per output column, is stored at its own shape). The graph reads these
variables, so a mask changed between batches or epochs takes effect on the next step with no
recompiling and no retracing, and masks save with the model and restore from a checkpoint.

Edge cases, decided:

* ``norms="trainable"`` (default): the wrapped optimizer sees zero gradient at frozen entries, so
  ``clipnorm``/``global_clipnorm`` and Adafactor's factored statistics see trainable entries only
  (as if the frozen entries were not trainable), and Lamb's trust ratio ``||w|| / ||update||`` sums
  over trainable entries only. ``norms="all"``: they see every entry's gradient, and Lamb's ratio the
  whole variable (Keras' own formula, frozen entries' weights and would-be update included).
* Adafactor: per-element masks hold values and the full-shape ``velocity`` exactly. Its factored row
  and column statistics are shared by a whole row or column: a row's statistic is held only when
  every entry of the row is frozen, and updated (from the trainable entries' gradients) otherwise.
* Constraints: applied to trainable entries only; a frozen entry never changes. The constraint
  itself still sees the whole variable (a max-norm constraint computes the norm over all entries).
* Gradient accumulation: a frozen entry's accumulator neither grows nor resets, and on the step that
  applies the accumulated gradient a frozen entry's value and slots are held; what it accumulated
  while trainable is applied on the first update step after it is unfrozen.
* ``keras.optimizers.LossScaleOptimizer`` and ``MultiOptimizer`` work on either side. Under a
  ``mixed_float16`` policy ``compile`` puts a ``LossScaleOptimizer`` outside (the nesting to use with
  ``fit``); ``MaskedOptimizer(LossScaleOptimizer(...))`` is for custom loops, where ``scale_loss`` is
  forwarded.
* ``tf.distribute`` strategies are refused with a clear error at construction and build.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing._wrappers import wrapper_chain
from freezing.selection import variable_path
from freezing.slots import slot_initial_value, slots
from freezing.validation import check_choice

POLICIES = ("hold", "reset", "none")
"""hold: frozen values and all their optimizer state unchanged; reset: values unchanged, moments
re-initialised; none: the inner optimizer runs on gated gradients (the drifting baseline)."""

NORMS = ("trainable", "all")
"""Whether gradient norms (clipping, Adafactor statistics) see frozen entries' gradients."""

MaskFn = Callable[[Any, Any], Any]
"""``mask_fn(step, variable) -> keep or None``: computed in the graph at every step."""

# Keras optimizers whose update of an entry depends only on that entry's gradient and state: zeroing
# frozen gradients changes nothing they write, so norms="trainable" skips that work for them.
_ELEMENTWISE = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.Adamax,
    keras.optimizers.Nadam, keras.optimizers.RMSprop, keras.optimizers.Adagrad,
    keras.optimizers.Adadelta, keras.optimizers.Ftrl, keras.optimizers.Lion, keras.optimizers.Lamb,
)


class _Target:
    """What an intercepted write touches: a masked variable's value or one of its slots."""

    __slots__ = ("keep", "reset_to")

    def __init__(self, keep: tf.Tensor, reset_to: float | None):
        self.keep, self.reset_to = keep, reset_to


def _leaves(optimizer: keras.optimizers.Optimizer) -> list[keras.optimizers.Optimizer]:
    """The optimizers that actually write variables, looking through LossScale and Multi optimizers."""
    chain = wrapper_chain(optimizer)
    if any(isinstance(o, MaskedOptimizer) for o in chain):
        raise ValueError("MaskedOptimizer: the inner optimizer is itself a MaskedOptimizer; wrap the plain one once")
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is not None and isinstance(chain[-1], multi):
        return [leaf for sub in chain[-1].optimizers for leaf in _leaves(sub)]
    return [chain[-1]]


def _refuse_distribution(where: str) -> None:
    strategy = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and not isinstance(strategy, tf.distribute.OneDeviceStrategy):
        raise ValueError(
            f"MaskedOptimizer ({where}): tf.distribute strategies are not supported (got "
            f"{type(strategy).__name__}); allowed: the default strategy or OneDeviceStrategy"
        )


@keras.saving.register_keras_serializable(package="freezing")
class MaskedOptimizer(keras.optimizers.Optimizer):
    """A Keras optimizer that freezes chosen entries of chosen variables exactly, under any inner optimizer.

    Args:
        inner: the optimizer that does the update: an instance, or anything ``keras.optimizers.get``
            accepts (``"adam"``, a config dict).
        policy: ``"hold"`` (default), ``"reset"`` or ``"none"``; see ``POLICIES``.
        mask_fn: optional ``mask_fn(step, variable) -> keep or None``, called in the graph at every
            step (``step`` is the iterations tensor): masks computed each step with nothing stored,
            ANDed with the stored mask. Save only module-level functions; a lambda is not saved.
        norms: ``"trainable"`` (default) or ``"all"``: whether clipping norms and Adafactor's
            statistics see frozen entries' gradients.
        name: the optimizer's name.

    Returns:
        A ``keras.optimizers.Optimizer`` for ``model.compile`` or a custom loop.

    Raises:
        ValueError: an unknown policy or norms, a nested MaskedOptimizer, or a tf.distribute strategy.

    Example:

    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
    >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    >>> model.compile(optimizer=opt, loss="mse")
    >>> kernel = model.get_layer("fc").kernel
    >>> before = kernel.numpy().copy()
    >>> opt.set_mask(kernel, [[1, 0], [1, 0], [1, 0]])   # column 1 frozen
    >>> _ = model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=2, verbose=0)
    >>> bool((kernel.numpy()[:, 1] == before[:, 1]).all()), bool((kernel.numpy()[:, 0] != before[:, 0]).all())
    (True, True)
    """

    def __init__(
        self,
        inner: Any,
        policy: str = "hold",
        mask_fn: MaskFn | None = None,
        norms: str = "trainable",
        name: str | None = None,
        **kwargs: Any,
    ):
        _refuse_distribution("construction")
        for option in ("use_ema", "gradient_accumulation_steps", "weight_decay", "clipnorm",
                       "global_clipnorm", "clipvalue", "loss_scale_factor"):
            if kwargs.get(option) not in (None, False):
                raise ValueError(f"MaskedOptimizer: set {option!r} on the inner optimizer, not on the wrapper")
            kwargs.pop(option, None)
        kwargs.pop("learning_rate", None)
        super().__init__(learning_rate=0.0, name=name, **kwargs)
        if not isinstance(inner, keras.optimizers.Optimizer):
            try:
                inner = keras.optimizers.get(inner)
            except ValueError:
                raise ValueError(
                    f"MaskedOptimizer: inner must be a Keras 3 optimizer, its name (like 'adam') or its config "
                    f"dict; got {type(inner).__name__} {inner!r:.80}"
                ) from None
        _leaves(inner)  # refuses a nested MaskedOptimizer early
        self.inner = inner
        self.policy = check_choice("MaskedOptimizer policy", policy, POLICIES)
        self.norms = check_choice("MaskedOptimizer norms", norms, NORMS)
        if mask_fn is not None and not callable(mask_fn):
            raise ValueError(f"MaskedOptimizer: mask_fn must be callable(step, variable) or None; got {mask_fn!r}")
        self.mask_fn = mask_fn
        # Plain Python state, kept out of Keras' and TF's attribute tracking.
        object.__setattr__(self, "_pending", {})  # masks set before build, by path
        object.__setattr__(self, "_mask_index", {})  # variable key -> index into _mask_list
        object.__setattr__(self, "_active", None)  # {key: _Target}, set only while a masked step runs
        object.__setattr__(self, "_initial", {})  # slot key -> initial value, for policy="reset"
        self._masks = _MaskStore()  # tracked by TF: the masks save with checkpoints

    # -- the Keras optimizer surface, forwarded to the inner optimizer ---------------------------
    @property
    def learning_rate(self) -> Any:
        """The inner optimizer's learning rate; setting it sets the inner one's.

        Returns:
            The inner optimizer's learning-rate variable (or schedule).

        >>> opt = MaskedOptimizer(keras.optimizers.SGD(0.1)); opt.learning_rate = 0.5
        >>> float(opt.inner.learning_rate.numpy())
        0.5
        """
        return self.inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self.inner.learning_rate = value

    @property
    def iterations(self) -> Any:
        """The inner optimizer's step counter (what ``mask_fn`` receives as ``step``).

        Returns:
            The inner optimizer's ``iterations`` variable.

        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("sgd")
        >>> _ = opt.apply_gradients([(np.float32([1.0]), w)]); int(opt.iterations.numpy())
        1
        """
        return self.inner.iterations

    @property
    def variables(self) -> list[Any]:
        """The inner optimizer's variables, then one mask variable per built variable (what saving stores).

        Returns:
            A new list of variables.

        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("adam"); opt.build([w])
        >>> len(opt.variables)  # iterations, learning rate, m, v, and the mask of w
        5
        """
        return list(self.inner.variables) + list(self._masks.keep)

    def scale_loss(self, loss: Any) -> Any:
        """Forward loss scaling to the inner optimizer (a ``LossScaleOptimizer`` multiplies it).

        Args:
            loss: the loss tensor.

        Returns:
            The scaled loss (unchanged when the inner optimizer does not scale).

        >>> opt = MaskedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=8.0))
        >>> float(opt.scale_loss(2.0))
        16.0
        """
        return self.inner.scale_loss(loss)

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        """Forward to the inner optimizer (with ``use_ema``, ``fit`` ends by overwriting weights with averages).

        Args:
            var_list: the model's trainable variables.

        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.finalize_variable_values([w]); w.numpy().tolist()  # no EMA: nothing to do
        [1.0]
        """
        self.inner.finalize_variable_values(var_list)

    # -- build: the mask variables and the one-time interception ----------------------------------
    def build(self, var_list: Sequence[Any]) -> None:
        """Build the inner optimizer, one mask variable per variable, and install the interception.

        Args:
            var_list: every variable this optimizer will ever update (any subset may be applied later).

        >>> a, b = keras.Variable([1.0], name="a"), keras.Variable([2.0], name="b")
        >>> opt = MaskedOptimizer("adam"); opt.build([a, b])
        >>> _ = opt.apply_gradients([(np.float32([1.0]), b)])  # a subset of what it was built with
        >>> opt.built, int(opt.iterations.numpy())
        (True, 1)
        """
        if self.built:
            return
        _refuse_distribution("build")
        var_list = list(var_list)
        if not self.inner.built:
            self.inner.build(var_list)
        leaves = _leaves(self.inner)
        with tf.init_scope():
            for i, v in enumerate(var_list):
                self._mask_index[self._var_key(v)] = i
                self._masks.keep.append(
                    tf.Variable(True, shape=tf.TensorShape(None), dtype=tf.bool, trainable=False,
                                name=f"keep_{i}")
                )
            for leaf in leaves:
                for v in var_list:
                    if self._knows(leaf, v):
                        for name, slot in slots(leaf, v).items():
                            value = np.asarray(slot.numpy())
                            same = value.size and np.all(value == value.flat[0])
                            initial = float(value.flat[0]) if same else slot_initial_value(leaf, name)
                            self._initial[leaf._var_key(slot)] = initial
        for leaf in leaves:
            self._install(leaf)
        super().build(var_list)
        pending = dict(self._pending)
        self._pending.clear()
        with tf.init_scope():  # build may run while fit traces its step: store the masks now
            for path, keep in pending.items():
                self.set_mask(path, keep)

    @staticmethod
    def _knows(optimizer: Any, variable: Any) -> bool:
        return optimizer.built and optimizer._var_key(variable) in optimizer._trainable_variables_indices

    # -- masks as state ---------------------------------------------------------------------------
    def _resolve(self, target: Any) -> Any:
        """A variable or a path string -> the built variable (or the path itself before build)."""
        if not self.built:
            return variable_path(target) if not isinstance(target, str) else target
        if isinstance(target, str):
            by_path = {variable_path(v): v for v in self._trainable_variables}
            if target in by_path:
                return by_path[target]
            close = difflib.get_close_matches(target, list(by_path), n=3, cutoff=0.5)
            raise ValueError(
                f"MaskedOptimizer: no variable with path {target!r}"
                + (f"; close matches: {close}" if close else f"; paths: {sorted(by_path)[:8]}")
            )
        if self._var_key(target) not in self._mask_index:
            raise ValueError(
                f"MaskedOptimizer: variable {variable_path(target)!r} is not one this optimizer was built "
                f"with ({len(self._trainable_variables)} variables); build it with every variable it will "
                "update, e.g. opt.build(model.trainable_variables)"
            )
        return target

    def set_mask(self, target: Any, keep: Any) -> None:
        """Store a mask: entries where ``keep`` is 1/True train, the others stay frozen.

        Args:
            target: a variable, or its path string (``variable.path``).
            keep: bool-like, broadcastable to the variable (a scalar, a row, a full array).

        Raises:
            ValueError: an unknown path (close matches listed), a variable the optimizer was not
                built for, or a mask that does not broadcast to the variable.

        >>> v = keras.Variable([1.0, 2.0, 3.0], name="w")
        >>> opt = MaskedOptimizer("sgd"); opt.build([v])
        >>> opt.set_mask(v, [True, False, True]); opt.get_mask(v).tolist()
        [True, False, True]
        """
        variable = self._resolve(target)
        if isinstance(variable, str):  # before build: validated and stored at build
            self._pending[variable] = np.asarray(keep).astype(bool)
            return
        keep = _check_mask(keep, variable, "set_mask")
        self._masks.keep[self._mask_index[self._var_key(variable)]].assign(keep)

    def get_mask(self, target: Any) -> np.ndarray | None:
        """Return the stored mask broadcast to the variable (True = trains), or None when there is none.

        Args:
            target: a variable, or its path string.

        Returns:
            A new boolean array shaped like the variable, or None.

        >>> v = keras.Variable([[1.0, 2.0]], name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v])
        >>> opt.get_mask(v) is None
        True
        >>> opt.set_mask("w", [False, True]); opt.get_mask("w").tolist()
        [[False, True]]
        """
        variable = self._resolve(target)
        if isinstance(variable, str):
            keep = self._pending.get(variable)
            return None if keep is None else np.array(keep)
        keep = self._masks.keep[self._mask_index[self._var_key(variable)]].numpy()
        if keep.ndim == 0 and bool(keep):
            return None
        return np.array(np.broadcast_to(keep, tuple(variable.shape)))

    def clear_mask(self, target: Any) -> None:
        """Remove the stored mask: every entry of the variable trains again.

        Args:
            target: a variable, or its path string.

        >>> v = keras.Variable([1.0, 2.0], name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v]); opt.set_mask(v, [0, 1])
        >>> opt.clear_mask(v); opt.get_mask(v) is None
        True
        """
        variable = self._resolve(target)
        if isinstance(variable, str):
            self._pending.pop(variable, None)
            return
        self._masks.keep[self._mask_index[self._var_key(variable)]].assign(True)

    def mask_bytes(self) -> int:
        """Bytes the stored masks take (1 per stored entry, 1 per variable without a mask).

        Returns:
            The total size of the mask variables, in bytes.

        >>> v = keras.Variable(np.zeros((4, 5)), name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v]); opt.mask_bytes()
        1
        >>> opt.set_mask(v, np.ones((4, 5))); opt.mask_bytes()
        20
        """
        return int(sum(tf.size(m).numpy() * m.dtype.size for m in self._masks.keep))

    # -- applying a step --------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], masks: Sequence[Any] | None = None) -> Any:
        """Apply one step; ``masks[i]`` (None, scalar or broadcastable; 1 = train) overrides variable i's stored mask.

        Args:
            grads_and_vars: (gradient, variable) pairs, as for any Keras optimizer.
            masks: optional per-pair masks for this call only.

        Returns:
            The iterations counter.

        >>> w = keras.Variable([0.0, 0.0], name="w")
        >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
        >>> _ = opt.apply_gradients([(np.float32([1.0, 1.0]), w)], masks=[[1, 0]])
        >>> np.round(w.numpy(), 3).tolist()
        [-0.1, 0.0]
        """
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        self.apply(grads, variables, masks=masks)
        return self.iterations

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None,
              masks: Sequence[Any] | None = None) -> None:
        """Keras' ``apply(grads, variables)``, with optional per-call masks; see ``apply_gradients``.

        Args:
            grads: gradients, one per variable.
            trainable_variables: the variables (default: all it was built with, in order).
            masks: optional per-variable masks overriding the stored ones for this call.

        Raises:
            ValueError: a variable the optimizer was not built for, a count mismatch, or a bad mask.

        >>> w = keras.Variable([0.0, 0.0], name="w"); opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
        >>> opt.apply([np.float32([1.0, 1.0])], [w], masks=[[False, True]]); w.numpy().tolist()
        [0.0, -1.0]
        """
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise ValueError("MaskedOptimizer.apply: pass the variables, or build the optimizer first")
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                self.build(variables)
        if len(grads) != len(variables):
            raise ValueError(f"MaskedOptimizer: got {len(grads)} gradients for {len(variables)} variables")
        for v in variables:
            self._resolve(v)  # a clear error for a variable the optimizer was not built for
        if masks is not None:
            masks = list(masks)
            if len(masks) > len(variables):
                raise ValueError(
                    f"MaskedOptimizer: got {len(masks)} masks for {len(variables)} variables; "
                    "expected at most one mask per (gradient, variable) pair"
                )
            masks += [None] * (len(variables) - len(masks))
        keeps = [self._keep(v, None if masks is None else masks[i], i) for i, v in enumerate(variables)]
        zero_frozen = self.policy == "none" or (self.norms == "trainable" and self._norms_see_gradients())
        if zero_frozen:
            grads = [g if g is None else _zero_where_frozen(g, k) for g, k in zip(grads, keeps)]
        if self.policy == "none":
            self.inner.apply(grads, variables)
            return
        object.__setattr__(self, "_active", self._targets(variables, keeps))
        swapped = []
        try:
            for v, keep in zip(variables, keeps):
                constraint = getattr(v, "constraint", None)
                if constraint is not None:
                    swapped.append((v, constraint))
                    v.constraint = _masked_constraint(constraint, keep)
            self.inner.apply(grads, variables)
        finally:
            object.__setattr__(self, "_active", None)
            for v, constraint in swapped:
                v.constraint = constraint

    def _norms_see_gradients(self) -> bool:
        """Whether zeroing frozen gradients can change what the inner optimizer writes."""
        return any(
            leaf.clipnorm or leaf.global_clipnorm or not isinstance(leaf, _ELEMENTWISE)
            for leaf in _leaves(self.inner)
        )

    def _keep(self, variable: Any, override: Any, index: int) -> tf.Tensor:
        """The boolean mask in force for ``variable`` this step (True = train)."""
        if override is not None:
            keep = _as_keep(override, variable, f"masks[{index}]")
        else:
            keep = tf.convert_to_tensor(self._masks.keep[self._mask_index[self._var_key(variable)]])
        if self.mask_fn is not None:
            extra = self.mask_fn(self.iterations, variable)
            if extra is not None:
                keep = tf.logical_and(keep, _as_keep(extra, variable, "mask_fn's result"))
        return keep

    def _targets(self, variables: Sequence[Any], keeps: Sequence[tf.Tensor]) -> dict[int, _Target]:
        targets: dict[int, _Target] = {}
        for leaf in _leaves(self.inner):
            for v, keep in zip(variables, keeps):
                if not self._knows(leaf, v):
                    continue
                targets[leaf._var_key(v)] = _Target(keep, None)
                for name, slot in slots(leaf, v).items():
                    key = leaf._var_key(slot)
                    reset_to = self._initial.get(key, 0.0) if self.policy == "reset" else None
                    targets[key] = _Target(_slot_keep(keep, v, slot, name), reset_to)
        return targets

    # -- the interception, installed once per writing optimizer ------------------------------------
    def _install(self, leaf: keras.optimizers.Optimizer) -> None:
        key = leaf._var_key
        assign, assign_add, assign_sub = leaf.assign, leaf.assign_add, leaf.assign_sub
        decay = leaf._apply_weight_decay
        ema_update = leaf._update_model_variables_moving_average
        ema_overwrite = leaf._overwrite_model_variables_with_average_value
        accumulate = leaf._backend_increment_gradient_accumulators
        reset_accumulators = leaf._backend_reset_gradient_accumulators
        wrapper = self

        def target(variable: Any) -> _Target | None:
            active = wrapper._active
            return None if active is None else active.get(key(variable))

        def masked_assign(variable: Any, value: Any) -> Any:
            t = target(variable)
            if t is None:
                return assign(variable, value)
            value = _dense(value, variable)
            old = tf.convert_to_tensor(variable) if t.reset_to is None else tf.cast(t.reset_to, variable.dtype)
            return assign(variable, _where(t.keep, value, old, variable))

        def masked_increment(write: Any, pad: float, combine: Any) -> Any:
            def increment(variable: Any, value: Any) -> Any:
                t = target(variable)
                if t is None:
                    return write(variable, value)
                value = _dense(value, variable)
                if t.reset_to is None:
                    return write(variable, _where(t.keep, value, tf.constant(pad, variable.dtype), variable))
                new = combine(tf.convert_to_tensor(variable), value)
                return assign(variable, _where(t.keep, new, tf.cast(t.reset_to, variable.dtype), variable))

            return increment

        def masked_decay(variables: Sequence[Any]) -> None:
            if wrapper._active is None or leaf.weight_decay is None:
                return decay(variables)
            decay([v for v in variables if target(v) is None])
            standard = type(leaf)._apply_weight_decay is keras.optimizers.Optimizer._apply_weight_decay
            for v in variables:
                t = target(v)
                if t is None or not leaf._use_weight_decay(v):
                    continue
                var = v.value if isinstance(v, keras.Variable) else v
                if standard:  # the TF backend's formula, with the frozen entries' decay set to +0
                    lr = tf.cast(leaf.learning_rate, var.dtype)
                    wd = tf.cast(leaf.weight_decay, var.dtype)
                    var.assign_sub(_where(t.keep, var * wd * lr, tf.zeros_like(var), var))
                else:  # an optimizer with its own decay rule: run it, then put frozen entries back
                    before = tf.identity(var)
                    decay([v])
                    var.assign(_where(t.keep, tf.convert_to_tensor(var), before, var))

        def masked_ema_update(variables: Sequence[Any]) -> None:
            if wrapper._active is None:
                return ema_update(variables)
            for var, average in zip(variables, leaf._model_variables_moving_average):
                if average is None:
                    continue
                first = tf.cast(tf.not_equal(leaf.iterations, 0), var.dtype)
                momentum = first * tf.cast(leaf.ema_momentum, var.dtype)
                new = momentum * average + (1 - momentum) * tf.convert_to_tensor(var)
                t = target(var)
                average.assign(new if t is None else _where(t.keep, new, tf.convert_to_tensor(average), average))

        def masked_ema_overwrite(variables: Sequence[Any]) -> None:
            if wrapper._active is None:
                return ema_overwrite(variables)
            for var, average in zip(variables, leaf._model_variables_moving_average):
                if average is None:
                    continue
                t = target(var)
                new = tf.convert_to_tensor(average)
                var.assign(new if t is None else _where(t.keep, new, tf.convert_to_tensor(var), var))

        def masked_accumulate(grads: Sequence[Any], accumulators: Sequence[Any]) -> None:
            if wrapper._active is None:
                return accumulate(grads, accumulators)
            for g, acc in zip(grads, accumulators):
                t = target(acc)
                new = tf.convert_to_tensor(acc) + _dense(g, acc)
                acc.assign(new if t is None else _where(t.keep, new, tf.convert_to_tensor(acc), acc))

        overrides = []
        if isinstance(leaf, keras.optimizers.Lamb):
            overrides.append(("update_step", self._lamb_update_step(leaf, target)))
        def masked_reset_accumulators() -> None:
            if wrapper._active is None:
                return reset_accumulators()
            for acc in leaf._accumulated_gradients:
                if acc is None:
                    continue
                t = target(acc)
                zero = tf.zeros(acc.shape, acc.dtype)
                acc.assign(zero if t is None else _where(t.keep, zero, tf.convert_to_tensor(acc), acc))

        # Instance attributes shadow the class's methods; object.__setattr__ keeps Keras' tracker out.
        for name, fn in (*overrides,("assign", masked_assign),
                         ("assign_add", masked_increment(assign_add, -0.0, tf.add)),
                         ("assign_sub", masked_increment(assign_sub, 0.0, tf.subtract)),
                         ("_apply_weight_decay", masked_decay),
                         ("_update_model_variables_moving_average", masked_ema_update),
                         ("_overwrite_model_variables_with_average_value", masked_ema_overwrite),
                         ("_backend_increment_gradient_accumulators", masked_accumulate),
                         ("_backend_reset_gradient_accumulators", masked_reset_accumulators)):
            object.__setattr__(leaf, name, fn)

    def _lamb_update_step(self, leaf: Any, target: Callable[[Any], _Target | None]) -> Callable[..., None]:
        """Lamb's step with its trust ratio over trainable entries only, for ``norms="trainable"``.

        Keras' ``Lamb.update_step`` with ``||w||`` and ``||update||`` summed where the mask trains; the
        same formula otherwise (``norms="all"``, or a variable without a target this step).
        """
        plain = leaf.update_step
        wrapper = self

        def update_step(gradient: Any, variable: Any, learning_rate: Any) -> None:
            t = target(variable)
            if t is None or wrapper.norms != "trainable":
                return plain(gradient, variable, learning_rate)
            dtype = variable.dtype
            lr = tf.cast(learning_rate, dtype)
            gradient = tf.cast(gradient, dtype)
            step = tf.cast(leaf.iterations + 1, dtype)
            beta_1_power = tf.pow(tf.cast(leaf.beta_1, dtype), step)
            beta_2_power = tf.pow(tf.cast(leaf.beta_2, dtype), step)
            index = leaf._get_variable_index(variable)
            m, v = leaf._momentums[index], leaf._velocities[index]
            leaf.assign_add(m, (gradient - m) * (1 - leaf.beta_1))
            leaf.assign_add(v, (tf.square(gradient) - v) * (1 - leaf.beta_2))
            update = keras.ops.divide(keras.ops.divide(m, 1.0 - beta_1_power),
                                      keras.ops.add(keras.ops.sqrt(keras.ops.divide(v, 1.0 - beta_2_power)), leaf.epsilon))
            zero = tf.zeros((), dtype)  # Keras' own ops below, so an all-True mask gives Keras' bits
            w_norm = keras.ops.sqrt(keras.ops.sum(keras.ops.power(tf.where(t.keep, tf.convert_to_tensor(variable), zero), 2)))
            g_norm = keras.ops.sqrt(keras.ops.sum(keras.ops.power(tf.where(t.keep, update, zero), 2)))
            ratio = tf.where(w_norm > 0, tf.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
            leaf.assign_sub(variable, ratio * lr * update)

        return update_step

    # -- saving -----------------------------------------------------------------------------------
    def load_own_variables(self, store: Any) -> None:
        """Restore the inner optimizer's variables and the masks from a ``.keras`` file's store.

        Args:
            store: the mapping Keras' saving passes (``"0"``, ``"1"``, ... -> arrays).

        Raises:
            ValueError: the store holds a different number of variables.

        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.load_own_variables({"0": 0, "1": 0.1, "2": [True, False]}); opt.get_mask(w).tolist()
        [True, False]
        """
        variables = self.variables
        if len(store.keys()) != len(variables):
            raise ValueError(
                f"MaskedOptimizer: the saved optimizer has {len(store.keys())} variables, this one "
                f"{len(variables)}; was it saved from the same model and optimizer?"
            )
        for i, variable in enumerate(variables):
            variable.assign(np.asarray(store[str(i)]))

    def get_config(self) -> dict[str, Any]:
        """The wrapper's config with the inner optimizer serialised (masks are state, not config).

        Returns:
            A JSON-serialisable dict; ``MaskedOptimizer.from_config`` rebuilds the wrapper from it.

        >>> config = MaskedOptimizer("adam", policy="reset").get_config()
        >>> config["policy"], config["inner"]["class_name"]
        ('reset', 'Adam')
        """
        mask_fn = None
        if self.mask_fn is not None:
            if getattr(self.mask_fn, "__name__", "<lambda>") in ("<lambda>",) or "<locals>" in getattr(
                self.mask_fn, "__qualname__", ""
            ):
                warnings.warn(
                    "MaskedOptimizer: mask_fn is a lambda or local function and is not saved; "
                    "re-attach it after loading (opt.mask_fn = fn) or pass a module-level function",
                    stacklevel=2,
                )
            else:
                mask_fn = keras.saving.serialize_keras_object(self.mask_fn)
        return {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner),
            "policy": self.policy,
            "norms": self.norms,
            "mask_fn": mask_fn,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> MaskedOptimizer:
        """Rebuild from ``get_config``'s output.

        Args:
            config: what ``get_config`` returned.
            custom_objects: passed to Keras' deserialisation of the inner optimizer and ``mask_fn``.

        Returns:
            A new, unbuilt ``MaskedOptimizer``.

        >>> opt = MaskedOptimizer.from_config(MaskedOptimizer("sgd", norms="all").get_config())
        >>> type(opt.inner).__name__, opt.norms
        ('SGD', 'all')
        """
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner"), custom_objects=custom_objects)
        mask_fn = config.pop("mask_fn", None)
        if mask_fn is not None:
            mask_fn = keras.saving.deserialize_keras_object(mask_fn, custom_objects=custom_objects)
        return cls(inner, mask_fn=mask_fn, **config)


class _MaskStore(tf.Module):
    """The mask variables, one per built variable, in build order (a TF-tracked child for checkpoints)."""

    def __init__(self) -> None:
        super().__init__(name="masks")
        self.keep: list[tf.Variable] = []


def _masked_constraint(constraint: Callable[[Any], Any], keep: tf.Tensor) -> Callable[[Any], Any]:
    def masked(value: Any) -> Any:
        value = tf.convert_to_tensor(value)
        return _where(keep, tf.convert_to_tensor(constraint(value), value.dtype), value, value)

    return masked


def _where(keep: tf.Tensor, new: Any, old: Any, like: Any) -> tf.Tensor:
    """``tf.where(keep, new, old)`` with the static shape of ``like`` (a stored mask's shape is dynamic)."""
    result = tf.where(keep, new, old)
    if not tf.executing_eagerly() and result.shape != like.shape:
        result.set_shape(like.shape)
    return result


def _zero_where_frozen(grad: Any, keep: tf.Tensor) -> tf.Tensor:
    grad = tf.convert_to_tensor(grad)
    return _where(keep, grad, tf.zeros((), grad.dtype), grad)


def _dense(value: Any, target: Any) -> tf.Tensor:
    """A sparse or Python value as a dense tensor of the target's dtype."""
    if isinstance(value, tf.IndexedSlices):
        value = tf.convert_to_tensor(value)
    return tf.cast(value, target.dtype)


def _slot_keep(keep: tf.Tensor, variable: Any, slot: Any, name: str) -> tf.Tensor:
    """The mask of a slot: the variable's, or for a factored statistic (Adafactor's row/column), any-of."""
    var_shape, slot_shape = tuple(variable.shape), tuple(slot.shape)
    if slot_shape == var_shape or keep.shape.rank == 0:
        return keep
    full = tf.broadcast_to(keep, var_shape)
    for axis in range(len(var_shape)):
        if var_shape[:axis] + var_shape[axis + 1:] == slot_shape:
            return tf.reduce_any(full, axis=axis)
    raise ValueError(
        f"MaskedOptimizer: slot {name!r} of {variable_path(variable)!r} has shape {slot_shape}, which is "
        f"neither the variable's {var_shape} nor the variable's with one axis reduced; only a scalar "
        "mask can hold it"
    )


def _check_mask(keep: Any, variable: Any, where: str) -> np.ndarray:
    """A stored mask as a boolean array, checked to broadcast to the variable without growing it."""
    try:
        array = np.asarray(keep)
    except (TypeError, ValueError) as e:
        raise ValueError(f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} is not array-like: {e}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} has dtype {array.dtype}; "
            "expected bool or numbers (1/True = train, 0/False = frozen)"
        )
    shape = tuple(variable.shape)
    try:
        grown = np.broadcast_shapes(array.shape, shape) != shape
    except ValueError:
        grown = True
    if grown or array.ndim > len(shape):
        raise ValueError(
            f"MaskedOptimizer.{where}: the mask for {variable_path(variable)!r} has shape {array.shape}; "
            f"expected a scalar or a shape broadcastable to the variable's {shape}"
        )
    return array.astype(bool)


def _as_keep(mask: Any, variable: Any, what: str) -> tf.Tensor:
    """Validate one in-graph mask and return it as a boolean tensor (True = train this step)."""
    keep = tf.convert_to_tensor(mask)
    if keep.dtype != tf.bool:
        keep = tf.not_equal(keep, tf.zeros((), keep.dtype))
    shape = tf.TensorShape(variable.shape)
    try:
        broadcast = tf.broadcast_static_shape(keep.shape, shape)
    except ValueError:
        broadcast = None
    too_many = keep.shape.rank is not None and keep.shape.rank > shape.rank
    if broadcast is None or too_many or (broadcast.is_fully_defined() and broadcast != shape):
        raise ValueError(
            f"MaskedOptimizer: {what} for {variable_path(variable)!r} has shape {keep.shape}; "
            f"expected None, a scalar, or a shape broadcastable to the variable's {shape}"
        )
    return keep
