"""Staleness in one process: every gradient applied ``tau`` updates late, for SGD, Adam, Adagrad, AdamW and Muon,
many seeds at once.

* ``StaleTrainer``: an MLP 784-hidden-10 with one copy per seed along a leading axis, its optimizers written out
  element-wise so that the learning rate and ``tau`` are tensors (one trace per optimizer);
* ``staleness_study``: accuracy curves for every optimizer x learning rate x tau x seed;
* ``final_accuracy``, ``best_learning_rates``, ``best_per_tau``, ``rate_grid``, ``updates_to_target``,
  ``dai_check``, ``paired_difference(s)``: the tables study 04 reads off those curves. Every learning rate is
  chosen on the validation split; every accuracy reported is the test split's; every gap comes with a
  ``CONFIDENCE`` interval over seeds (Student's t, paired by seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf

from study.data import MnistSplits
from study.gradients.config import STALENESS_OPTIMIZERS, GradientStudyConfig
from study.intervals import CONFIDENCE, t_interval  # noqa: F401  (re-exported: 04 reads staleness.CONFIDENCE)
from study.validation import check_choice

NAN = float("nan")


def _mlp_init(seed: int, hidden: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.05, (784, hidden)).astype(np.float32), np.zeros(hidden, np.float32),
            rng.normal(0, 0.05, (hidden, 10)).astype(np.float32), np.zeros(10, np.float32)]


ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}  # Keras 3 defaults
ADAGRAD = {"initial_accumulator_value": 0.1, "epsilon": 1e-7}
ADAMW = {"weight_decay": 0.004}  # keras.optimizers.AdamW's default; the rest as Adam
MUON = {"momentum": 0.95, "ns_steps": 5, "a": 3.4445, "b": -4.7750, "c": 2.0315, "rms_rate": 0.2,
        "weight_decay": 0.004}  # keras.optimizers.Muon's defaults (nesterov=True)
MUON_PARAMETERS = (0,)
"""The variables Muon updates with its orthogonalised step: the hidden layer's kernel. The output kernel and the
biases take its AdamW step, as Keras' ``Muon`` documentation asks for the output layer and every 1-D variable."""


def _newton_schulz(x: tf.Tensor, steps: int) -> tf.Tensor:
    """Muon's quintic Newton-Schulz iteration on the last two axes (``keras.optimizers.Muon``'s, batched by seed)."""
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = tf.linalg.matrix_transpose(x)
    x = x / (tf.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)
    for _ in range(steps):
        a = x @ tf.linalg.matrix_transpose(x)
        x = MUON["a"] * x + (MUON["b"] * a + MUON["c"] * a @ a) @ x
    return tf.linalg.matrix_transpose(x) if tall else x


