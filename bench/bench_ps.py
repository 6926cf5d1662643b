"""Benchmark: asynchronous parameter-server throughput, 2 workers vs 1, and the PS step vs a local step.

All on this machine in one run: ``run_downpour`` with 1 and 2 workers (one ps task; ``steps_per_function``
steps packed into each scheduled function), then the same MLP step (compute, T(g), assign_sub) in a local
``tf.function`` loop. Prints ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from freezing import gradients  # noqa: E402
from study.parameter_server import DownpourConfig, run_downpour  # noqa: E402


def local_steps_per_s(steps: int, batch: int = 64, hidden: int = 128, learning_rate: float = 0.1) -> float:
    """The Downpour step without the cluster: same MLP, same compute -> transform -> apply, in-process."""
    rng = np.random.default_rng(0)
    params = [tf.Variable(rng.normal(0, 0.05, (784, hidden)).astype(np.float32)), tf.Variable(np.zeros(hidden, np.float32)),
              tf.Variable(rng.normal(0, 0.05, (hidden, 10)).astype(np.float32)), tf.Variable(np.zeros(10, np.float32))]
    x = tf.constant(rng.random((batch, 784)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))

    @tf.function
    def step() -> tf.Tensor:
        loss, grads = gradients.compute(lambda: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            y, tf.nn.relu(x @ params[0] + params[1]) @ params[2] + params[3])), params)
        gradients.apply(gradients.transform(grads, None), params, learning_rate=learning_rate)
        return loss

    step().numpy()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.numpy()
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--steps-per-function", type=int, default=8)
    args = parser.parse_args(argv)
    rates = {}
    for workers in (1, 2):
        result = run_downpour(DownpourConfig(workers=workers, steps=args.steps, steps_per_function=args.steps_per_function,
                                             eval_every=10**6))
        rates[workers] = result["steps_per_s"]
    local = local_steps_per_s(args.steps)
    out = {"ps_updates_per_s": rates, "local_steps_per_s": local, "ratio_2_over_1_workers": rates[2] / rates[1],
           "ratio_local_over_ps_1_worker": local / rates[1], "steps_per_function": args.steps_per_function,
           "cpus": os.cpu_count()}
    print(f"Asynchronous Downpour SGD (MLP 784-128-10, batch 64), {args.steps} updates, "
          f"{args.steps_per_function} steps per scheduled function, {os.cpu_count()} cores")
    print(f"  1 worker {rates[1]:7.1f} updates/s; 2 workers {rates[2]:7.1f} updates/s; local loop {local:7.1f} steps/s")
    print(f"  ratio 2 workers / 1 worker      = {out['ratio_2_over_1_workers']:.3f}  (target >= 1.6)")
    print(f"  PS step overhead: local / PS(1) = {out['ratio_local_over_ps_1_worker']:.2f}x")
    return out


if __name__ == "__main__":
    main()
