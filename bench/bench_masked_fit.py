"""Benchmark: ``MaskedOptimizer(Adam)`` in ``model.fit`` vs plain Adam in ``model.fit``, Deep MNIST CNN.

Variants, each its own compiled model (same initial weights, same data), timed side by side in one
run in interleaved rounds (the order rotates every round; one round = one ``fit`` call):

* ``plain``      -- ``keras.optimizers.Adam``.
* ``hold``       -- ``MaskedOptimizer(Adam)`` with a stored per-element mask on EVERY trainable
  variable, a fresh random half frozen, set by a callback at every ``on_epoch_begin``.
* ``hold_one``   -- the same on one variable of the eight (``conv2`` kernel, 51,200 entries).
* ``frozen_half``-- ``conv1`` and ``conv2`` wholly frozen the way the library README tells a user to:
  ``set_mask(v, False)`` and ``fit(..., callbacks=[freezing.SkipFrozen()])`` (their gradients are not
  computed, their optimizer state is kept); compared with ``untrainable``, plain Adam with those layers
  ``trainable=False`` (Keras' own way, which also stops computing their gradients), and with
  ``recompiled_half``: the MaskedOptimizer built on every variable, then those layers ``trainable=False``
  and ``compile`` again with it (the same skip, by hand, between ``fit`` calls only).
* ``frozen_half_masks`` -- the same masks without ``SkipFrozen``: the gradients of the frozen layers are
  computed and thrown away (what skipping buys).
* ``mask_fn``    -- ``mask_fn=random_keep``: a fresh random mask every step, computed in the graph
  from random bits seeded by the step; nothing stored (``mask_fn_uniform``, by name only: the
  same with ``stateless_uniform(shape) < 0.5``, three times the random-number cost).
* ``unmasked`` -- ``MaskedOptimizer(Adam)`` with no mask at all: what wrapping costs by itself.
* ``hold_adamw`` -- as ``hold`` with ``AdamW(weight_decay=0.004)``, against ``plain_adamw``: weight decay
  is a write outside ``update_step``, masked by the same guard.
* ``hold_unfused`` -- as ``hold`` with ``fuse_above`` out of reach (``freezing._tuning``, not API): every guarded
  write as TensorFlow's add, select and assign instead of one XLA-compiled pass (what fusing buys).
* ``frozen_half_undispatched`` -- as ``frozen_half_masks`` with ``dispatch_above`` out of reach: every
  variable takes the masked update, the wholly frozen ones included (what the per-variable
  ``switch_case`` buys).
* ``dense_fc1``, ``sparse_fc1`` -- FISH-style sparse fine-tuning: a fixed 1% of ``fc1``'s kernel
  trains, every other variable is frozen; dense ``hold`` state vs ``state="sparse"``.

``--jit`` compiles every variant's whole step with XLA (``jit_compile=True``, Keras' default on a
GPU machine). ``--variants`` picks variants (plain is always timed).

Per-step time is measured by a callback (``on_train_batch_begin`` -> ``on_train_batch_end``; the
step function is synchronous on CPU); a round's time is the median of its steps; the tracing epoch
is a warm-up outside the rounds. Reported: the median over rounds of (variant / reference) with min
and max, from wall time and from process CPU time (all threads of this process; on a machine shared
with other jobs it moves far less than wall time, which counts the time this process waited for a
core), and, as further cross-checks, from whole-epoch wall times and from each round's fastest step.
Also measured: the persistent memory the wrapper adds, and the optimizer bytes for ``fc1``. Prints
ratios; asserts nothing about time.
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

from freezing import MaskedOptimizer, SkipFrozen, slots  # noqa: E402
from freezing._tuning import tune  # noqa: E402  (the bench's one private name: thresholds are not API)
from study.models import deep_mnist_cnn  # noqa: E402

TARGETS = {  # (variant, reference): target for variant / reference (issues 15 and 20)
    ("hold", "plain"): 1.05, ("hold_one", "plain"): 1.02, ("frozen_half", "untrainable"): 1.02,
    ("mask_fn", "plain"): 1.10, ("sparse_fc1", "dense_fc1"): 1.0, ("recompiled_half", "untrainable"): 1.02,
    ("hold_adamw", "plain_adamw"): 1.05, ("unmasked", "plain"): 1.01,
}
OUT_OF_REACH = 1 << 40
SETTINGS = {  # variant -> its optimizer's write thresholds (freezing._tuning; read while its step is traced)
    "hold_unfused": {"fuse_above": OUT_OF_REACH},
    "frozen_half_undispatched": {"dispatch_above": OUT_OF_REACH},
}
XLA_TARGET = 1.03  # every masked variant / plain under jit_compile=True
ONE = "conv2/kernel"  # the one masked variable of hold_one
HALF = ("conv1", "conv2")  # the layers frozen_half freezes


def random_keep(step, variable):
    """``mask_fn``: a fresh random half of each variable trains at every step (stateless, from the step).

    One random 32-bit word per 32 entries, unpacked bit by bit: about a third of the CPU time of
    ``tf.random.stateless_uniform(shape) < 0.5`` (measured here: 5.3 vs 16 ms for the CNN's 3.3 M entries),
    which is most of what a random mask costs per step.
    """
    tag = zlib.crc32(variable.path.encode()) & 0x7FFFFFFF
    seed = tf.stack([tf.cast(step, tf.int64), tf.constant(tag, tf.int64)])
    size = int(np.prod(variable.shape))
    words = tf.random.stateless_uniform(((size + 31) // 32, 1), seed=seed, minval=None, maxval=None, dtype=tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words, tf.range(32)), 1) > 0
    return tf.reshape(tf.reshape(bits, [-1])[:size], tuple(variable.shape))


def random_keep_uniform(step, variable):
    """``mask_fn`` as the previous benchmark wrote it: ``stateless_uniform(shape) < 0.5`` (profile only)."""
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
    """At every epoch's start: a fresh random per-element mask (a ``fraction`` frozen) on the chosen variables."""

    def __init__(self, optimizer: MaskedOptimizer, seed: int, fraction: float = 0.5, only: str | None = None) -> None:
        super().__init__()
        self.optimizer, self.fraction, self.only = optimizer, fraction, only
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def on_epoch_begin(self, epoch, logs=None):
        if not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        for v in self.model.trainable_variables:
            if self.only is None or v.path.endswith(self.only):
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


def _bytes(variables) -> int:
    return int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables))


