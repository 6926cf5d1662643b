"""Study 04: getting all gradients efficiently, compute -> transform -> apply, Downpour SGD, and staleness.

* ``fetch_costs``: ms for all gradients of the Deep MNIST CNN, one pass vs one per variable, in TF1 graph
  mode (``sess.run(all)`` vs ``g.eval()`` per variable) and in TF2 (one tape, a persistent tape per
  variable, recomputing per variable), eagerly and inside ``tf.function``.
* ``exact_update_check`` and ``quadratic_with_tensorboard``: ``x_after == x_before - lr*T(g)``, and the
  seed's TensorBoard scalars of ``x`` and ``dy/dx``.
* ``GradientStudyConfig``: every parameter of notebook 04 with its default; the staleness sweep itself is
  ``study.staleness``.
* ``ps_*`` tables: the asynchronous parameter-server runs (``study.ps``) as tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing import gradients
from freezing.validation import check_choices, check_int_list, check_positive_int, check_range
from study.models import deep_mnist_cnn
from study.prose import fixed, pm
from study.staleness import STALENESS_OPTIMIZERS
from study.training import LOSS

FAULTS = ("worker", "chief", "ps")


@dataclass(frozen=True)
class GradientStudyConfig:
    """Parameters of study 04 and their defaults (the full run), validated. ``GradientStudyConfig(repeats=3)``"""

    # 1-2. gradient fetching and the exact update
    batch: int = 50
    repeats: int = 5
    # 3-5. Downpour SGD on a local cluster: the Deep MNIST CNN, n_fetch = n_push = ps_n unless swept
    ps_model: str = "study.models:deep_mnist_cnn"
    worker_counts: Sequence[int] = (1, 2)
    ps_tasks: int = 2
    ps_steps: int = 256
    ps_batch: int = 50
    ps_learning_rate: float = 0.05
    ps_n: int = 4
    ps_steps_per_function: int = 8
    ps_eval_every: int = 8
    n_push_sweep: Sequence[int] = (1, 8)
    n_push_sweep_steps: int = 128
    fault_model: str = "study.ps.examples:mnist_mlp"
    fault_steps: int = 240
    faults: Sequence[str] = ("worker", "chief", "ps")
    # 7. Adam on the ps with frozen entries: an MLP, a random share masked_keep of fc1's kernel trains
    masked_steps: int = 96
    masked_keep: float = 0.5
    # 6. staleness in one process
    taus: Sequence[int] = (0, 1, 2, 4, 8)
    staleness_optimizers: Sequence[str] = ("sgd", "adam")
    staleness_learning_rates: dict[str, list[float]] = field(
        default_factory=lambda: {"sgd": [0.05, 0.2, 0.5, 1.0], "adam": [0.001, 0.003, 0.01, 0.03],
                                 "adagrad": [0.05, 0.1, 0.3]})
    staleness_steps: int = 300
    staleness_eval_every: int = 10
    staleness_target: float = 0.85
    seeds: Sequence[int] = (0, 1, 2, 3, 4, 5, 6, 7)

    def __post_init__(self) -> None:
        for name in ("batch", "repeats", "ps_tasks", "ps_steps", "ps_batch", "ps_n", "ps_steps_per_function",
                     "ps_eval_every", "n_push_sweep_steps", "fault_steps", "masked_steps", "staleness_steps",
                     "staleness_eval_every"):
            check_positive_int(name, getattr(self, name))
        check_int_list("worker_counts", self.worker_counts, minimum=1)
        if list(self.n_push_sweep):  # empty: no sweep
            check_int_list("n_push_sweep", self.n_push_sweep, minimum=1)
        check_choices("faults", self.faults, FAULTS)
        check_int_list("taus", self.taus, minimum=0)
        if 0 not in self.taus:
            raise ValueError(f"taus: must include 0 (the baseline each delay is compared with); got {list(self.taus)}")
        check_int_list("seeds", self.seeds, minimum=0)
        check_range("ps_learning_rate", self.ps_learning_rate, 0.0, 10.0, low_open=True)
        check_range("staleness_target", self.staleness_target, 0.0, 1.0, low_open=True)
        check_range("masked_keep", self.masked_keep, 0.0, 1.0, low_open=True)
        if self.masked_steps % 4:
            raise ValueError(f"masked_steps: must be a multiple of 4 (steps per scheduled function); "
                             f"got {self.masked_steps}")
        if self.staleness_steps % self.staleness_eval_every:
            raise ValueError(f"staleness_eval_every: must divide staleness_steps={self.staleness_steps}; "
                             f"got {self.staleness_eval_every}")
        check_choices("staleness_optimizers", self.staleness_optimizers, STALENESS_OPTIMIZERS)
        for name in self.staleness_optimizers:
            rates = self.staleness_learning_rates.get(name) if isinstance(self.staleness_learning_rates, dict) else None
            if not rates:
                raise ValueError(f"staleness_learning_rates: no rates for {name!r}; give a list per optimizer")
            for lr in rates:
                check_range(f"staleness_learning_rates[{name}]", lr, 0.0, 10.0, low_open=True)
        for n in (self.ps_n, *self.n_push_sweep):
            if self.ps_steps_per_function % n:
                raise ValueError(f"ps_steps_per_function: must be a multiple of ps_n and of every n_push_sweep value; "
                                 f"{self.ps_steps_per_function} is not a multiple of {n}")

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any]) -> GradientStudyConfig:
        """The config from notebook parameters: every field name in ``values`` that is not None; defaults otherwise."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    @classmethod
    def parameter_names(cls) -> list[str]:
        """Every field, in order (the names the parameters cell may set)."""
        return [f.name for f in fields(cls)]

    def plain(self) -> dict[str, Any]:
        """The resolved parameters as plain data (for metrics.json)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


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
        tf.compat.v1.set_random_seed(0)  # a graph-level seed: the initializers' ops need one under op determinism
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


# -- the parameter-server runs as tables ----------------------------------------------------------------------


def window_rates(result: Mapping[str, Any], windows: int = 4) -> list[float]:
    """Worker steps per second in ``windows`` equal slices of a run's timed (steady) window, from the workers' clocks.

    The spread of these is the run's own variation over time; ``run_downpour`` results only.
    """
    times = result["function_times"][result.get("steady_from_function") or 0:]
    if len(times) < 2:
        return [result.get("steps_per_s", float("nan"))]
    start, end = min(t[1] for t in times), max(t[2] for t in times)
    edges = np.linspace(start, end, windows + 1)
    steps = result["config"]["steps_per_function"]
    ended = np.array([t[2] for t in times])
    counts = np.histogram(ended, bins=edges)[0]
    return (counts * steps / np.diff(edges)).tolist()


def ps_row(label: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """One run of ``run_downpour`` as a table row: throughput (mean and std over windows), staleness, accuracy, CPU."""
    rates = window_rates(result)
    cfg = result["config"]
    cpu = result.get("steady_task_cpu_s") or {}
    window = result.get("steady_seconds") or float("nan")
    workers = [v for k, v in cpu.items() if k.startswith("worker") and v is not None][:cfg["workers"]]
    ps_cpu = [v for k, v in cpu.items() if k.startswith("ps") and v is not None]
    staleness = np.asarray(result["staleness"]) if result["staleness"] else np.zeros(1)
    return {"run": label, "model": cfg["model"].rpartition(":")[2], "workers": cfg["workers"], "ps": cfg["ps"],
            "n_fetch": cfg["n_fetch"], "n_push": cfg["n_push"], "steps": result["returned_steps"],
            "applied_updates": result["applied_updates"], "steps_per_s": result.get("steps_per_s"),
            "steps_per_s_std": float(np.std(rates, ddof=1)) if len(rates) > 1 else float("nan"),
            "updates_per_s": result.get("updates_per_s"),
            "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
            "final_accuracy": result["final_accuracy"],
            "worker_cpu_share_min": min(workers) / window if workers else float("nan"),
            "worker_cpu_s_per_step": sum(workers) / result["steady_steps"] if workers and result.get("steady_steps")
            else float("nan"),
            "ps_cpu_s_per_step": sum(ps_cpu) / result["steady_steps"] if ps_cpu and result.get("steady_steps")
            else float("nan"),
            "samples_shared_between_workers": result["samples_shared_between_workers"]}


def ps_table(runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``ps_row`` for every run. ``ps_table({"1 worker": r1, "2 workers": r2})``"""
    return pd.DataFrame([ps_row(label, r) for label, r in runs.items()])


