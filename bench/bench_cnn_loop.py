"""Benchmark: the Deep MNIST CNN's custom tf.function training loop against Keras ``model.fit``, and its
achieved GFLOP/s against this machine's dense-matmul GFLOP/s, all measured in one run.

Both loops train the same architecture with Adam on the same fixed batch; FLOPs are counted from the
model's layers (``study.models.training_flops_per_sample``). Prints ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from study.models import deep_mnist_cnn, training_flops_per_sample  # noqa: E402
from study.training import LOSS  # noqa: E402


def matmul_gflops(n: int = 2048, repeats: int = 10) -> float:
    """Dense float32 matmul throughput of this machine, GFLOP/s (best of several timings)."""
    a, b = tf.random.normal((n, n)), tf.random.normal((n, n))
    mm = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
    mm().numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mm().numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--steps", type=int, default=30, help="steps per timing")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    x = tf.random.uniform((args.batch, 28, 28, 1))
    y = tf.random.uniform((args.batch,), maxval=10, dtype=tf.int32)

    custom_model, custom_opt = deep_mnist_cnn(), keras.optimizers.Adam(1e-4)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, custom_model(x, training=True))
        grads = tape.gradient(loss, custom_model.trainable_variables)
        custom_opt.apply_gradients(zip(grads, custom_model.trainable_variables))
        return loss

    def run_custom() -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step(x, y)
        loss.numpy()
        return time.perf_counter() - start

    fit_model = deep_mnist_cnn()
    fit_model.compile(keras.optimizers.Adam(1e-4), loss=LOSS)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()

    def run_fit() -> float:
        start = time.perf_counter()
        fit_model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, shuffle=False)
        return time.perf_counter() - start

    run_custom(), run_fit()  # trace both
    custom_times, fit_times = [], []
    for r in range(args.rounds):
        for name, run, times in (("custom", run_custom, custom_times),
                                 ("fit", run_fit, fit_times))[:: 1 if r % 2 else -1]:
            times.append(run())
    custom_sps = args.steps / statistics.median(custom_times)
    fit_sps = args.steps / statistics.median(fit_times)
    flops = training_flops_per_sample(custom_model)
    achieved = flops * args.batch * custom_sps / 1e9
    peak = matmul_gflops()
    result = {
        "batch": args.batch, "steps_per_s_custom": custom_sps, "steps_per_s_fit": fit_sps,
        "ratio_custom_over_fit": custom_sps / fit_sps, "fit_jit_compile": bool(fit_model.jit_compile),
        "training_mflop_per_sample": flops / 1e6, "train_gflops": achieved, "matmul_gflops": peak,
        "ratio_train_over_matmul_gflops": achieved / peak,
    }
    print(f"Deep MNIST CNN training, batch {args.batch}, Adam, {args.rounds} rounds x {args.steps} steps")
    print(f"  custom tf.function loop {custom_sps:7.1f} steps/s;  model.fit {fit_sps:7.1f} steps/s "
          f"(fit jit_compile={fit_model.jit_compile})")
    print(f"  ratio custom / fit              = {result['ratio_custom_over_fit']:.3f}  (target >= 1.0)")
    print(f"  training {flops / 1e6:.1f} MFLOP/sample -> {achieved:.1f} GFLOP/s; dense matmul {peak:.1f} GFLOP/s")
    print(f"  ratio train / matmul GFLOP/s    = {result['ratio_train_over_matmul_gflops']:.3f}  (target >= 0.5)")
    return result


if __name__ == "__main__":
    main()
