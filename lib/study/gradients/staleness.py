"""Staleness in one process: every gradient applied ``tau`` updates late, for SGD, Adam and Adagrad, many seeds at once.

* ``StaleTrainer``: an MLP 784-hidden-10 with one copy per seed along a leading axis, its optimizers written out
  element-wise so that the learning rate and ``tau`` are tensors (one trace per optimizer);
* ``staleness_study``: accuracy curves for every optimizer x learning rate x tau x seed;
* ``final_accuracy``, ``staleness_table``, ``best_learning_rates``, ``updates_to_target``, ``dai_check``,
  ``best_per_tau``, ``paired_difference``: the tables study 04 reads off those curves (Dai et al.'s claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf

from study.validation import check_choice
from study.data import MnistSplits
from study.gradients.config import STALENESS_OPTIMIZERS, GradientStudyConfig


def _mlp_init(seed: int, hidden: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.05, (784, hidden)).astype(np.float32), np.zeros(hidden, np.float32),
            rng.normal(0, 0.05, (hidden, 10)).astype(np.float32), np.zeros(10, np.float32)]


ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}  # Keras 3 defaults
ADAGRAD = {"initial_accumulator_value": 0.1, "epsilon": 1e-7}


class StaleTrainer:
    """An MLP 784-hidden-10 trained with every gradient computed ``tau`` updates late, one copy per seed at once.

    The seeds are a leading axis of every variable; the loss is the sum over seeds of each copy's own mean loss,
    so each copy's gradient is its own. The optimizers are element-wise, written out here so that the learning
    rate and ``tau`` are tensors (one trace per optimizer); ``tests/test_gradient_study.py`` checks them against
    ``keras.optimizers.SGD``/``Adam``/``Adagrad``. ``StaleTrainer(data, "adam", seeds=[0, 1]).run(0.003, tau=4)``
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
        self.x_test, self.y_test = tf.constant(data.x_test.reshape(-1, 784)), tf.constant(data.y_test)
        self._run = tf.function(self._train)

    @staticmethod
    def logits(params: Sequence[Any], x: tf.Tensor) -> tf.Tensor:
        """Logits of every seed's copy: x is (seeds, batch, 784) or (n, 784), shared."""
        w1, b1, w2, b2 = params
        eq = "sbi,sih->sbh" if x.shape.rank == 3 else "bi,sih->sbh"
        h = tf.nn.relu(tf.einsum(eq, x, w1) + b1[:, None, :])
        return tf.einsum("sbh,shk->sbk", h, w2) + b2[:, None, :]

    def _update(self, step: tf.Tensor, grads: list[tf.Tensor], lr: tf.Tensor) -> None:
        if self.optimizer == "sgd":
            for v, g in zip(self.params, grads):
                v.assign_sub(lr * g)
        elif self.optimizer == "adam":
            t = tf.cast(step + 1, tf.float32)
            alpha = lr * tf.sqrt(1 - ADAM["beta_2"] ** t) / (1 - ADAM["beta_1"] ** t)
            for v, g, m, s in zip(self.params, grads, *self.slots):
                m.assign_add((g - m) * (1 - ADAM["beta_1"]))
                s.assign_add((tf.square(g) - s) * (1 - ADAM["beta_2"]))
                v.assign_sub(m * alpha / (tf.sqrt(s) + ADAM["epsilon"]))
        else:  # adagrad
            for v, g, acc in zip(self.params, grads, self.slots[0]):
                acc.assign_add(tf.square(g))
                v.assign_sub(lr * g / tf.sqrt(acc + ADAGRAD["epsilon"]))

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
                predicted = tf.argmax(self.logits(self.params, self.x_test), -1, output_type=tf.int32)
                accuracy = tf.reduce_mean(tf.cast(predicted == self.y_test[None, :], tf.float32), 1)
                evals = evals.write((step + 1) // self.eval_every - 1, accuracy)
        return evals.stack()

    def run(self, learning_rate: float, tau: int) -> np.ndarray:
        """Test accuracy after every ``eval_every`` updates, shape (evaluations, seeds). ``trainer.run(0.2, 4)``"""
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
        return self._run(tf.constant(learning_rate, tf.float32), tf.constant(tau)).numpy()


def staleness_study(config: GradientStudyConfig, data: MnistSplits) -> pd.DataFrame:
    """Accuracy curves for every optimizer x learning rate x tau x seed. ``staleness_study(cfg, data)``

    Columns: optimizer, learning_rate, tau, seed, updates, accuracy (test accuracy after ``updates`` updates).
    """
    rows = []
    for name in config.staleness_optimizers:
        trainer = StaleTrainer(data, name, config.seeds, steps=config.staleness_steps,
                               eval_every=config.staleness_eval_every, tau_max=max(config.taus))
        for lr in config.staleness_learning_rates[name]:
            for tau in config.taus:
                curves = trainer.run(lr, tau)
                for e, accuracies in enumerate(curves):
                    for seed, acc in zip(config.seeds, accuracies):
                        rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed,
                                     "updates": (e + 1) * config.staleness_eval_every, "accuracy": float(acc)})
    return pd.DataFrame(rows)


