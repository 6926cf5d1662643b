"""How ``MaskedOptimizer`` writes: a frozen bit is only ever copied, never recomputed.

**The invariant.** During a ``MaskedOptimizer`` step, a frozen entry of a variable or of any
optimizer variable that belongs to it (slots, EMA average, gradient accumulator, Adafactor's factors)
is either not written at all, or written by a select whose frozen branch is a copy of the old bits::

    assign(t, new)     -> assign(t, where(keep, new, t))
    assign_add(t, d)   -> assign(t, where(keep, t + d, t))
    assign_sub(t, d)   -> assign(t, where(keep, t - d, t))
    scatter_*(t, rows) -> Keras' own scatter, then the touched rows' frozen entries copied back

TensorFlow's CPU kernels flush subnormals (``x + -0.0`` turns ``1e-40`` into ``+0.0``), so padding a
frozen entry's delta with zero is not enough: a select is. The only exception is the EMA average of a
frozen entry, whose frozen branch copies the frozen *weight* (so swapping EMA weights in and out, or
``fit``'s final overwrite, hands the frozen weight its own bits back).

**Where.** The guard sits on the variables, not on Keras' code paths: at ``build`` every
``tf.Variable`` behind a model variable and its optimizer state (one per replica under a strategy)
gets instance attributes that shadow its public write methods (``assign``, ``assign_add``,
``scatter_add``, ...), and knows which ``MaskedOptimizer`` s guard it (weak references to their
``Guards``). Outside a step of one of them they call TensorFlow's own method. During a step they mask
whatever writes them -- ``update_step``, weight decay, constraints, EMA, gradient accumulation,
``overwrite_with_gradient``, an optimizer this library has never seen -- with no copy of Keras'
formulas. There is no process-wide table: a write finds the step in progress through the variable it
writes, so steps of two models in two threads, or several wrappers in one traced step, never meet.

**Per-variable paths**, chosen in one function, ``choose`` (below), from the step's kind and the variable's mode
(read off its mask, ``freezing._masks``). Every path keeps the frozen bits by a copy:

============  ============================================  =================================================
path          chosen when                                   how the frozen bits are kept
============  ============================================  =================================================
``keras``     no mask (eager: read now; graph: ``dispatch``)  nothing is frozen: Keras' own ``update_step``,
                                                            unguarded
``skip``      wholly frozen (eager, or ``dispatch``)        no ``update_step``; any other write (decay, EMA)
                                                            is a guarded select (a held decay is dropped)
``select``    some entries frozen (eager); in a graph,      every write is guarded: ``where(keep, new, old)``
              every variable under XLA or with fewer than   (one XLA-compiled pass from ``fuse_above``
              ``dispatch_above`` entries                    entries, in a graph XLA does not compile); a
                                                            scatter puts the touched rows' frozen entries
                                                            back; a non-elementwise optimizer's slots are
                                                            selected back after its ``update_step`` (a held
                                                            slot must not change how Keras computes the
                                                            trainable entries)
``dispatch``  a graph XLA does not compile, a variable of   one ``switch_case`` on the mode at run time:
              ``dispatch_above`` entries or more            ``keras``, ``skip`` or ``select`` (a changed mask
                                                            never retraces)
============  ============================================  =================================================

An **eager step** (``write_step``) has no trace for the check (``freezing._trace_check``) to read, so each masked
variable whose gradient is dense also gets the snapshot-and-select construction (``freezing._restore``): its old
bits and its state's are read before Keras' ``apply`` and selected back after it, whatever wrote them. An
``IndexedSlices`` gradient stays a scatter under the guard alone (a snapshot would make the step O(size)). Under
XLA, selects with an all-True mask give Keras' bits, so ``select`` is exact for an unmasked variable too. A
variable with sparse state (``freezing._sparse_state``) is not guarded: the inner optimizer updates its K selected
entries only.

The thresholds (``freezing._tuning``) change speed, never bits; ``make bench``'s ``hold_unfused`` and
``frozen_half_undispatched`` rows measure what each buys.

**A held weight decay.** In a graph, for the optimizers in ``FOLDS`` (whose ``update_step`` never reads the
variable), Keras' weight decay of a masked variable (an ``assign_sub`` before its ``update_step``) is not written:
it is held, and the next guarded write of the variable subtracts it first, in the same select -- ``keras``: Keras'
own decay, then Keras' own update; ``skip``: dropped (a wholly frozen variable keeps every entry); ``select``:
``where(keep, (old - decay) - delta, old)``, the bits of the two writes in turn; held past the update: written
alone at the step's end. One masked pass instead of two (``make bench``'s ``hold_adamw`` row).
``freezing._trace_check.check_unread`` raises at trace time if an op read the variable in between.

**The check** (``freezing._trace_check``): at trace time, a write to a guarded variable that its owner's guard
did not make raises ``RuntimeError``, so a Keras release that reroutes its writes fails loudly.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from freezing import _keras_api as api
from freezing import _masks, _restore
from freezing._masks import FROZEN, UNMASKED
from freezing._trace_check import check_unread, check_writes
from freezing._tuning import WriteTuning
from freezing.selection import variable_path

ELEMENTWISE = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.Adamax,
    keras.optimizers.Nadam, keras.optimizers.RMSprop, keras.optimizers.Adagrad,
    keras.optimizers.Adadelta, keras.optimizers.Ftrl, keras.optimizers.Lion,
)
"""Keras optimizers whose update of an entry reads only that entry's gradient and state."""

