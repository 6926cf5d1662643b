"""Benchmark: an Embedding under ``MaskedOptimizer(state="sparse")``, its gradient kept sparse vs densified.

New-token fine-tuning: a fixed set of embedding rows trains (200 new rows of a 200,000 x 32 table: K = 6,400
of N = 6.4 million entries), every other variable is frozen. The tape gives the embedding an ``IndexedSlices``
gradient (the rows a batch looks up). Two ``tf.function`` train steps on two identical models, timed side by
side in alternating rounds:

* ``sparse_gradient`` -- the gradient goes to ``apply`` as it comes: the wrapper hands the inner Adam an
  ``IndexedSlices`` over the selected entries of the touched rows (cost in proportion to the batch and K);
* ``densified`` -- the same step with ``tf.convert_to_tensor`` on the gradient first: an N-entry tensor per
  step (what the wrapper itself did before).

The ratio is the median over rounds of (sparse_gradient / densified); below 1 is faster. Both steps keep
costs in proportion to N that the wrapper does not make: Keras' ``Embedding`` reads the whole table in its
forward pass, and after a sparse write TensorFlow copies a variable on such a read. Prints ratios; asserts
nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from freezing import MaskedOptimizer  # noqa: E402


def make_step(vocabulary: int, dim: int, new_rows: int, densify: bool, seed: int = 0):
    """A train step on a fresh model: embedding rows ``[vocabulary - new_rows, vocabulary)`` train."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(vocabulary, dim),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    embeddings = model.layers[0].embeddings
    opt = MaskedOptimizer(keras.optimizers.Adam(1e-3), state="sparse")
    keep = np.zeros((vocabulary, 1), bool)
    keep[vocabulary - new_rows:] = True
    opt.set_mask(embeddings, np.broadcast_to(keep, (vocabulary, dim)))
    opt.set_mask(model.layers[-1].kernel, False)
    opt.set_mask(model.layers[-1].bias, False)
    opt.build(model.trainable_variables)

    @tf.function
    def step(ids, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(ids)[:, 0] - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        if densify:
            grads = [tf.convert_to_tensor(g) for g in grads]
        opt.apply(grads, model.trainable_variables)

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabulary", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--new-rows", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    pool = []
    for _ in range(8):  # a quarter of each batch's ids are new tokens
        ids = rng.integers(0, args.vocabulary, (args.batch, args.length))
        new = rng.random(ids.shape) < 0.25
        ids[new] = rng.integers(args.vocabulary - args.new_rows, args.vocabulary, int(new.sum()))
        pool.append((tf.constant(ids, tf.int32), tf.constant(rng.normal(size=args.batch), tf.float32)))
    steps = {name: make_step(args.vocabulary, args.dim, args.new_rows, densify=name == "densified")
             for name in ("sparse_gradient", "densified")}
    for fn in steps.values():  # trace and warm up
        for i in range(3):
            fn(*pool[i])
    times = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    k = 0
    for r in range(args.rounds):
        for name in list(steps)[r % 2:] + list(steps)[: r % 2]:
            fn = steps[name]
            start_cpu, start = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                fn(*pool[k % len(pool)])
                k += 1
            times[name].append((time.perf_counter() - start) / args.steps)
            cpu[name].append((time.process_time() - start_cpu) / args.steps)
    per_round = [s / d for s, d in zip(times["sparse_gradient"], times["densified"])]
    per_round_cpu = [s / d for s, d in zip(cpu["sparse_gradient"], cpu["densified"])]
    result = {
        "vocabulary": args.vocabulary, "dim": args.dim, "new_rows": args.new_rows, "batch": args.batch,
        "length": args.length, "rounds": args.rounds, "steps_per_round": args.steps,
        "ms_per_step": {name: 1e3 * statistics.median(t) for name, t in times.items()},
        "cpu_ms_per_step": {name: 1e3 * statistics.median(t) for name, t in cpu.items()},
        "ratio_sparse_over_densified": statistics.median(per_round),
        "ratio_sparse_over_densified_rounds_min_max": (min(per_round), max(per_round)),
        "cpu_ratio_sparse_over_densified": statistics.median(per_round_cpu),
        "cpu_ratio_sparse_over_densified_rounds_min_max": (min(per_round_cpu), max(per_round_cpu)),
    }
    print(f"Embedding {args.vocabulary} x {args.dim} under MaskedOptimizer(Adam, state='sparse'), {args.new_rows} rows "
          f"train (K = {args.new_rows * args.dim:,}), batch {args.batch} x {args.length} ids, {args.rounds} "
          f"interleaved rounds x {args.steps} steps")
    for name in steps:
        print(f"  {name:<16} {result['ms_per_step'][name]:8.2f} ms/step wall, {result['cpu_ms_per_step'][name]:8.2f} "
              "ms/step process CPU (medians of rounds)")
    for key, what in (("", "wall"), ("cpu_", "CPU ")):
        lo, hi = result[f"{key}ratio_sparse_over_densified_rounds_min_max"]
        print(f"  ratio sparse gradient / densified, {what} = {result[f'{key}ratio_sparse_over_densified']:.3f}  "
              f"(median of {args.rounds} per-round ratios, min-max {lo:.3f}-{hi:.3f})")
    return result


if __name__ == "__main__":
    main()