class StaleTrainer:
    """An MLP 784-hidden-10 trained with every gradient computed ``tau`` updates late, one copy per seed at once.

    The seeds are a leading axis of every variable; the loss is the sum over seeds of each copy's own mean loss,
    so each copy's gradient is its own. The optimizers are element-wise, written out here so that the learning
    rate and ``tau`` are tensors (one trace per optimizer); ``tests/test_gradient_study.py`` checks them against
    ``keras.optimizers.SGD``/``Adam``/``Adagrad``/``AdamW``/``Muon``. Every ``eval_every`` updates it measures
    accuracy on the validation split (which chooses learning rates) and on the test split (which is reported).
    ``StaleTrainer(data, "adam", seeds=[0, 1]).run(0.003, tau=4)``
    """

    def __init__(self, data: MnistSplits, optimizer: str, seeds: Sequence[int], steps: int = 200,
                 batch: int = 64, eval_every: int = 10, tau_max: int = 16, hidden: int = 64):
        check_choice("optimizer", optimizer, STALENESS_OPTIMIZERS)
        self.optimizer, self.seeds, self.steps, self.eval_every = optimizer, list(seeds), steps, eval_every
        self.tau_max = tau_max
        inits = [_mlp_init(seed, hidden) for seed in self.seeds]
        self.init = [np.stack(parts) for parts in zip(*inits)]
        self.params = [tf.Variable(v) for v in self.init]
        self.history = [tf.Variable(np.zeros((tau_max + 1, *v.shape), np.float32)) for v in self.init]
        self.slots = [[tf.Variable(np.zeros_like(v)) for v in self.init] for _ in range(2)]
        x = data.x_train.reshape(-1, 784)
        # the same minibatches for every optimizer, learning rate and tau: seed s draws from its own generator
        idx = np.stack([np.random.default_rng(seed).integers(0, len(x), (steps, batch)) for seed in self.seeds], 1)
        self.x_train, self.y_train = tf.constant(x), tf.constant(data.y_train)
        self.idx = tf.constant(idx)
        self.splits = {"val": (tf.constant(data.x_val.reshape(-1, 784)), tf.constant(data.y_val)),
                       "test": (tf.constant(data.x_test.reshape(-1, 784)), tf.constant(data.y_test))}
        self._run = tf.function(self._train)

    @staticmethod
    def logits(params: Sequence[Any], x: tf.Tensor) -> tf.Tensor:
        """Logits of every seed's copy: x is (seeds, batch, 784) or (n, 784), shared."""
        w1, b1, w2, b2 = params
        eq = "sbi,sih->sbh" if x.shape.rank == 3 else "bi,sih->sbh"
        h = tf.nn.relu(tf.einsum(eq, x, w1) + b1[:, None, :])
        return tf.einsum("sbh,shk->sbk", h, w2) + b2[:, None, :]

    @staticmethod
    def _adam(v: tf.Variable, g: tf.Tensor, m: tf.Variable, s: tf.Variable, lr: tf.Tensor, step: tf.Tensor) -> None:
        t = tf.cast(step + 1, tf.float32)
        alpha = lr * tf.sqrt(1 - ADAM["beta_2"] ** t) / (1 - ADAM["beta_1"] ** t)
        m.assign_add((g - m) * (1 - ADAM["beta_1"]))
        s.assign_add((tf.square(g) - s) * (1 - ADAM["beta_2"]))
        v.assign_sub(m * alpha / (tf.sqrt(s) + ADAM["epsilon"]))

    def _update(self, step: tf.Tensor, grads: list[tf.Tensor], lr: tf.Tensor) -> None:
        if self.optimizer == "sgd":
            for v, g in zip(self.params, grads):
                v.assign_sub(lr * g)
        elif self.optimizer in ("adam", "adamw"):
            for v, g, m, s in zip(self.params, grads, *self.slots):
                if self.optimizer == "adamw":  # decoupled weight decay, applied before the step as Keras does
                    v.assign_sub(v * ADAMW["weight_decay"] * lr)
                self._adam(v, g, m, s, lr, step)
        elif self.optimizer == "muon":
            for i, (v, g, m, s) in enumerate(zip(self.params, grads, *self.slots)):
                v.assign_sub(v * MUON["weight_decay"] * lr)
                if i not in MUON_PARAMETERS:
                    self._adam(v, g, m, s, lr, step)
                    continue
                m.assign_add(g + m * (MUON["momentum"] - 1))
                update = _newton_schulz(g + MUON["momentum"] * m, MUON["ns_steps"])  # Nesterov
                scale = np.sqrt(max(v.shape[-2], v.shape[-1])) * MUON["rms_rate"]
                v.assign_sub(lr * update * scale)
        else:  # adagrad
            for v, g, acc in zip(self.params, grads, self.slots[0]):
                acc.assign_add(tf.square(g))
                v.assign_sub(lr * g / tf.sqrt(acc + ADAGRAD["epsilon"]))

    def _accuracy(self, split: str) -> tf.Tensor:
        x, y = self.splits[split]
        predicted = tf.argmax(self.logits(self.params, x), -1, output_type=tf.int32)
        return tf.reduce_mean(tf.cast(predicted == y[None, :], tf.float32), 1)

    def _train(self, lr: tf.Tensor, tau: tf.Tensor) -> tf.Tensor:
        evals = tf.TensorArray(tf.float32, size=self.steps // self.eval_every)
        for step in tf.range(self.steps):
            slot = step % (tau + 1)
            for h, v in zip(self.history, self.params):  # a ring of the last tau+1 parameter values
                h.scatter_update(tf.IndexedSlices(v[None], slot[None]))
            stale_slot = tf.where(step >= tau, (step - tau) % (tau + 1), 0)  # the parameters tau updates ago
            stale = [h.sparse_read(stale_slot) for h in self.history]
            idx = self.idx[step]
            x, y = tf.gather(self.x_train, idx), tf.gather(self.y_train, idx)
            with tf.GradientTape() as tape:
                tape.watch(stale)
                per_seed = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, self.logits(stale, x)), 1)
                loss = tf.reduce_sum(per_seed)
            self._update(step, tape.gradient(loss, stale), lr)
            if (step + 1) % self.eval_every == 0:
                evals = evals.write((step + 1) // self.eval_every - 1,
                                    tf.stack([self._accuracy("val"), self._accuracy("test")]))
        return evals.stack()

    def run(self, learning_rate: float, tau: int) -> dict[str, np.ndarray]:
        """Validation and test accuracy after every ``eval_every`` updates, each of shape (evaluations, seeds):
        ``{"val": ..., "test": ...}``. ``trainer.run(0.2, 4)["test"]``"""
        if not 0 <= tau <= self.tau_max:
            raise ValueError(f"tau: expected 0..{self.tau_max}; got {tau}")
        for v, init in zip(self.params, self.init):
            v.assign(init)
        for h in self.history:
            h.assign(tf.zeros_like(h))
        for slot in self.slots:
            for v in slot:
                v.assign(tf.fill(v.shape, ADAGRAD["initial_accumulator_value"] if self.optimizer == "adagrad"
                                 and slot is self.slots[0] else 0.0))
        both = self._run(tf.constant(learning_rate, tf.float32), tf.constant(tau)).numpy()
        return {"val": both[:, 0], "test": both[:, 1]}


