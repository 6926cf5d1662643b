"""Study 04, sections 1-2: getting all gradients efficiently, and compute -> transform -> apply, exactly.

* ``fetch_costs``: ms for all gradients of the Deep MNIST CNN, one pass vs one per variable, in TF1 graph
  mode (``sess.run(all)`` vs ``g.eval()`` per variable) and in TF2 (one tape, a persistent tape per
  variable, recomputing per variable), eagerly and inside ``tf.function``.
* ``exact_update_check`` and ``quadratic_with_tensorboard``: ``x_after == x_before - lr*T(g)``, and the
  seed's TensorBoard scalars of ``x`` and ``dy/dx``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from freezing import gradients
from study.gradients.config import GradientStudyConfig
from study.models import deep_mnist_cnn
from study.training import LOSS


def interleaved_ms(methods: Mapping[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Wall time of each method in every round (ms), the methods called in turn within a round, their order rotated
    from round to round, after one warm-up call each: a method's times and its rival's are paired by round, under
    the same load. ``interleaved_ms({"a": f, "b": g}, rounds=5)["a"]``"""
    names = list(methods)
    for fn in methods.values():
        fn()  # warm up / trace
    times: dict[str, list[float]] = {name: [0.0] * rounds for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            methods[name]()
            times[name][r] = 1e3 * (time.perf_counter() - start)
    return times


def _rows(mode: str, times: Mapping[str, list[float]]) -> list[dict[str, Any]]:
    """One row per method: median/fastest/slowest ms, and the ratio to the mode's first (one-pass) method, per
    round: its median and its range over the rounds."""
    base = np.asarray(next(iter(times.values())))
    rows = []
    for method, ms in times.items():
        ms = np.asarray(ms)
        ratios = ms / base
        rows.append({"mode": mode, "method": method, "ms": float(np.median(ms)), "ms_min": float(ms.min()),
                     "ms_max": float(ms.max()), "ratio_to_one_pass": float(np.median(ratios)),
                     "ratio_low": float(ratios.min()), "ratio_high": float(ratios.max()), "rounds": len(ms)})
    return rows


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
    """ms to get every gradient of the CNN, per method, and the ratio to one pass in the same mode. ``fetch_costs(cfg)``

    The methods of a mode are timed interleaved (``interleaved_ms``) in ``config.repeats`` rounds. Each row holds
    the median, fastest and slowest ms, and the ratio to the mode's one-pass method in the same round: its median
    (``ratio_to_one_pass``) and its range over the rounds (``ratio_low`` to ``ratio_high``). A method is called
    faster or slower than one pass only when that whole range is (``study.report.prose.timing_side``)."""
    rng = np.random.default_rng(seed)
    xb = rng.random((config.batch, 28, 28, 1)).astype(np.float32)
    yb = rng.integers(0, 10, config.batch).astype(np.int32)
    rows = []
    graph, x, y, variables, grads = _tf1_cnn(config.batch)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.variables_initializer(variables))
        feed = {x: xb, y: yb}
        rows += _rows("TF1 graph", interleaved_ms({
            "one sess.run(all gradients)": lambda: sess.run(grads, feed),
            "g.eval() per variable": lambda: [g.eval(feed, session=sess) for g in grads]}, config.repeats))
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
        wrapped = {name: wrap(fn) for name, fn in methods.items()}
        rows += _rows(mode, interleaved_ms({name: (lambda f=f: [g.numpy() for g in f()])
                                            for name, f in wrapped.items()}, config.repeats))
    return pd.DataFrame(rows)


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
    """The seed's y = 0.5*(x-b)^2 through compute -> transform ->
    apply, logging x and dy/dx. ``quadratic_with_tensorboard(None)``"""
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


def costs_display(costs: pd.DataFrame) -> pd.DataFrame:
    """``fetch_costs`` as the report shows it: rows (mode, method), text cells; the ratio as the prose quotes it
    (three significant digits) and every range rounded outward, so that each printed range holds its data.

    ``costs_display(fetch_costs(config))``"""
    from study.report.prose import ceil, fixed, floor, times

    out = pd.DataFrame(index=pd.MultiIndex.from_frame(costs[["mode", "method"]]))
    out["median (ms)"] = [fixed(v, 1) for v in costs["ms"]]
    out["fastest–slowest round (ms)"] = [f"{floor(a, 'fixed', 1)}–{ceil(b, 'fixed', 1)}"
                                          for a, b in zip(costs["ms_min"], costs["ms_max"])]
    out["ratio to one pass"] = [times(v) for v in costs["ratio_to_one_pass"]]
    out["ratio's range over the rounds"] = [f"{floor(a, 'times', 3)}–{ceil(b, 'times', 3)}"
                                              for a, b in zip(costs["ratio_low"], costs["ratio_high"])]
    return out
