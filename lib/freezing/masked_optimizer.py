"""``MaskedOptimizer``: per-element freezing that any Keras 3 optimizer honours exactly.

A stop_gradient mask freezes entries under SGD but not under Adam, momentum or weight decay: the
optimizer still moves an entry whose gradient is zero. ``MaskedOptimizer`` is a Keras optimizer that
wraps another one (the pattern of Keras' own ``LossScaleOptimizer``) and guarantees, by construction,
that a frozen entry keeps every bit: during its step, a frozen entry of a variable or of any optimizer
state that belongs to it is only ever copied, never recomputed (``freezing._write_path``, whose
docstring tables every path). Each variable's update takes its path from its mask at every step, so a
changed mask never retraces (``freezing._masks``): no mask -- Keras' own update; wholly frozen -- no
update at all, slots untouched; some entries frozen -- Keras' own update with every write masked.

What is held, per policy:

* ``"hold"``  -- value, moments (every slot), gradient accumulator of a frozen entry keep their bits
  (its EMA average is its weight); unfrozen later, the entry resumes from the moments it had.
* ``"reset"`` -- value held; the frozen entries' moments go back to their initial value once, when
  ``set_mask`` stores the mask, and are held after that (a mask given per call or by ``mask_fn``
  is new at every step, so its frozen moments are reset at the start of every step).
* ``"none"``  -- the wrapped optimizer runs on gradients whose frozen entries are zero: the drifting
  baseline a ``stop_gradient`` mask gives.

Masks are optimizer state: one boolean variable per trainable variable, scalar ``True`` ("no mask",
1 byte) until ``set_mask`` stores a mask (1 byte per stored entry; a mask broadcastable to the
variable, such as one per output column, is stored at its own shape; a wholly frozen variable is
scalar ``False``). Which path a variable's step takes is read off its mask, never stored beside it
(``freezing._masks``). The graph reads these variables, so a mask changed between batches or epochs
takes effect on the next step with no ``compile()`` and no retracing, and masks save with the model and
restore from a checkpoint. Under XLA (``jit_compile=True``) the step is compiled once per combination of
the stored masks' shapes: a mask that takes a shape the step has not run with (no mask or wholly frozen:
a scalar; partly frozen: the mask's own shape) makes the next step compile once more; a mask of a shape
already seen compiles nothing.

Edge cases, decided:

* ``norms="trainable"`` (default): the wrapped optimizer sees zero gradient at frozen entries
  wherever something other than the entry itself reads it -- ``clipnorm``/``global_clipnorm``, and
  any optimizer not in ``freezing._write_path.ELEMENTWISE`` (Adafactor's factored statistics and
  update clipping, Lamb's trust ratio, Muon): as if the frozen entries had no gradient.
  ``norms="all"``: they see every entry's gradient.
* Optimizers whose update of one entry reads others' state (Lamb, Adafactor, Muon, ScheduleFreeAdamW):
  their trainable entries get the bits Keras gives on the same gradients in the step; frozen entries'
  state is copied back after Keras' ``update_step``. A statistic shared by several entries
  (Adafactor's row and column factors, told apart by role, not shape) is held only when every entry
  sharing it is frozen. Where a wholly frozen row meets a wholly frozen column, Keras' Adafactor on the
  zeroed gradients turns every entry NaN (a zero velocity there); ``norms="all"`` avoids it.
* Constraints: the constraint sees the whole variable; only trainable entries take its result.
* Gradient accumulation: a frozen entry's accumulator neither grows nor resets; what it
  accumulated while trainable is applied on the first update step after it is unfrozen.
* ``use_ema``: a frozen entry's average is its weight, so ``SwapEMAWeights`` and ``fit``'s final
  overwrite (``finalize_variable_values``) leave frozen weights with their own bits.
* ``overwrite_with_gradient`` variables (float8 scales): their frozen entries are not overwritten.
* ``IndexedSlices`` gradients (an ``Embedding``'s) stay sparse: a scatter stays a scatter.
* ``keras.optimizers.LossScaleOptimizer`` and ``MultiOptimizer`` work on either side. Under a
  ``mixed_float16`` policy ``compile`` puts a ``LossScaleOptimizer`` outside (the nesting to use with
  ``fit``); ``MaskedOptimizer(LossScaleOptimizer(...))`` is for custom loops, where ``scale_loss`` is
  forwarded.
* ``tf.distribute``: ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` (see
  ``freezing._distribute`` for what is refused, and why).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing import _distribute, _foreign, _keras_api, _masks, _write_path
from freezing._mask_api import MaskAccess
from freezing._saving import SavedState
from freezing._sizes import StateSizes
from freezing._sparse_state import SparseState
from freezing._surface import InnerSurface
from freezing._wrappers import wrapper_chain
from freezing._write_path import ELEMENTWISE, Guards, WritePath, entries_for, install, reset_frozen_slots
from freezing.selection import variable_path
from freezing.slots import slot_initial_value, slots

POLICIES = ("hold", "reset", "none")
"""hold: frozen values and all their optimizer state unchanged; reset: values unchanged, moments
re-initialised; none: the inner optimizer runs on gated gradients (the drifting baseline)."""

NORMS = ("trainable", "all")
"""Whether gradient norms (clipping, non-elementwise optimizers' statistics) see frozen entries' gradients."""

STATES = ("dense", "sparse")
"""dense: the inner optimizer's slots cover every entry, masks may change at every step; sparse:
slots only for the entries a fixed mask trains (memory in proportion to them), see ``set_mask``."""

_BASE_OPTIONS = ("use_ema", "gradient_accumulation_steps", "weight_decay", "clipnorm", "global_clipnorm",
                 "clipvalue", "loss_scale_factor", "ema_momentum", "ema_overwrite_frequency")


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}: got {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def _leaves(optimizer: keras.optimizers.Optimizer) -> list[keras.optimizers.Optimizer]:
    """The optimizers that actually write variables, looking through LossScale and Multi optimizers."""
    chain = wrapper_chain(optimizer)
    if any(isinstance(o, MaskedOptimizer) for o in chain):
        raise ValueError("MaskedOptimizer: the inner optimizer is itself a MaskedOptimizer; wrap the plain one once")
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is not None and isinstance(chain[-1], multi):
        return [leaf for sub in chain[-1].optimizers for leaf in _leaves(sub)]
    return [chain[-1]]


@keras.saving.register_keras_serializable(package="freezing")
class MaskedOptimizer(MaskAccess, InnerSurface, SavedState, StateSizes, keras.optimizers.Optimizer):
    """A Keras optimizer that freezes chosen entries of chosen variables exactly, under any inner optimizer.

    Args:
        inner: the optimizer that does the update: an instance, or anything ``keras.optimizers.get``
            accepts (``"adam"``, a config dict). Its options (learning rate, weight decay, EMA,
            clipping, loss scale) are read and written through the wrapper.
        policy: ``"hold"`` (default), ``"reset"`` or ``"none"``; see ``POLICIES``.
        mask_fn: optional ``mask_fn(step, variable) -> trainable mask or None``, called in the graph at
            every step (``step`` is the iterations tensor): masks computed each step with nothing stored,
            ANDed with the stored mask. Save only module-level functions; a lambda is not saved.
        norms: ``"trainable"`` (default) or ``"all"``: whether clipping norms and non-elementwise
            optimizers see frozen entries' gradients.
        state: ``"dense"`` (default) or ``"sparse"``: with ``"sparse"``, a variable whose mask is set
            before ``build`` keeps inner-optimizer state only for its trainable entries (the mask is
            then fixed); see ``freezing._sparse_state``.
        name: the optimizer's name.
        sparse_sizes: written by ``get_config`` for ``state="sparse"`` (K per built variable, None for a
            dense one) so that loading recreates the state before reading it; not for users.

    Returns:
        A ``keras.optimizers.Optimizer`` for ``model.compile`` or a custom loop.

    Raises:
        ValueError: an unknown policy, norms or state, a nested MaskedOptimizer, an option that
            belongs on the inner optimizer, or what a ``tf.distribute`` strategy cannot run.

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
        mask_fn: Any = None,
        norms: str = "trainable",
        state: str = "dense",
        name: str | None = None,
        sparse_sizes: list[int | None] | None = None,
        **kwargs: Any,
    ):
        for option in _BASE_OPTIONS + ("learning_rate",):
            if kwargs.get(option) not in (None, False) and not (option == "ema_momentum" and kwargs[option] == 0.99):
                raise ValueError(
                    f"MaskedOptimizer: {option}={kwargs[option]!r} belongs on the inner optimizer: "
                    f"MaskedOptimizer(keras.optimizers.Adam({option}=...)); the wrapper reads it through"
                )
            kwargs.pop(option, None)
        if kwargs:
            raise ValueError(f"MaskedOptimizer: unknown arguments {sorted(kwargs)}; allowed: inner, policy, mask_fn, "
                             "norms, state, name")
        if not isinstance(inner, keras.optimizers.Optimizer):
            try:
                inner = keras.optimizers.get(inner)
            except ValueError:
                raise ValueError(
                    f"MaskedOptimizer: inner must be a Keras 3 optimizer, its name (like 'adam') or its config "
                    f"dict; got {type(inner).__name__} {inner!r:.80}"
                ) from None
        _leaves(inner)  # refuses a nested MaskedOptimizer early
        policy = _check_choice("MaskedOptimizer policy", policy, POLICIES)
        norms = _check_choice("MaskedOptimizer norms", norms, NORMS)
        state = _check_choice("MaskedOptimizer state", state, STATES)
        if mask_fn is not None and not callable(mask_fn):
            raise ValueError(f"MaskedOptimizer: mask_fn must be callable(step, variable) or None; got {mask_fn!r}")
        if state == "sparse" and policy == "none":
            raise ValueError("MaskedOptimizer: state='sparse' keeps no state for frozen entries; use policy 'hold'")
        if state == "sparse" and mask_fn is not None:
            raise ValueError("MaskedOptimizer: state='sparse' is for a fixed selection; a mask_fn changes it every "
                             "step")
        super().__init__(learning_rate=0.0, name=name)
        self.inner = inner
        self.policy, self.norms, self.state, self.mask_fn = policy, norms, state, mask_fn
        _distribute.check_construction(self)
        # Plain Python state, kept out of Keras' and TF's attribute tracking.
        object.__setattr__(self, "_pending", {})  # masks set before build: path -> (checked mask, variable or None)
        object.__setattr__(self, "_mask_index", {})  # variable key -> index into the mask store
        object.__setattr__(self, "_paths", [])  # one WritePath per writing optimizer
        # this optimizer's steps in progress: what its variables' guards read
        object.__setattr__(self, "_guards", Guards())
        object.__setattr__(self, "_sparse", SparseState(self, sparse_sizes or []))
        self._masks = _masks.MaskStore()  # tracked by TF: the masks save with checkpoints

    def _leaves(self) -> list[keras.optimizers.Optimizer]:
        return _leaves(self.inner)

    @property
    def variables(self) -> list[Any]:
        """The inner optimizer's variables, one mask per built variable, then any sparse state.

        Returns:
            A new list of variables (what ``.keras`` saving stores and ``set_weights`` writes).

        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("adam"); opt.build([w])
        >>> len(opt.variables)  # iterations, learning rate, m, v, the mask of w
        5
        """
        return list(self.inner.variables) + list(self._masks.keep) + self._sparse.variables()

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        """Forward to the inner optimizer with every mask in force (with ``use_ema``, ``fit`` ends by
        overwriting weights with their averages: frozen entries keep their bits).

        Args:
            var_list: the model's trainable variables.

        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.finalize_variable_values([w]); w.numpy().tolist()  # no EMA: nothing to do
        [1.0]
        """
        if not self.built:
            return self.inner.finalize_variable_values(var_list)
        entries, _ = self._entries(_keras_api.trainable_variables(self), None, mask_fn=False)
        self._guarded(entries, lambda: self.inner.finalize_variable_values(self._sparse.inner_variables(var_list)),
                      "finalize_variable_values")
        if any(leaf.use_ema for leaf in self._leaves()):
            self._sparse.scatter(everything=True)  # sparse state: the averages went into the scratch values

    def _ema_for_callbacks(self) -> list[Any]:
        """The EMA averages, one per built variable, as ``keras.callbacks.SwapEMAWeights`` pairs them with the
        variables (``state="sparse"``: see ``SparseState.ema_view``); AttributeError when there is no EMA.
        Installed as Keras' own name for that list (``_keras_api.MOVING_AVERAGES``), below the class."""
        return self._sparse.ema_view(_keras_api.moving_averages(self.inner))

    # -- build: the mask variables and the guard ---------------------------------------------------
    def build(self, var_list: Sequence[Any]) -> None:
        """Build the inner optimizer, one mask variable per variable, and guard every variable it writes.

        Masks set before ``build`` (by path) are checked first: a bad one raises and leaves the
        optimizer unbuilt with every pending mask kept, so the mask can be fixed and ``build`` rerun.

        Args:
            var_list: every variable this optimizer will ever update (any subset may be applied later).

        Raises:
            ValueError: a pending mask that names no variable or does not fit its variable, or what the
                ``tf.distribute`` strategy in force cannot run.
            RuntimeError: a Keras or TensorFlow that lacks what the guard relies on (named).

        >>> a, b = keras.Variable([1.0], name="a"), keras.Variable([2.0], name="b")
        >>> opt = MaskedOptimizer("adam"); opt.build([a, b])
        >>> _ = opt.apply_gradients([(np.float32([1.0]), b)])  # a subset of what it was built with
        >>> opt.built, int(opt.iterations.numpy())
        (True, 1)
        """
        if self.built:
            return
        var_list = list(var_list)
        leaves = _leaves(self.inner)
        pending = self._check_pending(var_list)
        self._sparse.check_options()
        _distribute.check_build(self, leaves)
        _foreign.unwatch(self, var_list)  # this optimizer now updates them: nothing to watch for
        with tf.init_scope():
            keeps = [tf.Variable(True, shape=tf.TensorShape(None), dtype=tf.bool, trainable=False, name=f"keep_{i}")
                     for i in range(len(var_list))]
            inner_vars = self._sparse.build(var_list, pending)
        if not self.inner.built:
            self.inner.build(inner_vars)
        leaves = _leaves(self.inner)  # again: a MultiOptimizer with a selector finds its optimizers at build
        for leaf in leaves:
            _keras_api.check(leaf)
        with tf.init_scope():
            for i, v in enumerate(var_list):
                self._mask_index[_keras_api.key(v)] = i
            self._masks.keep.extend(keeps)
            for v in inner_vars:
                install(v, self._guards)
            for leaf in leaves:
                for v in inner_vars:
                    if _keras_api.knows(leaf, v):
                        for values in _keras_api.per_variable_lists(leaf).values():
                            if values[_keras_api.index(leaf, v)] is not None:
                                install(values[_keras_api.index(leaf, v)], self._guards)
                self._paths.append(WritePath(leaf, self._guards))
        object.__setattr__(self, "_own_defaults", True)  # Keras' own build must not create EMA/accumulators
        try:
            super().build(var_list)
        finally:
            object.__setattr__(self, "_own_defaults", False)
        self._pending.clear()
        with tf.init_scope():  # build may run while fit traces its step: store the masks now
            by_path = {variable_path(v): v for v in var_list}
            for path, keep in pending.items():  # checked: stored as they are (fresh slots: nothing to reset)
                v = by_path[path]
                if not self._sparse.check_set(v, keep):
                    self._put(v, keep)

    def _reset_slots(self, variable: Any, keep: np.ndarray) -> None:
        entries = entries_for(self._leaves(), [variable], {_keras_api.key(variable): lambda: tf.constant(keep)},
                              {_keras_api.key(variable): lambda: _masks.ELEMENTS})
        reset_frozen_slots(entries, self._initial)

    def _initial(self, slot: Any) -> float:
        """The value ``policy="reset"`` puts back into a slot's frozen entries (``slot_initial_value``), from a table
        of every slot made once, at the first reset after build (not a scan of every slot for each slot)."""
        table = self.__dict__.get("_initials")
        if table is None:
            table = {id(candidate): slot_initial_value(leaf, name) for leaf in self._leaves()
                     for v in _keras_api.trainable_variables(leaf) for name, candidate in slots(leaf, v).items()}
            object.__setattr__(self, "_initials", table)
        return table.get(id(slot), 0.0)

    # -- applying a step --------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], trainable_masks: Sequence[Any] | None = None,
                        masks: Sequence[Any] | None = None) -> Any:
        """Apply one step; ``trainable_masks[i]`` (None, scalar or broadcastable; 1 = train) overrides pair i's
        stored mask.

        Args:
            grads_and_vars: (gradient, variable) pairs, as for any Keras optimizer.
            trainable_masks: optional per-pair masks for this call only.
            masks: the former name of ``trainable_masks`` (deprecated).

        Returns:
            The iterations counter.

        >>> w = keras.Variable([0.0, 0.0], name="w")
        >>> opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
        >>> _ = opt.apply_gradients([(np.float32([1.0, 1.0]), w)], trainable_masks=[[1, 0]])
        >>> np.round(w.numpy(), 3).tolist()
        [-0.1, 0.0]
        """
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        self.apply(grads, variables, trainable_masks=_renamed(trainable_masks, masks))
        return self.iterations

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None,
              trainable_masks: Sequence[Any] | None = None, masks: Sequence[Any] | None = None) -> None:
        """Keras' ``apply(grads, variables)``, with optional per-call masks; see ``apply_gradients``.

        Args:
            grads: gradients, one per variable.
            trainable_variables: the variables (default: all it was built with, in order).
            trainable_masks: optional per-variable masks (1 = train) overriding the stored ones for this call.
            masks: the former name of ``trainable_masks`` (deprecated).

        Raises:
            ValueError: a variable the optimizer was not built for, a count mismatch, or a bad mask.

        >>> w = keras.Variable([0.0, 0.0], name="w"); opt = MaskedOptimizer(keras.optimizers.SGD(1.0))
        >>> opt.apply([np.float32([1.0, 1.0])], [w], trainable_masks=[[False, True]]); w.numpy().tolist()
        [0.0, -1.0]
        """
        masks = _renamed(trainable_masks, masks)
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise ValueError("MaskedOptimizer.apply: pass the variables, or build the optimizer first")
            variables = _keras_api.trainable_variables(self)
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
            masks = [None if m is None else _masks.as_keep(m, v, f"trainable_masks[{i}]")
                     for i, (m, v) in enumerate(zip(masks, variables))]
            masks = self._sparse.check_call_masks(variables, masks)
        self._step(grads, variables, masks)

    def _entries(self, variables: list[Any], masks: list[Any] | None,
                 mask_fn: bool = True) -> tuple[dict[int, Any], dict[int, Any]]:
        """Each built variable's mask and mode for this step: stored, given for this call, or ANDed with ``mask_fn``'s.

        Returns the step's entries (what the guard reads) and the masks made in the graph, by variable key.
        """
        called = [_keras_api.key(v) for v in variables]
        overrides = {} if masks is None else {k: m for k, m in zip(called, masks) if m is not None}
        keeps, modes, in_graph = {}, {}, {}
        for v in _keras_api.trainable_variables(self):
            k = _keras_api.key(v)
            if self._sparse.holds(v):
                continue
            index = self._mask_index[k]
            stored = self._masks.keep[index]
            keep = overrides.get(k)
            if mask_fn and self.mask_fn is not None and k in called:
                extra = self.mask_fn(self.iterations, v)
                if extra is not None:
                    base = tf.convert_to_tensor(stored) if keep is None else keep
                    keep = tf.logical_and(base, _masks.as_keep(extra, v, "mask_fn's result"))
            if keep is not None:
                in_graph[k] = keep
                mode = _masks.graph_mode(keep)
                keeps[k], modes[k] = (lambda keep=keep: keep), (lambda mode=mode: mode)
            elif not (tf.executing_eagerly() and _masks.stored_mode(stored) == _masks.UNMASKED):
                keeps[k] = lambda stored=stored: tf.convert_to_tensor(stored)
                modes[k] = lambda stored=stored: _masks.stored_mode(stored)
        return entries_for(self._leaves(), _keras_api.trainable_variables(self), keeps, modes), in_graph

    def _step(self, grads: list[Any], variables: list[Any], masks: list[Any] | None) -> None:
        """One step: the masks and modes, the gradients the policy calls for, then the inner ``apply`` under the
        guard."""
        entries, in_graph = self._entries(variables, masks)
        leaves = self._leaves()
        norms_see_gradients = any(leaf.clipnorm or leaf.global_clipnorm or not isinstance(leaf, ELEMENTWISE)
                                  for leaf in leaves)
        if self.policy == "none" or (self.norms == "trainable" and norms_see_gradients):
            grads = [g if g is None or _keras_api.key(v) not in entries
                     else _masks.zero_where_frozen(g, entries[_keras_api.key(v)].target.keep(), v)
                     for g, v in zip(grads, variables)]
        self._sparse.check_options()
        grads, variables = self._sparse.gather(grads, variables)
        if self.policy == "none":
            self.inner.apply(grads, variables)
        else:
            if self.policy == "reset" and in_graph:
                reset_frozen_slots({k: e for k, e in entries.items() if k in in_graph}, self._initial)
            sparse = {_keras_api.key(v) for g, v in zip(grads, variables) if isinstance(g, tf.IndexedSlices)}
            self._guarded(entries, lambda: self.inner.apply(grads, variables), f"{type(self.inner).__name__}.apply",
                          sparse)
        self._sparse.scatter()

    def _guarded(self, entries: dict[int, Any], write: Any, who: str, sparse: set[int] = frozenset()) -> None:
        """Run ``write`` (the inner optimizer's own code) so that no frozen entry of ``entries`` changes a bit
        (``freezing._write_path.write_step``)."""
        _write_path.write_step(self._guards, entries, write, who, sparse)

def _renamed(trainable_masks: Any, masks: Any) -> Any:
    if masks is None:
        return trainable_masks
    if trainable_masks is not None:
        raise ValueError("MaskedOptimizer: pass trainable_masks= (masks= is its former name), not both")
    warnings.warn("MaskedOptimizer: masks= is now trainable_masks= (True trains)", DeprecationWarning, stacklevel=3)
    return masks


setattr(MaskedOptimizer, _keras_api.MOVING_AVERAGES, property(MaskedOptimizer._ema_for_callbacks))