FOLDS = tuple(t for t in ELEMENTWISE if t is not keras.optimizers.Ftrl)
"""Keras optimizers (these classes exactly) whose ``update_step`` never reads the variable it updates: in a graph
their weight decay is held and folded into the update's write (``check_unread`` checks that nothing read it)."""

WRITE_METHODS = (
    "assign", "assign_add", "assign_sub",
    "scatter_update", "scatter_add", "scatter_sub", "scatter_max", "scatter_min", "scatter_mul", "scatter_div",
    "batch_scatter_update", "scatter_nd_update", "scatter_nd_add", "scatter_nd_sub", "scatter_nd_max",
    "scatter_nd_min",
)
"""The public write methods of ``tf.Variable`` the guard shadows."""

DENSE = {"assign": "scatter_update", "assign_add": "scatter_add", "assign_sub": "scatter_sub"}
"""The dense write methods (a select), each with the scatter that writes the rows of an ``IndexedSlices`` value."""

GUARD_SCOPE = "freezing_guard"
"""Prefix of the name scope of an owner's own writes in a graph; each ``Guards`` adds a random suffix (its
token), so the trace-time check tells its writes from any other op, whatever that op is named."""

KERAS, SKIP, SELECT, DISPATCH = "keras", "skip", "select", "dispatch"
"""The per-variable paths of the module docstring's table."""

DEFAULT_TUNING = WriteTuning()
"""The thresholds a new ``MaskedOptimizer`` starts with (read once, when it is made); each optimizer then keeps its
own (held by its ``Guards``; ``freezing._tuning.tune`` sets them): no step reads process-wide state."""


def _size(variable: Any) -> int:
    return int(np.prod(tuple(variable.shape)))


def _in_graph() -> bool:
    return not tf.executing_eagerly()


class Target:
    """A guarded ``tf.Variable``: how to compute its mask in the current graph, and where frozen bits come from."""

    __slots__ = ("keep", "source", "path")

    def __init__(self, keep: Callable[[], tf.Tensor], path: str, source: Any = None):
        self.keep, self.path, self.source = keep, path, source


class Entry:
    """One model variable in one step: its mode, its own target, its optimizer variables' targets, and its held
    weight decay (per ``tf.Variable`` behind it: the value, and the graph and op count where it was held)."""

    __slots__ = ("variable", "mode", "target", "slots", "folds", "held", "updated")

    def __init__(self, variable: Any, mode: Callable[[], Any], target: Target, slots: list[tuple[Any, Target, bool]],
                 folds: bool = False):
        self.variable, self.mode, self.target = variable, mode, target
        self.slots = slots  # (optimizer variable, its target, whether update_step updates it)
        self.folds = folds  # whether its weight decay is held for its update's write (FOLDS)
        self.held: dict[int, Held] = {}  # per tf.Variable: until the next guarded write to it takes it
        self.updated: set[int] = set()  # the tf.Variables whose update_step has begun: nothing more is held

    def hold(self, component: Any, value: tf.Tensor) -> None:
        graph = api.default_graph()
        self.held[id(component)] = (component, value, graph, len(graph.get_operations()))


Held = tuple[Any, tf.Tensor, Any, int]
"""A held weight decay: the ``tf.Variable``, the value to subtract, and the graph and op count where it was held."""


def _unread(held: Held, token: str) -> tf.Tensor:
    """The held value, once no op has read its variable since it was held (``check_unread``)."""
    component, value, graph, start = held
    check_unread(component, graph, start, token)
    return value


