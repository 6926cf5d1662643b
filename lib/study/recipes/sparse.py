"""Study 05, recipe 4: sparse fine-tuning of a fixed 1-5 % of entries chosen by accumulated squared gradients
(FISH-style), against full and last-layer fine-tuning and Keras' own LoRA at a comparable count of trained
parameters; the sparse selection trained with dense ``hold`` state and with ``state="sparse"`` (optimizer
state only for the selected entries)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import changed_bits
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from study.data import MnistSplits
from study.intervals import bound_text, interval_sign, t_interval
from study.optimizers import make_optimizer
from study.recipes.setup import (
    SPARSE_METHODS,
    Pretrained,
    RecipesConfig,
    StudyResult,
    _accuracies,
    _digest,
    _fit_steps,
    body_layers,
    mlp,
    old_new,
)
from study.training import LOSS, StepTimer, batch_indices, median_ms, restore, snapshot
from study.validation import check_range

METHODS = (*SPARSE_METHODS, "sparse_state", "lora")
"""Recipe 4's methods: full, last layer, the FISH selection with dense hold state and with sparse state, LoRA."""

SPARSE_COLUMNS = {
    "optimizer_bytes": "bytes of every variable the optimizer holds: slots, step counter, learning rate, "
                       "masks, sparse selections and scratch (bytes)",
    "lora_rank": "rank r of layer.enable_lora(r) on every Dense layer (LoRA only; empty for other methods)",
    "weights_digest": "SHA-256 of all weights' bits at the end: equal digests mean bit-identical weights",
}
"""Columns recipe 4 adds to ``COLUMNS`` (pass ``{**COLUMNS, **SPARSE_COLUMNS}`` to ``save_table``)."""
SPARSE_COLUMNS.update({f"{name}_{stat}": f"{label} over seeds of: {meaning}"
                       for name, meaning in list(SPARSE_COLUMNS.items())
                       for stat, label in (("mean", "mean"), ("std", "standard deviation"), ("min", "smallest"),
                                           ("max", "largest"))})