def staleness_study(config: GradientStudyConfig, data: MnistSplits) -> pd.DataFrame:
    """Accuracy curves for every optimizer x learning rate x tau x seed. ``staleness_study(cfg, data)``

    Columns: optimizer, learning_rate, tau, seed, updates, accuracy (test accuracy after ``updates`` updates) and
    val_accuracy (on the validation split, which alone chooses learning rates).
    """
    rows = []
    for name in config.staleness_optimizers:
        trainer = StaleTrainer(data, name, config.seeds, steps=config.staleness_steps,
                               eval_every=config.staleness_eval_every, tau_max=max(config.taus))
        for lr in config.staleness_learning_rates[name]:
            for tau in config.taus:
                curves = trainer.run(lr, tau)
                for e, (val, test) in enumerate(zip(curves["val"], curves["test"])):
                    for seed, v, t in zip(config.seeds, val, test):
                        rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed,
                                     "updates": (e + 1) * config.staleness_eval_every, "accuracy": float(t),
                                     "val_accuracy": float(v)})
    return pd.DataFrame(rows)


def final_accuracy(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the test accuracy after the last update. ``final_accuracy(staleness_study(...))``"""
    last = curves["updates"].max()
    return curves[curves["updates"] == last].drop(columns="updates").reset_index(drop=True)


def _mean_over_seeds(curves: pd.DataFrame) -> pd.DataFrame:
    final = final_accuracy(curves)
    return final.groupby(["optimizer", "learning_rate", "tau"], sort=False).agg(
        val_mean=("val_accuracy", "mean"), test_mean=("accuracy", "mean"), test_std=("accuracy", "std")).reset_index()


def best_learning_rates(curves: pd.DataFrame) -> dict[str, float]:
    """Each optimizer's learning rate with the best mean final *validation* accuracy at tau = 0 (tuned without
    delay); the test split never chooses. Optimizers in the order of ``curves``."""
    fresh = _mean_over_seeds(curves).query("tau == 0")
    return {name: float(g.loc[g["val_mean"].idxmax(), "learning_rate"])
            for name, g in fresh.groupby("optimizer", sort=False)}


def best_per_tau(curves: pd.DataFrame) -> pd.DataFrame:
    """Final accuracy with the learning rate re-tuned for each tau on the validation split: rows tau, columns
    optimizer (the chosen rate's mean *test* accuracy over seeds), with ``<optimizer>_std`` (its std over seeds),
    ``<optimizer>_lr`` (the rate) and ``<optimizer>_val`` (the mean validation accuracy that chose it) beside it."""
    stats = _mean_over_seeds(curves)
    best = stats.loc[stats.groupby(["optimizer", "tau"], sort=False)["val_mean"].idxmax()]
    out = pd.DataFrame(index=pd.Index(sorted(best["tau"].unique()), name="tau"))
    for name in best["optimizer"].unique():
        mine = best[best["optimizer"] == name].set_index("tau")
        out[name] = mine["test_mean"]
        out[f"{name}_std"] = mine["test_std"]
        out[f"{name}_lr"] = mine["learning_rate"]
        out[f"{name}_val"] = mine["val_mean"]
    return out


def rate_grid(curves: pd.DataFrame) -> pd.DataFrame:
    """Every rate of the grid at every tau: mean final validation accuracy (which chooses), mean and std of the
    final test accuracy (which is reported), and whether validation chose this rate for this tau (``chosen``) and
    for tau = 0 (``chosen_undelayed``, the rate the undelayed comparisons use). ``rate_grid(staleness_study(...))``"""
    stats = _mean_over_seeds(curves)
    first = stats.loc[stats.groupby(["optimizer", "tau"], sort=False)["val_mean"].idxmax()]  # ties: the first rate
    picked = set(zip(first["optimizer"], first["tau"], first["learning_rate"]))
    stats["chosen"] = [(o, t, lr) in picked
                       for o, t, lr in zip(stats["optimizer"], stats["tau"], stats["learning_rate"])]
    best = best_learning_rates(curves)
    stats["chosen_undelayed"] = [best.get(o) == lr for o, lr in zip(stats["optimizer"], stats["learning_rate"])]
    return stats


def peek_cost(grid: pd.DataFrame, tau: int = 0) -> dict[str, float]:
    """Per optimizer, the test accuracy choosing on the validation split gave up at ``tau``: the grid's best mean
    test accuracy minus that of the rate validation chose (0 when both splits agree). ``peek_cost(rate_grid(c))``"""
    mine = grid[grid["tau"] == tau]
    return {o: float(g["test_mean"].max() - g.loc[g["chosen"], "test_mean"].iloc[0])
            for o, g in mine.groupby("optimizer", sort=False)}


def worst_peek_cost(grid: pd.DataFrame) -> dict[str, Any]:
    """``peek_cost`` at every tau, the largest: ``{"value", "optimizer", "tau"}`` (the rates re-chosen for a delay are
    chosen on the validation split too, and give up test accuracy the same way). ``worst_peek_cost(rate_grid(c))``"""
    costs = {(o, int(t)): v for t in sorted(grid["tau"].unique()) for o, v in peek_cost(grid, t).items()}
    (optimizer, tau), value = max(costs.items(), key=lambda kv: kv[1])
    return {"value": value, "optimizer": optimizer, "tau": tau}


def rate_grid_display(grid: pd.DataFrame) -> pd.DataFrame:
    """``rate_grid`` as the report shows it: rows (optimizer, learning rate), per τ one cell
    "validation · test mean ± std", marked "◀" where validation chose that rate for that τ."""
    from study.report.reporting import common_decimals, format_mean_std

    decimals = common_decimals(grid["test_mean"], grid["test_std"].fillna(0))
    decimals = 3 if decimals is None else min(decimals, 3)
    cells = [f"{v:.{decimals}f} · {format_mean_std(m, s, decimals=decimals)}{' ◀' if c else ''}"
             for v, m, s, c in zip(grid["val_mean"], grid["test_mean"], grid["test_std"], grid["chosen"])]
    shown = grid.assign(cell=cells, rate=[f"{lr:g}" for lr in grid["learning_rate"]])
    table = shown.pivot(index=["optimizer", "rate"], columns="tau", values="cell")
    table = table.reindex(pd.MultiIndex.from_frame(shown[["optimizer", "rate"]].drop_duplicates()))
    table.index.names = ["optimizer", "learning rate"]
    table.columns = [f"τ = {t}: validation · test (mean ± std)" for t in table.columns]
    return table


def updates_to_target(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per run: the first evaluated update count with test accuracy >= target (inf if never). Dai et al.'s measure."""
    def first(group: pd.DataFrame) -> float:
        hit = group.loc[group["accuracy"] >= target, "updates"]
        return float(hit.min()) if len(hit) else float("inf")

    keys = ["optimizer", "learning_rate", "tau", "seed"]
    return curves.groupby(keys).apply(first, include_groups=False).rename("updates_to_target").reset_index()


def _drops(curves: pd.DataFrame, name: str, lr: float) -> dict[int, np.ndarray]:
    """Per tau: each seed's final test accuracy at tau = 0 minus at tau (the same seed, rate ``lr``), in seed order."""
    final = final_accuracy(curves)
    acc = final[(final["optimizer"] == name) & (final["learning_rate"] == lr)].set_index(["tau", "seed"])["accuracy"]
    fresh = acc.loc[0].sort_index()
    return {int(tau): fresh.to_numpy() - acc.loc[tau].sort_index().to_numpy()
            for tau in sorted(acc.index.get_level_values("tau").unique())}


def _slowdowns(curves: pd.DataFrame, target: float) -> dict[str, tuple[float, dict[int, np.ndarray]]]:
    """Per optimizer: its best tau=0 rate (chosen on the validation split), and per tau each seed's updates to reach
    ``target`` test accuracy / the same seed's at tau=0, in seed order (inf where the seed never reached it)."""
    steps = updates_to_target(curves, target)
    out = {}
    for name, lr in best_learning_rates(curves).items():
        mine = steps[(steps["optimizer"] == name) & (steps["learning_rate"] == lr)].set_index(["tau", "seed"])
        fresh = mine.loc[0, "updates_to_target"].sort_index()
        out[name] = (lr, {int(tau): (mine.loc[tau, "updates_to_target"].sort_index() / fresh).to_numpy()
                          for tau in sorted(mine.index.get_level_values("tau").unique())})
    return out


def _all_reached(x: np.ndarray) -> tuple[float, float, float]:
    """``t_interval`` of ``x`` where every value is finite (every seed reached the target), else NaN."""
    return t_interval(x) if len(x) and np.isfinite(x).all() else (float("inf"), NAN, NAN)


def dai_check(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Dai et al. (2019): adaptive optimizers slow down more under staleness than SGD. Per tau, at each optimizer's
    best tau=0 learning rate (chosen on the validation split): the slowdown (updates to reach ``target`` test
    accuracy, / the same seed's at tau=0) and the drop in final test accuracy, as mean and std over seeds, each with
    its ``CONFIDENCE`` interval over seeds (``slowdown_ci_low``/``_high``, ``drop_ci_low``/``_high``).

    A run that never reaches the target has an infinite slowdown; ``reached`` counts the runs that did; the
    slowdown's mean is infinite and its std and interval empty unless every seed reached it.
    """
    rows = []
    for name, (lr, slowdowns) in _slowdowns(curves, target).items():
        drops = _drops(curves, name, lr)
        for tau, slow in slowdowns.items():
            drop = drops[int(tau)]
            mean, low, high = t_interval(drop)
            slow_mean, slow_low, slow_high = _all_reached(slow)
            rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seeds": len(slow),
                         "reached": int(np.isfinite(slow).sum()),
                         "slowdown_mean": slow_mean,
                         # over the same seeds as the mean: undefined when a seed never reached the target
                         "slowdown_std": float(np.std(slow, ddof=1)) if np.isfinite(slow).all() and len(slow) > 1
                         else float("nan"), "slowdown_ci_low": slow_low, "slowdown_ci_high": slow_high,
                         "drop_mean": mean, "drop_std": float(np.std(drop, ddof=1)) if len(drop) > 1
                         else float("nan"), "drop_ci_low": low, "drop_ci_high": high})
    return pd.DataFrame(rows)


def slowdown_differences(curves: pd.DataFrame, target: float, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """Dai et al.'s own measure compared: per pair (a, b) and tau, a's slowdown (updates to reach ``target`` test
    accuracy / the same seed's at tau=0, each at its rate chosen on the validation split without delay) minus b's,
    paired by seed, with its ``CONFIDENCE`` interval; empty where a seed of either never reached the target.

    Columns: a, b, tau, seeds, both_reached (seeds where both reached it), slowdown_gap_mean, slowdown_gap_ci_low,
    slowdown_gap_ci_high. ``slowdown_differences(curves, 0.85, [("adam", "sgd")])``
    """
    slow = _slowdowns(curves, target)
    rows = []
    for a, b in pairs:
        if a not in slow or b not in slow:
            continue
        for tau in sorted(set(slow[a][1]) & set(slow[b][1])):
            x, y = slow[a][1][tau], slow[b][1][tau]
            both = np.isfinite(x) & np.isfinite(y)
            mean, low, high = _all_reached(x - y) if both.all() else (NAN, NAN, NAN)
            rows.append({"a": a, "b": b, "tau": tau, "seeds": len(x), "both_reached": int(both.sum()),
                         "slowdown_gap_mean": mean, "slowdown_gap_ci_low": low, "slowdown_gap_ci_high": high})
    return pd.DataFrame(rows, columns=["a", "b", "tau", "seeds", "both_reached", "slowdown_gap_mean",
                                       "slowdown_gap_ci_low", "slowdown_gap_ci_high"])


def paired_difference(curves: pd.DataFrame, a: str = "adam", b: str = "sgd") -> pd.DataFrame:
    """Per tau: drop in final test accuracy of ``a`` minus that of ``b`` (each at its best tau=0 rate, chosen on
    the validation split), paired by seed.

    ``mean``, ``std``, ``se`` (std / sqrt(seeds)) and the ``CONFIDENCE`` interval (``ci_low``, ``ci_high``) of the
    difference: an interval above zero says ``a`` loses more to staleness than ``b`` here, below zero less, and
    one that holds zero cannot tell them apart.
    """
    best = best_learning_rates(curves)
    da, db = _drops(curves, a, best[a]), _drops(curves, b, best[b])
    rows = []
    for tau in da:
        diff = da[tau] - db[tau]
        std = float(np.std(diff, ddof=1)) if len(diff) > 1 else float("nan")
        mean, low, high = t_interval(diff)
        rows.append({"a": a, "b": b, "tau": tau, "mean": mean, "std": std, "se": std / np.sqrt(len(diff)),
                     "ci_low": low, "ci_high": high, "seeds": len(diff)})
    return pd.DataFrame(rows)


def tuned_differences(curves: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """Per pair and tau: the test accuracy ``a`` lost to the delay minus what ``b`` lost, each optimizer at the rate
    the validation split chose for that tau (``best_per_tau``), paired by seed; columns as ``paired_differences``
    (negative: a loses less). A loss is the seed's accuracy at tau = 0 (at the rate chosen without delay) minus its
    accuracy at tau, so that an optimizer that is simply better without delay is not counted as more robust."""
    final = final_accuracy(curves)
    tuned = best_per_tau(curves)

    def accuracy(name: str, tau: int) -> np.ndarray:
        lr = tuned.loc[tau, f"{name}_lr"]
        mine = final[(final["optimizer"] == name) & (final["learning_rate"] == lr) & (final["tau"] == tau)]
        return mine.sort_values("seed")["accuracy"].to_numpy()

    def lost(name: str, tau: int) -> np.ndarray:
        return accuracy(name, 0) - accuracy(name, tau)

    rows = []
    for a, b in pairs:
        for tau in tuned.index:
            diff = lost(a, tau) - lost(b, tau)
            std = float(np.std(diff, ddof=1)) if len(diff) > 1 else float("nan")
            mean, low, high = t_interval(diff)
            rows.append({"a": a, "b": b, "tau": int(tau), "mean": mean, "std": std, "se": std / np.sqrt(len(diff)),
                         "ci_low": low, "ci_high": high, "seeds": len(diff)})
    columns = ["a", "b", "tau", "mean", "std", "se", "ci_low", "ci_high", "seeds"]
    return pd.DataFrame(rows, columns=columns)


def gap_pairs(optimizers: Sequence[str]) -> list[tuple[str, str]]:
    """The gaps the study reports: every optimizer against SGD (Dai's and Dean's comparisons) and Muon against
    AdamW (arXiv 2606.30634's), among those run. ``gap_pairs(["sgd", "adam", "muon", "adamw"])``"""
    names = list(optimizers)
    pairs = [(o, "sgd") for o in names if o != "sgd" and "sgd" in names]
    if {"muon", "adamw"} <= set(names):
        pairs.append(("muon", "adamw"))
    return pairs


def paired_differences(curves: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """``paired_difference`` for every pair, one frame (columns a, b, tau, mean, std, se, ci_low, ci_high, seeds)."""
    frames = [paired_difference(curves, a, b) for a, b in pairs]
    columns = ["a", "b", "tau", "mean", "std", "se", "ci_low", "ci_high", "seeds"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _column(means: Any, stds: Any, most: int = 4) -> list[str]:
    """A table column of 'mean ± std', every row at the precision the finest row needs, at most ``most`` decimals."""
    from study.report.reporting import common_decimals, format_mean_std

    means, stds = list(means), list(stds)
    finite = [(m, s) for m, s in zip(means, stds) if np.isfinite(m)]
    decimals = common_decimals([m for m, _ in finite], [s for _, s in finite]) if finite else None
    decimals = None if decimals is None else min(decimals, most)
    return [format_mean_std(m, s, decimals=decimals) if np.isfinite(m) else "—" for m, s in zip(means, stds)]


def dai_display(check: pd.DataFrame) -> pd.DataFrame:
    """``dai_check`` as the report shows it: rows (optimizer, τ), every cell text, one precision per column.

    A slowdown is shown only where every seed reached the target (otherwise its mean is infinite: "—")."""
    out = pd.DataFrame(index=pd.MultiIndex.from_frame(check[["optimizer", "tau"]],
                                                      names=["optimizer", "τ (updates late)"]))
    out["learning rate"] = [f"{lr:g}" for lr in check["learning_rate"]]
    out["seeds that reached the target"] = [f"{r} of {n}" for r, n in zip(check["reached"], check["seeds"])]
    out["slowdown (× the updates at τ = 0), mean ± std"] = _column(check["slowdown_mean"], check["slowdown_std"])
    out["accuracy lost, mean ± std"] = _column(check["drop_mean"], check["drop_std"], most=3)
    out[f"accuracy lost, {CONFIDENCE:.0%} interval"] = _interval(check["drop_ci_low"], check["drop_ci_high"])
    return out


def _bound(x: float, rounding: str) -> str:
    """One interval bound to 3 decimals, rounded outward (``rounding``: ``"floor"`` for a low end, ``"ceil"`` for a
    high end), signed; a bound that rounds to zero prints ``0.000``. ``_bound(-0.023249, "floor") == '-0.024'``"""
    from study.report.prose import fixed

    text = fixed(x, 3, rounding)
    return "0.000" if float(text) == 0 else text if text.startswith("-") else f"+{text}"


def _interval(lows: Any, highs: Any) -> list[str]:
    """Each interval as "low to high", its bounds rounded outward, so the printed interval holds the computed one
    (and a verdict read off it, ``verdicts.interval_sign``, agrees with what the table shows)."""
    return [f"{_bound(low, 'floor')} to {_bound(high, 'ceil')}" if np.isfinite(low) and np.isfinite(high) else "—"
            for low, high in zip(lows, highs)]


def difference_display(differences: pd.DataFrame, what: str = "test accuracy lost: a − b") -> pd.DataFrame:
    """``paired_differences`` (or ``tuned_differences``) as the report shows it: rows (pair, τ), the paired
    difference as mean ± std, its standard error and its ``CONFIDENCE`` interval."""
    pair = [f"{a} − {b}" for a, b in zip(differences["a"], differences["b"])]
    out = pd.DataFrame(index=pd.MultiIndex.from_arrays([pair, differences["tau"]], names=[what, "τ (updates late)"]))
    out["mean ± std over seeds"] = _column(differences["mean"], differences["std"], most=3)
    out["standard error"] = [f"{se:.3f}" for se in differences["se"]]
    out[f"{CONFIDENCE:.0%} interval"] = _interval(differences["ci_low"], differences["ci_high"])
    out["seeds"] = differences["seeds"].to_numpy()
    return out


def tuned_display(tuned: pd.DataFrame) -> pd.DataFrame:
    """``best_per_tau`` as the report shows it: rows τ, each optimizer's final test accuracy (mean ± std) at the
    rate validation chose for that τ, and the rate."""
    out = pd.DataFrame(index=pd.Index(tuned.index, name="τ (updates late)"))
    for name in [c for c in tuned.columns if not c.endswith(("_std", "_lr", "_val"))]:
        out[f"{name}: test accuracy, mean ± std"] = _column(tuned[name], tuned[f"{name}_std"], most=3)
        out[f"{name}: learning rate"] = [f"{lr:g}" for lr in tuned[f"{name}_lr"]]
    return out