class Guards:
    """The guarded variables of one ``MaskedOptimizer``'s steps in progress, per replica.

    Each wrapper owns one; each guarded ``tf.Variable`` knows the wrappers that guard it (weak
    references), so a write finds its guard through the variable it writes and the step in progress
    of *its* owner, never through a process-wide table: two models stepping at the same time in two
    threads, or several wrappers in one traced step, never see each other's entries. Within one
    owner the entries are per replica (under ``MirroredStrategy`` a replica's update runs in the
    thread of its ``merge_call``, not the replica's), and a step entered inside another step of the
    same owner stacks on it.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._frames: dict[Any, list[tuple[int, dict[int, Target], dict[int, Entry]]]] = {}
        self._local = threading.local()
        self.token = f"{GUARD_SCOPE}_{uuid.uuid4().hex[:12]}"  # the name scope of this owner's writes
        self.tuning = DEFAULT_TUNING  # the owner's thresholds (freezing._tuning.tune)

    def _find(self, k: int, which: int) -> Any:
        frames = self._frames
        if not frames:
            return None
        mine = frames.get(api.replica_id())
        for stack in ([mine] if mine else []) + list(frames.values()):  # another replica id: masks are the same
            for frame in reversed(stack):
                found = frame[which].get(k)
                if found is not None:
                    return found
        return None

    @contextlib.contextmanager
    def active(self, entries: dict[int, Entry]) -> Iterator[None]:
        """Guard the entries' variables for the duration of the block (one replica's step of this owner): each
        write to one of them, or to its optimizer state, is masked, and ``update_step`` takes its path.

        Raises:
            RuntimeError: a step of the same owner and replica is in progress in another thread.
        """
        rid, thread = api.replica_id(), threading.get_ident()
        targets = {}
        for k, entry in entries.items():
            targets[k] = entry.target
            for slot, target, _ in entry.slots:
                targets[api.key(slot)] = target
        frame = (thread, targets, entries)
        with self._mutex:
            stack = self._frames.setdefault(rid, [])
            if any(t != thread for t, _, _ in stack):
                raise RuntimeError(
                    "MaskedOptimizer: this optimizer is already applying a step in another thread; one optimizer "
                    "steps one model at a time (give each model, or each thread, its own MaskedOptimizer)"
                )
            stack.append(frame)
        try:
            yield
        finally:
            with self._mutex:
                stack = self._frames.get(rid, [])
                stack[:] = [f for f in stack if f is not frame]
                if not stack:
                    self._frames.pop(rid, None)

    def lookup(self, variable: Any) -> tuple[bool, Target | None]:
        """Whether a step of this owner guards ``variable`` now, and its target (None: write it unmasked)."""
        k = api.key(variable)
        target = self._find(k, 1)
        if target is None:
            return False, None
        return True, (None if k in getattr(self._local, "passthrough", ()) else target)

    def entry(self, variable: Any) -> Entry | None:
        return self._find(api.key(variable), 2)

    @contextlib.contextmanager
    def passthrough(self, variables: Sequence[Any]) -> Iterator[None]:
        """Writes to these variables in this thread go through unmasked (Keras' own update, or our restore)."""
        before = getattr(self._local, "passthrough", frozenset())
        self._local.passthrough = before | {api.key(v) for v in variables}
        try:
            yield
        finally:
            self._local.passthrough = before


# -- the guard on one tf.Variable -------------------------------------------------------------------
class _Guard:
    """The shadow of one write method of one ``tf.Variable``."""

    __slots__ = ("variable", "method", "plain", "fused", "owners")

    def __init__(self, variable: Any, method: str, fused: dict[Any, Any], owners: list[Any]):
        self.variable, self.method = variable, method
        self.plain = getattr(type(variable), method)
        self.fused = fused  # shared by a variable's guards: the XLA-compiled writes
        self.owners = owners  # shared by a variable's guards: weak references to the Guards that guard it

    def _owner(self) -> tuple[Guards | None, Target | None]:
        for ref in self.owners:
            guards = ref()
            if guards is not None:
                guarded, target = guards.lookup(self.variable)
                if guarded:
                    return guards, target
        return None, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guards, target = self._owner()
        if guards is None:
            return self.plain(self.variable, *args, **kwargs)
        with tf.name_scope(guards.token):  # in a graph: how the step's check knows this write went through here
            if target is None:  # unmasked on purpose: Keras' own update of an unmasked variable, or a copy-back
                return self.plain(self.variable, *args, **kwargs)
            entry = guards.entry(self.variable) if _in_graph() else None  # None for an optimizer variable
            k = id(self.variable)
            rows = self.method not in DENSE or (args and isinstance(args[0], tf.IndexedSlices))
            if (entry is not None and entry.folds and self.method == "assign_sub" and not rows
                    and k not in entry.updated and k not in entry.held):  # the weight decay: held for the next write
                entry.hold(self.variable, tf.convert_to_tensor(args[0], dtype=self.variable.dtype))
                return self.variable  # Keras ignores it; an op that read it would fail check_unread
            held = entry.held.pop(k, None) if entry is not None else None
            decay = None if held is None else _unread(held, guards.token)
            if rows:
                if decay is not None:  # a scatter takes no held decay: written first, on its own
                    _Guard(self.variable, "assign_sub", self.fused, self.owners)._dense(
                        target, decay, fuse_above=guards.tuning.fuse_above, read_value=False)
                if self.method not in DENSE:
                    return self._scatter(target, *args, **kwargs)
                scatter = _Guard(self.variable, DENSE[self.method], self.fused, self.owners)  # a dense method given
                return scatter._scatter(target, args[0])  # rows: scatter them, as Keras' TF optimizer does
            return self._dense(target, *args, fuse_above=guards.tuning.fuse_above, decay=decay, **kwargs)

    def _frozen(self, target: Target, old: tf.Tensor) -> tf.Tensor:
        if target.source is None:
            return old
        return tf.cast(tf.convert_to_tensor(target.source), old.dtype)

    def _dense(self, target: Target, value: Any, *args: Any, fuse_above: int = 1 << 17, decay: tf.Tensor | None = None,
               **kwargs: Any) -> Any:
        """The masked write; ``decay``, a held weight decay, is subtracted first, in the same select (the entries the
        write keeps get exactly the bits of the two writes in turn, the others theirs)."""
        var = self.variable
        value = tf.convert_to_tensor(value, dtype=var.dtype)
        keep = target.keep()
        if target.source is None and _in_graph() and not api.in_xla() and _size(var) >= fuse_above:
            return self._fused_write(value, keep, kwargs, decay)
        old = var.value()
        new = _new(self.method, old if decay is None else old - decay, value)
        assign = type(var).assign
        return assign(var, _masks.where(keep, new, self._frozen(target, old), old), *args, **kwargs)

    def _fused_write(self, value: tf.Tensor, keep: tf.Tensor, kwargs: dict[str, Any], decay: tf.Tensor | None) -> Any:
        var, method = self.variable, self.method
        name = method if decay is None else f"decay_then_{method}"
        fn = self.fused.get(name)
        if fn is None:
            assign = type(var).assign

            def write(value: tf.Tensor, keep: tf.Tensor, *decay: tf.Tensor) -> None:
                old = var.value()
                new = _new(method, old - decay[0] if decay else old, value)
                assign(var, _select_bits(keep, new, old), read_value=False)

            fn = self.fused[name] = tf.function(write, jit_compile=True, autograph=False)
        fn(value, keep, *(() if decay is None else (decay,)))
        return var if kwargs.get("read_value", True) is not False else None

    def _scatter(self, target: Target, delta: Any, *args: Any, **kwargs: Any) -> Any:
        """Keras' own scatter, then the touched rows' frozen entries copied back from before it."""
        var = self.variable
        nd = self.method.startswith("scatter_nd")
        if nd:
            indices = tf.convert_to_tensor(delta)
            gather = lambda t: tf.gather_nd(t, indices)  # noqa: E731
        else:
            indices = tf.convert_to_tensor(delta.indices)
            delta = tf.IndexedSlices(delta.values, indices, delta.dense_shape)
            gather = lambda t: tf.gather(t, indices)  # noqa: E731
        old = gather(var.value())
        result = self.plain(var, delta, *args, **kwargs)
        new = gather(var.value())
        keep = target.keep()
        if nd:
            rows = tf.gather_nd(tf.broadcast_to(keep, tf.shape(var)), indices)
        else:
            rows = _masks.keep_rows(keep, indices, len(var.shape))
        back = tf.where(rows, new, old)
        if nd:
            type(var).scatter_nd_update(var, indices, back)
        else:
            type(var).scatter_update(var, tf.IndexedSlices(back, indices, delta.dense_shape))
        return result


def _new(method: str, old: tf.Tensor, value: tf.Tensor) -> tf.Tensor:
    """What the dense write method ``method`` writes, from the value it reads."""
    return {"assign": lambda: value, "assign_add": lambda: old + value, "assign_sub": lambda: old - value}[method]()


_BITS = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32, tf.float64: tf.int64}
"""The integer type of each float type's width: what ``_select_bits`` selects."""


