"""The trace-time check of a ``MaskedOptimizer`` step in a graph: no op writes a guarded variable but the guard.

When a step is traced, every op the inner optimizer's ``apply`` (or weight decay, or ``finalize_variable_values``)
added to the graph is inspected, and so are the graphs of the functions those ops run (``cond`` branches, loop
bodies, nested ``tf.function`` s): a write to a guarded variable that its owner's guard did not make (its ops carry
the owner's random name scope, ``Guards.token``) raises ``RuntimeError`` at trace time, whatever method, op or name
made it, so a Keras release that reroutes its writes fails loudly instead of moving frozen entries.

A held weight decay (``freezing._write_path``) adds the mirror-image check, ``check_unread``: between the decay and
the write it is folded into, no op may read the variable (it would read it undecayed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from freezing import _keras_api as api
from freezing.selection import variable_path

CALLS = ("If", "StatelessIf", "Case", "StatelessCase", "While", "StatelessWhile", "PartitionedCall",
         "StatefulPartitionedCall")
"""Op types that run functions of their own (branches, loop bodies, nested ``tf.function`` s): the check
reads their graphs too."""


def _is_write(op: Any) -> bool:
    return op.type.startswith(("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply",
                               "ResourceStridedSliceAssign"))


def _handles(graph: Any, variables: Sequence[Any]) -> dict[int, str]:
    """``id`` of every tensor that stands for a guarded variable's handle in ``graph`` -> its path."""
    found: dict[int, str] = {}
    for v in variables:
        for component in api.components(v):
            found[id(component.handle)] = variable_path(v)
    chain = []
    g = graph
    while g is not None:
        chain.append(g)
        g = getattr(g, "outer_graph", None)
    for g in reversed(chain):
        for external, internal in getattr(g, "captures", ()):
            if id(external) in found:
                found[id(internal)] = found[id(external)]
    return found


def _check_ops(ops: Sequence[Any], handles: dict[int, str], token: str, who: str) -> None:
    for op in ops:
        if token in op.name:  # the owner's own write, or a function it made (the fused write)
            continue
        if _is_write(op):
            path = handles.get(id(op.inputs[0])) if op.inputs else None
            if path is not None:
                raise RuntimeError(
                    f"MaskedOptimizer: {who} wrote {path!r} with {op.type} (op {op.name!r}) outside the masked "
                    f"write; frozen entries would move. Keras {keras.__version__} updates variables in a way this "
                    "version of freezing does not guard: use a Keras in the range freezing declares, or report it."
                )
        if op.type in CALLS:
            for inner in api.called_graphs(op):
                mapped = {id(i): handles[id(e)] for e, i in getattr(inner, "captures", ()) if id(e) in handles}
                for outer_input, inner_input in zip(op.inputs[1 if op.type.endswith(("If", "Case")) else 0:],
                                                    inner.inputs):
                    if id(outer_input) in handles:
                        mapped[id(inner_input)] = handles[id(outer_input)]
                if mapped:
                    _check_ops(inner.get_operations(), mapped, token, who)


def check_writes(graph: Any, start: int, guarded: Sequence[Any], token: str, who: str) -> None:
    """Raise if an op created since ``start`` -- in ``graph`` or in any function it calls (branches, loop
    bodies, nested ``tf.function`` s) -- writes a guarded variable and is not the owner's own write."""
    _check_ops(graph.get_operations()[start:], _handles(graph, guarded), token, who)


HARMLESS_READS = ("VariableShape",)
"""Op types that take a variable's handle but read none of its values."""


def check_unread(component: Any, graph: Any, start: int, token: str) -> None:
    """Raise if an op added to ``graph`` since op ``start``, or to any graph nested in it up to the one being traced
    (a ``cond`` branch, a ``switch_case`` branch), reads ``component``'s values -- the guard's own ops included (a
    scatter's read of the touched rows would read them undecayed too).

    A held weight decay is only written when it is folded into the variable's next write; an op that read the
    variable in between would read it undecayed, so a Keras release whose update reads the variable it updates
    fails loudly here instead of computing its trainable entries from other values than plain Keras.

    Raises:
        RuntimeError: such a read, or a held write met in a graph that is not ``graph`` or nested in it.
    """
    chain = [api.default_graph()]
    while chain[-1] is not graph:
        outer = getattr(chain[-1], "outer_graph", None)
        if outer is None:
            raise RuntimeError(f"MaskedOptimizer: the weight decay of {variable_path(component)!r} was held in one "
                               "graph and met its update in another; report it, with this Keras version "
                               f"({keras.__version__})")
        chain.append(outer)
    handles = set(_handles(chain[0], [component]))
    for g in chain:
        for op in g.get_operations()[start if g is graph else 0:]:
            if op.type in HARMLESS_READS:  # the owner's own ops too: none of them may read it either
                continue
            if any(id(t) in handles for t in op.inputs):
                raise RuntimeError(
                    f"MaskedOptimizer: an op read {variable_path(component)!r} (op {op.name!r}, {op.type}) between "
                    "its weight decay and its update, which this version of freezing folds into one write; frozen "
                    f"entries are safe, but trainable ones would differ from Keras {keras.__version__}'s: use a "
                    "Keras in the range freezing declares, or report it."
                )