def placement_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """Where each variable of a run lives: one row per shard, with its task, shape and bytes."""
    rows = []
    for row in result["placement"]:
        for i, shard in enumerate(row["shards"]):
            rows.append({"variable": row["variable"], "shard": f"{i + 1} of {len(row['shards'])}",
                         "task": shard["task"], "shard shape": "x".join(map(str, shard["shape"])) or "scalar",
                         "bytes": shard["bytes"]})
    return pd.DataFrame(rows)


RUN_DISPLAY = {  # ps_table column -> the report's header (units in brackets); CPU seconds are shown in ms
    "workers": "workers", "n_push": "n_fetch = n_push", "steps": "minibatches", "applied_updates": "updates applied",
    "steps_per_s": "steps/s (mean ± std over timed windows)", "staleness_mean": "mean staleness [updates]",
    "staleness_max": "max staleness [updates]", "final_accuracy": "final test accuracy",
    "worker_cpu_s_per_step": "worker CPU per step [ms]", "ps_cpu_s_per_step": "ps CPU per step [ms]",
    "worker_cpu_share_min": "smallest share of a core a worker got",
    "samples_shared_between_workers": "samples both workers read",
}


def runs_display(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``ps_table`` rows as the report shows them: indexed by run, readable headers with units, CPU in ms,
    steps/s as mean ± std. ``runs_display(ps_table(runs), ["steps_per_s", "final_accuracy"])``"""
    out = pd.DataFrame(index=pd.Index(table["run"], name="run"))
    for column in columns:
        values = table[column].to_numpy()
        if column == "steps_per_s":
            shown = [pm(m, s) for m, s in zip(values, table["steps_per_s_std"])]
        elif column.endswith("_cpu_s_per_step"):
            shown = [fixed(1e3 * v, 1) for v in values]
        elif column in ("staleness_mean", "final_accuracy", "worker_cpu_share_min"):
            shown = [fixed(v, 3 if column == "final_accuracy" else 2) for v in values]
        else:
            shown = [f"{int(v):,}" for v in values]
        out[RUN_DISPLAY[column]] = shown
    return out


def frozen_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """A masked run's frozen and trainable entries per masked variable: how many, and how many changed (bitwise)."""
    tasks = {row["variable"]: ", ".join(s["task"] for s in row["shards"]) for row in result["placement"]}
    return pd.DataFrame([{"variable": path, "shards_on": tasks.get(path, ""), "frozen_entries": r["frozen_entries"],
                          "frozen_bits_changed": r["frozen_changed"], "trainable_entries": r["trainable_entries"],
                          "trainable_changed": r["trainable_changed"]}
                         for path, r in result["frozen"]["per_variable"].items()])


def fault_job(config: GradientStudyConfig) -> Any:
    """The fault run: 2 workers, the ps tasks, checkpoints; each fault in ``config.faults`` at a fixed share of it."""
    from study.ps import DownpourConfig

    updates = config.fault_steps // 2
    at = {"worker": 0.15, "chief": 0.35, "ps": 0.6}
    kills = {f"kill_{name}_at": max(1, int(at[name] * updates)) for name in config.faults}
    return DownpourConfig(model=config.fault_model, workers=2, ps=config.ps_tasks, steps=config.fault_steps,
                          n_fetch=2, n_push=2, steps_per_function=4, learning_rate=0.1, optimizer="adagrad",
                          checkpoint_every=max(2, updates // 6), shard_min_bytes=64 * 1024, seed=config.seeds[0],
                          **kills)


COLUMNS = {
    # fetch_costs
    "mode": "how the gradients are computed: TF1 graph (Session), TF2 eager, or TF2 inside tf.function",
    "method": "the way all gradients are fetched (one pass, one call per variable, or a recomputed pass per variable)",
    "ms": "median wall time to get all gradients of the Deep MNIST CNN for one batch, over `repeats` (ms)",
    "ratio_to_one_pass": "ms / the one-pass method's ms in the same mode (ratio)",
    # quadratic_trace
    "step": "step of the compute-transform-apply loop on y = 0.5 (x - 3)^2; 0 is the start (count)",
    "x": "x at the start of the step (after the previous step's update)",
    "dy_dx": "the gradient dy/dx at that x, which the step transforms and applies",
    "error": "|x after the step - (x before - lr * T(dy/dx))|; 0 means the update is exact (x units)",
    # ps_runs and n_push_sweep
    "run": "label of the cluster run",
    "model": "the Keras model trained (module:function of its builder)",
    "workers": "worker tasks that computed gradients (count)",
    "ps": "parameter-server tasks holding the variables (count)",
    "n_fetch": "a worker fetches fresh parameters every n_fetch of its steps (steps)",
    "n_push": "a worker pushes its summed gradients every n_push of its steps (steps)",
    "steps": "minibatches computed by all workers together (count)",
    "applied_updates": "pushes applied on the ps tasks (count; one per n_push steps of a worker)",
    "steps_per_s": "minibatches per second of all workers together, after the warm-up (1/s)",
    "steps_per_s_std": "std of steps_per_s over 4 equal windows of the run (1/s)",
    "updates_per_s": "updates applied per second after the warm-up (1/s)",
    "staleness_mean": "mean over pushes of the updates other workers applied between a push's fetch and the push "
                      "(updates)",
    "staleness_max": "largest staleness of a push (updates)",
    "final_accuracy": "test accuracy of the parameters on the ps at the end (fraction, 0-1)",
    "worker_cpu_share_min": "smallest share of one core a worker process got over the timed window (fraction of a "
                            "core)",
    "worker_cpu_s_per_step": "CPU seconds of all worker processes per minibatch, timed window, read from /proc (s)",
    "ps_cpu_s_per_step": "CPU seconds of all ps processes per minibatch, timed window, read from /proc (s)",
    "samples_shared_between_workers": "training samples read by more than one worker (count; 0 = disjoint shards)",
    # ps_frozen
    "shards_on": "the ps tasks holding the variable's shards, in order",
    "frozen_entries": "entries its mask freezes (count)",
    "frozen_bits_changed": "frozen entries whose value differs in any bit between the start and the end of the run "
                           "(count; 0 = exactly frozen)",
    "trainable_entries": "entries its mask lets train (count)",
    "trainable_changed": "trainable entries whose value changed during the run (count)",
    # ps_placement
    "variable": "path of the Keras variable",
    "shard": "which shard of the variable (a variable over 256 KiB is split over the ps tasks)",
    "task": "the ps task that holds the shard",
    "shard shape": "shape of the shard (a split variable's shards each hold part of its first axis)",
    "bytes": "size of the shard (bytes)",
    # staleness_curves, staleness_dai_check, staleness_best_per_tau
    "optimizer": "optimizer of the in-process staleness study",
    "learning_rate": "learning rate of the run (for the check: the optimizer's best rate without delay)",
    "tau": "delay: the gradient applied at update t was computed on the parameters of update t - tau (updates)",
    "seed": "seed of the run (weights and minibatches)",
    "updates": "updates applied so far (count)",
    "accuracy": "test accuracy after that many updates (fraction, 0-1)",
    "seeds": "seeds run (count)",
    "reached": "seeds whose run reached staleness_target accuracy (count)",
    "slowdown_mean": "mean over seeds of updates to reach the target / the same seed's updates at tau = 0 (ratio; "
                     "inf if a seed never reached it)",
    "slowdown_std": "std over seeds of that ratio; empty when a seed never reached the target (ratio)",
    "drop_mean": "mean over seeds of final accuracy at tau = 0 minus final accuracy at this tau, the same seed "
                 "(absolute, fraction of test images)",
    "drop_std": "std over seeds of that drop (fraction)",
    "adam": "Adam's final accuracy at its best rate for this tau, mean over seeds (fraction)",
    "sgd": "SGD's final accuracy at its best rate for this tau, mean over seeds (fraction)",
    "adam_std": "std over seeds of Adam's final accuracy at that rate (fraction)",
    "sgd_std": "std over seeds of SGD's final accuracy at that rate (fraction)",
    "adam_lr": "Adam's best learning rate for this tau",
    "sgd_lr": "SGD's best learning rate for this tau",
    # fault_accounting
    "fault": "the task killed",
    "updates when killed (seen)": "the update counter as the launcher last read it before the kill (count)",
    "updates when killed (exact)": "the counter when the task died, read on a ps task that survived (count; empty "
                                   "where it cannot be read)",
    "in the last checkpoint": "updates in the checkpoint the job resumed from (count; empty for a worker: no "
                              "restart from a checkpoint)",
    "lost": "updates applied before the kill but not in the resumed checkpoint (count)",
    "lost is exact": "whether lost is counted exactly (from the surviving ps task) or estimated from the launcher's "
                     "last reading",
    "how it came back": "what restarted after the kill",
}
"""Every column of study 04's tables: meaning (unit), for the data dictionary (``reporting.save_table``)."""


def fault_accounting(result: Mapping[str, Any]) -> pd.DataFrame:
    """Every update of a fault run, accounted for: per fault, what was in the checkpoint, lost, applied after."""
    rows = []
    resumed = [a for a in result["attempts"] if a["resumed"]]
    restored = iter(resumed)
    for fault in result["faults"]:
        row = {"fault": f"{fault['killed']} killed", "updates when killed (seen)": fault.get("version_seen"),
               "updates when killed (exact)": fault.get("version_at_failure")}
        if fault["killed"].startswith("worker"):  # nothing restarts from a checkpoint; its pushes stay applied
            row["in the last checkpoint"], row["lost"], row["lost is exact"] = None, 0, True
            row["how it came back"] = "the coordinator re-ran its function; the worker was started again"
        else:
            attempt = next(restored)
            row["in the last checkpoint"] = attempt["restored_version"]
            at_failure = fault.get("version_at_failure")
            exact = at_failure is not None  # read on a ps task that survived; else what the launcher last saw
            row["lost"] = (at_failure if exact else fault.get("version_seen") or 0) - attempt["restored_version"]
            row["lost is exact"] = exact
            row["how it came back"] = (f"{'ps restarted, ' if fault['killed'].startswith('ps') else ''}"
                                       f"chief restarted with --resume from update {attempt['restored_version']}")
        rows.append(row)
    return pd.DataFrame(rows)


def headline(metrics: dict[str, Any]) -> dict[str, str]:
    """The numbers ``results/SUMMARY.md`` shows for this study. ``headline(metrics)``"""
    out = {f"{k}: time / one pass in the same mode (ratio)": f"{v['ratio']:.2f}"
           for k, v in metrics["fetch_costs"].items() if v["ratio"] != 1.0 or "one" not in k.split("/")[1]}
    error = metrics["exact_update_max_error"]
    out["max |x_after - (x_before - lr*T(g))| on the CNN"] = "0 (exact)" if error == 0 else f"{error:.1e}"
    for w, r in metrics["ps"].items():
        out[f"Downpour CNN, {w} worker{'s' * (int(w) > 1)}: steps/s (mean ± std over timed windows) / final test "
            f"accuracy / mean staleness (updates)"] = \
            f"{r['steps_per_s']:.1f} ± {r['steps_per_s_std']:.1f} / {r['final_accuracy']:.3f} / {r['staleness_mean']:.2f}"
    q = metrics.get("quoted", {})
    for tau in (1, 2, 4, 8):
        value = q.get(f"difference_{tau}")
        if isinstance(value, float) and value == value:  # not NaN: this delay was measured
            out[f"staleness tau = {tau}, each optimizer at its best undelayed learning rate: Adam's accuracy lost "
                f"minus SGD's, paired by seed (mean ± se; negative: Adam loses less)"] = \
                f"{value:+.3f} ± {q[f'difference_se_{tau}']:.3f}"
    f = metrics["fault_accounting"]
    out["faults: updates in the last checkpoint restored / lost with the ps / applied after the last restart"] = \
        f"{f['restored_version']} / {f['lost_with_ps']} / {f['applied_after_restart']}"
    return out
