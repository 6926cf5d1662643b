"""``MaskedOptimizer``: per-element freezing that any Keras 3 optimizer honours exactly.

A stop_gradient mask freezes entries under SGD but not under Adam, momentum or weight decay: the
optimizer still moves an entry whose gradient is zero. ``MaskedOptimizer`` is a Keras optimizer that
wraps another one (the pattern of Keras' own ``LossScaleOptimizer``) and fixes that where the wrapped
optimizer writes (``freezing._write_path``). Each variable's update takes one of four paths, chosen
in the graph from its mask at every step, so a changed mask never retraces (``freezing._masks``):
no mask -- Keras' own update, nothing extra; wholly frozen -- no update at all, slots untouched;
some entries frozen -- the masked update, whose writes leave the frozen entries' bits alone; few
entries frozen -- Keras' own update with the frozen entries' bits saved and put back. Under XLA
(``jit_compile=True``) every variable takes the masked update, whose selects XLA fuses into it, and so
does a small variable in any graph (the same bits, cheaper than a conditional).
No copy of a whole variable or slot is made. What is held, per policy:

* ``"hold"``  -- value, moments (every slot), EMA average and gradient accumulator of a frozen entry
  keep their bits; unfrozen later, the entry resumes from the moments it had.
* ``"reset"`` -- value held; the frozen entries' moments go back to their initial value once, when
  ``set_mask`` stores the mask, and are held after that (a mask given per call or by ``mask_fn``
  is new at every step, so its frozen moments are reset in the step).
* ``"none"``  -- the wrapped optimizer runs on gradients whose frozen entries are zero: the drifting
  baseline a ``stop_gradient`` mask gives.

Masks are optimizer state: one boolean variable per trainable variable, scalar ``True`` ("no mask",
1 byte) until ``set_mask`` stores a mask (1 byte per stored entry; a mask broadcastable to the
variable, such as one per output column, is stored at its own shape), and 4 bytes per variable
for its mode (``int32``: the smallest integer tf.distribute's collectives broadcast). The graph reads these variables, so a mask changed between batches or epochs takes
effect on the next step with no recompiling and no retracing, and masks save with the model and
restore from a checkpoint.

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
* ``IndexedSlices`` gradients (an ``Embedding``'s) stay sparse: a scatter stays a scatter.
* ``keras.optimizers.LossScaleOptimizer`` and ``MultiOptimizer`` work on either side. Under a
  ``mixed_float16`` policy ``compile`` puts a ``LossScaleOptimizer`` outside (the nesting to use with
  ``fit``); ``MaskedOptimizer(LossScaleOptimizer(...))`` is for custom loops, where ``scale_loss`` is
  forwarded.
* ``tf.distribute``: ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` (see
  ``freezing._distribute`` for what is refused, and why).
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing import _distribute, _masks
from freezing._sparse_state import SparseState
from freezing._wrappers import wrapper_chain
from freezing._write_path import Context, WritePath, apply_step, in_xla, initial_slot_values
from freezing.selection import variable_path
from freezing.validation import check_choice

POLICIES = ("hold", "reset", "none")
"""hold: frozen values and all their optimizer state unchanged; reset: values unchanged, moments
re-initialised; none: the inner optimizer runs on gated gradients (the drifting baseline)."""

NORMS = ("trainable", "all")
"""Whether gradient norms (clipping, Adafactor statistics) see frozen entries' gradients."""

