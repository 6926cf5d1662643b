"""Study 04: getting all gradients efficiently, the compute -> transform -> apply split, and staleness.

* ``fetch_costs``: ms for all gradients of the Deep MNIST CNN, one pass vs one per variable, in TF1 graph
  mode (``sess.run(all)`` vs ``g.eval()`` per variable) and in TF2 (one tape, a persistent tape per
  variable, recomputing per variable), eagerly and inside ``tf.function``.
* ``exact_update_check`` and ``quadratic_with_tensorboard``: ``x_after == x_before - lr*T(g)``, and the
  seed's TensorBoard scalars of ``x`` and ``dy/dx``.
* ``staleness_study``: in one process, every gradient applied tau updates late, for SGD and Adam.
The asynchronous parameter server itself is ``study.parameter_server``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing import gradients
from study.data import MnistSplits
from study.models import deep_mnist_cnn
from study.training import LOSS
from freezing.validation import check_choices, check_int_list, check_positive_int, check_range

STALENESS_OPTIMIZERS = {"sgd": lambda lr: keras.optimizers.SGD(lr), "adam": lambda lr: keras.optimizers.Adam(lr),
                        "adagrad": lambda lr: keras.optimizers.Adagrad(lr)}


@dataclass(frozen=True)
class GradientStudyConfig:
    """Parameters of study 04, validated on construction. ``GradientStudyConfig(repeats=3)``"""

    batch: int = 50
    repeats: int = 5
    worker_counts: Sequence[int] = (1, 2, 4)
    ps_steps: int = 240
    steps_per_function: int = 4
    ps_learning_rate: float = 0.1
    kill_worker_after: int = 10
    taus: Sequence[int] = (0, 1, 2, 4, 8, 16)
    staleness_optimizers: Sequence[str] = ("sgd", "adam")
    staleness_learning_rates: dict[str, list[float]] = field(
        default_factory=lambda: {"sgd": [0.05, 0.2, 0.5], "adam": [0.001, 0.003, 0.01], "adagrad": [0.05, 0.1, 0.3]})
    staleness_steps: int = 200
    seeds: Sequence[int] = (0, 1, 2)

    def __post_init__(self) -> None:
        for name in ("batch", "repeats", "ps_steps", "steps_per_function", "kill_worker_after", "staleness_steps"):
            check_positive_int(name, getattr(self, name))
        check_int_list("worker_counts", self.worker_counts, minimum=1)
        check_int_list("taus", self.taus, minimum=0)
        check_int_list("seeds", self.seeds, minimum=0)
        check_range("ps_learning_rate", self.ps_learning_rate, 0.0, 10.0, low_open=True)
        check_choices("staleness_optimizers", self.staleness_optimizers, STALENESS_OPTIMIZERS)
        for name in self.staleness_optimizers:
            rates = self.staleness_learning_rates.get(name) if isinstance(self.staleness_learning_rates, dict) else None
            if not rates:
                raise ValueError(f"staleness_learning_rates: no rates for {name!r}; give a list per optimizer")
            for lr in rates:
                check_range(f"staleness_learning_rates[{name}]", lr, 0.0, 10.0, low_open=True)


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm up / trace
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _tf1_cnn(batch: int) -> tuple[tf.Graph, Any, Any, list[Any], list[Any]]:
    """The Deep MNIST CNN in TF1 graph ops: (graph, x, y placeholders, variables, gradient tensors)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (batch, 28, 28, 1))
        y = tf.compat.v1.placeholder(tf.int32, (batch,))
        shapes = {"conv1/kernel": (5, 5, 1, 32), "conv1/bias": (32,), "conv2/kernel": (5, 5, 32, 64),
                  "conv2/bias": (64,), "fc1/kernel": (3136, 1024), "fc1/bias": (1024,), "fc2/kernel": (1024, 10),
                  "fc2/bias": (10,)}
        v = {name: tf.compat.v1.get_variable(name, shape, initializer=tf.compat.v1.glorot_uniform_initializer(),
                                             use_resource=True) for name, shape in shapes.items()}
        pool = lambda h: tf.nn.max_pool2d(h, 2, 2, "VALID")  # noqa: E731
        h = pool(tf.nn.relu(tf.nn.conv2d(x, v["conv1/kernel"], 1, "SAME") + v["conv1/bias"]))
        h = pool(tf.nn.relu(tf.nn.conv2d(h, v["conv2/kernel"], 1, "SAME") + v["conv2/bias"]))
        h = tf.nn.relu(tf.reshape(h, (batch, 3136)) @ v["fc1/kernel"] + v["fc1/bias"])
        logits = h @ v["fc2/kernel"] + v["fc2/bias"]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        variables = list(v.values())
        grads = tf.gradients(loss, variables)
    return graph, x, y, variables, grads


