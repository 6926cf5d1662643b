"""Study 01: why frozen entries move under Adam, measured and predicted.

* ``seed2_tf1`` / ``seed2_tf2``: the seed's worked example (W=[0,0,0,0], x=[1,2,3,4],
  masks [0,1,1,0] then [1,0,0,1] then all ones) in TF1 graph mode and in TF2, naive and fixed.
* ``drift_matrix``: every optimizer x {naive gate, hold, reset} x steps since freezing, measured per step
  with the study-wide names: ``changed_entries`` (frozen entries whose bits changed in that step,
  ``freezing.audit.changed_bits``) and ``max_abs_dW`` (the largest |ΔW| of a frozen entry in that step);
  ``max_abs_displacement`` is the accumulated max |W − W_freeze| since freezing.
* ``predict_adam_drift`` / ``adam_drift_vs_prediction``: the drift of a frozen entry under Adam
  predicted from its m, v, beta_1, beta_2, epsilon and the step count, against the measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing.audit import FreezeAudit
from freezing.determinism import enable_determinism
from freezing.gates import gate
from freezing.masked_optimizer import MaskedOptimizer
from freezing.slots import SlotStash, reset_slots, restore_slots, slots, stash_slots
from study.optimizers import OPTIMIZERS, make_optimizer
from study.processes import map_in_processes
from study.report.prose import ceil, num, pm
from study.report.reporting import format_count
from study.validation import check_choice, check_choices, check_int_list, check_positive_int, check_range

SEED2_X = (1.0, 2.0, 3.0, 4.0)
SEED2_MASKS = ((0, 1, 1, 0), (1, 0, 0, 1), (1, 1, 1, 1))
SEED2_LR = 0.1
SEED2_TF1_METHODS = ("naive", "reset_slots", "stash_restore")
SEED2_TF2_METHODS = SEED2_TF1_METHODS + ("hold", "reset")
DRIFT_POLICIES = ("naive", "hold", "reset")
STATELESS = ("sgd", "adagrad", "adadelta", "rmsprop", "ftrl")
"""Optimizers (as built in ``study.optimizers``) that leave an entry with a zero gradient bit for bit still: no
momentum, no first moment, no weight decay. SGD, RMSprop without momentum, Adagrad and Adadelta take a step
proportional to the gradient (their state only scales it); Ftrl (with L1 here) recomputes the weight from its
accumulators, which a zero gradient leaves unchanged. Every other one moves frozen entries under a stop_gradient
mask."""


def optimizer_label(name: str) -> str:
    """``name`` with its Keras class and the options that make it what it is. ``optimizer_label("rmsprop_centered")``

    -> ``'rmsprop_centered (RMSprop, momentum 0.5, centered)'``: the drift comes from the momentum, which the name
    does not say.
    """
    opt = make_optimizer(name, 0.01)
    config = opt.get_config()
    notes = [type(opt).__name__]
    if config.get("momentum"):
        notes.append(f"momentum {config['momentum']:g}")
    for flag, text in (("nesterov", "Nesterov"), ("amsgrad", "AMSGrad"), ("centered", "centered")):
        if config.get(flag):
            notes.append(text)
    if config.get("weight_decay"):
        notes.append(f"weight decay {config['weight_decay']:g}")
    if config.get("l1_regularization_strength"):
        notes.append(f"L1 {config['l1_regularization_strength']:g}")
    if type(opt).__name__ == "Muon":  # Keras' Muon sends every variable that is not 2-D to its AdamW branch
        notes.append("on this 1-D W its AdamW branch")
    return f"{name} ({', '.join(notes)})"


def optimizer_classes(names: Sequence[str]) -> list[str]:
    """The Keras optimizer classes behind ``names``, sorted. ``optimizer_classes(["sgd", "momentum"]) == ["SGD"]``"""
    return sorted({type(make_optimizer(name, 0.01)).__name__ for name in names})


COLUMNS = {
    "api": "TF1 graph (tf.compat.v1 Session, AdamOptimizer) or TF2 Keras",
    "method": "how frozen entries are handled: naive (mask only), reset_slots, stash_restore, hold, reset",
    "step": "training step of the seed example (1-3), or step after freezing (drift tables)",
    "mask": "the seed example's mask MW for that step (1 = trains)",
    **{f"W[{i}]": f"W[{i}] after the step (W units)" for i in range(4)},
    **{f"m[{i}]": f"Adam's first moment of W[{i}] after the step (gradient units)" for i in range(4)},
    "optimizer": "optimizer name (study.optimizers)",
    "policy": "naive (mask only, MaskedOptimizer policy none), hold or reset",
    "seed": "seed of the toy problem's data, initial W and frozen half",
    "changed_entries": "frozen entries whose bits changed in this step (count)",
    "max_abs_dW": "largest |ΔW| of a frozen entry in this step (W units)",
    "max_abs_displacement": "largest |W - W_freeze| of a frozen entry after this step (W units)",
    "frozen_entries": "entries of W frozen in each step (count)",
    "changed_entries_sum_mean": "frozen entry-steps that changed: changed entries summed over all steps after freezing "
                                "(count), mean over seeds",
    "changed_entries_sum_std": "std over seeds of changed_entries_sum (count of entry-steps)",
    "steps_with_change_mean": "steps in which at least one frozen entry changed (count), mean over seeds",
    "steps_with_change_std": "std over seeds of steps_with_change (count)",
    "max_abs_dW_mean": "largest one-step |ΔW| of a frozen entry over all steps (W units), mean over seeds",
    "max_abs_dW_std": "std over seeds of max_abs_dW (W units)",
    "max_abs_displacement_mean": "max |W - W_freeze| after the last step (W units), mean over seeds",
    "max_abs_displacement_std": "std over seeds of max_abs_displacement (W units)",
    "steps": "steps after freezing per run (count)",
    "seeds": "seeds averaged (count)",
    "entry": "index of the frozen entry of W",
    "m0_over_sqrt_v0": "the entry's m/sqrt(v) when it was frozen (dimensionless)",
    "measured": "measured W - W_freeze of the entry after the step (W units)",
    "predicted": "predicted W - W_freeze from m, v, beta_1, beta_2, epsilon, t (W units)",
}
"""Meaning and unit of every column of the study's tables (``reporting.save_table(..., columns=COLUMNS)``)."""