STATES = ("dense", "sparse")
"""dense: the inner optimizer's slots cover every entry, masks may change at every step; sparse:
slots only for the entries a fixed mask trains (memory in proportion to them), see ``set_mask``."""


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
        state: ``"dense"`` (default) or ``"sparse"``: with ``"sparse"``, a variable whose mask is set
            before ``build`` keeps inner-optimizer state only for its trainable entries (the mask is
            then fixed); see ``freezing._sparse_state``.
        jit_update: compile the optimizer's update (only it) with XLA inside a step that is not
            compiled: one fused pass per variable, several times faster on CPU, but XLA contracts
            ``a * b + c`` into fused multiply-adds, so trainable entries can differ from Keras'
            kernels in the last bit (frozen entries stay exact). Not under ``tf.distribute``.
        name: the optimizer's name.
        sparse_sizes: written by ``get_config`` for ``state="sparse"`` (K per built variable, None for a
            dense one) so that loading recreates the state before reading it; not for users.

    Returns:
        A ``keras.optimizers.Optimizer`` for ``model.compile`` or a custom loop.

    Raises:
        ValueError: an unknown policy, norms or state, a nested MaskedOptimizer, or what a
            ``tf.distribute`` strategy cannot run (named in the message).

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
        jit_update: bool = False,
        name: str | None = None,
        sparse_sizes: list[int | None] | None = None,
        **kwargs: Any,
    ):
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
        self.state = check_choice("MaskedOptimizer state", state, STATES)
        if mask_fn is not None and not callable(mask_fn):
            raise ValueError(f"MaskedOptimizer: mask_fn must be callable(step, variable) or None; got {mask_fn!r}")
        if state == "sparse" and policy == "none":
            raise ValueError("MaskedOptimizer: state='sparse' keeps no state for frozen entries; use policy 'hold'")
        if state == "sparse" and mask_fn is not None:
            raise ValueError("MaskedOptimizer: state='sparse' is for a fixed selection; a mask_fn changes it every step")
        self.mask_fn = mask_fn
        self.jit_update = bool(jit_update)
        _distribute.check_construction(self)
        # Plain Python state, kept out of Keras' and TF's attribute tracking.
        object.__setattr__(self, "_pending", {})  # masks set before build, by path
        object.__setattr__(self, "_mask_index", {})  # variable key -> index into the mask store
        object.__setattr__(self, "_context", Context())  # the step in force, per replica
        object.__setattr__(self, "_paths", [])  # one WritePath per writing optimizer
        object.__setattr__(self, "_jitted", {})  # variables -> the XLA-compiled apply (jit_update)
        object.__setattr__(self, "_sparse", SparseState(self, sparse_sizes or []))
        self._masks = _masks.MaskStore()  # tracked by TF: the masks save with checkpoints

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
        """The inner optimizer's variables, one mask per built variable, their modes, then any sparse state.

        Returns:
            A new list of variables (what ``.keras`` saving stores).

        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("adam"); opt.build([w])
        >>> len(opt.variables)  # iterations, learning rate, m, v, the mask of w, the modes
        6
        """
        modes = [] if self._masks.mode is None else [self._masks.mode]
        return list(self.inner.variables) + list(self._masks.keep) + modes + self._sparse.variables()

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
        self.inner.finalize_variable_values(self._sparse.inner_variables(var_list))

    # -- build: the mask variables and the one-time interception ----------------------------------
    def build(self, var_list: Sequence[Any]) -> None:
        """Build the inner optimizer, one mask variable per variable, and install the interception.

        Args:
            var_list: every variable this optimizer will ever update (any subset may be applied later).

        Raises:
            ValueError: what the ``tf.distribute`` strategy in force cannot run, named.

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
        _distribute.check_build(self, leaves)
        with tf.init_scope():
            for i, v in enumerate(var_list):
                self._mask_index[self._var_key(v)] = i
                self._masks.keep.append(
                    tf.Variable(True, shape=tf.TensorShape(None), dtype=tf.bool, trainable=False, name=f"keep_{i}")
                )
            self._masks.mode = tf.Variable(np.zeros(len(var_list), np.int32), dtype=tf.int32, trainable=False,
                                           name="modes")
            inner_vars = self._sparse.build(var_list, self._pending)
        if not self.inner.built:
            self.inner.build(inner_vars)
        with tf.init_scope():
            for leaf in leaves:
                self._paths.append(WritePath(self, leaf, self._context, inner_vars, initial_slot_values(leaf, inner_vars)))
        super().build(var_list)
        pending = dict(self._pending)
        self._pending.clear()
        with tf.init_scope():  # build may run while fit traces its step: store the masks now
            for path, keep in pending.items():
                self._store(self._resolve(path), keep, reset=False)  # fresh slots: nothing to reset

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

        With ``policy="reset"`` the newly frozen entries' slots go back to their initial values now.
        With ``state="sparse"``, a mask set before ``build`` fixes the variable's trainable entries;
        after ``build`` only the same mask is accepted.

        Args:
            target: a variable, or its path string (``variable.path``).
            keep: bool-like, broadcastable to the variable (a scalar, a row, a full array).

        Raises:
            ValueError: an unknown path (close matches listed), a variable the optimizer was not
                built for, a mask that does not broadcast to the variable, or a changed sparse selection.

        >>> v = keras.Variable([1.0, 2.0, 3.0], name="w")
        >>> opt = MaskedOptimizer("sgd"); opt.build([v])
        >>> opt.set_mask(v, [True, False, True]); opt.get_mask(v).tolist()
        [True, False, True]
        """
        variable = self._resolve(target)
        if isinstance(variable, str):  # before build: validated and stored at build
            self._pending[variable] = np.asarray(keep).astype(bool)
            return
        self._store(variable, keep, reset=self.policy == "reset")

    def _store(self, variable: Any, keep: Any, reset: bool) -> None:
        keep = _masks.check_mask(keep, variable, "set_mask")
        index = self._mask_index[self._var_key(variable)]
        if self._sparse.check_set(variable, keep):
            return  # the same fixed selection: stored as the sparse state's index
        mode = _masks.host_mode(keep, tuple(variable.shape))
        stored = keep if mode not in (_masks.UNMASKED, _masks.FROZEN) else np.asarray(mode == _masks.UNMASKED)
        self._masks.keep[index].assign(stored)
        modes = self._masks.mode.numpy()
        modes[index] = mode
        self._masks.mode.assign(modes)
        if reset and mode != _masks.UNMASKED:
            self._reset_slots(variable, stored)

    def _reset_slots(self, variable: Any, keep: np.ndarray) -> None:
        for path in self._paths:
            key = path.leaf._var_key(variable)
            for name, slot in path.slots.get(key, []):
                k = _masks.slot_keep(tf.constant(keep), variable, slot, name)
                initial = tf.cast(path.reset_to.get(path.leaf._var_key(slot), 0.0), slot.dtype)
                slot.assign(tf.where(k, tf.convert_to_tensor(slot), initial))

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
        sparse = self._sparse.mask(variable)
        if sparse is not None:
            return sparse
        keep = self._masks.keep[self._mask_index[self._var_key(variable)]].numpy()
        if keep.ndim == 0 and bool(keep):
            return None
        return np.array(np.broadcast_to(keep, tuple(variable.shape)))

    def clear_mask(self, target: Any) -> None:
        """Remove the stored mask: every entry of the variable trains again.

        Args:
            target: a variable, or its path string.

        Raises:
            ValueError: with ``state="sparse"``, a variable whose selection is fixed.

        >>> v = keras.Variable([1.0, 2.0], name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v]); opt.set_mask(v, [0, 1])
        >>> opt.clear_mask(v); opt.get_mask(v) is None
        True
        """
        variable = self._resolve(target)
        if isinstance(variable, str):
            self._pending.pop(variable, None)
            return
        self.set_mask(variable, True)

    def mask_bytes(self) -> int:
        """Bytes the stored masks take: 1 per stored entry, 1 per variable without a mask, 4 per variable's mode.

        Returns:
            The total size of the mask and mode variables, in bytes.

        >>> v = keras.Variable(np.zeros((4, 5)), name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([v]); opt.mask_bytes()
        5
        >>> opt.set_mask(v, np.random.default_rng(0).random((4, 5)) < 0.5); opt.mask_bytes()
        24
        """
        return int(sum(tf.size(m).numpy() * m.dtype.size for m in list(self._masks.keep) + [self._masks.mode]))

    def state_bytes(self) -> int:
        """Bytes of every variable this optimizer holds: the inner optimizer's, the masks and modes, sparse state.

        The inner optimizer's variables are its slots, step counter and learning rate; with
        ``state="sparse"`` each selection adds K ``int32`` indices and K scratch values.

        Returns:
            The total, in bytes.

        >>> w = keras.Variable(np.zeros((4, 5), "float32"), name="w")
        >>> opt = MaskedOptimizer("adam"); opt.build([w])
        >>> opt.state_bytes()  # step 8 + learning rate 4 + m 80 + v 80 + mask 1 + mode 4
        177
        """
        variables = self.variables + self._sparse.scratch()
        return int(sum(int(tf.size(v).numpy()) * tf.as_dtype(v.dtype).size for v in variables))

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
            masks = [None if m is None else _masks.as_keep(m, v, f"masks[{i}]") for i, (m, v) in enumerate(zip(masks, variables))]
            masks = self._sparse.check_call_masks(variables, masks)
        if self.jit_update and not in_xla():
            return self._jit_apply(grads, variables, masks)
        self._apply_now(grads, variables, masks)

    def _jit_apply(self, grads: list[Any], variables: list[Any], masks: list[Any] | None) -> None:
        key = tuple(self._var_key(v) for v in variables)
        if key not in self._jitted:
            self._jitted[key] = tf.function(lambda g, m: self._apply_now(g, variables, m), jit_compile=True)
        self._jitted[key](grads, masks)

    def _apply_now(self, grads: list[Any], variables: list[Any], masks: list[Any] | None) -> None:
        apply_step(self, _leaves(self.inner), grads, variables, masks)

    # -- saving -----------------------------------------------------------------------------------
    def load_own_variables(self, store: Any) -> None:
        """Restore the inner optimizer's variables and the masks from a ``.keras`` file's store.

        Args:
            store: the mapping Keras' saving passes (``"0"``, ``"1"``, ... -> arrays).

        Raises:
            ValueError: the store holds a different number of variables.

        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer("sgd"); opt.build([w])
        >>> opt.load_own_variables({"0": 0, "1": 0.1, "2": [True, False], "3": [2]}); opt.get_mask(w).tolist()
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
        config = {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner),
            "policy": self.policy,
            "norms": self.norms,
            "mask_fn": mask_fn,
        }
        if self.state != "dense":
            config.update(state=self.state, sparse_sizes=self._sparse.sizes())
        if self.jit_update:
            config["jit_update"] = True
        return config

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
