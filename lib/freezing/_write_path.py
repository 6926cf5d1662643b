"""How ``MaskedOptimizer`` writes: the per-variable update and the interception of the inner optimizer's writes.

At ``build`` the wrapper installs, once per optimizer that writes variables (its "leaves": the inner
optimizer, or each optimizer of a ``MultiOptimizer``), instance attributes that shadow Keras' methods:

* ``_all_reduce_sum_gradients`` and ``_distributed_tf_update_step`` -- Keras' per-variable loop (the
  TensorFlow backend's, with the same all-reduce and ``merge_call`` under ``tf.distribute``), where
  each variable's update dispatches on its mode (see ``freezing._masks``): Keras' own ``update_step`` (unmasked), nothing (frozen), the
  masked update (some entries), or Keras' own update bracketed by a gather/scatter of the few frozen
  entries (restore). The mask and the mode travel to each replica's update as arguments, so every
  replica writes with its own copy of them.
* ``assign``/``assign_add``/``assign_sub`` -- while a masked update runs, a write to that variable
  or one of its slots leaves the frozen entries' bits alone::

      assign(t, new)    -> assign(t, where(keep, new, t))
      assign_add(t, d)  -> assign_add(t, where(keep, d, -0.0))    # x + -0.0 == x, bit for bit
      assign_sub(t, d)  -> assign_sub(t, where(keep, d, +0.0))    # x - +0.0 == x, bit for bit

  An ``IndexedSlices`` write stays a scatter: its values are masked with the mask's rows.
* weight decay, the EMA update and overwrite, and the gradient accumulators: masked the same way.

Outside a ``MaskedOptimizer`` step every attribute calls Keras' own method.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing import _masks
from freezing._masks import ELEMENTS, FROZEN, RESTORE, UNMASKED
from freezing.slots import slot_initial_value, slots

# Keras optimizers whose update of an entry depends only on that entry's gradient and state.
ELEMENTWISE = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.Adamax,
    keras.optimizers.Nadam, keras.optimizers.RMSprop, keras.optimizers.Adagrad,
    keras.optimizers.Adadelta, keras.optimizers.Ftrl, keras.optimizers.Lion, keras.optimizers.Lamb,
)


FUSE_ABOVE = 1 << 17
"""A masked write to a variable with at least this many entries, in a graph that XLA does not compile,
runs as one small XLA-compiled function: ``t.assign_add(where(keep, d, -0.0))`` becomes one fused pass
instead of TensorFlow's two (a ``SelectV2``, then the add). The value ``d`` is computed outside it,
so the one operation XLA compiles is the write itself and the bits are TensorFlow's. Measured on
3.2 M entries: 1.64 ms of CPU against 4.11 ms (the unmasked add: 1.30 ms); below about 2^17 entries
the launch costs more than it saves."""


DISPATCH_ABOVE = 1 << 14
"""In a graph, a variable with fewer entries than this always takes the masked update (with no mask, or
wholly frozen, it gives the same bits as Keras' update or no update): the per-variable conditional keeps the
untaken branches' operations in the graph, which cost more than the masked writes of a small variable
(measured on the CNN's shapes: the conditionals of its six small variables added about 2 ms to a 8 ms
optimizer step with no mask at all)."""


def _size(variable: Any) -> int:
    return int(np.prod(tuple(variable.shape)))


def in_xla() -> bool:
    """Whether the graph being traced is compiled by XLA (``jit_compile=True``), where shapes must be static."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without these private modules
        return False
    return not tf.executing_eagerly() and control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


class Target:
    """What an intercepted write touches: a masked variable's value or one of its slots."""

    __slots__ = ("keep", "reset_to")

    def __init__(self, keep: tf.Tensor, reset_to: float | None):
        self.keep, self.reset_to = keep, reset_to


class Step:
    """What one ``MaskedOptimizer.apply`` decided, by variable key: the mask, the mode, in-step reset."""

    __slots__ = ("keeps", "modes", "resets")

    def __init__(self) -> None:
        self.keeps: dict[int, tf.Tensor] = {}
        self.modes: dict[int, Any] = {}
        self.resets: dict[int, bool] = {}


class Context:
    """The step in force for each replica, and the targets of the write being traced (thread-safe).

    ``tf.distribute`` may run a replica's code in different threads (``call_for_each_replica`` inside
    a ``merge_call``), so the step is keyed by the replica id; the targets live only while one
    variable's update is traced, in one thread.
    """

    def __init__(self) -> None:
        self._steps: dict[Any, Step] = {}
        self._local = threading.local()

    @staticmethod
    def _replica() -> Any:
        ctx = tf.distribute.get_replica_context()
        return None if ctx is None else getattr(ctx, "_replica_id_in_sync_group", 0)

    def start(self, step: Step) -> None:
        self._steps[self._replica()] = step

    def stop(self) -> None:
        self._steps.pop(self._replica(), None)

    def step(self) -> Step | None:
        if not self._steps:
            return None
        return self._steps.get(self._replica())

    @property
    def writing(self) -> dict[int, Target] | None:
        return getattr(self._local, "writing", None)

    @writing.setter
    def writing(self, value: dict[int, Target] | None) -> None:
        self._local.writing = value


def _dense(value: Any, target: Any) -> tf.Tensor:
    """A sparse or Python value as a dense tensor of the target's dtype."""
    if isinstance(value, tf.IndexedSlices):
        value = tf.convert_to_tensor(value)
    return tf.cast(value, target.dtype)


def _sparse(value: Any, target: Any) -> tf.IndexedSlices | None:
    """``value`` as an ``IndexedSlices`` of the target's dtype, or None when it is dense."""
    if not isinstance(value, tf.IndexedSlices):
        return None
    return tf.IndexedSlices(tf.cast(value.values, target.dtype), value.indices, value.dense_shape)


def _tf_variable(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


def _switch(mode: Any, branches: dict[int, Callable[[], None]]) -> None:
    """Run the branch of ``mode``: a Python choice when eager, else one ``switch_case`` (no retrace on change)."""
    order = sorted(branches)
    if tf.executing_eagerly():
        value = int(mode)
        branches[value if value in branches else ELEMENTS]()
        return
    index = tf.convert_to_tensor(mode, tf.int32)
    if order != list(range(len(order))):  # map modes to dense branch indices
        index = tf.gather(tf.constant([order.index(m) if m in order else order.index(ELEMENTS)
                                       for m in range(max(order) + 1)], tf.int32), index)

    def run(fn: Callable[[], None]) -> Callable[[], tf.Tensor]:
        def branch() -> tf.Tensor:
            fn()
            return tf.constant(0)

        return branch

    tf.switch_case(index, [run(branches[m]) for m in order])


class WritePath:
    """The interception of one leaf optimizer, installed once at ``MaskedOptimizer.build``."""

    def __init__(self, wrapper: Any, leaf: keras.optimizers.Optimizer, context: Context,
                 variables: Sequence[Any], reset_to: dict[int, float]):
        self.wrapper, self.leaf, self.context = wrapper, leaf, context
        self.reset_to = reset_to  # slot key -> initial value, for policy="reset"
        self.fused: dict[tuple[str, int], Any] = {}  # (write, variable) -> its XLA-compiled masked write
        key = leaf._var_key
        self.slots: dict[int, list[tuple[str, Any]]] = {}  # what update_step writes: not EMA averages, accumulators
        aside = {id(a) for a in list(getattr(leaf, "_model_variables_moving_average", None) or [])
                 + list(getattr(leaf, "_accumulated_gradients", None) or []) if a is not None}
        for v in variables:
            if leaf.built and key(v) in leaf._trainable_variables_indices:
                self.slots[key(v)] = [(n, s) for n, s in slots(leaf, v).items() if id(s) not in aside]
        standard_decay = type(leaf)._apply_weight_decay
        self.standard_decay = standard_decay in (keras.optimizers.Optimizer._apply_weight_decay,)
        self.plain = {name: getattr(leaf, name) for name in (
            "assign", "assign_add", "assign_sub", "update_step", "_apply_weight_decay", "_all_reduce_sum_gradients",
            "_distributed_tf_update_step",
            "_update_model_variables_moving_average", "_overwrite_model_variables_with_average_value",
            "_backend_increment_gradient_accumulators", "_backend_reset_gradient_accumulators")}
        overrides = {
            "assign": self._assign, "assign_add": self._increment("assign_add", -0.0, tf.add),
            "assign_sub": self._increment("assign_sub", 0.0, tf.subtract),
            "_apply_weight_decay": self._decay_outside_update,
            "_all_reduce_sum_gradients": self._all_reduce,
            "_distributed_tf_update_step": self._distributed_update,
            "_update_model_variables_moving_average": self._ema_update,
            "_overwrite_model_variables_with_average_value": self._ema_overwrite,
            "_backend_increment_gradient_accumulators": self._accumulate,
            "_backend_reset_gradient_accumulators": self._reset_accumulators,
        }
        for name, fn in overrides.items():  # instance attributes shadow the class's; keep Keras' tracker out
            object.__setattr__(leaf, name, fn)

    # -- which variables are masked this step -----------------------------------------------------
    def _target(self, variable: Any) -> Target | None:
        writing = self.context.writing
        return None if writing is None else writing.get(self.leaf._var_key(variable))

    def _step_keep(self, variable: Any) -> tf.Tensor | None:
        step = self.context.step()
        return None if step is None else step.keeps.get(self.leaf._var_key(variable))

    def restorable(self, key: int, variable: Any) -> bool:
        """Whether the restore mode applies: an elementwise update whose every slot has the variable's shape."""
        leaf, wrapper = self.leaf, self.wrapper
        if not isinstance(leaf, ELEMENTWISE) or in_xla():
            return False
        if isinstance(leaf, keras.optimizers.Lamb) and wrapper.norms == "trainable":
            return False
        return all(tuple(s.shape) == tuple(variable.shape) for _, s in self.slots.get(key, []))

    # -- the per-variable update -----------------------------------------------------------------
    def _all_reduce(self, grads_and_vars: Any) -> Any:
        """Keras' all-reduce of the gradients; during a masked step each pair also carries its mask and mode.

        Keras passes what this returns through ``merge_call`` to ``_distributed_tf_update_step``, so
        each replica's mask reaches that replica's update the way its gradient does.
        """
        pairs = self.plain["_all_reduce_sum_gradients"](grads_and_vars)
        step = self.context.step()
        if step is None:
            return pairs
        key = self.leaf._var_key
        return [(g, v, step.keeps[key(v)], step.modes[key(v)], step.resets[key(v)]) for g, v in pairs]

    def _distributed_update(self, distribution: Any, grads_and_vars: Any, learning_rate: Any) -> None:
        """Keras' per-variable ``extended.update`` loop, with ``_update_one`` in place of ``update_step``."""
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars or len(grads_and_vars[0]) == 2:
            return self.plain["_distributed_tf_update_step"](distribution, grads_and_vars, learning_rate)
        for grad, var, keep, mode, reset in grads_and_vars:
            distribution.extended.update(var, self._update_one, args=(grad, keep, mode, reset, learning_rate),
                                         group=False)
        return None

    def _update_one(self, variable: Any, grad: Any, keep: tf.Tensor, mode: Any, reset: bool,
                    learning_rate: Any) -> None:
        """One variable's update on one replica, by mode (see ``freezing._masks``)."""
        leaf, key = self.leaf, self.leaf._var_key(variable)
        slot_list = self.slots.get(key, [])

        def plain() -> None:
            self._decay(variable, None)
            self.plain["update_step"](grad, variable, learning_rate)

        def frozen() -> None:
            if reset:  # a mask given in the graph with policy="reset": the frozen moments restart
                for name, slot in slot_list:
                    self.plain["assign"](slot, tf.fill(tf.shape(slot), tf.cast(self.reset_to.get(leaf._var_key(slot), 0.0), slot.dtype)))

        def elements() -> None:
            writing = {key: Target(keep, None)}
            for name, slot in slot_list:
                writing[leaf._var_key(slot)] = Target(
                    _masks.slot_keep(keep, variable, slot, name),
                    self.reset_to.get(leaf._var_key(slot), 0.0) if reset else None)
            self.context.writing = writing
            try:
                self._decay(variable, keep)
                self._masked_update_step(grad, variable, learning_rate, keep)
            finally:
                self.context.writing = None

        def restore() -> None:
            tensors = [variable] + [slot for _, slot in slot_list]
            full = tf.broadcast_to(_masks.full_rank(keep, len(variable.shape)), tf.shape(variable))
            where = tf.where(tf.logical_not(full))
            saved = [tf.raw_ops.ResourceGatherNd(resource=_tf_variable(t).handle, indices=where, dtype=t.dtype)
                     for t in tensors]
            plain()
            for t, old in zip(tensors, saved):  # the handle: this replica's copy inside extended.update
                tf.raw_ops.ResourceScatterNdUpdate(ref=_tf_variable(t).handle, indices=where, updates=old)

        branches = {UNMASKED: plain, FROZEN: frozen, ELEMENTS: elements}
        if not reset and self.restorable(key, variable) and len(variable.shape) > 0:
            branches[RESTORE] = restore
        if in_xla():  # XLA fuses the select into the update; a conditional keeps it from fusing (measured:
            return elements()  # CNN custom-loop step masked/plain 1.006 without it, 1.11 with it)
        if not tf.executing_eagerly() and _size(variable) < DISPATCH_ABOVE:
            return elements()  # small: the masked update costs less than a conditional's untaken branches
        _switch(mode, branches)

    def _masked_update_step(self, grad: Any, variable: Any, learning_rate: Any, keep: tf.Tensor) -> None:
        if isinstance(self.leaf, keras.optimizers.Lamb) and self.wrapper.norms == "trainable":
            return self._lamb_update_step(grad, variable, learning_rate, keep)
        return self.plain["update_step"](grad, variable, learning_rate)

    def _lamb_update_step(self, gradient: Any, variable: Any, learning_rate: Any, keep: tf.Tensor) -> None:
        """Lamb's step with its trust ratio over trainable entries only (``norms="trainable"``).

        Keras' ``Lamb.update_step`` with ``||w||`` and ``||update||`` summed where the mask trains.
        """
        leaf = self.leaf
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
        w_norm = keras.ops.sqrt(keras.ops.sum(keras.ops.power(tf.where(keep, tf.convert_to_tensor(variable), zero), 2)))
        g_norm = keras.ops.sqrt(keras.ops.sum(keras.ops.power(tf.where(keep, update, zero), 2)))
        ratio = tf.where(w_norm > 0, tf.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
        leaf.assign_sub(variable, ratio * lr * update)

    # -- the interception of writes -------------------------------------------------------------
    def _assign(self, variable: Any, value: Any) -> Any:
        t = self._target(variable)
        assign = self.plain["assign"]
        if t is None:
            return assign(variable, value)
        sparse = _sparse(value, variable)
        if sparse is not None and t.reset_to is None:
            rows = _masks.keep_rows(t.keep, sparse.indices, len(variable.shape))
            old = tf.gather(tf.convert_to_tensor(variable), sparse.indices)
            return assign(variable, tf.IndexedSlices(tf.where(rows, sparse.values, old), sparse.indices, sparse.dense_shape))
        value = _dense(value, variable)
        if t.reset_to is None and self._fuse(variable):
            return self._fused_write("assign", variable, value, t.keep)
        old = tf.convert_to_tensor(variable) if t.reset_to is None else tf.cast(t.reset_to, variable.dtype)
        return assign(variable, _masks.where(t.keep, value, old, variable))

    def _increment(self, name: str, pad: float, combine: Any) -> Callable[[Any, Any], Any]:
        def increment(variable: Any, value: Any) -> Any:
            write, assign = self.plain[name], self.plain["assign"]
            t = self._target(variable)
            if t is None:
                return write(variable, value)
            sparse = _sparse(value, variable)
            if sparse is not None and t.reset_to is None:
                rows = _masks.keep_rows(t.keep, sparse.indices, len(variable.shape))
                values = tf.where(rows, sparse.values, tf.constant(pad, variable.dtype))
                return write(variable, tf.IndexedSlices(values, sparse.indices, sparse.dense_shape))
            value = _dense(value, variable)
            if t.reset_to is None and self._fuse(variable):
                return self._fused_write(name, variable, value, t.keep)
            if t.reset_to is None:
                return write(variable, _masks.where(t.keep, value, tf.constant(pad, variable.dtype), variable))
            new = combine(tf.convert_to_tensor(variable), value)
            return assign(variable, _masks.where(t.keep, new, tf.cast(t.reset_to, variable.dtype), variable))

        return increment

    def _fuse(self, variable: Any) -> bool:
        """Whether this masked write runs as one XLA-compiled pass (see ``FUSE_ABOVE``)."""
        size = variable.shape.num_elements() if hasattr(variable.shape, "num_elements") else int(np.prod(variable.shape))
        return size is not None and size >= FUSE_ABOVE and not tf.executing_eagerly() and not in_xla()

    def _fused_write(self, kind: str, variable: Any, value: tf.Tensor, keep: tf.Tensor) -> None:
        var = _tf_variable(variable)
        key = (kind, id(var))
        fn = self.fused.get(key)
        if fn is None:
            zero = {"assign_add": -0.0, "assign_sub": 0.0}.get(kind)

            def write(value: tf.Tensor, keep: tf.Tensor) -> None:
                if kind == "assign":
                    var.assign(tf.where(keep, value, var.read_value()))
                else:
                    getattr(var, kind)(tf.where(keep, value, tf.constant(zero, var.dtype)))

            fn = self.fused[key] = tf.function(write, jit_compile=True, autograph=False)
        fn(value, keep)

    # -- weight decay, inside each variable's update ------------------------------------------------
    def _decay_outside_update(self, variables: Sequence[Any]) -> None:
        """Keras calls decay before the update; during a masked step it runs in ``_update_one`` instead."""
        if self.context.step() is None:
            return self.plain["_apply_weight_decay"](variables)
        return None

    def _decay(self, variable: Any, keep: tf.Tensor | None) -> None:
        """Weight decay of one variable (the TensorFlow backend's formula), frozen entries' decay +0."""
        leaf = self.leaf
        if leaf.weight_decay is None or not leaf._use_weight_decay(variable):
            return
        if not self.standard_decay:  # an optimizer with its own decay rule: run it, put frozen entries back
            before = None if keep is None else tf.identity(variable)
            self.plain["_apply_weight_decay"]([variable])
            if keep is not None:
                variable.assign(_masks.where(keep, tf.convert_to_tensor(variable), before, variable))
            return
        lr = tf.cast(leaf.learning_rate, variable.dtype)
        wd = tf.cast(leaf.weight_decay, variable.dtype)
        decay = variable * wd * lr
        if keep is not None:
            decay = _masks.where(keep, decay, tf.zeros_like(decay), variable)
        variable.assign_sub(decay)

    # -- EMA and gradient accumulation (refused under tf.distribute, as in plain Keras) -----------
    def _ema_update(self, variables: Sequence[Any]) -> None:
        if self.context.step() is None:
            return self.plain["_update_model_variables_moving_average"](variables)
        leaf = self.leaf
        for var, average in zip(variables, leaf._model_variables_moving_average):
            if average is None:
                continue
            first = tf.cast(tf.not_equal(leaf.iterations, 0), var.dtype)
            momentum = first * tf.cast(leaf.ema_momentum, var.dtype)
            new = momentum * average + (1 - momentum) * tf.convert_to_tensor(var)
            keep = self._step_keep(var)
            average.assign(new if keep is None else _masks.where(keep, new, tf.convert_to_tensor(average), average))

    def _ema_overwrite(self, variables: Sequence[Any]) -> None:
        if self.context.step() is None:
            return self.plain["_overwrite_model_variables_with_average_value"](variables)
        for var, average in zip(variables, self.leaf._model_variables_moving_average):
            if average is None:
                continue
            keep = self._step_keep(var)
            new = tf.convert_to_tensor(average)
            var.assign(new if keep is None else _masks.where(keep, new, tf.convert_to_tensor(var), var))

    def _accumulate(self, grads: Sequence[Any], accumulators: Sequence[Any]) -> None:
        if self.context.step() is None:
            return self.plain["_backend_increment_gradient_accumulators"](grads, accumulators)
        for g, acc in zip(grads, accumulators):
            keep = self._accumulator_keep(acc)
            new = tf.convert_to_tensor(acc) + _dense(g, acc)
            acc.assign(new if keep is None else _masks.where(keep, new, tf.convert_to_tensor(acc), acc))

    def _reset_accumulators(self) -> None:
        if self.context.step() is None:
            return self.plain["_backend_reset_gradient_accumulators"]()
        for acc in self.leaf._accumulated_gradients:
            if acc is None:
                continue
            keep = self._accumulator_keep(acc)
            zero = tf.zeros(acc.shape, acc.dtype)
            acc.assign(zero if keep is None else _masks.where(keep, zero, tf.convert_to_tensor(acc), acc))

    def _accumulator_keep(self, accumulator: Any) -> tf.Tensor | None:
        leaf = self.leaf
        index = next(i for i, a in enumerate(leaf._accumulated_gradients) if a is accumulator)
        return self._step_keep(leaf._trainable_variables[index])


def masked_constraint(constraint: Callable[[Any], Any], keep: tf.Tensor) -> Callable[[Any], Any]:
    """A variable constraint that leaves frozen entries as they are."""
    def masked(value: Any) -> Any:
        value = tf.convert_to_tensor(value)
        return _masks.where(keep, tf.convert_to_tensor(constraint(value), value.dtype), value, value)

    return masked


def initial_slot_values(leaf: keras.optimizers.Optimizer, variables: Sequence[Any]) -> dict[int, float]:
    """Slot key -> the value ``policy="reset"`` puts back: the slot's current uniform value, else its initial one."""
    out = {}
    for v in variables:
        if not (leaf.built and leaf._var_key(v) in leaf._trainable_variables_indices):
            continue
        for name, slot in slots(leaf, v).items():
            value = np.asarray(slot.numpy())
            same = value.size and np.all(value == value.flat[0])
            out[leaf._var_key(slot)] = float(value.flat[0]) if same else slot_initial_value(leaf, name)
    return out


def apply_step(wrapper: Any, leaves: Sequence[Any], grads: list[Any], variables: list[Any],
               masks: list[Any] | None) -> None:
    """One ``MaskedOptimizer`` step: each variable's mask and mode, then the inner optimizer's ``apply``.

    A stored mask comes with the mode ``set_mask`` decided; a mask given for this call or computed by
    ``mask_fn`` gets its mode in the graph, and with ``policy="reset"`` its frozen moments reset in the step.
    """
    step = Step()
    keeps = []
    for i, v in enumerate(variables):
        key = wrapper._var_key(v)
        index = wrapper._mask_index[key]
        override = None if masks is None else masks[i]
        in_graph = override is not None
        if in_graph:
            keep = override
        else:
            keep = tf.convert_to_tensor(wrapper._masks.keep[index])
            mode = tf.gather(tf.convert_to_tensor(wrapper._masks.mode), index)
        if wrapper.mask_fn is not None:
            extra = wrapper.mask_fn(wrapper.iterations, v)
            if extra is not None:
                keep = tf.logical_and(keep, _masks.as_keep(extra, v, "mask_fn's result"))
                in_graph = True
        if in_graph:
            mode = _masks.graph_mode(keep)
        keeps.append(keep)
        step.keeps[key], step.modes[key] = keep, mode
        step.resets[key] = in_graph and wrapper.policy == "reset"
    norms_see_gradients = any(leaf.clipnorm or leaf.global_clipnorm or not isinstance(leaf, ELEMENTWISE)
                              for leaf in leaves)
    if wrapper.policy == "none" or (wrapper.norms == "trainable" and norms_see_gradients):
        grads = [g if g is None else _masks.zero_where_frozen(g, k, v) for g, k, v in zip(grads, keeps, variables)]
    grads, variables, step = wrapper._sparse.gather(grads, variables, step)
    if wrapper.policy == "none":
        wrapper.inner.apply(grads, variables)
        return
    wrapper._context.start(step)
    swapped = []
    try:
        for v in variables:
            constraint = getattr(v, "constraint", None)
            keep = step.keeps.get(wrapper._var_key(v))
            if constraint is not None and keep is not None:
                swapped.append((v, constraint))
                v.constraint = masked_constraint(constraint, keep)
        wrapper.inner.apply(grads, variables)
    finally:
        wrapper._context.stop()
        for v, constraint in swapped:
            v.constraint = constraint
    wrapper._sparse.scatter()
