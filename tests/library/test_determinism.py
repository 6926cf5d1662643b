"""enable_determinism: the same seed gives bit-identical weights in separate processes, another seed does not."""

import json
import os
import subprocess
import sys

import pytest

from freezing.determinism import enable_determinism

# Short training runs, one per seed given on the command line: Conv + Dropout + Dense, Adam, three
# steps of fit on fixed data. The data come from their own generator (independent of the seed), so
# only initialization, dropout masks and fit's shuffling depend on the seed under test.
_RUN = r"""
import hashlib, json, os, subprocess, sys
import numpy as np
from freezing.determinism import enable_determinism
import keras
from tensorflow.python.framework import config

def train(seed):
    before = dict(os.environ)
    env = enable_determinism(seed)
    untouched = dict(os.environ) == before
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(24, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=24)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(3),
    ])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # 3 steps
    weights = b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())
    child_hash = subprocess.run([sys.executable, "-c", "print(hash('freezing'))"], env={**os.environ, **env},
                                capture_output=True, text=True, check=True).stdout.strip()
    return {
        "seed": seed,
        "sha256": hashlib.sha256(weights).hexdigest(),
        "n_bytes": len(weights),
        "op_determinism": config.is_op_determinism_enabled(),
        "env": [env.get("PYTHONHASHSEED"), env.get("TF_DETERMINISTIC_OPS")],
        "environ_untouched": untouched,
        "child_hash": child_hash,
    }

print(json.dumps([train(int(seed)) for seed in sys.argv[1:]]))
"""


def _start(*seeds: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "TF_DETERMINISTIC_OPS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.Popen([sys.executable, "-c", _RUN, *map(str, seeds)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _results(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_same_seed_same_bits_in_separate_processes_and_another_seed_differs():
    # Two processes, run concurrently (the results must not depend on timing). The second trains
    # first with the largest seed allowed, then again with seed 0: re-seeding restarts every stream.
    procs = [_start(0), _start(2**32 - 1, 0)]
    (first,), (other, second) = (_results(p) for p in procs)
    assert first["n_bytes"] > 0
    assert first["sha256"] == second["sha256"]  # bit-identical weights after 3 steps of fit
    assert other["sha256"] != first["sha256"]  # the seed matters, so the check above can fail
    assert first["op_determinism"] and other["op_determinism"] and second["op_determinism"]
    assert first["env"] == second["env"] == ["0", "1"] and other["env"] == [str(2**32 - 1), "1"]
    assert first["child_hash"] == second["child_hash"] != other["child_hash"]  # PYTHONHASHSEED reaches subprocesses
    assert first["environ_untouched"] and other["environ_untouched"] and second["environ_untouched"]


def test_the_environment_is_left_as_it_was_and_what_subprocesses_need_is_returned():
    before = dict(os.environ)
    try:
        env = enable_determinism(7)
        assert env == {"PYTHONHASHSEED": "7", "TF_DETERMINISTIC_OPS": "1"}
        assert dict(os.environ) == before
    finally:
        from tensorflow.python.framework import config as tf_config

        tf_config.disable_op_determinism()


@pytest.mark.parametrize("bad", [True, False, -1, 2**32, 1.0, "0", None])
def test_bad_seeds_are_rejected_before_anything_changes(bad):
    before = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "TF_DETERMINISTIC_OPS")}
    with pytest.raises(ValueError, match=r"^enable_determinism: seed must be an int in \[0, 4294967295\]"):
        enable_determinism(bad)
    assert {k: os.environ.get(k) for k in before} == before
