"""Study 05, recipe 4: sparse fine-tuning of a fixed 1-5 % of entries chosen by accumulated squared gradients
(FISH-style), against full and last-layer fine-tuning."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import changed_bits
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.validation import check_range
from study.data import MnistSplits
from study.optimizers import make_optimizer
from study.training import LOSS, StepTimer, batch_indices, median_ms, restore, snapshot
from study.recipes.setup import (
    Pretrained, RecipesConfig, SPARSE_METHODS, StudyResult, _accuracies, _fit_steps, body_layers, mlp, old_new,
)


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
def sparse_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Fine-tune on digits 5-9: everything, the head only, or the FISH-selected entries. ``sparse_study(cfg, data, pre)``"""
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    rows, selection = [], []
    for method in SPARSE_METHODS:
        model = mlp(10, config.hidden)
        if method == "last_layer":
            for layer in body_layers(model):
                layer.trainable = False
        inner = make_optimizer("adam", config.learning_rate)
        opt = MaskedOptimizer(inner, policy="hold") if method == "sparse" else inner
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        opt_init = snapshot(opt.variables)
        all_vars = list(model.weights)
        fractions = config.sparse_fractions if method == "sparse" else [np.nan]
        for seed in config.seeds:
            scores = None
            for fraction in fractions:
                enable_determinism(seed)
                model.set_weights(pretrained[seed].extended)
                restore(opt.variables, opt_init)
                acc_before = _accuracies(model, data)
                trained = {v.path: np.ones(v.shape, bool) for v in model.trainable_variables}
                if method == "sparse":
                    if scores is None:
                        scores = squared_gradients(model, x_new, y_new, config.batch, config.fish_batches, seed)
                    for v, m in zip(model.trainable_variables, fish_masks(scores, fraction)):
                        opt.set_mask(v, m)
                        trained[v.path] = m
                        if seed == config.seeds[0]:
                            selection.append({"fraction": fraction, "variable": v.path, "selected": int(m.sum()),
                                              "entries": int(m.size), "share": float(m.mean())})
                before = snapshot(all_vars)
                timer = StepTimer()
                _fit_steps(model, x_new, y_new, config.batch, config.sparse_steps, seed, [timer])
                changed = outside = 0
                for v, b in zip(all_vars, before):
                    diff = changed_bits(b, v.numpy())
                    changed += int(diff.sum())
                    outside += int((diff & ~trained.get(v.path, np.zeros(v.shape, bool))).sum())
                after = _accuracies(model, data)
                variant = method if method != "sparse" else f"sparse {100 * fraction:g} %"
                rows.append({"method": method, "variant": variant, "fraction": fraction, "seed": seed,
                             "trained_entries": int(sum(m.sum() for m in trained.values())),
                             "total_entries": int(sum(np.prod(v.shape) for v in all_vars)),
                             "changed": changed, "changed_outside_selection": outside,
                             "acc_new": after["acc_new"], "acc_old": after["acc_old"],
                             "acc_old_before": acc_before["acc_old"],
                             "forgetting": acc_before["acc_old"] - after["acc_old"],
                             "step_time_ms": median_ms(timer.times),
                             "extra_state_bytes": opt.mask_bytes() if method == "sparse" else 0})
    return StudyResult(pd.DataFrame(rows), extra={"selection": pd.DataFrame(selection)})