def final_accuracy(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the test accuracy after the last update. ``final_accuracy(staleness_study(...))``"""
    last = curves["updates"].max()
    return curves[curves["updates"] == last].drop(columns="updates").reset_index(drop=True)


def staleness_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Final test accuracy as 'mean ± std' over seeds (one precision per column); rows optimizer x learning rate
    (written as ``dai_display`` and ``tuned_display`` write it), columns τ (updates late)."""
    from study.report.reporting import common_decimals, format_mean_std

    final = final_accuracy(curves)
    grouped = final.groupby(["optimizer", "learning_rate", "tau"])["accuracy"].agg(["mean", "std"]).reset_index()
    decimals = {tau: common_decimals(g["mean"], g["std"]) for tau, g in grouped.groupby("tau")}  # one per column
    grouped["accuracy"] = [format_mean_std(m, s, decimals=decimals[t])
                           for m, s, t in zip(grouped["mean"], grouped["std"], grouped["tau"])]
    table = grouped.pivot(index=["optimizer", "learning_rate"], columns="tau", values="accuracy")
    table.columns = [f"τ = {t}" for t in table.columns]
    table.index = pd.MultiIndex.from_tuples([(o, f"{lr:g}") for o, lr in table.index], names=table.index.names)
    return table


def best_learning_rates(curves: pd.DataFrame) -> dict[str, float]:
    """Each optimizer's learning rate with the best mean final accuracy at tau = 0 (tuned without delay)."""
    final = final_accuracy(curves)
    fresh = final[final["tau"] == 0].groupby(["optimizer", "learning_rate"])["accuracy"].mean().reset_index()
    return {name: float(g.sort_values("accuracy").iloc[-1]["learning_rate"]) for name, g in fresh.groupby("optimizer")}


def updates_to_target(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per run: the first evaluated update count with accuracy >= target (inf if never). Dai et al.'s measure."""
    def first(group: pd.DataFrame) -> float:
        hit = group.loc[group["accuracy"] >= target, "updates"]
        return float(hit.min()) if len(hit) else float("inf")

    keys = ["optimizer", "learning_rate", "tau", "seed"]
    return curves.groupby(keys).apply(first, include_groups=False).rename("updates_to_target").reset_index()


def dai_check(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Dai et al. (2019): adaptive optimizers slow down more under staleness than SGD. Per tau, at each optimizer's
    best tau=0 learning rate: the slowdown (updates to reach ``target`` accuracy, / the same seed's at tau=0)
    and the drop in final accuracy, as mean and std over seeds, and the paired adam-minus-sgd differences.

    A run that never reaches the target has an infinite slowdown; ``reached`` counts the runs that did.
    """
    best = best_learning_rates(curves)
    steps = updates_to_target(curves, target)
    final = final_accuracy(curves)
    rows = []
    for name, lr in best.items():
        mine = steps[(steps["optimizer"] == name) & (steps["learning_rate"] == lr)].set_index(["tau", "seed"])
        acc = final[(final["optimizer"] == name) & (final["learning_rate"] == lr)].set_index(["tau", "seed"])
        for tau in sorted(mine.index.get_level_values("tau").unique()):
            slow = (mine.loc[tau, "updates_to_target"] / mine.loc[0, "updates_to_target"]).to_numpy()
            drop = (acc.loc[0, "accuracy"] - acc.loc[tau, "accuracy"]).to_numpy()
            finite = slow[np.isfinite(slow)]
            rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seeds": len(slow),
                         "reached": int(np.isfinite(slow).sum()),
                         "slowdown_mean": float(np.mean(slow)) if len(finite) == len(slow) else float("inf"),
                         # over the same seeds as the mean: undefined when a seed never reached the target
                         "slowdown_std": float(np.std(slow, ddof=1)) if len(finite) == len(slow) > 1
                         else float("nan"),
                         "drop_mean": float(np.mean(drop)), "drop_std": float(np.std(drop, ddof=1)) if len(drop) > 1
                         else float("nan")})
    return pd.DataFrame(rows)


def best_per_tau(curves: pd.DataFrame) -> pd.DataFrame:
    """Final accuracy with the learning rate re-tuned for each tau: rows tau, columns optimizer, the best mean over
    rates, with ``<optimizer>_std`` (over seeds) and ``<optimizer>_lr`` beside it."""
    final = final_accuracy(curves)
    stats = final.groupby(["optimizer", "tau", "learning_rate"])["accuracy"].agg(["mean", "std"]).reset_index()
    best = stats.loc[stats.groupby(["optimizer", "tau"])["mean"].idxmax()]
    out = best.pivot(index="tau", columns="optimizer", values="mean")
    for name in out.columns.tolist():
        mine = best[best["optimizer"] == name].set_index("tau")
        out[f"{name}_std"] = mine["std"]
        out[f"{name}_lr"] = mine["learning_rate"]
    return out


def paired_difference(curves: pd.DataFrame, a: str = "adam", b: str = "sgd") -> pd.DataFrame:
    """Per tau: drop in final accuracy of ``a`` minus that of ``b`` (each at its best tau=0 rate), paired by seed.

    ``mean``, ``std`` and ``se`` (std / sqrt(seeds)) of the difference: a positive mean more than 2 se above
    zero says ``a`` loses more to staleness than ``b`` here.
    """
    best = best_learning_rates(curves)
    final = final_accuracy(curves)

    def drops(name: str) -> pd.DataFrame:
        acc = final[(final["optimizer"] == name) & (final["learning_rate"] == best[name])].set_index(["tau", "seed"])
        fresh = acc.loc[0, "accuracy"]
        return acc["accuracy"].groupby("tau").apply(lambda s: fresh.to_numpy() - s.to_numpy())

    da, db = drops(a), drops(b)
    rows = []
    for tau in da.index:
        diff = np.asarray(da[tau]) - np.asarray(db[tau])
        std = float(np.std(diff, ddof=1)) if len(diff) > 1 else float("nan")
        rows.append({"tau": tau, "mean": float(np.mean(diff)), "std": std, "se": std / np.sqrt(len(diff)),
                     "seeds": len(diff)})
    return pd.DataFrame(rows)


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
    out = pd.DataFrame(index=pd.MultiIndex.from_frame(check[["optimizer", "tau"]], names=["optimizer", "τ (updates late)"]))
    out["learning rate"] = [f"{lr:g}" for lr in check["learning_rate"]]
    out["seeds that reached the target"] = [f"{r} of {n}" for r, n in zip(check["reached"], check["seeds"])]
    out["slowdown (× the updates at τ = 0), mean ± std"] = _column(check["slowdown_mean"], check["slowdown_std"])
    out["accuracy lost, mean ± std"] = _column(check["drop_mean"], check["drop_std"], most=3)
    return out


def difference_display(difference: pd.DataFrame, a: str = "adam", b: str = "sgd") -> pd.DataFrame:
    """``paired_difference`` as the report shows it: rows τ, the paired difference as mean ± std, its standard error."""
    out = pd.DataFrame(index=pd.Index(difference["tau"], name="τ (updates late)"))
    out[f"{a}'s accuracy lost minus {b}'s, mean ± std"] = _column(difference["mean"], difference["std"], most=3)
    out["standard error"] = [f"{se:.3f}" for se in difference["se"]]
    out["seeds"] = difference["seeds"].to_numpy()
    return out


def tuned_display(tuned: pd.DataFrame) -> pd.DataFrame:
    """``best_per_tau`` as the report shows it: rows τ, each optimizer's best final accuracy (mean ± std) and rate."""
    out = pd.DataFrame(index=pd.Index(tuned.index, name="τ (updates late)"))
    for name in [c for c in tuned.columns if not c.endswith(("_std", "_lr"))]:
        out[f"{name}: final accuracy, mean ± std"] = _column(tuned[name], tuned[f"{name}_std"], most=3)
        out[f"{name}: learning rate"] = [f"{lr:g}" for lr in tuned[f"{name}_lr"]]
    return out
