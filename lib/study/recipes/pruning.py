"""Study 05, recipe 2: magnitude-prune ``fc1`` of the Deep MNIST CNN, then fine-tune with the dense run's
Adam/AdamW state, keeping the pruned weights at zero."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import pandas as pd

import freezing
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.slots import slots
from study.data import MnistSplits
from study.models import deep_mnist_cnn
from study.optimizers import make_optimizer
from study.recipes.setup import (
    _POLICY,
    PRUNE_METHODS,
    PRUNED_LAYER,
    CopyBack,
    RecipesConfig,
    StudyResult,
    _diagnosis_rows,
    _digest,
    _fit_steps,
    _momentum,
    _momentum_nonzero,
    _moved,
)
from study.training import LOSS, StepTimer, accuracy, median_ms, restore, snapshot
from study.validation import check_range


def magnitude_mask(weights: np.ndarray, sparsity: float) -> np.ndarray:
    """Keep-mask of magnitude pruning: False for exactly ``round(sparsity * size)`` smallest ``|w|``.

    ``magnitude_mask(np.array([3., -1., 2., .5]), 0.5).tolist() == [True, False, True, False]``
    """
    check_range("sparsity", sparsity, 0.0, 1.0)
    flat = np.abs(np.asarray(weights)).ravel()
    pruned = int(round(sparsity * flat.size))
    keep = np.ones(flat.size, bool)
    if pruned:
        keep[np.argpartition(flat, pruned - 1)[:pruned]] = False
    return keep.reshape(np.shape(weights))


# -- 2. pruned weights stay zero --------------------------------------------------------------------
@dataclass
class CnnState:
    """The Deep MNIST CNN after dense training with Adam: all its variables and Adam's state."""

    seed: int
    variables: list[np.ndarray]
    slots: dict[str, dict[str, np.ndarray]]
    iterations: int
    accuracy: float
    step_time_ms: float


def _eval_cnn(model: keras.Model, data: MnistSplits, n: int) -> float:
    return accuracy(model, data.x_test[:n], data.y_test[:n])


def pretrain_cnns(config: RecipesConfig, data: MnistSplits) -> dict[int, CnnState]:
    """Per seed: dense training of the Deep MNIST CNN on all digits with
    Adam; keep weights and Adam state. ``pretrain_cnns(cfg, data)``"""
    model = deep_mnist_cnn()
    opt = make_optimizer("adam", config.learning_rate)
    model.compile(optimizer=opt, loss=LOSS)
    opt.build(model.trainable_variables)
    opt_init = snapshot(opt.variables)
    out = {}
    for seed in config.seeds:
        enable_determinism(seed)
        restore(model.variables, snapshot(deep_mnist_cnn().variables))  # this seed's init and dropout stream
        restore(opt.variables, opt_init)
        timer = StepTimer()
        _fit_steps(model, data.x_train, data.y_train, config.prune_batch, config.prune_pretrain_steps, seed, [timer])
        state = {v.path: {k: s.numpy().copy() for k, s in slots(opt, v).items()} for v in model.trainable_variables}
        out[seed] = CnnState(seed, snapshot(model.variables), state, int(opt.iterations.numpy()),
                             _eval_cnn(model, data, config.prune_eval_samples), median_ms(timer.times))
    return out


def load_cnn_state(model: keras.Model, optimizer: Any, state: CnnState) -> None:
    """Put a ``CnnState`` into a Deep MNIST CNN and a built Adam/AdamW
    (looked up through wrappers). ``load_cnn_state(m, opt, s)``"""
    restore(model.variables, state.variables)
    inner = freezing.unwrap(optimizer)
    for v in model.trainable_variables:
        for name, slot in slots(inner, v).items():
            slot.assign(state.slots[v.path][name])
    inner.iterations.assign(state.iterations)


def dense_cnn(state: CnnState, optimizer: str = "adam", learning_rate: float = 1e-3) -> tuple[keras.Model, Any]:
    """A new Deep MNIST CNN and a built optimizer holding the state of dense training. ``model, adam = dense_cnn(s)``"""
    model = deep_mnist_cnn()
    opt = make_optimizer(optimizer, learning_rate)
    opt.build(model.trainable_variables)
    load_cnn_state(model, opt, state)
    return model, opt


