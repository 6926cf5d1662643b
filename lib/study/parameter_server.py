"""Asynchronous Downpour-SGD on TensorFlow's own parameter-server runtime, with staleness measured.

The variables live on the ps tasks (``tf.distribute.ParameterServerStrategy``); a ``ClusterCoordinator``
schedules functions on the workers. Each scheduled function runs ``steps_per_function`` Downpour steps:
read a version counter, compute the gradients of a minibatch (``gradients.compute``), pass them through
a transform hook, apply them as ``v -= lr * T(g)`` on the ps (``gradients.apply``), and bump the counter.
The staleness of an applied gradient is the number of updates other workers applied in between.

The model is a plain-TF MLP on MNIST: on this machine, closures over a Keras model's variables ran one
worker at a time (see the closing note of the gradients issue), while plain ``tf.Variable`` s interleave.

``run_downpour(workers=2, steps=200)`` runs the whole job (cluster and coordinator) in a child process,
so the caller's process never holds a distributed runtime, and returns the measurements as a dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from freezing.validation import check_positive_int, check_range


@dataclass(frozen=True)
class DownpourConfig:
    """One asynchronous training job. ``DownpourConfig(workers=2, steps=200)``"""

    workers: int = 1
    ps: int = 1
    steps: int = 200
    steps_per_function: int = 4
    batch: int = 64
    learning_rate: float = 0.1
    gradient_decay: float = 1.0
    hidden: int = 128
    seed: int = 0
    kill_worker_after: int | None = None
    start_timeout: float = 90.0
    eval_every: int = 10

    def __post_init__(self) -> None:
        for name in ("workers", "ps", "steps", "steps_per_function", "batch", "hidden", "eval_every"):
            check_positive_int(name, getattr(self, name))
        check_range("learning_rate", self.learning_rate, 0.0, 10.0, low_open=True)
        check_range("gradient_decay", self.gradient_decay, 0.0, 10.0)
        if self.kill_worker_after is not None:
            check_positive_int("kill_worker_after", self.kill_worker_after)
            if self.workers < 2:
                raise ValueError("kill_worker_after: needs workers >= 2, so that training can go on without one")

    @property
    def functions(self) -> int:
        """Scheduled functions: ``steps`` rounded up to whole functions."""
        return -(-self.steps // self.steps_per_function)


def _train(config: DownpourConfig) -> dict[str, Any]:
    """The coordinator's side: build variables on the ps, schedule, collect. Runs in the child process."""
    import numpy as np
    import tensorflow as tf

    from freezing import gradients
    from study.cluster import LocalCluster
    from study.data import load_mnist

    data = load_mnist(seed=config.seed)
    x_train = data.x_train.reshape(-1, 784)
    x_test, y_test = data.x_test.reshape(-1, 784), data.y_test
    with LocalCluster(config.workers, config.ps, start_timeout=config.start_timeout) as cluster:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster.spec),
                                                                        rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        rng = np.random.default_rng(config.seed)
        init = [rng.normal(0, 0.05, (784, config.hidden)), np.zeros(config.hidden),
                rng.normal(0, 0.05, (config.hidden, 10)), np.zeros(10)]
        with strategy.scope():
            params = [tf.Variable(v.astype(np.float32), name=f"w{i}") for i, v in enumerate(init)]
            version = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        def logits(x: tf.Tensor) -> tf.Tensor:
            return tf.nn.relu(x @ params[0] + params[1]) @ params[2] + params[3]

        def dataset_fn() -> tf.data.Dataset:
            return (tf.data.Dataset.from_tensor_slices((x_train, data.y_train)).shuffle(len(x_train))
                    .repeat().batch(config.batch))

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        decay = config.gradient_decay

        @tf.function
        def scheduled(it: Any) -> tuple[tf.Tensor, tf.Tensor]:
            def one_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                read = version.read_value()
                with tf.control_dependencies([read]):
                    x = tf.identity(x)
                loss, grads = gradients.compute(
                    lambda: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits(x))), params)
                gradients.apply(gradients.transform(grads, lambda g: decay * g), params,
                                learning_rate=config.learning_rate)
                with tf.control_dependencies([p.read_value() for p in params]):
                    new = version.assign_add(1)
                return loss, new - 1 - read

            losses, stale = [], []
            for _ in range(config.steps_per_function):
                x, y = next(it)
                loss, s = strategy.run(one_step, args=(x, y))
                losses.append(loss)
                stale.append(s)
            return tf.stack(losses), tf.stack(stale)

        started = time.perf_counter()
        results, curve, killed_at = [], [], None
        for f in range(config.functions):
            results.append(coordinator.schedule(scheduled, args=(iterator,)))
            if config.kill_worker_after is not None and killed_at is None and f + 1 >= config.kill_worker_after:
                cluster.kill("worker", 0)
                killed_at = f + 1
            if (f + 1) % config.eval_every == 0 or f + 1 == config.functions:
                coordinator.join()
                weights = [p.numpy() for p in params]
                hidden = np.maximum(x_test @ weights[0] + weights[1], 0)
                accuracy = float(np.mean((hidden @ weights[2] + weights[3]).argmax(1) == y_test))
                curve.append({"functions": f + 1, "applied_updates": int(version.numpy()),
                              "seconds": time.perf_counter() - started, "accuracy": accuracy})
        coordinator.join()
        elapsed = time.perf_counter() - started
        staleness = np.concatenate([np.asarray(r.fetch()[1]).reshape(-1) for r in results])
        return {
            "config": asdict(config),
            "scheduled_steps": config.functions * config.steps_per_function,
            "returned_steps": int(staleness.size),
            "applied_updates": int(version.numpy()),
            "seconds": elapsed,
            "steps_per_s": int(version.numpy()) / elapsed,
            "staleness": staleness.astype(int).tolist(),
            "curve": curve,
            "killed_worker_after_function": killed_at,
            "pids": cluster.pids,
        }


def run_downpour(config: DownpourConfig, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one job in a child process and return its measurements. ``run_downpour(DownpourConfig(workers=2))``"""
    with tempfile.TemporaryDirectory(prefix="freezing-downpour-") as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2")
        try:
            run = subprocess.run([sys.executable, "-m", "study.parameter_server", json.dumps(asdict(config)),
                                  str(out)], env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"run_downpour: the job did not finish within {timeout_s:g} s") from None
        if run.returncode != 0 or not out.is_file():
            tail = "\n".join(run.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"run_downpour: the job failed (exit {run.returncode}): {tail}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    """Child-process entry point: ``python -m study.parameter_server CONFIG_JSON OUT_JSON``."""
    argv = sys.argv[1:] if argv is None else argv
    config = DownpourConfig(**json.loads(argv[0]))
    result = _train(config)
    Path(argv[1]).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # the distributed runtime's teardown would talk to servers that are already gone


if __name__ == "__main__":
    sys.exit(main())