@dataclass(frozen=True)
class AdamDriftConfig:
    """Parameters of study 01 and their defaults (the one place they live), validated on construction.

    ``AdamDriftConfig(optimizers=["adam"])``; ``AdamDriftConfig.from_parameters(steps=None)`` keeps the default.
    """

    optimizers: Sequence[str] = field(default_factory=lambda: sorted(OPTIMIZERS))
    policies: Sequence[str] = DRIFT_POLICIES
    steps: int = 40
    warmup: int = 10
    size: int = 64
    seeds: Sequence[int] = field(default_factory=lambda: [0, 1, 2])
    learning_rate: float = 0.01
    processes: int = 2

    def __post_init__(self) -> None:
        check_choices("optimizers", self.optimizers, OPTIMIZERS)
        check_choices("policies", self.policies, DRIFT_POLICIES)
        check_positive_int("steps", self.steps)
        check_positive_int("warmup", self.warmup)
        check_positive_int("size", self.size)
        check_positive_int("processes", self.processes)
        check_int_list("seeds", self.seeds, minimum=0)
        check_range("learning_rate", self.learning_rate, 0.0, 10.0, low_open=True)

    @classmethod
    def from_parameters(cls, **parameters: Any) -> "AdamDriftConfig":
        """The config with the notebook's parameters that are not None; None keeps the default here."""
        return cls(**{k: v for k, v in parameters.items() if v is not None})


# -- the seed's worked example -------------------------------------------------------------------
def _seed2_loss(w: Any, mask: Any) -> tf.Tensor:
    return tf.reduce_sum((gate(w, mask) * tf.constant(SEED2_X) - 1.0) ** 2)


def _manual_fix(method: str, opt: Any, w: Any, frozen: np.ndarray, stash: SlotStash | None,
                session: Any = None) -> SlotStash | None:
    """The seed's fix before a step: put stashed moments back, stash the frozen ones, zero them."""
    if method == "stash_restore":
        if stash is not None:
            restore_slots(opt, w, stash, session=session)
        stash = stash_slots(opt, w, where=frozen, session=session)
    if method in ("reset_slots", "stash_restore"):
        reset_slots(opt, w, where=frozen, session=session)
    return stash


def _row(api: str, method: str, step: int, mask: Sequence[int], w: np.ndarray, m: np.ndarray) -> dict:
    row = {"api": api, "method": method, "step": step, "mask": str(list(mask))}
    row.update({f"W[{i}]": float(x) for i, x in enumerate(w)})
    row.update({f"m[{i}]": float(x) for i, x in enumerate(m)})
    return row


