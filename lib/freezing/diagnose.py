"""``diagnose``: why did my frozen weight move? Every cause that can move it, found without training.

Given a compiled Keras 3 model and the entries believed frozen, ``diagnose`` reads the model, the
optimizer and its slots (no step is run, no variable is written) and returns one row per
(variable, cause) with the number of frozen entries the cause can move and a one-sentence fix.

``print(freezing.diagnose(model, masks={"fc/kernel": keep}))`` (``keep``: True = trains, as in ``set_mask``), or
``print(freezing.diagnose(model, [layer]))`` for targets frozen whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import keras
import numpy as np

from freezing import _foreign, _keras_api, _mask_api, masked_optimizer
from freezing._wrappers import wrapper_chain
from freezing.selection import variable_path
from freezing.slots import slot_initial_value, slots

CAUSES = (
    "gradient", "not_masked", "trainable_changed_after_compile", "unknown_to_optimizer",
    "moments", "weight_decay", "constraint", "ema", "batchnorm_statistics",
)
"""Every cause ``diagnose`` can report, in the order rows are listed for one variable."""

FIXES = {
    "gradient": "It is trainable and no mask holds it: set layer.trainable = False and recompile, or mask it with "
                "freezing.MaskedOptimizer.",
    "not_masked": "The MaskedOptimizer's mask lets these entries train: call opt.set_mask(...) with them set to False.",
    "trainable_changed_after_compile": "trainable was set to False after fit traced its train step, which still "
                                       "updates it: recompile with a fresh optimizer, or use freezing.MaskedOptimizer "
                                       "masks.",
    "unknown_to_optimizer": "It is trainable but the built optimizer does not know it, so the next traced step "
                            "raises 'Unknown variable' and a fresh optimizer trains it: set trainable = False and "
                            "recompile.",
    "moments": "The optimizer's momentum for these entries is not at its initial value, so a zero gradient still "
               "moves them: call freezing.reset_slots(opt, v, where=frozen) after every step, or use "
               "freezing.MaskedOptimizer.",
    "weight_decay": "Weight decay shrinks non-zero entries whatever the gradient: exclude the variable with "
                    "opt.exclude_from_weight_decay before build, or use freezing.MaskedOptimizer.",
    "constraint": "Keras applies the constraint to every entry after each step: remove it, or hold the entries "
                  "with freezing.MaskedOptimizer.",
    "ema": "With use_ema Keras overwrites the weights with their moving averages (every ema_overwrite_frequency "
           "steps and at the end of fit): set use_ema=False, call freezing.reset_slots(opt, v, where=frozen) after "
           "every step (it sets their averages to their weights; not with an ema_overwrite_frequency), or hold the "
           "entries with freezing.MaskedOptimizer.",
    "batchnorm_statistics": "BatchNormalization updates its moving statistics in training mode whatever the "
                            "optimizer: set the layer's trainable = False and recompile (it then runs in inference "
                            "mode).",
}
"""One fix per cause, as shown in the ``fix`` column."""

# Slots that only divide the gradient (a zero gradient stays a zero step, measured for every
# Keras 3.15 optimizer); any other slot (momentum) moves an entry whose gradient is zero.
_NORMALISERS = frozenset(
    {"velocity", "velocity_hat", "accumulator", "accumulated_grad", "accumulated_delta_var", "norm", "r", "c",
     "average_gradient"}
)


@dataclass(frozen=True)
class Cause:
    """One cause that can move ``entries`` frozen entries of ``variable`` (a path).

    Args:
        variable: the variable's path, as ``variable.path``.
        cause: one of ``CAUSES``.
        entries: how many of its frozen entries the cause can move.
        fix: one sentence saying what to do.

    Returns:
        A frozen (immutable, comparable) record.

    Example:
        >>> Cause("net/fc/kernel", "constraint", 6, FIXES["constraint"]).entries
        6
    """

    variable: str
    cause: str
    entries: int
    fix: str


class Diagnosis:
    """The rows ``diagnose`` found: list-like, printable as a table; empty means nothing moves them.

    Args:
        rows: the ``Cause`` rows.
        empty: what ``str`` says when there are none.

    Returns:
        ``len``, iteration and indexing over the rows; ``str`` is a plain-text table and
        ``_repr_markdown_`` a Markdown one for notebooks.

    Example:
        >>> d = Diagnosis([Cause("net/fc/kernel", "constraint", 6, FIXES["constraint"])])
        >>> len(d), d.causes, d.rows()[0]["entries"]
        (1, {'constraint'}, 6)
        >>> print(Diagnosis([]))
        no cause can move the frozen entries
    """

    def __init__(self, rows: list[Cause], empty: str = "no cause can move the frozen entries"):
        self._rows = list(rows)
        self._empty = empty

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Cause]:
        return iter(self._rows)

    def __getitem__(self, index: int) -> Cause:
        return self._rows[index]

    @property
    def causes(self) -> set[str]:
        """The cause ids found.

        Returns:
            A set of ``CAUSES`` members, such as ``{"moments", "weight_decay"}``.
        """
        return {row.cause for row in self._rows}

    def rows(self) -> list[dict[str, Any]]:
        """The rows as plain dicts, for a table library (``pd.DataFrame(d.rows())``).

        Returns:
            A list of ``{"variable", "cause", "entries", "fix"}`` dicts, in row order.
        """
        return [asdict(row) for row in self._rows]

    def _table(self) -> list[list[str]]:
        return [["variable", "cause", "entries", "fix"]] + [[r.variable, r.cause, str(r.entries), r.fix] for r in self]

    def __str__(self) -> str:
        if not self._rows:
            return self._empty
        table = self._table()
        widths = [max(len(row[i]) for row in table) for i in range(3)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in table]
        return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])

    def __repr__(self) -> str:
        return f"<Diagnosis: {len(self)} rows, causes {sorted(self.causes)}>"

    def _repr_markdown_(self) -> str:
        if not self._rows:
            return str(self)
        table = self._table()
        return "\n".join("| " + " | ".join(row) + " |" for row in table[:1] + [["---"] * 4] + table[1:])


FROZEN_IS_TARGETS = (
    "diagnose: frozen= takes the targets believed wholly frozen (a variable, a path, a layer, or a list of them); "
    "per-entry masks go in masks={target: keep} or masks=[(target, keep)], where True means trains, as in "
    "MaskedOptimizer.set_mask: what was frozen={target: frozen} is masks={target: ~frozen}"
)


def _items(frozen: Any, masks: Any) -> list[tuple[Any, np.ndarray]]:
    """(target, True where believed frozen) pairs from ``frozen`` (targets) and ``masks`` (True = trains)."""
    if frozen is None and masks is None:
        raise TypeError("diagnose: pass the entries believed frozen: frozen=[targets] (wholly frozen) or "
                        "masks={target: keep} (True = trains, as in set_mask)")
    items: list[tuple[Any, np.ndarray]] = []
    if frozen is not None:
        many = isinstance(frozen, (list, tuple, set))
        if isinstance(frozen, Mapping) or (many and any(isinstance(t, tuple) for t in frozen)):
            raise TypeError(FROZEN_IS_TARGETS)
        items += [(t, np.asarray(True)) for t in (frozen if many else [frozen])]
    if masks is not None:
        pairs = list(masks.items()) if isinstance(masks, Mapping) else list(masks)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"diagnose: masks= is {{target: keep}} or a list of (target, keep) pairs; got an item "
                                f"{type(pair).__name__} {pair!r:.60}")
            items.append((pair[0], ~np.asarray(pair[1]).astype(bool)))
    return items


def _targets(model: Any, frozen: Any, masks: Any = None) -> list[tuple[Any, np.ndarray]]:
    """Resolve the targets to (variable, bool mask shaped like it, True = believed frozen) pairs, merging repeats."""
    out: dict[int, tuple[Any, np.ndarray]] = {}
    for target, mask in _items(frozen, masks):
        if isinstance(target, str):
            variables = [_mask_api.find_path(target, model.variables, "diagnose")]
        elif isinstance(target, keras.layers.Layer):
            variables = list(target.weights)
        elif hasattr(target, "shape") and hasattr(target, "assign"):
            variables = [target]
        else:
            raise TypeError(f"diagnose: a target is a variable, a variable path or a layer; "
                            f"got {type(target).__name__}")
        for v in variables:
            shape, given = tuple(v.shape), np.asarray(mask).astype(bool)
            try:
                m = np.broadcast_to(given, shape)
            except ValueError:
                raise ValueError(
                    f"diagnose: mask for {variable_path(v)!r} has shape {given.shape}, not broadcastable to the "
                    f"variable's shape {shape}"
                ) from None
            old = out.get(id(v), (v, np.zeros(shape, bool)))[1]
            out[id(v)] = (v, old | m)
    return list(out.values())


def _chain(optimizer: Any) -> tuple[Any, Any]:
    """Return (the innermost Keras optimizer, the MaskedOptimizer in the chain or None)."""
    masked_type = masked_optimizer.MaskedOptimizer  # read now, not at import: a test replaces the class
    chain = wrapper_chain(optimizer)
    return chain[-1], next((o for o in chain if isinstance(o, masked_type)), None)


def _moved_by_moments(opt: Any, v: Any) -> np.ndarray | bool:
    """Entries a zero gradient still moves because of the optimizer's state (True: all of them)."""
    if isinstance(opt, keras.optimizers.Ftrl):
        return True  # Ftrl recomputes every entry it updates from its accumulators and the learning rate
    if not opt.built:
        return False  # fresh state: a zero gradient is a zero step
    moved: np.ndarray | bool = False
    averages = _keras_api.ema_averages(opt)  # an EMA average moves nothing in a step: the "ema" row's cause
    average = averages[_keras_api.index(opt, v)] if averages else None
    for name, slot in slots(opt, v).items():
        if name in _NORMALISERS or slot is average:
            continue
        off = np.asarray(slot.numpy()) != slot_initial_value(opt, name)
        moved = moved | (off if off.shape == tuple(v.shape) else bool(off.any()))
    return moved