def pruning_study(config: RecipesConfig, data: MnistSplits, states: Mapping[int, CnnState]) -> StudyResult:
    """Prune fc1 to each sparsity, fine-tune with the dense run's Adam/AdamW state; one row per run.

    ``extra["fresh_gradient_mask"]``: the gradient mask once more per optimizer and seed, at the highest sparsity,
    with the optimizer's state reset to that of a new optimizer (zero moments, step 0) instead of the dense
    run's. ``pruning_study(cfg, data, states)``
    """
    rows, diagnosis, pruned_acc, acc_by_weights, masks, fresh_rows = [], [], {}, {}, {}, []
    for name in config.prune_optimizers:
        for method in PRUNE_METHODS:
            model = deep_mnist_cnn()
            inner = make_optimizer(name, config.learning_rate)
            fc1 = model.get_layer(PRUNED_LAYER)
            constraint = None
            if method == "constraint":
                opt = inner
                constraint = CopyBack(np.ones(fc1.kernel.shape, bool))  # re-zero
                fc1.kernel.constraint = constraint
            else:
                opt = MaskedOptimizer(inner, policy=_POLICY[method])
            model.compile(optimizer=opt, loss=LOSS)
            opt.build(model.trainable_variables)
            fresh = snapshot(opt.variables)  # a new optimizer's state: zero moments, step 0
            for seed in config.seeds:
                for sparsity in config.sparsities:
                    enable_determinism(seed)
                    load_cnn_state(model, opt, states[seed])
                    key = (seed, sparsity)
                    if key not in masks:  # the same dense weights for every optimizer and method
                        masks[key] = magnitude_mask(fc1.kernel.numpy(), sparsity)
                    keep = masks[key]
                    fc1.kernel.assign(np.where(keep, fc1.kernel.numpy(), np.float32(0)))
                    if constraint is not None:
                        constraint.reset(keep=keep)
                    else:
                        opt.set_mask(fc1.kernel, keep)
                    if key not in pruned_acc:
                        pruned_acc[key] = _eval_cnn(model, data, config.prune_eval_samples)
                    momentum_at_start = _momentum_nonzero(inner, fc1.kernel, ~keep)
                    m_start = _momentum(inner, fc1.kernel)
                    if seed == config.seeds[0] and sparsity == config.sparsities[0]:
                        diagnosis += _diagnosis_rows(f"2 pruning, {name}", method,
                                                     freezing.diagnose(model, masks={fc1.kernel.path: keep}))
                    before = fc1.kernel.numpy().copy()
                    timer = StepTimer()
                    _fit_steps(model, data.x_train, data.y_train, config.prune_batch, config.prune_steps,
                               seed + 1000, [timer])
                    after = fc1.kernel.numpy()
                    digest = _digest(model.trainable_variables)
                    if digest not in acc_by_weights:  # bit-identical weights have the same accuracy
                        acc_by_weights[digest] = _eval_cnn(model, data, config.prune_eval_samples)
                    m_changed = _moved(m_start, _momentum(inner, fc1.kernel), ~keep)
                    extra = opt.mask_bytes() if constraint is None else constraint.state_bytes()
                    rows.append({"optimizer": name, "method": method, "seed": seed, "sparsity": sparsity,
                                 "pruned": int((~keep).sum()), "moved": _moved(before, after, ~keep),
                                 "sparsity_kept": float(np.mean(after == 0)),
                                 "momentum_nonzero_at_start": momentum_at_start, "momentum_changed": m_changed,
                                 "acc_dense": states[seed].accuracy, "acc_pruned": pruned_acc[key],
                                 "acc_finetuned": acc_by_weights[digest],
                                 "step_time_ms": median_ms(timer.times), "extra_state_bytes": extra,
                                 "weights": digest})
            if method == "gradient_mask":  # the same mask with a new optimizer's state instead of the dense run's
                sparsity = max(config.sparsities)
                for seed in config.seeds:
                    enable_determinism(seed)
                    load_cnn_state(model, opt, states[seed])
                    restore(opt.variables, fresh)
                    keep = masks[(seed, sparsity)]
                    fc1.kernel.assign(np.where(keep, fc1.kernel.numpy(), np.float32(0)))
                    opt.set_mask(fc1.kernel, keep)
                    before = fc1.kernel.numpy().copy()
                    nonzero = _momentum_nonzero(inner, fc1.kernel, ~keep)
                    _fit_steps(model, data.x_train, data.y_train, config.prune_batch, config.prune_steps, seed + 1000)
                    fresh_rows.append({"optimizer": name, "seed": seed, "sparsity": sparsity,
                                       "pruned": int((~keep).sum()), "momentum_nonzero_at_start": nonzero,
                                       "moved": _moved(before, fc1.kernel.numpy(), ~keep)})
    runs = pd.DataFrame(rows)
    ref = runs[runs["method"] == "exact"].set_index(["optimizer", "seed", "sparsity"])["weights"]
    runs["same_weights_as_exact"] = [
        w == ref.get((o, s, p))
        for o, s, p, w in zip(runs["optimizer"], runs["seed"], runs["sparsity"], runs["weights"])]
    dense_ms = float(np.mean([s.step_time_ms for s in states.values()]))
    return StudyResult(runs.drop(columns="weights"), pd.DataFrame(diagnosis),
                       {"dense_adam_step_time_ms": dense_ms, "fresh_gradient_mask": pd.DataFrame(fresh_rows)})


def pruning_twin(runs: pd.DataFrame, a: str = "adam", b: str = "adamw") -> dict[str, int]:
    """Whether recipe 2's runs under ``b`` repeat those under ``a``: over the runs paired by (method, sparsity,
    seed), how many have the same ``moved`` and ``sparsity_kept`` (``same_counts``) and the same final accuracy
    (``same_accuracy``); ``runs`` is 0 where either optimizer did not run. ``pruning_twin(r2.runs)``

    >>> r = pd.DataFrame({"optimizer": ["adam", "adamw"], "method": ["exact"] * 2, "sparsity": [0.5] * 2,
    ...                   "seed": [0] * 2, "moved": [0, 0], "sparsity_kept": [1.0, 1.0], "acc_finetuned": [0.9, 0.91]})
    >>> pruning_twin(r)
    {'runs': 1, 'same_counts': 1, 'same_accuracy': 0}
    """
    if not {a, b} <= set(runs["optimizer"]):
        return {"runs": 0, "same_counts": 0, "same_accuracy": 0}
    keys = ["method", "sparsity", "seed"]
    x, y = (runs[runs["optimizer"] == o].set_index(keys).sort_index() for o in (a, b))
    x, y = x.align(y, join="inner", axis=0)
    same = (x["moved"] == y["moved"]) & (x["sparsity_kept"] == y["sparsity_kept"])
    return {"runs": int(len(x)), "same_counts": int(same.sum()),
            "same_accuracy": int((x["acc_finetuned"] == y["acc_finetuned"]).sum())}
