"""Benchmark: ``MaskedOptimizer(Adam)`` in ``model.fit`` vs plain Adam in ``model.fit``, Deep MNIST CNN.

Variants, each its own compiled model (same initial weights, same data), timed side by side in one
run in interleaved rounds (the order rotates every round; one round = one ``fit`` call):

* ``plain``    -- ``keras.optimizers.Adam``.
* ``hold``     -- ``MaskedOptimizer(Adam, policy="hold")`` with a stored per-element mask on EVERY
  trainable variable, a fresh random one set by a callback at every ``on_epoch_begin``.
* ``mask_fn``  -- ``MaskedOptimizer(Adam, policy="hold", mask_fn=random_keep)``: a fresh random mask
  every step, computed in the graph with ``tf.random.stateless_uniform`` from the step; nothing stored.

Profiling, not part of ``make bench``: ``--profile`` adds ``hold_nomask`` (the wrapper with no
stored mask) and ``none`` (policy="none", the same per-epoch masks); ``--jit`` compiles every variant
with XLA; ``--variants`` picks variants, among them ``hold_fused``/``plain_fused``, a prototype of a
suggested change (only the optimizer update under XLA; see ``fuse_update``).

Per-step time is measured by a callback (``on_train_batch_begin`` -> ``on_train_batch_end``; the
step function is synchronous on CPU); a round's time is the median of its steps; the tracing epoch
is a warm-up outside the rounds. Reported: the median over rounds of (variant / plain) with min and
max, from wall time and from process CPU time (all threads of this process; on a machine shared with
other jobs it moves far less than wall time, which counts the time this process waited for a core),
and, as further cross-checks, from whole-epoch wall times and from each round's fastest step. Also
measured: the persistent memory the wrapper adds. Prints ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from freezing import MaskedOptimizer  # noqa: E402
from study.models import deep_mnist_cnn  # noqa: E402

TARGET = 1.05


def random_keep(step, variable):
    """``mask_fn``: a fresh random half of each variable trains at every step (stateless, from the step)."""
    tag = zlib.crc32(variable.path.encode()) & 0x7FFFFFFF
    seed = tf.stack([tf.cast(step, tf.int64), tf.constant(tag, tf.int64)])
    return tf.random.stateless_uniform(tuple(variable.shape), seed=seed) < 0.5


class StepTimer(keras.callbacks.Callback):
    """Wall seconds per training step (batch begin -> batch end) and per epoch; process CPU seconds per step."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[float] = []
        self.cpu_steps: list[float] = []
        self.epochs: list[float] = []
        self._step = self._cpu = self._epoch = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(time.perf_counter() - self._epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._cpu = time.process_time()
        self._step = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(time.perf_counter() - self._step)
        self.cpu_steps.append(time.process_time() - self._cpu)

    def clear(self) -> None:
        self.steps.clear(), self.cpu_steps.clear(), self.epochs.clear()


class RandomMasks(keras.callbacks.Callback):
    """At every epoch's start: a fresh random per-element mask on every trainable variable."""

    def __init__(self, optimizer: MaskedOptimizer, seed: int, fraction: float = 0.5) -> None:
        super().__init__()
        self.optimizer, self.fraction = optimizer, fraction
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def on_epoch_begin(self, epoch, logs=None):
        for v in self.model.trainable_variables:
            self.optimizer.set_mask(v, self.rng.random(tuple(v.shape)) >= self.fraction)
        self.calls += 1


def _count_traces(optimizer) -> list[int]:
    """Count Python calls of ``optimizer.apply_gradients``: inside ``fit`` these happen only when tracing."""
    count = [0]
    apply_gradients = optimizer.apply_gradients

    def counting(*args, **kwargs):
        count[0] += 1
        return apply_gradients(*args, **kwargs)

    object.__setattr__(optimizer, "apply_gradients", counting)  # bypass Keras' attribute tracking
    return count


def fuse_update(optimizer) -> None:
    """PROTOTYPE of a suggested change (profile only): run the optimizer's update under XLA, the rest not.

    Replaces ``optimizer.apply`` on this instance with one that calls the original inside a
    ``tf.function(jit_compile=True)``: XLA fuses Adam's element-wise ops and the wrapper's ``tf.where``
    into one pass per variable, while the model's forward/backward stay on the (faster on CPU) non-XLA
    kernels. Works for a plain Keras optimizer and for ``MaskedOptimizer`` (stored masks; not mask_fn).
    """
    base = optimizer.apply
    compiled = {}

    def apply(grads, trainable_variables=None, masks=None):
        if masks is not None:
            raise ValueError("fuse_update: per-call masks are not supported by this prototype")
        variables = list(trainable_variables if trainable_variables is not None else optimizer._trainable_variables)
        if not optimizer.built:
            with tf.init_scope():
                optimizer.build(variables)
        key = tuple(id(v) for v in variables)
        if key not in compiled:
            compiled[key] = tf.function(lambda g: base(g, variables), jit_compile=True)
        compiled[key](list(grads))

    object.__setattr__(optimizer, "apply", apply)


def _bytes(variables) -> int:
    return int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables))