def fetch_costs(config: GradientStudyConfig, seed: int = 0) -> pd.DataFrame:
    """ms to get every gradient of the CNN, per method, and the ratio to one pass in the same mode. ``fetch_costs(cfg)``"""
    rng = np.random.default_rng(seed)
    xb = rng.random((config.batch, 28, 28, 1)).astype(np.float32)
    yb = rng.integers(0, 10, config.batch).astype(np.int32)
    rows = []
    graph, x, y, variables, grads = _tf1_cnn(config.batch)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.variables_initializer(variables))
        feed = {x: xb, y: yb}
        rows.append({"mode": "TF1 graph", "method": "one sess.run(all gradients)",
                     "ms": _median_ms(lambda: sess.run(grads, feed), config.repeats)})
        rows.append({"mode": "TF1 graph", "method": "g.eval() per variable",
                     "ms": _median_ms(lambda: [g.eval(feed, session=sess) for g in grads], config.repeats)})
    keras.utils.set_random_seed(seed)
    model = deep_mnist_cnn()
    xs, ys = tf.constant(xb), tf.constant(yb)
    trainable = model.trainable_variables

    def loss() -> tf.Tensor:
        return LOSS(ys, model(xs, training=False))

    def one_tape() -> list[Any]:
        return gradients.compute(loss, trainable)[1]

    def persistent_per_variable() -> list[Any]:
        with tf.GradientTape(persistent=True) as tape:
            value = loss()
        out = [tape.gradient(value, v) for v in trainable]
        del tape
        return out

    def recompute_per_variable() -> list[Any]:
        out = []
        for v in trainable:
            with tf.GradientTape() as tape:
                value = loss()
            out.append(tape.gradient(value, v))
        return out

    methods = {"one tape": one_tape, "persistent tape, one gradient call per variable": persistent_per_variable,
               "recompute forward and backward per variable": recompute_per_variable}
    for mode, wrap in (("TF2 eager", lambda f: f), ("TF2 tf.function", tf.function)):
        for name, fn in methods.items():
            wrapped = wrap(fn)
            rows.append({"mode": mode, "method": name,
                         "ms": _median_ms(lambda: [g.numpy() for g in wrapped()], config.repeats)})
    table = pd.DataFrame(rows)
    table["ratio_to_one_pass"] = table["ms"] / table.groupby("mode")["ms"].transform("first")
    return table


