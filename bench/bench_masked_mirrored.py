"""Benchmark: ``MaskedOptimizer(Adam)`` in ``model.fit`` under ``MirroredStrategy`` over two logical CPU devices.

Both variants run under the same strategy (two logical devices on the machine's cores, set up before
TensorFlow starts, so ``bench/run.py`` runs this in its own process): plain Adam, and
``MaskedOptimizer(Adam)`` with a fresh random per-element mask on every variable at every epoch
(``bench_masked_fit.RandomMasks``). Interleaved rounds, one ``fit`` call each; per-step wall and process
CPU time from a callback; the ratio is the median over rounds of masked / plain. Prints ratios and
writes them as JSON (``--json``); asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_masked_fit import RandomMasks, StepTimer  # noqa: E402

from freezing import MaskedOptimizer  # noqa: E402
from study.models import deep_mnist_cnn  # noqa: E402

TARGET = 1.05


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=50, help="global batch (each replica gets half)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", default=None, help="write the result here")
    args = parser.parse_args(argv)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True).cache().repeat()

    variants = {}
    for name in ("plain", "hold"):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = deep_mnist_cnn()
            opt = keras.optimizers.Adam(1e-4) if name == "plain" else MaskedOptimizer(keras.optimizers.Adam(1e-4))
            model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        timer = StepTimer()
        callbacks = [timer] if name == "plain" else [RandomMasks(opt, seed=1), timer]
        variants[name] = (model, callbacks, timer)

    def fit(name: str, epochs: int) -> None:
        model, callbacks, _ = variants[name]
        model.fit(data, epochs=epochs, steps_per_epoch=args.steps, callbacks=callbacks, verbose=0, shuffle=False)

    for name in variants:
        fit(name, 1)
        variants[name][2].clear()
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[: r % 2]:
            timer = variants[name][2]
            first = len(timer.steps)
            fit(name, args.epochs)
            wall[name].append(statistics.median(timer.steps[first:]))
            cpu[name].append(statistics.median(timer.cpu_steps[first:]))
    ratios = [h / p for h, p in zip(wall["hold"], wall["plain"])]
    cpu_ratios = [h / p for h, p in zip(cpu["hold"], cpu["plain"])]
    result = {
        "replicas": strategy.num_replicas_in_sync, "batch": args.batch, "rounds": args.rounds,
        "epochs_per_round": args.epochs, "steps_per_epoch": args.steps, "target": TARGET,
        "ms_per_step": {k: 1e3 * statistics.median(v) for k, v in wall.items()},
        "cpu_ms_per_step": {k: 1e3 * statistics.median(v) for k, v in cpu.items()},
        "ratio_hold_over_plain": statistics.median(ratios), "ratio_rounds": ratios,
        "cpu_ratio_hold_over_plain": statistics.median(cpu_ratios), "cpu_ratio_rounds": cpu_ratios,
    }
    print(f"MirroredStrategy over {result['replicas']} logical CPU devices, Deep MNIST CNN, global batch {args.batch}, "
          f"Adam; {args.rounds} interleaved rounds x {args.epochs} epochs x {args.steps} steps; masked: a random half "
          "of every variable frozen, a new mask every epoch")
    for name in variants:
        print(f"  {name:<6} {result['ms_per_step'][name]:8.2f} ms/step wall, "
              f"{result['cpu_ms_per_step'][name]:8.2f} ms/step process CPU (medians of rounds)")
    for key, what, rounds in (("ratio_hold_over_plain", "wall", ratios),
                              ("cpu_ratio_hold_over_plain", "CPU ", cpu_ratios)):
        value = result[key]
        print(f"  mirrored fit ratio masked / plain, {what} = {value:.3f}  (median of {args.rounds} rounds, min-max "
              f"{min(rounds):.3f}-{max(rounds):.3f})  target <= {TARGET}: {'met' if value <= TARGET else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
