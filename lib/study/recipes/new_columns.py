"""Study 05, recipe 1: train only the new output columns of an extended classifier (AdamW)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

import freezing
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from study.data import MnistSplits
from study.optimizers import make_optimizer
from study.recipes.setup import (
    _POLICY,
    NEW_COLUMN_METHODS,
    OLD_CLASSES,
    CopyBack,
    Pretrained,
    RecipesConfig,
    StudyResult,
    _accuracies,
    _diagnosis_rows,
    _digest,
    _fit_steps,
    _momentum_nonzero,
    _moved,
    body_layers,
    mlp,
    old_new,
)
from study.training import LOSS, StepTimer, median_ms, restore, snapshot


def new_columns_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Train only the 5 new output columns of the extended classifier on
    digits 5-9; body frozen. ``new_columns_study(cfg, data, pre)``"""
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    keep = np.arange(10) >= OLD_CLASSES  # the new columns train
    rows, diagnosis = [], []
    for method in NEW_COLUMN_METHODS:
        model = mlp(10, config.hidden)
        for layer in body_layers(model):
            layer.trainable = False
        head = model.get_layer("head")
        inner = make_optimizer(config.new_columns_optimizer, config.new_columns_learning_rate)
        constraints = None
        if method == "constraint":
            opt = inner
            constraints = (CopyBack(keep[None, :], head.kernel.numpy()), CopyBack(keep, head.bias.numpy()))
            head.kernel.constraint, head.bias.constraint = constraints
        else:
            opt = MaskedOptimizer(inner, policy=_POLICY[method])
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        if isinstance(opt, MaskedOptimizer):
            opt.set_mask(head.kernel, keep[None, :])
            opt.set_mask(head.bias, keep)
        opt_init = snapshot(opt.variables)
        frozen = {head.kernel.path: ~keep[None, :], head.bias.path: ~keep}
        n_frozen = int(head.kernel.shape[0] * OLD_CLASSES + OLD_CLASSES)
        for seed in config.seeds:
            enable_determinism(seed)
            model.set_weights(pretrained[seed].extended)
            restore(opt.variables, opt_init)
            if constraints is not None:
                constraints[0].reset(values=head.kernel.numpy())
                constraints[1].reset(values=head.bias.numpy())
            before = [head.kernel.numpy().copy(), head.bias.numpy().copy()]
            if seed == config.seeds[0]:
                diagnosis += _diagnosis_rows("1 new columns", method,
                                             freezing.diagnose(model, masks={k: ~m for k, m in frozen.items()}))
            timer = StepTimer()
            _fit_steps(model, x_new, y_new, config.batch, config.new_columns_steps, seed, [timer])
            after = [head.kernel.numpy(), head.bias.numpy()]
            moved = _moved(before[0], after[0], ~keep[None, :]) + _moved(before[1], after[1], ~keep)
            old_a, old_b = (np.concatenate([w[..., :OLD_CLASSES].ravel() for w in ws]) for ws in (after, before))
            largest = float(np.max(np.abs(old_a - old_b)) / np.max(np.abs(old_b)))
            trained = _moved(before[0], after[0], keep[None, :]) + _moved(before[1], after[1], keep)
            slot_moved = sum(_momentum_nonzero(inner, v, f) for v, f in ((head.kernel, ~keep[None, :]),
                                                                          (head.bias, ~keep)))
            extra_bytes = (opt.mask_bytes() if isinstance(opt, MaskedOptimizer)
                           else sum(c.state_bytes() for c in constraints))
            rows.append({"method": method, "optimizer": config.new_columns_optimizer, "seed": seed,
                         "weights": _digest(model.weights),
                         **_accuracies(model, data), "acc_old_pretrained": pretrained[seed].acc_old,
                         "old_moved": moved, "old_entries": n_frozen, "old_max_relative_change": largest,
                         "new_changed": trained,
                         "frozen_momentum_nonzero": slot_moved, "extra_state_bytes": extra_bytes,
                         "step_time_ms": median_ms(timer.times)})
    runs = pd.DataFrame(rows)
    ref = runs[runs["method"] == "exact"].set_index("seed")["weights"]
    runs["same_weights_as_exact"] = [w == ref.get(s) for s, w in zip(runs["seed"], runs["weights"])]
    return StudyResult(runs.drop(columns="weights"), pd.DataFrame(diagnosis))
