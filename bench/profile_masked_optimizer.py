"""Profile (not part of ``make bench``): where ``MaskedOptimizer``'s time goes, optimizer step only.

Times ``apply_gradients`` alone (fixed gradients, no forward/backward) on the Deep MNIST CNN's variable
shapes, in interleaved rounds, for: plain Adam; ``hold`` with a stored per-element mask on every
variable; ``hold`` with no stored mask; ``policy="none"`` with the same masks; ``hold`` with
``mask_fn`` (fresh random mask each step); and, as references, the bare cost of the ops the wrapper
adds: the random masks alone (``bench_masked_fit.random_keep``) and three ``tf.where`` per variable.
Reports milliseconds per call (median of rounds, wall and process CPU) and the difference to plain
Adam, which is what each variant adds to every ``fit`` step. ``--jit`` compiles the functions with XLA.

    .venv/bin/python bench/profile_masked_optimizer.py [--jit] [--rounds 9] [--calls 10]
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
from bench_masked_fit import random_keep  # noqa: E402

from freezing import MaskedOptimizer  # noqa: E402
from study.models import deep_mnist_cnn  # noqa: E402

tf.get_logger().setLevel("ERROR")  # seven functions from one closure: TF warns about "retracing"; each traces once


def _step(name, shapes, grads, masks):
    """One variant's step function, with its own variables (a closure: tf.function captures them)."""
    variables = [keras.Variable(np.zeros(s, np.float32), name=p.split("/")[-1]) for s, p in shapes]
    if name == "plain":
        opt = keras.optimizers.Adam(1e-4)
    elif name == "hold_masks":
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-4), "hold")
    elif name == "hold_nomask":
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-4), "hold")
    elif name == "none_masks":
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-4), "none")
    elif name == "mask_fn":
        opt = MaskedOptimizer(keras.optimizers.Adam(1e-4), "hold", mask_fn=random_keep)
    else:
        opt = None
    if opt is not None:
        opt.build(variables)
        if name.endswith("_masks"):
            for v, m in zip(variables, masks):
                opt.set_mask(v, m)

        def fn():
            opt.apply_gradients(zip(grads, variables))
    elif name == "rng_only":  # the masks mask_fn draws, alone
        step = tf.Variable(0, dtype=tf.int64)

        def fn():
            step.assign_add(1)
            keeps = [random_keep(step, v) for v in variables]
            return tf.add_n([tf.reduce_sum(tf.cast(k, tf.int32)) for k in keeps])
    elif name == "where_only":  # three tf.where per variable (value, m, v) with stored-shape masks
        stored = [tf.Variable(m, shape=tf.TensorShape(None)) for m in masks]

        def fn():
            for v, g, k in zip(variables, grads, stored):
                keep, w = tf.convert_to_tensor(k), v.value  # the tf.Variable under the keras.Variable
                for pad in (-0.0, 0.0):
                    w.assign_add(tf.ensure_shape(tf.where(keep, g, tf.constant(pad)), w.shape))
                w.assign(tf.ensure_shape(tf.where(keep, tf.convert_to_tensor(w), g), w.shape))
    else:
        raise ValueError(name)
    return fn


def make(names: list[str], jit: bool) -> dict:
    keras.utils.set_random_seed(0)
    shapes = [(tuple(v.shape), v.path) for v in deep_mnist_cnn().trainable_variables]
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.normal(size=s).astype(np.float32)) for s, _ in shapes]
    masks = [rng.random(s) < 0.5 for s, _ in shapes]
    fns = {}
    for name in names:
        fns[name] = tf.function(_step(name, shapes, grads, masks), jit_compile=jit)
    return fns


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=10, help="calls per variant per round")
    parser.add_argument("--jit", action="store_true")
    args = parser.parse_args(argv)
    names = ["plain", "hold_masks", "hold_nomask", "none_masks", "mask_fn", "rng_only", "where_only"]
    fns = make(names, args.jit)
    for fn in fns.values():
        for _ in range(3):
            fn()
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = fns[name]
            c, t = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                fn()
            wall[name].append((time.perf_counter() - t) / args.calls)
            cpu[name].append((time.process_time() - c) / args.calls)
    out = {"jit": args.jit, "rounds": args.rounds, "calls": args.calls, "variants": {}}
    print(f"apply_gradients alone, Deep MNIST CNN variable shapes (3,274,634 entries), Adam, "
          f"{'XLA' if args.jit else 'no XLA'}, {args.rounds} rounds x {args.calls} calls")
    for name in names:
        diff = [a - b for a, b in zip(wall[name], wall["plain"])]
        cdiff = [a - b for a, b in zip(cpu[name], cpu["plain"])]
        row = {"wall_ms": 1e3 * statistics.median(wall[name]), "cpu_ms": 1e3 * statistics.median(cpu[name]),
               "wall_ms_minus_plain": 1e3 * statistics.median(diff),
               "cpu_ms_minus_plain": 1e3 * statistics.median(cdiff),
               "wall_ms_minus_plain_min_max": (1e3 * min(diff), 1e3 * max(diff))}
        out["variants"][name] = row
        extra = "" if name == "plain" else (f"   adds {row['wall_ms_minus_plain']:+7.2f} ms wall "
                                            f"({row['wall_ms_minus_plain_min_max'][0]:+.1f}.."
                                            f"{row['wall_ms_minus_plain_min_max'][1]:+.1f}), "
                                            f"{row['cpu_ms_minus_plain']:+7.2f} ms CPU")
        ref = " (reference, not an optimizer)" if name.endswith("_only") else ""
        print(f"  {name:<12} {row['wall_ms']:8.2f} ms wall {row['cpu_ms']:8.2f} ms CPU per call{extra}{ref}")
    return out


if __name__ == "__main__":
    main()