def make_variants(names: list[str], seed: int, jit: bool) -> dict:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variants = {}
    for i, name in enumerate(names):
        keras.utils.set_random_seed(seed)
        model = deep_mnist_cnn()
        adam = keras.optimizers.Adam(1e-4)
        callbacks = []
        if name in ("plain", "plain_fused"):
            opt = adam
        elif name == "mask_fn":
            opt = MaskedOptimizer(adam, policy="hold", mask_fn=random_keep)
        elif name == "hold_nomask":
            opt = MaskedOptimizer(adam, policy="hold")
        elif name in ("hold", "none", "hold_fused"):
            opt = MaskedOptimizer(adam, policy=name.removesuffix("_fused"))
        else:
            raise ValueError(name)
        if name.endswith("_fused"):
            fuse_update(opt)
        if isinstance(opt, MaskedOptimizer) and name in ("hold", "none", "hold_fused"):
            callbacks.append(RandomMasks(opt, seed=seed + 1))  # same mask sequence for every masked variant
        model.compile(optimizer=opt, loss=loss, jit_compile=jit)
        timer = StepTimer()
        variants[name] = {"model": model, "opt": opt, "callbacks": callbacks + [timer], "timer": timer,
                          "traces": _count_traces(opt)}
    return variants


def memory_report(variants: dict, plain_opt, hold_opt, fn_opt) -> dict:
    """Persistent bytes the wrapper adds, measured on the built optimizers."""
    model = variants["plain"]["model"]
    entries = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))
    hold_masked = int(sum(int(np.prod(v.shape)) for v in variants["hold"]["model"].trainable_variables
                          if hold_opt.get_mask(v) is not None))
    out = {
        "trainable_entries": entries,
        "hold_masked_entries": hold_masked,
        "hold_mask_bytes": hold_opt.mask_bytes(),
        "hold_mask_bytes_per_masked_entry": hold_opt.mask_bytes() / max(hold_masked, 1),
        "mask_fn_mask_bytes": fn_opt.mask_bytes(),
        "mask_fn_mask_bytes_per_entry": fn_opt.mask_bytes() / entries,
        "mask_fn_mask_variables": len(fn_opt._masks.keep),
        "inner_optimizer_bytes": {"plain": _bytes(plain_opt.variables), "hold": _bytes(hold_opt.inner.variables),
                                  "mask_fn": _bytes(fn_opt.inner.variables)},
        # The wrapper is a keras Optimizer: its base class creates its own (unused) iterations and
        # learning_rate variables. They are not in opt.variables; counted here to be complete.
        "wrapper_own_base_bytes": _bytes(hold_opt._variables),
    }
    inner = out["inner_optimizer_bytes"]
    out["inner_bytes_equal"] = inner["plain"] == inner["hold"] == inner["mask_fn"]
    out["hold_total_added_bytes"] = out["hold_mask_bytes"] + out["wrapper_own_base_bytes"]
    out["mask_fn_total_added_bytes"] = out["mask_fn_mask_bytes"] + out["wrapper_own_base_bytes"]
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5, help="fit calls per variant, interleaved")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per round (masks change at every one)")
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--jit", action="store_true", help="compile every variant with jit_compile=True")
    parser.add_argument("--profile", action="store_true",
                        help="add hold_nomask (no stored mask) and none (policy='none') variants")
    parser.add_argument("--variants", default="plain,hold,mask_fn",
                        help="comma-separated, from plain,hold,mask_fn,hold_nomask,none,hold_fused,plain_fused "
                             "(plain is always timed; *_fused: a prototype, see fuse_update)")
    args = parser.parse_args(argv)
    names = ["plain"] + [n for n in args.variants.split(",") if n and n != "plain"]
    names += [n for n in (["hold_nomask", "none"] if args.profile else []) if n not in names]

    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True).cache().repeat()

    variants = make_variants(names, seed=0, jit=args.jit)

    def fit(name: str, epochs: int) -> None:
        v = variants[name]
        v["model"].fit(data, epochs=epochs, steps_per_epoch=args.steps, callbacks=v["callbacks"],
                       verbose=0, shuffle=False)

    for name in names:  # trace and warm up: one epoch each, not timed
        fit(name, 1)
    traces_after_warmup = {name: v["traces"][0] for name, v in variants.items()}
    for v in variants.values():
        v["timer"].clear()

    per_round: dict[str, list[float]] = {name: [] for name in names}  # median s/step of each round
    per_round_epoch: dict[str, list[float]] = {name: [] for name in names}  # epoch wall s/step
    per_round_min: dict[str, list[float]] = {name: [] for name in names}  # fastest step of each round
    per_round_cpu: dict[str, list[float]] = {name: [] for name in names}  # median process-CPU s/step
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            timer = variants[name]["timer"]
            first_step, first_epoch = len(timer.steps), len(timer.epochs)
            fit(name, args.epochs)
            per_round[name].append(statistics.median(timer.steps[first_step:]))
            per_round_min[name].append(min(timer.steps[first_step:]))
            per_round_cpu[name].append(statistics.median(timer.cpu_steps[first_step:]))
            per_round_epoch[name].append(sum(timer.epochs[first_epoch:]) / (args.epochs * args.steps))

    def ratios(table: dict[str, list[float]], name: str) -> list[float]:
        return [a / b for a, b in zip(table[name], table["plain"])]

    comparisons = {}
    for name in names[1:]:
        c = {}
        for key, table in (("", per_round), ("epoch_", per_round_epoch), ("min_step_", per_round_min),
                           ("cpu_", per_round_cpu)):
            r = ratios(table, name)
            c.update({f"{key}ratio_median": statistics.median(r), f"{key}ratio_min": min(r),
                      f"{key}ratio_max": max(r), f"{key}ratio_rounds": r})
        comparisons[name] = c
    ms = {name: 1e3 * statistics.median(t) for name, t in per_round.items()}
    traces = {name: v["traces"][0] - traces_after_warmup[name] for name, v in variants.items()}
    mask_sets = {name: cb.calls for name, v in variants.items() for cb in v["callbacks"] if isinstance(cb, RandomMasks)}
    memory = (memory_report(variants, variants["plain"]["opt"], variants["hold"]["opt"], variants["mask_fn"]["opt"])
              if {"hold", "mask_fn"} <= set(names) else None)
    jit = {name: bool(v["model"].jit_compile) for name, v in variants.items()}

    print(f"model.fit, Deep MNIST CNN ({variants['plain']['model'].count_params():,} parameters), batch {args.batch}, "
          f"Adam; {args.rounds} interleaved rounds x {args.epochs} epochs x {args.steps} steps; "
          f"jit_compile={jit['plain']}")
    cpu_ms = {name: 1e3 * statistics.median(t) for name, t in per_round_cpu.items()}
    for name, value in ms.items():
        print(f"  {name:<12} {value:8.2f} ms/step wall, {cpu_ms[name]:8.2f} ms/step process CPU (medians of rounds)")
    labels = {"hold": "hold, per-element masks on every variable, new each epoch",
              "mask_fn": "mask_fn, fresh random in-graph mask every step",
              "hold_nomask": "hold, no stored mask (profile)", "none": "policy='none', same masks (profile)",
              "hold_fused": "hold, same masks, optimizer update under XLA (prototype)",
              "plain_fused": "plain Adam, update under XLA (prototype)"}
    for name, c in comparisons.items():
        targeted = name in ("hold", "mask_fn")
        for key, what in (("", "wall"), ("cpu_", "CPU ")):
            value, lo, hi = c[f"{key}ratio_median"], c[f"{key}ratio_min"], c[f"{key}ratio_max"]
            target = f"target <= {TARGET}: {_met(value <= TARGET)}" if targeted else "(profile, no target)"
            print(f"  fit ratio {name} / plain, {what} = {value:.3f}  (median of {args.rounds} rounds, "
                  f"min-max {lo:.3f}-{hi:.3f})  {target}  [{labels[name]}]")
        print(f"      other estimators, median of rounds: whole-epoch wall {c['epoch_ratio_median']:.3f}, "
              f"fastest step {c['min_step_ratio_median']:.3f}")
    print(f"  retraces during timed rounds: {traces}; set_mask rounds per variant: {mask_sets}")
    m = memory
    if m is None:
        print("  memory: not measured (needs the hold and mask_fn variants)")
    else:
        _print_memory(m)
    return {
        "batch": args.batch, "rounds": args.rounds, "epochs_per_round": args.epochs, "steps_per_epoch": args.steps,
        "jit_compile": jit, "target": TARGET, "ms_per_step": ms, "ms_per_step_rounds": {
            name: [1e3 * t for t in ts] for name, ts in per_round.items()},
        "cpu_ms_per_step": cpu_ms,
        "comparisons": comparisons, "retraces_during_rounds": traces, "memory": memory,
        **{f"ratio_{name}_over_plain": c["ratio_median"] for name, c in comparisons.items()},
    }