def seed2_tf1(method: str) -> pd.DataFrame:
    """Run the seed's example in TF1 graph mode (Session, AdamOptimizer, get_slot). ``seed2_tf1("naive")``"""
    check_choice("method", method, SEED2_TF1_METHODS)
    rows = []
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("W", initializer=tf.zeros(4), use_resource=True)
        mask_ph = tf.compat.v1.placeholder(tf.float32, [4], name="MW")
        opt = tf.compat.v1.train.AdamOptimizer(SEED2_LR)
        train = opt.minimize(_seed2_loss(w, mask_ph), var_list=[w])
        m_slot = opt.get_slot(w, "m")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            stash = None
            for step, mask in enumerate(SEED2_MASKS, start=1):
                stash = _manual_fix(method, opt, w, np.asarray(mask) == 0, stash, session=sess)
                sess.run(train, {mask_ph: mask})
                if stash is not None and step == len(SEED2_MASKS):
                    restore_slots(opt, w, stash, session=sess)
                rows.append(_row("TF1 graph", method, step, mask, *sess.run([w, m_slot])))
    return pd.DataFrame(rows)


def seed2_tf2(method: str) -> pd.DataFrame:
    """Run the seed's example eagerly with Keras 3 Adam, naive,
    fixed by hand, or MaskedOptimizer. ``seed2_tf2("hold")``"""
    check_choice("method", method, SEED2_TF2_METHODS)
    w = tf.Variable(tf.zeros(4), name="W")
    opt = keras.optimizers.Adam(SEED2_LR, epsilon=1e-8)  # TF1's default epsilon, to compare exactly
    opt.build([w])
    masked = MaskedOptimizer(opt, method) if method in ("hold", "reset") else None
    rows, stash = [], None
    for step, mask in enumerate(SEED2_MASKS, start=1):
        stash = _manual_fix(method, opt, w, np.asarray(mask) == 0, stash)
        with tf.GradientTape() as tape:
            loss = _seed2_loss(w, tf.constant(mask, tf.float32))
        grad = tape.gradient(loss, w)
        if masked is not None:
            masked.apply_gradients([(grad, w)], trainable_masks=[np.asarray(mask, bool)])
        else:
            opt.apply_gradients([(grad, w)])
        if stash is not None and step == len(SEED2_MASKS):
            restore_slots(opt, w, stash)
        rows.append(_row("TF2 Keras", method, step, mask, w.numpy(), slots(opt, w)["momentum"].numpy()))
    return pd.DataFrame(rows)


# -- the drift matrix ----------------------------------------------------------------------------
def _regression(size: int, seed: int) -> tuple[tf.Tensor, tf.Tensor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4 * size, size)).astype(np.float32)
    y = (x @ rng.normal(size=size) + 0.1 * rng.normal(size=4 * size)).astype(np.float32)
    frozen = np.zeros(size, bool)
    frozen[rng.permutation(size)[: size // 2 or 1]] = True
    init = (0.1 * rng.normal(size=size)).astype(np.float32)
    return tf.constant(x), tf.constant(y), frozen, init


def drift_run(optimizer: str, policy: str, *, steps: int, warmup: int, size: int, seed: int,
              learning_rate: float) -> pd.DataFrame:
    """Train a least-squares toy, then freeze half of W; one row per step after freezing.
    ``drift_run("adam", "naive", ...)``

    Columns: ``changed_entries`` (frozen entries whose bits changed in this step), ``max_abs_dW`` (largest
    |ΔW| of a frozen entry in this step), ``max_abs_displacement`` (largest |W − W_freeze| so far),
    ``frozen_entries``. The run starts with ``enable_determinism(seed)``: the same arguments give the same bits.
    """
    check_choice("policy", policy, DRIFT_POLICIES)
    enable_determinism(seed)
    x, y, frozen, init = _regression(size, seed)
    w = tf.Variable(init, name="W")
    opt = MaskedOptimizer(make_optimizer(optimizer, learning_rate), "none" if policy == "naive" else policy)
    opt.build([w])
    keep = tf.constant(~frozen)

    def step(mask: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(x, w if mask is None else gate(w, mask)) - y) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)], trainable_masks=None if mask is None else [mask])

    for _ in range(warmup):
        step(None)
    w0 = w.numpy().astype(np.float64)
    audit = FreezeAudit([w])
    rows = []
    for k in range(1, steps + 1):
        with audit.step(frozen=[frozen]):
            step(keep)
        record = audit.records[-1]
        rows.append({"optimizer": optimizer, "policy": policy, "seed": seed, "step": k,
                     "changed_entries": record.changed, "max_abs_dW": record.max_abs_delta,
                     "max_abs_displacement": float(np.abs(w.numpy().astype(np.float64) - w0)[frozen].max()),
                     "frozen_entries": record.frozen})
    return pd.DataFrame(rows)