def _fc1_selection(model: keras.Model, seed: int) -> np.ndarray:
    """The fixed 1% of fc1's kernel that dense_fc1 and sparse_fc1 train."""
    shape = tuple(model.get_layer("fc1").kernel.shape)
    return np.random.default_rng(seed).random(shape) < 0.01


VARIANTS = ("plain", "unmasked", "hold", "hold_unfused", "hold_one", "hold_adamw", "plain_adamw", "frozen_half",
            "frozen_half_masks", "frozen_half_undispatched", "untrainable", "recompiled_half", "mask_fn", "dense_fc1",
            "sparse_fc1")
PROFILE_VARIANTS = ("mask_fn_uniform",)  # by name only: --variants


def make_variants(names: list[str], seed: int, jit: bool) -> dict:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variants = {}
    for name in names:
        keras.utils.set_random_seed(seed)
        model = deep_mnist_cnn()
        adam = (keras.optimizers.AdamW(1e-4, weight_decay=0.004) if name.endswith("adamw")
                else keras.optimizers.Adam(1e-4))
        callbacks = []
        if name in ("plain", "plain_adamw", "untrainable"):
            opt = adam
            if name == "untrainable":
                for layer in HALF:
                    model.get_layer(layer).trainable = False
        elif name in ("mask_fn", "mask_fn_uniform"):
            opt = MaskedOptimizer(adam, mask_fn=random_keep_uniform if name == "mask_fn_uniform" else random_keep)
        elif name == "unmasked":
            opt = MaskedOptimizer(adam)
        elif name in ("hold", "hold_one", "hold_adamw", "hold_unfused"):
            opt = MaskedOptimizer(adam)
            callbacks.append(RandomMasks(opt, seed=seed + 1, only=ONE if name == "hold_one" else None))
        elif name == "recompiled_half":  # the same MaskedOptimizer, built on every variable, then trainable=False
            opt = MaskedOptimizer(adam)
            opt.build(model.trainable_variables)
            for layer in HALF:
                model.get_layer(layer).trainable = False
        elif name in ("frozen_half", "frozen_half_masks", "frozen_half_undispatched"):
            opt = MaskedOptimizer(adam)
            for layer in HALF:
                for v in model.get_layer(layer).trainable_variables:
                    opt.set_mask(v, False)
            if name == "frozen_half":  # as the README shows: the wholly frozen layers are not differentiated
                callbacks.append(SkipFrozen())
        elif name in ("dense_fc1", "sparse_fc1"):
            opt = MaskedOptimizer(adam, state="sparse" if name == "sparse_fc1" else "dense")
            for v in model.trainable_variables:
                opt.set_mask(v, _fc1_selection(model, seed + 2) if v is model.get_layer("fc1").kernel else False)
        else:
            raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS + PROFILE_VARIANTS)}")
        model.compile(optimizer=opt, loss=loss, jit_compile=jit)
        timer = StepTimer()
        variants[name] = {"model": model, "opt": opt, "callbacks": callbacks + [timer], "timer": timer,
                          "traces": _count_traces(opt)}
    return variants