def exact_update_check(batch: int = 50, learning_rate: float = 0.01, decay: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """One compute -> T(g) = decay*g -> assign_sub step on the CNN; max |after - (before - lr*T(g))| per variable."""
    keras.utils.set_random_seed(seed)
    model = deep_mnist_cnn()
    rng = np.random.default_rng(seed)
    xs = tf.constant(rng.random((batch, 28, 28, 1)).astype(np.float32))
    ys = tf.constant(rng.integers(0, 10, batch))
    before = [v.numpy().copy() for v in model.trainable_variables]
    _, grads = gradients.compute(lambda: LOSS(ys, model(xs, training=False)), model.trainable_variables)
    transformed = gradients.transform(grads, lambda g: decay * g)
    gradients.apply(transformed, model.trainable_variables, learning_rate=learning_rate)
    rows = []
    for v, old, t in zip(model.trainable_variables, before, transformed):
        expected = old - np.float32(learning_rate) * t.numpy()
        rows.append({"variable": v.path, "entries": int(old.size),
                     "max_abs_error": float(np.abs(v.numpy() - expected).max()),
                     "max_abs_update": float(np.abs(v.numpy() - old).max())})
    return pd.DataFrame(rows)


def quadratic_with_tensorboard(log_dir: str | Path | None, steps: int = 30, b: float = 3.0, x0: float = -2.0,
                               learning_rate: float = 0.2, decay: float = 0.9) -> pd.DataFrame:
    """The seed's y = 0.5*(x-b)^2 through compute -> transform -> apply, logging x and dy/dx. ``quadratic_with_tensorboard(None)``"""
    x = tf.Variable(x0, name="x")
    writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
    rows = []
    for step in range(steps):
        before = float(x.numpy())
        _, (grad,) = gradients.compute(lambda: 0.5 * (x - b) ** 2, [x])
        (t,) = gradients.transform([grad], lambda g: decay * g)
        gradients.apply([t], [x], learning_rate=learning_rate)
        if writer is not None:
            with writer.as_default():
                tf.summary.scalar("x", before, step=step)
                tf.summary.scalar("dy_dx", float(grad.numpy()), step=step)
        expected = np.float32(before) - np.float32(learning_rate) * np.float32(t.numpy())
        rows.append({"step": step, "x": before, "dy_dx": float(grad.numpy()),
                     "error": abs(float(x.numpy()) - float(expected))})
    if writer is not None:
        writer.flush()
    return pd.DataFrame(rows)


def _mlp_init(seed: int, hidden: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.05, (784, hidden)).astype(np.float32), np.zeros(hidden, np.float32),
            rng.normal(0, 0.05, (hidden, 10)).astype(np.float32), np.zeros(10, np.float32)]


def _mlp_logits(params: Sequence[Any], x: Any) -> tf.Tensor:
    return tf.nn.relu(x @ params[0] + params[1]) @ params[2] + params[3]


@tf.function
def _mlp_grads(params: list[tf.Tensor], x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=_mlp_logits(params, x)))
    return tape.gradient(loss, params)


def stale_run(data: MnistSplits, optimizer: str, learning_rate: float, tau: int, steps: int, seed: int,
              batch: int = 64) -> float:
    """Train an MLP where every gradient is computed tau updates late; returns test accuracy. ``stale_run(d, "sgd", .1, 4, 200, 0)``"""
    x = data.x_train.reshape(-1, 784)
    variables = [tf.Variable(v) for v in _mlp_init(seed)]
    opt = STALENESS_OPTIMIZERS[optimizer](learning_rate)
    opt.build(variables)
    history: deque[list[np.ndarray]] = deque(maxlen=tau + 1)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        history.append([v.numpy() for v in variables])
        stale = history[0]  # the parameters tau updates ago (or the oldest there is)
        idx = rng.integers(0, len(x), batch)
        grads = _mlp_grads([tf.constant(p) for p in stale], tf.constant(x[idx]), tf.constant(data.y_train[idx]))
        opt.apply_gradients(zip(grads, variables))
    logits = _mlp_logits(variables, tf.constant(data.x_test.reshape(-1, 784)))
    return float(np.mean(np.argmax(logits.numpy(), axis=1) == data.y_test))


def staleness_study(config: GradientStudyConfig, data: MnistSplits, progress: bool = True) -> pd.DataFrame:
    """Test accuracy for every tau x learning rate x optimizer x seed. ``staleness_study(cfg, data)``"""
    rows = []
    for name in config.staleness_optimizers:
        for lr in config.staleness_learning_rates[name]:
            for tau in config.taus:
                for seed in config.seeds:
                    rows.append({"optimizer": name, "learning_rate": lr, "tau": tau, "seed": seed,
                                 "accuracy": stale_run(data, name, lr, tau, config.staleness_steps, seed)})
            if progress:
                done = pd.DataFrame(rows).query("optimizer == @name and learning_rate == @lr")
                accs = done.groupby("tau")["accuracy"].mean()
                print(f"staleness: {name:<7} lr={lr:<6g} accuracy by tau " +
                      ", ".join(f"{t}:{a:.3f}" for t, a in accs.items()), flush=True)
    return pd.DataFrame(rows)