def _select_bits(keep: tf.Tensor, new: tf.Tensor, old: tf.Tensor) -> tf.Tensor:
    """``tf.where(keep, new, old)`` as a select of the two values' bit patterns (bitcast to the integer of the same
    width and back): each entry's bits are copied from ``new`` or from ``old``, so the result is the float select's,
    bit for bit. The fused write uses it because XLA's CPU backend runs this integer select faster than the same
    select of floats (a 3.2 M-entry write: about 0.65 instead of 0.79 ms on the 2-core bench machine)."""
    ints = _BITS.get(old.dtype)
    if ints is None:
        return tf.where(keep, new, old)
    return tf.bitcast(tf.where(keep, tf.bitcast(new, ints), tf.bitcast(old, ints)), old.dtype)


def install(variable: Any, guards: Guards) -> None:
    """Shadow the write methods of every ``tf.Variable`` behind ``variable``, guarded by ``guards`` (idempotent;
    a variable several wrappers guard knows each of them)."""
    for component in api.components(variable):
        existing = component.__dict__.get("assign")
        if isinstance(existing, _Guard):
            owners = existing.owners
            owners[:] = [ref for ref in owners if ref() is not None]
            if not any(ref() is guards for ref in owners):
                owners.append(weakref.ref(guards))
            continue
        fused: dict[Any, Any] = {}
        owners = [weakref.ref(guards)]
        for method in WRITE_METHODS:
            if hasattr(type(component), method):
                object.__setattr__(component, method, _Guard(component, method, fused, owners))