def optimizer_runs(config: AdamDriftConfig, name: str) -> pd.DataFrame:
    """``drift_run`` for every seed x policy of one optimizer, concatenated. ``optimizer_runs(cfg, "adam")``"""
    return pd.concat([drift_run(name, policy, steps=config.steps, warmup=config.warmup, size=config.size, seed=seed,
                                learning_rate=config.learning_rate)
                      for seed in config.seeds for policy in config.policies], ignore_index=True)


def drift_matrix(config: AdamDriftConfig, progress: bool = True) -> pd.DataFrame:
    """Run ``drift_run`` for every optimizer x policy x seed of ``config``. ``drift_matrix(AdamDriftConfig(["adam"]))``

    The optimizers run in ``config.processes`` worker processes (``study.processes``): every run starts from its
    own seed, so the table is the same bits for any number. Progress lines print per-run numbers averaged over
    seeds, as the tables do.
    """

    def report(i: int, runs: pd.DataFrame) -> None:
        if progress:
            per_run = runs.groupby(["policy", "seed"])["changed_entries"].sum().groupby("policy").mean()
            print(f"{config.optimizers[i]:<17} frozen entry-steps that changed, of "
                  f"{int(runs['frozen_entries'].iloc[0]) * config.steps:,} (mean over {len(config.seeds)} seeds): "
                  + ", ".join(f"{p} {num(float(per_run[p]))}" for p in config.policies), flush=True)

    frames = map_in_processes(optimizer_runs, [(config, name) for name in config.optimizers], config.processes,
                              threads=1, on_result=report)
    return pd.concat(frames, ignore_index=True)


# -- Adam's drift, predicted ---------------------------------------------------------------------
def predict_adam_drift(m0: np.ndarray, v0: np.ndarray, t0: int, steps: int, learning_rate: float,
                       beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7) -> np.ndarray:
    """Cumulative signed drift of entries frozen (zero gradient) after ``t0`` Adam steps.

    With g = 0 the moments decay, m_k = beta_1^k m0 and v_k = beta_2^k v0, and step t = t0 + k
    still moves W by lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m_k / (sqrt(v_k) + epsilon).
    ``predict_adam_drift(np.array([.1]), np.array([.01]), 10, 5, 1e-3)`` -> shape (5, 1)
    """
    m0, v0 = np.asarray(m0, np.float64), np.asarray(v0, np.float64)
    k = np.arange(1, steps + 1, dtype=np.float64).reshape((-1,) + (1,) * m0.ndim)
    t = t0 + k
    alpha = learning_rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    step = alpha * (beta_1**k * m0) / (np.sqrt(beta_2**k * v0) + epsilon)
    return -np.cumsum(step, axis=0)


def adam_drift_vs_prediction(*, steps: int, warmup: int, size: int, seed: int, learning_rate: float) -> pd.DataFrame:
    """Measured drift of frozen entries under Keras Adam with a naive gate, beside the prediction.
    ``adam_drift_vs_prediction(steps=20, ...)``

    ``measured`` and ``predicted`` are signed displacements W − W_freeze of each frozen entry after each step.
    """
    enable_determinism(seed)
    x, y, frozen, init = _regression(size, seed)
    w = tf.Variable(init, name="W")
    opt = keras.optimizers.Adam(learning_rate)
    opt.build([w])

    def step(mask: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(x, gate(w, mask)) - y) ** 2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])

    for _ in range(warmup):
        step(tf.ones(size))
    found = slots(opt, w)
    m0, v0 = found["momentum"].numpy()[frozen], found["velocity"].numpy()[frozen]
    w0, t0 = w.numpy()[frozen].astype(np.float64), int(opt.iterations.numpy())
    measured = []
    for _ in range(steps):
        step(tf.constant(~frozen, tf.float32))
        measured.append(w.numpy()[frozen].astype(np.float64) - w0)
    predicted = predict_adam_drift(m0, v0, t0, steps, learning_rate, opt.beta_1, opt.beta_2, opt.epsilon)
    entries = np.flatnonzero(frozen)
    return pd.DataFrame({
        "seed": seed,
        "step": np.repeat(np.arange(1, steps + 1), len(entries)),
        "entry": np.tile(entries, steps),
        "m0_over_sqrt_v0": np.tile(m0 / np.sqrt(v0), steps),
        "measured": np.concatenate(measured),
        "predicted": predicted.reshape(-1),
    })