def staleness_table(rows: pd.DataFrame) -> pd.DataFrame:
    """'mean ± std' accuracy, rows optimizer x learning rate, columns tau. ``staleness_table(staleness_study(...))``"""
    from study.reporting import format_mean_std

    grouped = rows.groupby(["optimizer", "learning_rate", "tau"])["accuracy"].agg(["mean", "std"]).reset_index()
    grouped["accuracy"] = [format_mean_std(m, s) for m, s in zip(grouped["mean"], grouped["std"])]
    return grouped.pivot(index=["optimizer", "learning_rate"], columns="tau", values="accuracy")


def sensitivity(rows: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer: accuracy at the largest tau minus at tau=0, at each one's best learning rate. ``sensitivity(rows)``"""
    means = rows.groupby(["optimizer", "learning_rate", "tau"])["accuracy"].mean().reset_index()
    out = []
    for name, group in means.groupby("optimizer", sort=False):
        best_lr = group[group["tau"] == group["tau"].min()].sort_values("accuracy").iloc[-1]["learning_rate"]
        at = group[group["learning_rate"] == best_lr].set_index("tau")["accuracy"]
        out.append({"optimizer": name, "learning_rate": best_lr, "accuracy_tau0": at.iloc[0],
                    f"accuracy_tau{int(at.index.max())}": at.iloc[-1], "drop": at.iloc[0] - at.iloc[-1]})
    return pd.DataFrame(out)


def conclusion(costs: pd.DataFrame, check: pd.DataFrame, ps_table: pd.DataFrame, sensitivity: pd.DataFrame,
               fault: dict[str, Any]) -> str:
    """A Markdown conclusion computed from the measurements. ``conclusion(costs, check, ps, sens, fault)``"""
    per_mode = costs.groupby("mode")["ratio_to_one_pass"].max()
    lines = ["* **Fetching gradients one by one costs** " + ", ".join(
        f"{ratio:.1f}× one pass ({mode})" for mode, ratio in per_mode.items()) + ".",
        f"* **Compute → transform → apply is exact:** the largest error of `x_after - (x_before - lr*T(g))` on the CNN "
        f"is {check['max_abs_error'].max():.1e}."]
    if len(ps_table) > 1:
        base = ps_table.iloc[0]
        lines.append("* **Parameter server:** " + "; ".join(
            f"{int(r.workers)} worker(s) {r.updates_per_s:.0f} updates/s ({r.updates_per_s / base.updates_per_s:.2f}× one), "
            f"mean staleness {r.staleness_mean:.2f}" for r in ps_table.itertuples()) + ".")
    if len(sensitivity):
        lines.append("* **Staleness:** at each optimizer's best learning rate without delay, accuracy drops by " + ", ".join(
            f"{r.drop:.3f} for {r.optimizer}" for r in sensitivity.itertuples()) + " at the largest delay.")
    lines.append(f"* **A killed worker:** {fault['returned_steps']} of {fault['scheduled_steps']} scheduled steps "
                 f"returned, {fault['applied_updates']} updates applied; training finished.")
    return "\n".join(lines)


def headline(metrics: dict[str, Any]) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study. ``headline(metrics)``"""
    out = {f"{k}: ratio to one pass": f"{v['ratio']:.2f}" for k, v in metrics["fetch_costs"].items()}
    out["max error of x_after - (x_before - lr*T(g)) on the CNN"] = f"{metrics['exact_update_max_error']:.1e}"
    ps = metrics["ps"]
    first = next(iter(ps.values()))["updates_per_s"]
    for w, r in ps.items():
        out[f"PS, {w} worker(s): updates/s (÷ 1 worker) / mean staleness"] = \
            f"{r['updates_per_s']:.0f} ({r['updates_per_s'] / first:.2f}) / {np.mean(r['staleness']):.2f}"
    f = metrics["fault"]
    out["worker killed midway: scheduled / returned / applied"] = \
        f"{f['scheduled_steps']} / {f['returned_steps']} / {f['applied_updates']}"
    return out