def diagnose(model: Any, frozen: Any = None, optimizer: Any = None, *, masks: Any = None) -> Diagnosis:
    """Name every cause that can move the entries believed frozen, without training or writing anything.

    The entries believed frozen are given as ``frozen=`` (targets frozen whole) or ``masks=`` (True = trains,
    False = frozen: the meaning ``MaskedOptimizer.set_mask`` and ``MaskSchedule`` give a mask), or both.

    Args:
        model: a compiled Keras 3 model.
        frozen: a target or a list of targets believed wholly frozen. A target is a variable, a variable path
            (``variable.path``, or a unique end of it such as ``"fc/kernel"``) or a layer (all its weights).
        optimizer: the optimizer ``fit`` uses; defaults to ``model.optimizer``.
        masks: ``{target: keep}`` or a list of ``(target, keep)`` pairs; ``keep`` is bool-like, broadcastable
            to the variable, True where the entry trains. Keras variables cannot be dict keys (Python raises
            before ``diagnose`` runs): key by ``variable.path``, or pass ``(variable, keep)`` pairs.

    Returns:
        A ``Diagnosis``: one ``Cause`` row per (variable, cause) with at least one entry.

    Raises:
        ValueError: an unknown or ambiguous path (matches listed), a mask of the wrong shape, or no optimizer.
        TypeError: a target that is not a variable, a path or a layer; a dict or pairs given as ``frozen=``
            (the masks go in ``masks=``, True = trains); neither ``frozen`` nor ``masks``.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")], name="net")
        >>> model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse")
        >>> [(row.cause, row.entries) for row in diagnose(model, ["fc/kernel"])]
        [('gradient', 6), ('weight_decay', 6)]
        >>> [(row.cause, row.entries) for row in diagnose(model, masks={"fc/kernel": [[True, False]] * 3})]
        [('gradient', 3), ('weight_decay', 3)]
        >>> model.get_layer("fc").trainable = False
        >>> len(diagnose(model, [model.get_layer("fc")]))
        0
    """
    compiled = optimizer is None or optimizer is getattr(model, "optimizer", None)
    optimizer = getattr(model, "optimizer", None) if optimizer is None else optimizer
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"diagnose: expected a Keras 3 optimizer (compile the model or pass optimizer=); "
                         f"got {optimizer!r}")
    opt, masked = _chain(optimizer)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    cached = (compiled and getattr(model, "train_function", None) is not None
              and not getattr(model, "run_eagerly", False))
    owned, trainable = {id(v) for v in model.variables}, {id(v) for v in model.trainable_variables}
    stats = {  # BatchNormalization weights other than gamma and beta: the moving statistics
        id(w): layer
        for layer in _keras_api.flatten_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
        for w in layer.weights
        if all(w is not getattr(layer, a, None) for a in ("gamma", "beta"))
    }

    def known(o: Any, v: Any) -> bool:
        return v is not None and _keras_api.knows(o, v)

    rows: list[Cause] = []
    for v, f in _targets(model, frozen, masks):
        counts: dict[str, Any] = {}
        leaf = _keras_api.multi_optimizer_for(opt, v) if multi is not None and isinstance(opt, multi) else opt
        live = id(v) in trainable or (id(v) not in owned and getattr(v, "trainable", False))
        updated = False  # whether fit hands it to the optimizer
        sparse = masked is not None and masked.built and masked.state == "sparse"
        ref = masked._sparse.reference(v) if sparse else v  # sparse state: the inner optimizer knows a scratch
        if sparse and masked._sparse.holds_all(v):
            updated = live  # wholly frozen with no state at all: the mask below holds every entry
        elif id(v) in stats:
            bn = stats[id(v)]  # a non-trainable BN still updates them in a step traced while it was trainable
            if bn.trainable or (cached and any(known(opt, getattr(bn, a, None)) for a in ("gamma", "beta"))):
                counts["batchnorm_statistics"] = f
        elif live and opt.built and not known(opt, ref):
            counts["unknown_to_optimizer"] = f
        else:
            updated = live or (cached and known(opt, ref))
        keep = None
        if masked is not None and (updated or known(opt, ref)):
            keep = masked.get_mask(v)
            keep = None if keep is None else np.broadcast_to(np.asarray(keep, bool), f.shape)
        held = f & ~keep if keep is not None and masked.policy in ("hold", "reset") else np.zeros_like(f)
        exposed = f & ~held
        if updated and live:
            counts["not_masked" if masked is not None else "gradient"] = f if keep is None else f & keep
        elif updated:
            counts["trainable_changed_after_compile"] = exposed
        if updated and not (sparse and masked._sparse.holds_all(v)):
            moved = _moved_by_moments(leaf, ref)
            if ref is not v and isinstance(moved, np.ndarray):  # K entries of a sparse state, at their places
                moved = masked._sparse.to_full(v, moved)
            counts["moments"] = exposed & moved
            if _keras_api.uses_weight_decay(leaf, v):
                counts["weight_decay"] = exposed & (np.asarray(v.numpy()) != 0)
            if _foreign.own_constraint(v) is not None:
                counts["constraint"] = exposed
        if leaf.use_ema and ((leaf.ema_overwrite_frequency and known(leaf, ref)) or (updated and live)):
            counts["ema"] = exposed
        for cause in CAUSES:
            n = int(np.count_nonzero(counts.get(cause, 0)))
            if n:
                rows.append(Cause(variable_path(v), cause, n, FIXES[cause]))
    return Diagnosis(rows)