# -- summaries the notebook reports ---------------------------------------------------------------
def seed2_summary(table: pd.DataFrame) -> dict[str, Any]:
    """Scalars of the seed example: how far TF1 and TF2 and the fixes agree, and per method the frozen entries'
    step-2 change (``..._frozen_max_abs_dW_step2``, ``..._frozen_changed_entries_step2``). ``seed2_summary(df)``"""
    w_cols = [c for c in table.columns if c.startswith("W[")]

    def weights(api: str, method: str, step: int) -> np.ndarray:
        rows = table.query("api == @api and method == @method and step == @step")
        return rows[w_cols].to_numpy(np.float64).reshape(-1)

    last = len(SEED2_MASKS)
    pairs = {  # (api, method) pairs that must give the same numbers
        "tf1_vs_tf2_naive": (("TF1 graph", "naive"), ("TF2 Keras", "naive")),
        "tf1_vs_tf2_reset_slots": (("TF1 graph", "reset_slots"), ("TF2 Keras", "reset_slots")),
        "tf1_vs_tf2_stash_restore": (("TF1 graph", "stash_restore"), ("TF2 Keras", "stash_restore")),
        "stash_restore_vs_hold": (("TF2 Keras", "stash_restore"), ("TF2 Keras", "hold")),
        "reset_slots_vs_reset": (("TF2 Keras", "reset_slots"), ("TF2 Keras", "reset")),
    }
    out: dict[str, Any] = {
        f"max_abs_diff_{name}": float(max(np.abs(weights(*a, s) - weights(*b, s)).max() for s in range(1, last + 1)))
        for name, (a, b) in pairs.items()
    }
    for api in ("TF1 graph", "TF2 Keras"):
        key = "tf1" if api.startswith("TF1") else "tf2"
        out[f"{key}_naive_W_step1"] = weights(api, "naive", 1).tolist()
        out[f"{key}_naive_W_step2"] = weights(api, "naive", 2).tolist()
        frozen = np.asarray(SEED2_MASKS[1]) == 0
        for method in SEED2_TF1_METHODS if key == "tf1" else SEED2_TF2_METHODS:
            delta = (weights(api, method, 2) - weights(api, method, 1))[frozen]
            out[f"{key}_{method}_frozen_max_abs_dW_step2"] = float(np.abs(delta).max())
            out[f"{key}_{method}_frozen_changed_entries_step2"] = int((delta != 0).sum())
    return out