def _print_memory(m: dict) -> None:
    print(f"  memory: hold mask_bytes() = {m['hold_mask_bytes']:,} B for {m['hold_masked_entries']:,} masked entries = "
          f"{m['hold_mask_bytes_per_masked_entry']:.3f} B/entry  (target <= 1): {_met(m['hold_mask_bytes_per_masked_entry'] <= 1)}")
    print(f"  memory: mask_fn only: mask_bytes() = {m['mask_fn_mask_bytes']} B ({m['mask_fn_mask_variables']} scalar "
          f"'no mask' variables) = {m['mask_fn_mask_bytes_per_entry']:.2e} B/entry  (target 0 per entry: "
          f"{_met(m['mask_fn_mask_bytes'] <= m['mask_fn_mask_variables'])}, a constant {m['mask_fn_mask_bytes']} B)")
    inner = m["inner_optimizer_bytes"]
    print(f"  memory: inner Adam variables plain {inner['plain']:,} B, under hold {inner['hold']:,} B, under mask_fn "
          f"{inner['mask_fn']:,} B (equal: {m['inner_bytes_equal']}); the wrapper's own base-class "
          f"variables (iterations, learning_rate; not in opt.variables): {m['wrapper_own_base_bytes']} B")


if __name__ == "__main__":
    main()