def fish_masks(scores: Sequence[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Keep-masks of the ``fraction`` of entries with the largest scores, chosen over all tensors together.

    FISH (Sung et al., 2021) scores an entry by its accumulated squared gradient on the new task; exactly
    ``max(1, round(fraction * total))`` entries are kept. ``fish_masks([np.array([1., 5.]), np.array([3.])], 1/3)``
    gives ``[[False, True], [False]]``.
    """
    check_range("fraction", fraction, 0.0, 1.0, low_open=True)
    flat = np.concatenate([np.asarray(s, np.float64).ravel() for s in scores])
    k = max(1, int(round(fraction * flat.size)))
    chosen = np.zeros(flat.size, bool)
    chosen[np.argsort(-flat, kind="stable")[:k]] = True
    out, start = [], 0
    for s in scores:
        size = int(np.size(s))
        out.append(chosen[start: start + size].reshape(np.shape(s)))
        start += size
    return out


def squared_gradients(model: keras.Model, x: np.ndarray, y: np.ndarray, batch: int, batches: int,
                      seed: int) -> list[np.ndarray]:
    """Sum over ``batches`` minibatches of the squared gradient of the loss, per trainable variable.

    ``squared_gradients(model, x_new, y_new, 64, 10, seed=0)`` -> one array per ``model.trainable_variables``.
    The gradient step is traced once per model and reused by later calls.
    """
    variables = model.trainable_variables
    grads = _SQUARED_GRADIENTS.get(model)
    if grads is None:
        @tf.function
        def grads(xb: tf.Tensor, yb: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                loss = LOSS(yb, model(xb, training=False))
            return [tf.square(g) for g in tape.gradient(loss, variables)]

        _SQUARED_GRADIENTS[model] = grads
    total = [np.zeros(v.shape, np.float64) for v in variables]
    for idx in batch_indices(len(y), batch, batches, seed):
        for t, g in zip(total, grads(x[idx], y[idx])):
            t += g.numpy()
    return total


_SQUARED_GRADIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# -- 4. sparse fine-tuning -------------------------------------------------------------------------------
def lora_rank(model: keras.Model, entries: int) -> int:
    """The LoRA rank whose adapters on every Dense layer of ``model`` hold about ``entries`` parameters.

    A rank-r adapter of a Dense layer with an n x m kernel holds r * (n + m) parameters.
    ``lora_rank(mlp(10), 1094) == 1`` (the MLP's adapters hold 1,178 per rank).
    """
    per_rank = sum(int(layer.kernel.shape[0] + layer.kernel.shape[1]) for layer in model.layers
                   if isinstance(layer, keras.layers.Dense))
    return max(1, int(round(entries / per_rank)))


def optimizer_bytes(optimizer: keras.optimizers.Optimizer) -> int:
    """Bytes of every variable ``optimizer`` holds (``MaskedOptimizer.state_bytes``
    for the wrapper). ``optimizer_bytes(adam)``"""
    if isinstance(optimizer, MaskedOptimizer):
        return optimizer.state_bytes()
    return int(sum(int(tf.size(v).numpy()) * tf.as_dtype(v.dtype).size for v in optimizer.variables))


def _effective(model: keras.Model) -> list[np.ndarray]:
    """Each Dense layer's kernel as the forward pass uses it (with LoRA: kernel + scaled A @ B) and its bias."""
    out = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense):
            out += [np.array(layer.kernel), np.array(layer.bias)]
    return out


def _lora_model(config: RecipesConfig, weights: Sequence[np.ndarray], rank: int, seed: int) -> keras.Model:
    """The pretrained MLP with ``layer.enable_lora(rank)`` on
    every Dense layer (seeded adapters), compiled with Adam."""
    enable_determinism(seed)
    model = mlp(10, config.hidden)
    model.set_weights(weights)
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dense):
            layer.enable_lora(rank)
    model.compile(optimizer=make_optimizer("adam", config.learning_rate), loss=LOSS)
    return model


def _sparse_state_model(config: RecipesConfig, weights: Sequence[np.ndarray], masks: Sequence[np.ndarray]):
    """The pretrained MLP with ``MaskedOptimizer(Adam, state="sparse")``
    for the selection ``masks`` (set before build)."""
    model = mlp(10, config.hidden)
    model.set_weights(weights)
    opt = MaskedOptimizer(make_optimizer("adam", config.learning_rate), state="sparse")
    for v, m in zip(model.trainable_variables, masks):
        opt.set_mask(v, m)
    model.compile(optimizer=opt, loss=LOSS)
    opt.build(model.trainable_variables)
    return model, opt


def sparse_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Fine-tune on digits 5-9: everything, the head only, the FISH-selected entries (dense and sparse optimizer state),
    or LoRA adapters of a comparable size. ``sparse_study(cfg, data, pre)``"""
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    rows, selection = [], []
    chosen: dict[tuple[int, float], list[np.ndarray]] = {}  # (seed, fraction) -> the FISH masks, shared by methods
    scores: dict[int, list[np.ndarray]] = {}  # seed -> accumulated squared gradients of the pretrained model
    total = int(mlp(10, config.hidden).count_params())
    for method in METHODS:
        fractions = config.sparse_fractions if method in ("sparse", "sparse_state", "lora") else [np.nan]
        if method in ("full", "last_layer", "sparse"):  # one compiled model for every seed: weights and state reset
            model = mlp(10, config.hidden)
            if method == "last_layer":
                for layer in body_layers(model):
                    layer.trainable = False
            inner = make_optimizer("adam", config.learning_rate)
            opt = MaskedOptimizer(inner, policy="hold") if method == "sparse" else inner
            model.compile(optimizer=opt, loss=LOSS)
            opt.build(model.trainable_variables)
            opt_init = snapshot(opt.variables)
        for seed in config.seeds:
            for fraction in fractions:
                rank = None
                if method in ("sparse", "sparse_state") and (seed, fraction) not in chosen:
                    if seed not in scores:
                        enable_determinism(seed)
                        probe = mlp(10, config.hidden)
                        probe.set_weights(pretrained[seed].extended)
                        scores[seed] = squared_gradients(probe, x_new, y_new, config.batch, config.fish_batches, seed)
                    chosen[(seed, fraction)] = fish_masks(scores[seed], fraction)
                if method == "sparse_state":
                    model, opt = _sparse_state_model(config, pretrained[seed].extended, chosen[(seed, fraction)])
                elif method == "lora":
                    rank = lora_rank(mlp(10, config.hidden), fraction * total)
                    model = _lora_model(config, pretrained[seed].extended, rank, seed)
                    opt = model.optimizer
                enable_determinism(seed)
                if method in ("full", "last_layer", "sparse"):
                    model.set_weights(pretrained[seed].extended)
                    restore(opt.variables, opt_init)
                acc_before = _accuracies(model, data)
                if method == "lora":
                    trained = None
                    trained_entries = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
                else:
                    trained = {v.path: np.ones(v.shape, bool) for v in model.trainable_variables}
                    if method in ("sparse", "sparse_state"):
                        for v, m in zip(model.trainable_variables, chosen[(seed, fraction)]):
                            trained[v.path] = m
                            if method == "sparse":
                                opt.set_mask(v, m)
                                if seed == config.seeds[0]:
                                    selection.append({"fraction": fraction, "variable": v.path,
                                                      "selected": int(m.sum()), "entries": int(m.size),
                                                      "share": float(m.mean())})
                    trained_entries = int(sum(m.sum() for m in trained.values()))
                weights = list(model.weights) if trained is not None else None
                before = snapshot(weights) if trained is not None else _effective(model)
                timer = StepTimer()
                _fit_steps(model, x_new, y_new, config.batch, config.sparse_steps, seed, [timer])
                changed = outside = 0
                if trained is None:  # LoRA: what the forward pass uses, kernel + A @ B, against the pretrained one;
                    for b, a in zip(before, _effective(model)):  # it may change every entry of what it adapts
                        changed += int(changed_bits(b, a).sum())
                else:
                    for v, b in zip(weights, before):
                        diff = changed_bits(b, v.numpy())
                        changed += int(diff.sum())
                        outside += int((diff & ~trained.get(v.path, np.zeros(v.shape, bool))).sum())
                after = _accuracies(model, data)
                variant = {"sparse": f"sparse {100 * fraction:g}%", "sparse_state": f"sparse state {100 * fraction:g}%",
                           "lora": f"LoRA r={rank}"}.get(method, method)
                rows.append({"method": method, "variant": variant, "fraction": fraction, "seed": seed,
                             "lora_rank": rank, "trained_entries": trained_entries, "total_entries": total,
                             "changed": changed, "changed_outside_selection": outside,
                             "acc_new": after["acc_new"], "acc_old": after["acc_old"],
                             "acc_old_before": acc_before["acc_old"],
                             "forgetting": acc_before["acc_old"] - after["acc_old"],
                             "step_time_ms": median_ms(timer.times),
                             "extra_state_bytes": opt.mask_bytes() if isinstance(opt, MaskedOptimizer) else 0,
                             "optimizer_bytes": optimizer_bytes(opt),
                             "weights_digest": _digest(model.weights) if method != "lora" else ""})
    return StudyResult(pd.DataFrame(rows), extra={"selection": pd.DataFrame(selection)})


def sparse_costs(runs: pd.DataFrame) -> dict:
    """What each recipe-4 variant costs and whether the sparse state trained the dense state's bits, for metrics.json.

    ``{"variants": {variant: {optimizer_bytes, step_time_ms, step_time_ms_std, trained_entries, changed_mean,
    lora_rank}}, "by_fraction": {"0.01": {sparse_state_bytes_share, same_bits, lora_variant}}}``;
    ``sparse_costs(r4.runs)``.
    """
    variants = {}
    for variant, g in runs.groupby("variant", sort=False):
        rank = g["lora_rank"].iloc[0]
        variants[variant] = {"method": str(g["method"].iloc[0]),
                             "optimizer_bytes": float(g["optimizer_bytes"].mean()),
                             "step_time_ms": float(g["step_time_ms"].mean()),
                             "step_time_ms_std": float(g["step_time_ms"].std()) if len(g) > 1 else 0.0,
                             "trained_entries": int(g["trained_entries"].iloc[0]),
                             "changed_mean": float(g["changed"].mean()),
                             "lora_rank": None if rank != rank or rank is None else int(rank)}
    by_fraction = {}
    for fraction, g in runs[runs["method"].isin(["sparse", "sparse_state", "lora"])].groupby("fraction"):
        dense, state = g[g["method"] == "sparse"], g[g["method"] == "sparse_state"]
        pairs = dense.set_index("seed")["weights_digest"].align(state.set_index("seed")["weights_digest"])
        by_fraction[f"{fraction:g}"] = {
            "fraction": float(fraction),
            "dense_variant": str(dense["variant"].iloc[0]), "state_variant": str(state["variant"].iloc[0]),
            "lora_variant": str(g[g["method"] == "lora"]["variant"].iloc[0]),
            "sparse_state_bytes_share": float(state["optimizer_bytes"].mean() / dense["optimizer_bytes"].mean()),
            "same_bits": bool((pairs[0] == pairs[1]).all()),
        }
    return {"variants": variants, "by_fraction": by_fraction}


LADDER_METHODS = ("last_layer", "sparse", "full")
"""Recipe 4's methods that change only the entries they are allowed to: the rungs of its budget ladder."""


def _paired(runs: pd.DataFrame, lower: str, upper: str, column: str) -> dict[str, Any]:
    """``upper`` minus ``lower`` in ``column``, paired by seed: the mean, its t interval and its verdict."""
    by = runs.pivot_table(index="seed", columns="variant", values=column)
    diff = (by[upper] - by[lower]).dropna()
    mean, low, high = t_interval(diff)
    return {"lower": lower, "upper": upper, "mean": mean, "low": low, "high": high,
            "low_text": bound_text(low, "floor"), "high_text": bound_text(high, "ceil"),
            "sign": interval_sign(low, high), "seeds": int(len(diff))}


def budget_ladder(runs: pd.DataFrame, label: Callable[[str], str] = str) -> dict[str, Any]:
    """Recipe 4's budget ladder: the ``LADDER_METHODS`` variants in the order of their trained entries, and per
    column (``acc_new``, ``forgetting``) each step up the ladder as a paired difference over seeds (the upper rung
    minus the lower, ``study.intervals``), and the whole ladder's (the top rung minus the bottom one).

    ``{"variants", "names" (``label`` of each), "entries", "steps": {column: [difference, ...]}, "ends": {column:
    difference}, "means_rise": {column: every step's mean above zero}, "intervals_rise": {column: every step's
    interval above zero}}``. A difference is ``{"lower", "upper", "lower_name", "upper_name", "mean", "low", "high",
    "low_text", "high_text", "sign", "seeds"}``: its bounds as the report prints them (rounded outward) and its verdict
    read off them (``interval_sign``: "+", "-", or "0" where the interval holds zero).
    ``budget_ladder(r4.runs, recipes.method_label)``
    """
    budget = runs.groupby("variant")["trained_entries"].first().sort_values(kind="stable")
    kind = runs.groupby("variant")["method"].first()
    ladder = [str(v) for v in budget.index if kind[v] in LADDER_METHODS]
    out: dict[str, Any] = {"variants": ladder, "names": [label(v) for v in ladder],
                           "entries": [int(budget[v]) for v in ladder], "steps": {}, "ends": {}, "means_rise": {},
                           "intervals_rise": {}}
    for column in ("acc_new", "forgetting"):
        steps = [_paired(runs, a, b, column) for a, b in zip(ladder, ladder[1:])]
        ends = _paired(runs, ladder[0], ladder[-1], column)
        for d in [*steps, ends]:
            d["lower_name"], d["upper_name"] = label(d["lower"]), label(d["upper"])
        out["steps"][column], out["ends"][column] = steps, ends
        out["means_rise"][column] = all(s["mean"] > 0 for s in steps)
        out["intervals_rise"][column] = all(s["sign"] == "+" for s in steps)
    return out