def drift_summary(matrix: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer x policy, mean and std over seeds of each run's totals. ``drift_summary(m)``

    Per run: ``changed_entries_sum`` (frozen entries that changed, summed over all steps after freezing),
    ``steps_with_change`` (steps in which at least one frozen entry changed), ``max_abs_dW`` (largest
    one-step |ΔW| of a frozen entry over all steps) and ``max_abs_displacement`` (max |W − W_freeze| after the
    last step). Then ``<name>_mean`` / ``<name>_std`` over seeds; ``steps`` and ``frozen_entries`` per run.
    """
    keys = ["optimizer", "policy", "seed"]
    last = matrix[matrix["step"] == matrix["step"].max()].set_index(keys)["max_abs_displacement"]
    runs = matrix.groupby(keys, sort=False).agg(
        changed_entries_sum=("changed_entries", "sum"),
        steps_with_change=("changed_entries", lambda c: int((c > 0).sum())),
        max_abs_dW=("max_abs_dW", "max"), frozen_entries=("frozen_entries", "first"), steps=("step", "max"),
    ).join(last).reset_index()
    values = ["changed_entries_sum", "steps_with_change", "max_abs_dW", "max_abs_displacement"]
    summary = runs.groupby(["optimizer", "policy"], sort=False).agg(
        **{f"{v}_{stat}": (v, stat) for v in values for stat in ("mean", "std")},
        frozen_entries=("frozen_entries", "first"), steps=("steps", "first"), seeds=("seed", "nunique"),
    )
    return summary.reset_index()


def drift_table(summary: pd.DataFrame, optimizers: Sequence[str], policies: Sequence[str]) -> pd.DataFrame:
    """The report's table: per optimizer, entry-steps changed under each policy and the naive mask's drift.

    Counts with thousands separators as mean ± std over seeds, other values in plain notation; an optimizer row
    is labelled with its class and options (``optimizer_label``). ``drift_table(drift_summary(m), ["adam"], ["naive"])``
    """
    by = summary.set_index(["optimizer", "policy"])
    steps, frozen = int(summary["steps"].max()), int(summary["frozen_entries"].max())
    table = pd.DataFrame(index=pd.Index([optimizer_label(o) for o in optimizers],
                                        name="optimizer (Keras class, options)"))
    for policy in policies:
        rows = by.xs(policy, level="policy").reindex(list(optimizers))
        table[f"{policy}: frozen entry-steps that changed (of {frozen} × {steps} = {frozen * steps:,})"] = [
            format_count(r.changed_entries_sum_mean, r.changed_entries_sum_std) for r in rows.itertuples()]
    if "naive" in policies:
        naive = by.xs("naive", level="policy").reindex(list(optimizers))
        table[f"naive: steps (of {steps}) in which a frozen entry changed"] = [
            pm(r.steps_with_change_mean, r.steps_with_change_std) for r in naive.itertuples()]
        table[f"naive: max |W − W_freeze| after {steps} steps (W units)"] = [
            pm(r.max_abs_displacement_mean, r.max_abs_displacement_std) for r in naive.itertuples()]
    return table


def headline(metrics: dict[str, Any], summary: pd.DataFrame) -> dict[str, str]:
    """Every section and every optimizer row, as text for ``results/SUMMARY.md``. ``headline(metrics, summary)``"""
    s2 = metrics["seed2"]
    steps, seeds = int(summary["steps"].max()), int(summary["seeds"].max())
    spread = f"mean ± std over {seeds} seeds" if seeds > 1 else "1 seed"
    w = lambda v: "[" + ", ".join(f"{x:.4f}" for x in v) + "]"  # noqa: E731
    out = {
        "seed example, Adam: W after step 2, TF1 graph / TF2 Keras (W units)":
            f"{w(s2['tf1_naive_W_step2'])} / {w(s2['tf2_naive_W_step2'])}",
        "seed example, step 2: max |ΔW| of the frozen W[1], W[2], naive / get_slot reset / MaskedOptimizer hold "
        "(W units)":
            f"{s2['tf1_naive_frozen_max_abs_dW_step2']:.4f} / {s2['tf1_reset_slots_frozen_max_abs_dW_step2']:g} / "
            f"{s2['tf2_hold_frozen_max_abs_dW_step2']:g}",
    }
    out["how the optimizer rows below are summarised"] = (
        f"mask only (naive gate), {int(summary['frozen_entries'].max())} frozen entries, {steps} steps after "
        f"freezing; {spread}")
    for r in summary[summary["policy"] == "naive"].itertuples():
        out[f"{optimizer_label(r.optimizer)}: frozen entries changed, summed over the steps (count of entry-steps); "
            f"max |W − W_freeze| "
            f"at the end (W units)"] = (f"{format_count(r.changed_entries_sum_mean, r.changed_entries_sum_std)}; "
                                        f"{pm(r.max_abs_displacement_mean, r.max_abs_displacement_std)}")
    fixed = summary[summary["policy"] != "naive"]
    if len(fixed):
        policies = "/".join(dict.fromkeys(fixed["policy"]))
        out[f"MaskedOptimizer {policies}, all {fixed['optimizer'].nunique()} optimizers: frozen entries changed, "
            f"summed over {steps} steps and all seeds (count)"] = f"{metrics['fixed_policies_changed_entries']}"
    out["Adam's drift predicted from m, v, β₁, β₂, ε, t: largest |measured − predicted|, and largest |measured| "
        "for scale (W units)"] = (
        f"at most {ceil(metrics['prediction_max_abs_error'], 'sci')}, "
        f"against {num(metrics['prediction_max_abs_drift'])}")
    return out


METRIC_KINDS = {
    "config": "constant", "freezing_version": "constant", "data_source": "constant",
    "steps_after_freezing": "constant", "frozen_entries_per_run": "constant", "max_entry_steps_per_run": "constant",
    "optimizer_classes": "constant",
    "seed2/*changed_entries*": "count", "fixed_policies_changed_entries": "count",
    "duration_s": "timing",
}
"""What each value of study 01's ``metrics.json`` is (``study.report.kinds``); the rest are measured values."""