# -- the per-variable update ------------------------------------------------------------------------
class WritePath:
    """The shadow of one leaf optimizer's ``update_step``: each variable on the path ``choose`` picks (the check of
    the whole step is ``write_step``'s)."""

    def __init__(self, leaf: keras.optimizers.Optimizer, guards: Guards):
        self.leaf, self.guards = leaf, guards
        self.plain = type(leaf).update_step.__get__(leaf)  # Keras' own, even if another wrapper installed a path
        self.elementwise = isinstance(leaf, ELEMENTWISE)
        object.__setattr__(leaf, "update_step", self.update_step)

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        entry = self.guards.entry(variable)
        if entry is None:  # not masked in this step: no mask (eagerly), sparse state, or another optimizer's
            return self.plain(gradient, variable, learning_rate)
        owned = [variable] + [slot for slot, _, _ in entry.slots]
        component = api.tf_variable(variable)
        k = id(component)
        entry.updated.add(k)
        held = entry.held.pop(k, None)  # its weight decay, held; each path below takes it its own way
        token = self.guards.token

        def plain() -> None:
            if held is not None:  # Keras' own decay, then Keras' own update
                decay = _unread(held, token)
                with tf.name_scope(token):
                    type(component).assign_sub(component, decay, read_value=False)
            with self.guards.passthrough(owned):
                self.plain(gradient, variable, learning_rate)

        def masked() -> None:
            if held is not None:  # the update's write of the variable subtracts it first
                entry.held[k] = held
            self._masked(entry, gradient, variable, learning_rate)
            left = entry.held.pop(k, None)
            if left is not None:  # the update did not write the variable: the decay alone, guarded
                component.assign_sub(_unread(left, token), read_value=False)

        paths = {KERAS: plain, SKIP: lambda: None, SELECT: masked}  # SKIP: wholly frozen, the decay moves nothing
        path = choose(entry, self.guards.tuning)
        if path != DISPATCH:
            return paths[path]()

        def run(fn: Callable[[], None]) -> Callable[[], tf.Tensor]:
            def branch() -> tf.Tensor:
                fn()
                return tf.constant(0)

            return branch

        branches = {UNMASKED: plain, FROZEN: paths[SKIP], _masks.ELEMENTS: masked}
        tf.switch_case(tf.cast(entry.mode(), tf.int32), [run(branches[m]) for m in sorted(branches)])
        return None

    def _masked(self, entry: Entry, gradient: Any, variable: Any, learning_rate: Any) -> None:
        deferred = [] if self.elementwise else [(s, t) for s, t, updated in entry.slots if updated]
        before = [tf.identity(tf.convert_to_tensor(s)) for s, _ in deferred]
        with self.guards.passthrough([s for s, _ in deferred]):
            self.plain(gradient, variable, learning_rate)
        for (slot, target), old in zip(deferred, before):  # the slots Keras updated, frozen entries copied back
            with self.guards.passthrough([slot]):
                now = tf.convert_to_tensor(slot)
                slot.assign(_masks.where(target.keep(), now, old, now))


