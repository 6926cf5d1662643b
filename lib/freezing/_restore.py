"""How a step writes (``guarded``), and the snapshot-and-select construction: Keras' own step, then every
frozen bit selected back.

Before the inner optimizer's ``apply`` runs, the step reads the old value of every masked variable and of
every optimizer variable that belongs to it (slots, EMA average, gradient accumulator, Adafactor's
factors); after it, each of them is written once more as ``where(keep, new, old)`` (an EMA average's
frozen entries take the variable's old bits: a frozen entry's average is its weight). Whatever wrote
them in between -- any write method, a raw op, a nested function, a write this library has never seen
-- the frozen entries end with their old bits, so no check is needed.

It costs a copy and a select per masked tensor whether or not anything was frozen, where the guarded
write (``freezing._write_path``) folds the select into each write: ``make bench``'s ``*_restore`` rows
measure it in graphs (``WriteTuning.restore_in_graphs``), where the guarded write is cheaper in every row, so graphs
keep the guarded write and its trace-time check. ``MaskedOptimizer`` runs it, under the guard, for eager
steps, where there is no trace for the check to read: for every variable with a dense gradient (an
``IndexedSlices`` one stays a scatter under the guard alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from freezing import _keras_api as api
from freezing import _masks, _write_path


def _component(variable: Any) -> Any:
    """The ``tf.Variable`` this replica writes: the only one, or the replica's copy under a strategy."""
    components = api.components(variable)
    return components[api.replica_id() if len(components) > 1 else 0]


@contextlib.contextmanager
def restored(entries: dict[int, Any]) -> Iterator[None]:
    """Run the block, then write back the old bits of every frozen entry of the entries' variables and state."""
    saved = []
    for entry in entries.values():
        variable = _component(entry.variable)
        old_variable = tf.identity(variable.read_value())
        saved.append((variable, entry.target, old_variable, None))
        for slot, target, _ in entry.slots:
            component = _component(slot)
            saved.append((component, target, tf.identity(component.read_value()), old_variable))
    try:
        yield
    finally:
        for component, target, old, variable_old in saved:
            frozen = old if target.source is None else tf.cast(variable_old, old.dtype)
            now = component.read_value()
            type(component).assign(component, _masks.where(target.keep(), now, frozen, now), read_value=False)


def guarded(guards: Any, entries: dict[int, Any], write: Callable[[], Any], who: str,
            sparse: set[int] = frozenset()) -> None:
    """Run ``write`` (the inner optimizer's own code) so that no frozen entry of ``entries`` changes a bit.

    In a graph: the guarded write (``freezing._write_path``), then the trace-time check that every op it
    added -- nested functions' too -- that writes a guarded variable went through ``guards``. Eagerly (no
    trace to check): the guarded write, and the snapshot-and-select construction for every entry but those
    whose gradient (keys in ``sparse``) is an ``IndexedSlices`` (a scatter stays a scatter).
    """
    if tf.executing_eagerly():
        with guards.active(entries), restored({k: e for k, e in entries.items() if k not in sparse}):
            write()
        return
    if guards.tuning.restore_in_graphs:  # the alternative construction the bench measures
        with guards.active(entries, writes=False), restored(entries):
            write()
        return
    graph = api.default_graph()
    start = len(graph.get_operations())
    with guards.active(entries):
        write()
    variables = [v for e in entries.values() for v in [e.variable] + [s for s, _, _ in e.slots]]
    _write_path.check_writes(graph, start, variables, guards.token, who)