def memory_report(variants: dict) -> dict:
    """Persistent bytes the wrapper adds, and the optimizer state for fc1 with dense and sparse state."""
    out: dict = {}
    plain = variants["plain"]
    entries = int(sum(int(np.prod(v.shape)) for v in plain["model"].trainable_variables))
    out["trainable_entries"] = entries
    if "hold" in variants:
        opt, model = variants["hold"]["opt"], variants["hold"]["model"]
        masked = int(sum(int(np.prod(v.shape)) for v in model.trainable_variables if opt.get_mask(v) is not None))
        unmasked = sum(1 for v in model.trainable_variables if opt.get_mask(v) is None)  # 1 B each
        out.update(hold_masked_entries=masked, hold_mask_bytes=opt.mask_bytes(), hold_unmasked_bytes=unmasked,
                   hold_mask_bytes_per_masked_entry=(opt.mask_bytes() - unmasked) / max(masked, 1),
                   inner_bytes_equal=_bytes(opt.inner.variables) == _bytes(plain["opt"].variables),
                   wrapper_extra_bytes=opt.state_bytes() - _bytes(opt.inner.variables) - opt.mask_bytes())
    if "mask_fn" in variants:
        opt = variants["mask_fn"]["opt"]
        out.update(mask_fn_mask_bytes=opt.mask_bytes(),
                   mask_fn_mask_variables=len(variants["mask_fn"]["model"].trainable_variables))
    for name in ("dense_fc1", "sparse_fc1"):
        if name in variants:
            opt, model = variants[name]["opt"], variants[name]["model"]
            kernel = model.get_layer("fc1").kernel
            state = slots(opt, kernel)
            # its slots, its stored mask (1 byte per entry, or 1 when none is stored), its K indices and scratch values
            out[f"{name}_optimizer_bytes_fc1"] = opt.state_bytes(kernel)
            out[f"{name}_slot_shapes"] = {k: list(v.shape) for k, v in state.items()}
            out[f"{name}_inner_optimizer_bytes"] = _bytes(opt.inner.variables)
    if "dense_fc1_optimizer_bytes_fc1" in out and "sparse_fc1_optimizer_bytes_fc1" in out:
        out["sparse_over_dense_fc1_bytes"] = (out["sparse_fc1_optimizer_bytes_fc1"]
                                              / out["dense_fc1_optimizer_bytes_fc1"])
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _reference(name: str) -> str:
    return {"frozen_half": "untrainable", "frozen_half_masks": "untrainable", "frozen_half_undispatched": "untrainable",
            "recompiled_half": "untrainable", "sparse_fc1": "dense_fc1", "hold_adamw": "plain_adamw"}.get(name, "plain")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5, help="fit calls per variant, interleaved")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per round (masks change at every one)")
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--jit", action="store_true", help="compile every variant with jit_compile=True")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {','.join(VARIANTS)} (plain is always timed)")
    args = parser.parse_args(argv)
    names = ["plain"] + [n for n in args.variants.split(",") if n and n != "plain"]
    names += [r for r in {_reference(n) for n in names} if r not in names]

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

    for name in names:  # trace and warm up: one epoch each, not timed; a variant's tuning is read while it traces
        if name in SETTINGS:
            tune(variants[name]["opt"], **SETTINGS[name])
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

    comparisons = {}
    pairs = [(name, _reference(name)) for name in names if name != "plain"]
    # also against plain fit
    pairs += [(name, "plain") for name in ("hold_adamw", "frozen_half", "frozen_half_masks") if name in names]
    for name, ref in pairs:
        c = {"variant": name, "reference": ref}
        for key, table in (("", per_round), ("epoch_", per_round_epoch), ("min_step_", per_round_min),
                           ("cpu_", per_round_cpu)):
            r = [a / b for a, b in zip(table[name], table[ref])]
            c.update({f"{key}ratio_median": statistics.median(r), f"{key}ratio_min": min(r),
                      f"{key}ratio_max": max(r), f"{key}ratio_rounds": r})
        masked = (name, ref) in TARGETS and ref in ("plain", "plain_adamw") and name != "mask_fn"
        target = XLA_TARGET if args.jit and masked else TARGETS.get((name, ref))  # XLA: each masked variant / its plain
        c["target"] = target
        comparisons[name if ref == _reference(name) else f"{name}/{ref}"] = c
    ms = {name: 1e3 * statistics.median(t) for name, t in per_round.items()}
    cpu_ms = {name: 1e3 * statistics.median(t) for name, t in per_round_cpu.items()}
    traces = {name: v["traces"][0] - traces_after_warmup[name] for name, v in variants.items()}
    mask_sets = {name: cb.calls for name, v in variants.items() for cb in v["callbacks"] if isinstance(cb, RandomMasks)}
    memory = memory_report(variants)
    jit = {name: bool(v["model"].jit_compile) for name, v in variants.items()}

    print(f"model.fit, Deep MNIST CNN ({variants['plain']['model'].count_params():,} parameters), batch {args.batch}, "
          f"Adam; {args.rounds} interleaved rounds x {args.epochs} epochs x {args.steps} steps; "
          f"jit_compile={jit['plain']}")
    for name, value in ms.items():
        print(f"  {name:<12} {value:8.2f} ms/step wall, {cpu_ms[name]:8.2f} ms/step process CPU (medians of rounds)")
    for c in comparisons.values():
        name = c["variant"]
        for key, what in (("", "wall"), ("cpu_", "CPU ")):
            value, lo, hi = c[f"{key}ratio_median"], c[f"{key}ratio_min"], c[f"{key}ratio_max"]
            target = f"target <= {c['target']}: {_met(value <= c['target'])}" if c["target"] else "(no target)"
            print(f"  fit ratio {name} / {c['reference']}, {what} = {value:.3f}  (median of {args.rounds} rounds, "
                  f"min-max {lo:.3f}-{hi:.3f})  {target}")
        print(f"      other estimators, median of rounds: whole-epoch wall {c['epoch_ratio_median']:.3f}, "
              f"fastest step {c['min_step_ratio_median']:.3f}")
    print(f"  retraces during timed rounds: {traces}; set_mask rounds per variant: {mask_sets}")
    _print_memory(memory)
    return {
        "batch": args.batch, "rounds": args.rounds, "epochs_per_round": args.epochs, "steps_per_epoch": args.steps,
        "jit_compile": jit, "ms_per_step": ms, "ms_per_step_rounds": {  # each comparison carries its own target
            name: [1e3 * t for t in ts] for name, ts in per_round.items()},
        "cpu_ms_per_step": cpu_ms,
        "comparisons": comparisons, "retraces_during_rounds": traces, "memory": memory,
        **{f"ratio_{c['variant']}_over_{c['reference']}": c["ratio_median"] for c in comparisons.values()},
    }