def choose(entry: Entry, tuning: WriteTuning) -> str:
    """The path of one masked variable in this step (the module docstring's table): the one place it is chosen.

    Eagerly the mode is read now; in a graph it is read when the step runs, by ``dispatch``'s ``switch_case``,
    unless XLA compiles the step or the variable is small, where ``select`` (exact for any mask) costs less.
    """
    if tf.executing_eagerly():
        return {UNMASKED: KERAS, FROZEN: SKIP}.get(int(entry.mode()), SELECT)
    if api.in_xla() or _size(entry.variable) < tuning.dispatch_above:
        return SELECT
    return DISPATCH


def write_step(guards: Guards, entries: dict[int, Entry], write: Callable[[], Any], who: str,
         sparse: set[int] = frozenset()) -> None:
    """Run ``write`` (the inner optimizer's own code) so that no frozen entry of ``entries`` changes a bit.

    Every write is guarded (each variable on its path, ``choose``). In a graph, the trace-time check then reads
    every op ``write`` added -- nested functions' too -- for a write to a guarded variable that did not go
    through ``guards``. Eagerly (no trace to check), the snapshot-and-select construction also runs for every
    entry but those whose gradient (keys in ``sparse``) is an ``IndexedSlices`` (a scatter stays a scatter).
    """
    if tf.executing_eagerly():
        with guards.active(entries), _restore.restored({k: e for k, e in entries.items() if k not in sparse}):
            write()
        return
    graph = api.default_graph()
    start = len(graph.get_operations())
    with guards.active(entries):
        write()
        for entry in entries.values():  # a decay held for an update that never came: written now, guarded
            for k, held in list(entry.held.items()):
                del entry.held[k]
                entry.updated.add(k)
                held[0].assign_sub(_unread(held, guards.token), read_value=False)
    variables = [v for e in entries.values() for v in [e.variable] + [s for s, _, _ in e.slots]]
    check_writes(graph, start, variables, guards.token, who)


def entries_for(leaves: Sequence[Any], variables: Sequence[Any], keeps: dict[int, Callable[[], tf.Tensor]],
                modes: dict[int, Callable[[], Any]]) -> dict[int, Entry]:
    """The step's ``Entry`` for each variable that has a mask source: its targets and its leaves' slots."""
    entries = {}
    for v in variables:
        k = api.key(v)
        if k not in keeps:
            continue
        keep = keeps[k]
        slots = []
        for leaf in leaves:
            if not api.knows(leaf, v):
                continue
            averages = api.ema_averages(leaf)
            i = api.index(leaf, v)
            average = averages[i] if averages else None
            for attr, values in api.per_variable_lists(leaf).items():
                slot = values[i]
                if slot is None or any(slot is s for s, _, _ in slots):
                    continue
                is_average = average is not None and slot is average
                target = Target(_slot_keep(keep, v, slot, api.factor_axis(leaf, attr)), variable_path(slot),
                                source=v if is_average else None)
                slots.append((slot, target, attr not in api.OUTSIDE_UPDATE_STEP))
        owners = [leaf for leaf in leaves if api.knows(leaf, v)]
        folds = bool(owners) and all(type(leaf) in FOLDS for leaf in owners)
        entries[k] = Entry(v, modes[k], Target(keep, variable_path(v)), slots, folds)
    return entries


def _slot_keep(keep: Callable[[], tf.Tensor], variable: Any, slot: Any, axis: int | None) -> Callable[[], tf.Tensor]:
    return lambda: _masks.slot_keep(keep(), variable, slot, axis)


def reset_frozen_slots(entries: dict[int, Entry], initial: Callable[[Any], float]) -> None:
    """``policy="reset"`` for a mask given in the step: the frozen entries' moments go back to their start value."""
    for entry in entries.values():
        for slot, target, updated in entry.slots:
            if not updated or target.source is not None:
                continue
            now = tf.convert_to_tensor(slot)
            slot.assign(_masks.where(target.keep(), now, tf.cast(initial(slot), now.dtype), now))
