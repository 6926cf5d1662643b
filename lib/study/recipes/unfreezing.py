"""Study 05, recipe 3: gradual (staged) unfreezing in one ``fit`` with ``MaskSchedule``, against recompiling
per stage and flipping ``trainable``; plus the ``trainable`` traps table."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import pandas as pd

import freezing
from freezing.audit import changed_bits
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from freezing.schedule import MaskSchedule
from freezing.slots import slots
from study.data import MnistSplits
from study.optimizers import make_optimizer
from study.recipes.setup import (
    UNFREEZE_METHODS,
    Pretrained,
    RecipesConfig,
    StudyResult,
    _dataset,
    _diagnosis_rows,
    body_layers,
    mlp,
    old_new,
)
from study.training import LOSS, StepTimer, accuracy, median_ms, restore, snapshot


# -- 3. staged (gradual) unfreezing ----------------------------------------------------------------
class _EpochProbe(keras.callbacks.Callback):
    """At each epoch's start and end: the head's Adam momentum and step; at the end, accuracy and layer changes.

    ``current()`` returns the (model, optimizer) training now: the recompiling variants switch models between stages.
    """

    def __init__(self, current: Callable[[], tuple[keras.Model, Any]], start: Mapping[str, list[np.ndarray]],
                 eval_x: np.ndarray, eval_y: np.ndarray, log: list[dict[str, Any]]):
        super().__init__()
        self._current, self._start = current, start
        self._eval, self.log = (eval_x, eval_y), log

    def _state(self) -> tuple[np.ndarray, int]:
        model, opt = self._current()
        head = model.get_layer("head").kernel
        return slots(opt, head)["momentum"].numpy().copy(), int(opt.iterations.numpy())

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        momentum, step = self._state()
        self.log.append({"epoch": epoch, "when": "begin", "momentum": momentum, "iterations": step})

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        momentum, step = self._state()
        model = self._current()[0]
        changed = {f"{name}_changed": sum(int(changed_bits(w0, w.numpy()).sum())
                                          for w0, w in zip(start, model.get_layer(name).weights))
                   for name, start in self._start.items()}
        self.log.append({"epoch": epoch, "when": "end", "momentum": momentum, "iterations": step,
                         "accuracy": accuracy(model, *self._eval), **changed})


def _set_stage(layers: Sequence[keras.layers.Layer], stage: int) -> None:
    """Stage s: the top s+1 of ``layers`` train (input side first)."""
    for i, layer in enumerate(layers):
        layer.trainable = i >= len(layers) - 1 - stage


def _unfreezing_layers(model: keras.Model) -> list[keras.layers.Layer]:
    return [*body_layers(model), model.get_layer("head")]


class _Compiled:
    """A model compiled once with a fresh Adam; ``reset`` puts the Adam back to its initial state (a new optimizer)."""

    def __init__(self, config: RecipesConfig, stage: int | None = None, masked: bool = False):
        self.model = mlp(10, config.hidden)
        self.layers = _unfreezing_layers(self.model)
        if stage is not None:
            _set_stage(self.layers, stage)
        adam = make_optimizer("adam", config.learning_rate)
        self.optimizer = MaskedOptimizer(adam, policy="hold") if masked else adam
        self.model.compile(optimizer=self.optimizer, loss=LOSS)
        self.optimizer.build(self.model.trainable_variables)
        self._initial = snapshot(self.optimizer.variables)

    def reset(self, weights: Sequence[np.ndarray]) -> None:
        self.model.set_weights(weights)
        restore(self.optimizer.variables, self._initial)


def unfreezing_study(config: RecipesConfig, data: MnistSplits, pretrained: Mapping[int, Pretrained]) -> StudyResult:
    """Gradual unfreezing on digits 5-9, top layer first, one more every ``unfreeze_every`` epochs.

    ``mask_schedule``: one ``fit`` with ``MaskSchedule``. ``skip_frozen``: the same with ``freezing.SkipFrozen``
    (a layer frozen whole is not differentiated; one retrace per stage). ``recompile_fresh``: each stage compiled with
    its own
    flags and a new Adam (one compiled model per stage, its Adam reset for every seed: the same as compiling anew,
    traced once). ``recompile_same``: compile again with the same Adam (first seed only: it raises). ``trainable_flip``:
    compile once with the first stage's flags, then flip ``trainable`` between ``fit`` calls.
    ``unfreezing_study(cfg, data, pre)``
    """
    _, (x_new, y_new) = old_new(data.x_train, data.y_train)
    _, (xt_new, yt_new) = old_new(data.x_test, data.y_test)
    k, spe = config.unfreeze_every, config.unfreeze_steps_per_epoch
    masked = _Compiled(config, masked=True)
    names = [layer.name for layer in masked.layers]
    stages = len(names)
    epochs = stages * k
    per_stage = [_Compiled(config, stage) for stage in range(stages)]
    flip = _Compiled(config, stage=0)
    log_rows, run_rows, diagnosis = [], [], []

    for method in UNFREEZE_METHODS:
        for seed in config.seeds if method != "recompile_same" else config.seeds[:1]:
            enable_determinism(seed)
            weights = pretrained[seed].extended
            start = {n: [np.asarray(w) for w in ws]
                     for n, ws in zip(names, zip(weights[0::2], weights[1::2]))}  # (kernel, bias) per layer
            log: list[dict[str, Any]] = []
            timer = StepTimer()
            data_all = _dataset(x_new, y_new, config.batch, epochs * spe, seed)
            now: dict[str, Any] = {}
            probe = _EpochProbe(lambda: (now["model"], now["opt"]), start, xt_new, yt_new, log)
            error = ""
            if method in ("mask_schedule", "skip_frozen"):
                masked.reset(weights)
                now.update(model=masked.model, opt=masked.optimizer)
                schedule = MaskSchedule.gradual_unfreezing(masked.layers, every=k)
                skip = [freezing.SkipFrozen()] if method == "skip_frozen" else []  # frozen whole: not differentiated
                masked.model.fit(data_all, epochs=epochs, steps_per_epoch=spe, verbose=0, shuffle=False,
                                 callbacks=[schedule, *skip, probe, timer])
            else:
                if method == "trainable_flip":
                    _set_stage(flip.layers, 0)
                    flip.reset(weights)
                elif method == "recompile_same":
                    same = _Compiled(config, stage=0)
                    same.reset(weights)
                for stage in range(stages):
                    part = data_all.skip(stage * k * spe).take(k * spe)
                    if method == "recompile_fresh":
                        compiled = per_stage[stage]
                        compiled.reset(weights if stage == 0 else now["model"].get_weights())
                    elif method == "trainable_flip":
                        compiled = flip
                        _set_stage(flip.layers, stage)  # the trap: the flags change, nothing is recompiled
                        if stage == 1 and seed == config.seeds[0]:  # the layer just unfrozen, before its first fit
                            diagnosis += _diagnosis_rows("3 unfreezing", method,
                                                         freezing.diagnose(flip.model, [flip.layers[-1 - stage]]))
                    else:
                        compiled = same
                        if stage > 0:
                            _set_stage(same.layers, stage)
                            same.model.compile(optimizer=same.optimizer, loss=LOSS)  # the same optimizer
                            diagnosis += _diagnosis_rows("3 unfreezing", method,
                                                         freezing.diagnose(same.model, [same.layers[-1 - stage]]))
                    now.update(model=compiled.model, opt=compiled.optimizer)
                    try:
                        compiled.model.fit(part, initial_epoch=stage * k, epochs=(stage + 1) * k, steps_per_epoch=spe,
                                           verbose=0, shuffle=False, callbacks=[probe, timer])
                    except ValueError as e:
                        error = str(e).split(" When working")[0]
                        break
            model = now["model"]
            for row in log:
                row.update(method=method, seed=seed)
            log_rows += log
            ends = [r for r in log if r["when"] == "end"]
            frozen_moved = 0
            for i, n in enumerate(names):
                unfreeze_epoch = (stages - 1 - i) * k
                if unfreeze_epoch > 0 and len(ends) >= unfreeze_epoch:
                    frozen_moved += ends[unfreeze_epoch - 1][f"{n}_changed"]
            boundaries = _boundaries(log, k, stages)
            last = ends[-1] if ends else {}
            run_rows.append({
                "method": method, "seed": seed, "finished": not error, "error": error,
                "acc_new": last.get("accuracy", np.nan) if not error else np.nan,
                "acc_old": accuracy(model, *old_new(data.x_test, data.y_test)[0]) if not error else np.nan,
                **{f"{n}_changed": last.get(f"{n}_changed", 0) for n in names},
                **{f"{n}_entries": sum(int(np.size(w)) for w in start[n]) for n in names},
                "frozen_moved": frozen_moved,
                "unfrozen_trained": all(last.get(f"{n}_changed", 0) > 0 for n in names),
                "state_kept": (bool(len(boundaries)) and all(b["kept"] for b in boundaries)) if not error else None,
                "boundaries": len(boundaries),
                "momentum_norm_lost": float(sum(b["norm_before"] - b["norm_after"] for b in boundaries)),
                "iterations_at_end": last.get("iterations", 0),
                "step_time_ms": median_ms(timer.times) if timer.times else np.nan,
                **{f"step_ms_stage{s + 1}": median_ms(timer.times[s * k * spe:(s + 1) * k * spe])
                   if len(timer.times) >= (s + 1) * k * spe else np.nan for s in range(stages)},
                "extra_state_bytes": masked.optimizer.mask_bytes() if method in ("mask_schedule", "skip_frozen") else 0,
            })
    curves = pd.DataFrame([{k2: v for k2, v in r.items() if k2 != "momentum"}
                           | {"momentum_norm": float(np.linalg.norm(r["momentum"]))} for r in log_rows])
    boundary_rows = []
    for (method, seed), group in pd.DataFrame(log_rows).groupby(["method", "seed"], sort=False):
        for b in _boundaries(group.to_dict("records"), k, stages):
            boundary_rows.append({"method": method, "seed": seed, **b})
    runs = pd.DataFrame(run_rows)
    return StudyResult(runs, pd.DataFrame(diagnosis),
                       {"curves": curves, "boundaries": pd.DataFrame(boundary_rows),
                        "stage_ratios": stage_step_ratios(runs, stages),
                        "layers": names, "epochs": epochs, "every": k})


def stage_step_ratios(runs: pd.DataFrame, stages: int, reference: str = "recompile_fresh") -> pd.DataFrame:
    """Each method's median step time in each stage over ``reference``'s in the same stage and seed: the median,
    min and max of that ratio over seeds (a stage's first step, which traces, left out of each median).

    >>> runs = pd.DataFrame({"method": ["a", "a", "recompile_fresh", "recompile_fresh"], "seed": [0, 1, 0, 1],
    ...                      "finished": True, "step_ms_stage1": [2.0, 3.0, 2.0, 2.0]})
    >>> stage_step_ratios(runs, 1)[["method", "stage", "ratio_median", "ratio_min", "ratio_max",
    ...                              "seeds"]].values.tolist()
    [['a', 1, 1.25, 1.0, 1.5, 2]]
    """
    done = runs[runs["finished"]].set_index(["method", "seed"])
    if reference not in done.index.get_level_values(0):
        return pd.DataFrame(columns=["method", "stage", "ratio_median", "ratio_min", "ratio_max", "seeds"])
    ref = done.loc[reference]
    rows = []
    for method in dict.fromkeys(done.index.get_level_values(0)):
        if method == reference:
            continue
        for stage in range(1, stages + 1):  # counted from 1, as every stage the report names
            column = f"step_ms_stage{stage}"
            ratio = (done.loc[method][column] / ref[column]).dropna()
            if len(ratio):
                rows.append({"method": method, "stage": stage, "reference": reference,
                             "ratio_median": float(ratio.median()), "ratio_min": float(ratio.min()),
                             "ratio_max": float(ratio.max()), "seeds": int(len(ratio))})
    return pd.DataFrame(rows)


def _boundaries(log: Sequence[Mapping[str, Any]], every: int, stages: int) -> list[dict[str, Any]]:
    """At each stage boundary: the head's momentum at the end of the stage and at the start of the next."""
    out = []
    for stage in range(1, stages):
        epoch = stage * every
        end = [r for r in log if r["when"] == "end" and r["epoch"] == epoch - 1]
        begin = [r for r in log if r["when"] == "begin" and r["epoch"] == epoch]
        if not end or not begin:
            continue
        a, b = end[-1], begin[-1]
        out.append({"epoch": epoch, "norm_before": float(np.linalg.norm(a["momentum"])),
                    "norm_after": float(np.linalg.norm(b["momentum"])), "iterations_before": a["iterations"],
                    "iterations_after": b["iterations"],
                    "kept": bool(not changed_bits(a["momentum"], b["momentum"]).any()
                                 and a["iterations"] == b["iterations"])})
    return out


def trainable_traps(seed: int = 0) -> pd.DataFrame:
    """What Keras 3 does when ``trainable`` changes around ``compile``/``fit``, observed on two-layer models.

    Three models; the rows of one model continue from the row before. Each row records what layer ``a`` did in
    its ``fit`` (its entries changed, or not, or the fit raised), what it should have done, and, where ``a``
    should stay or the optimizer does not know it, the causes ``freezing.diagnose`` names just before that
    ``fit`` for ``a`` believed frozen. Every ``fit`` uses batches of 16 unless the row says otherwise: a new
    batch shape makes ``fit`` retrace its train step. ``trainable_traps(0)``
    """
    enable_determinism(seed)
    rng = np.random.default_rng(seed)
    x, y = rng.random((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
    rows = []

    def start(frozen: bool, first_fit: bool = True) -> keras.Model:
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="a"), keras.layers.Dense(3, name="b")],
                             name="net")
        m.get_layer("a").trainable = not frozen
        m.compile(keras.optimizers.Adam(0.01), LOSS)
        if first_fit:
            m.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
        return m

    def observe(scenario: str, should: str, m: keras.Model, batch: int = 16) -> None:
        # whether the built optimizer lacks a trainable variable (the next traced step raises 'Unknown variable')
        unknown = "unknown_to_optimizer" in freezing.diagnose(m, list(m.trainable_variables)).causes
        causes = "(not asked)"  # a should train and the optimizer knows it: nothing to diagnose
        if should == "stay" or unknown:
            causes = ", ".join(sorted(freezing.diagnose(m, [m.get_layer("a")]).causes)) or "(none)"
        w0 = m.get_layer("a").kernel.numpy().copy()
        error = ""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                m.fit(x, y, epochs=1, batch_size=batch, verbose=0, shuffle=False)
            except ValueError as e:
                error = str(e).split(" When working")[0]
        changed = int(changed_bits(w0, m.get_layer("a").kernel.numpy()).sum())
        did = "raised" if error else ("trained" if changed else "stayed")
        rows.append({"scenario": scenario, "layer a should": should, "layer a did": did,
                     "entries of a changed": f"{changed} of {w0.size}",
                     "as expected": did == {"stay": "stayed", "train": "trained"}[should],
                     "diagnose names": causes,
                     "keras warned": any("trainable" in str(w.message) for w in seen), "error": error})

    m = start(frozen=False)
    m.get_layer("a").trainable = False
    observe("model 1: compile; fit; a.trainable = False; fit (no recompile)", "stay", m)
    observe("model 1, then: fit with batches of 32 (fit retraces)", "stay", m, batch=32)
    m = start(frozen=False, first_fit=False)
    m.get_layer("a").trainable = False
    observe("model 2: compile; a.trainable = False before the first fit; fit", "stay", m)
    m = start(frozen=True)
    m.get_layer("a").trainable = True
    observe("model 3: a.trainable = False; compile; fit; a.trainable = True; fit (no recompile)", "train", m)
    observe("model 3, then: fit with batches of 32 (fit retraces)", "train", m, batch=32)
    m.compile(m.optimizer, LOSS)
    observe("model 3, then: compile with the same optimizer; fit", "train", m)
    m.compile(keras.optimizers.Adam(0.01), LOSS)
    observe("model 3, then: compile with a new optimizer; fit", "train", m)
    return pd.DataFrame(rows)