def _print_memory(m: dict) -> None:
    if "hold_mask_bytes" in m:
        print(f"  memory: hold mask_bytes() = {m['hold_mask_bytes']:,} B = "
              f"{m['hold_mask_bytes_per_masked_entry']:.3f} B "
              f"per masked entry ({m['hold_masked_entries']:,}) + {m['hold_unmasked_bytes']} B of unmasked variables  "
              f"(target <= 1 B per "
              f"masked entry): {_met(m['hold_mask_bytes_per_masked_entry'] <= 1)}; inner Adam bytes equal to plain: "
              f"{m['inner_bytes_equal']}; the wrapper's state beyond the inner optimizer's and the masks: "
              f"{m['wrapper_extra_bytes']} B")
    if "mask_fn_mask_bytes" in m:
        print(f"  memory: mask_fn only: mask_bytes() = {m['mask_fn_mask_bytes']} B in all "
              f"({m['mask_fn_mask_variables']} scalar 'no mask' variables)")
    if "sparse_over_dense_fc1_bytes" in m:
        ratio = m["sparse_over_dense_fc1_bytes"]
        print(f"  memory: optimizer state for fc1 (1% trainable): dense hold {m['dense_fc1_optimizer_bytes_fc1']:,} B "
              f"(slots {m['dense_fc1_slot_shapes']} + mask), sparse {m['sparse_fc1_optimizer_bytes_fc1']:,} B (slots "
              f"{m['sparse_fc1_slot_shapes']} + K indices and values) = {ratio:.4f} of dense  (target <= 0.03): "
              f"{_met(ratio <= 0.03)}")


if __name__ == "__main__":
    main()
