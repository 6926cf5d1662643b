"""Child process for tests/library/test_masked_optimizer_xla_compiles.py: how often XLA compiles a masked ``fit``.

``python xla_compiles_child.py DUMP_DIR OUT.json`` with ``XLA_FLAGS=--xla_dump_to=DUMP_DIR`` set before TensorFlow
starts (hence a child process): XLA writes one ``*before_optimizations.txt`` per module it compiles, so the files
count compilations. A ``jit_compile=True`` fit runs after each mask change; the JSON holds, per fit, the phase,
the compilations it caused and its wall time.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time


def main(dump: str, out: str) -> None:
    import keras
    import numpy as np

    from freezing import MaskedOptimizer

    def compilations() -> int:
        return len(glob.glob(os.path.join(dump, "*before_optimizations.txt")))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(2, name="b")])
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1))
    model.compile(optimizer=opt, loss="mse", jit_compile=True)
    x, y = np.ones((8, 3), np.float32), np.ones((8, 2), np.float32)
    a, b = model.get_layer("a").kernel, model.get_layer("b").kernel
    rng = np.random.default_rng(0)
    rows = []

    def fit(phase: str) -> None:
        before, start = compilations(), time.perf_counter()
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)
        rows.append({"phase": phase, "compilations": compilations() - before, "seconds": time.perf_counter() - start})

    half = lambda shape: rng.random(shape) < 0.5  # noqa: E731
    fit("first fit: no masks")
    fit("again")
    opt.set_mask(a, half((3, 4)) | np.eye(3, 4, dtype=bool))
    fit("a: a partial full-shape mask")
    opt.set_mask(a, ~opt.get_mask(a))
    fit("a: another full-shape mask")
    opt.set_mask(a, [[True, False, True, False]])
    fit("a: a per-column mask")
    opt.set_mask(a, False)
    fit("a: wholly frozen")
    opt.clear_mask(a)
    fit("a: cleared")
    opt.set_mask(b, [[True, False]] * 4)
    fit("b: a partial full-shape mask")
    opt.set_mask(a, [[False, True, True, True]] * 3)
    fit("a and b: partial full-shape masks")
    opt.set_mask(a, [[True, True, False, True]] * 3)
    opt.set_mask(b, [[False, True]] * 4)
    fit("a and b: other partial full-shape masks")
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
