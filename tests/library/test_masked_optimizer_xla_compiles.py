"""What XLA compiles again when masks change: once per combination of stored-mask shapes, counted.

A stored mask is a scalar while its variable has no mask or is wholly frozen, and has the mask's own shape
otherwise (``freezing._masks``). A changed mask never retraces the step; under ``jit_compile=True`` XLA
compiles the traced step once for each combination of its variables' shapes, the masks' included. So a
mask that takes a shape the step has not run with (no mask -> partial) compiles once more, and a mask of a
shape already seen compiles nothing. The count comes from XLA itself: with ``--xla_dump_to`` it writes one
file per compiled module (a child process, since XLA reads its flags once).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("xla_compiles_child.py")

EXPECTED = {  # phase -> compilations: the masks' shapes (a, b), and whether that pair is new
    "first fit: no masks": 1,  # ((), ()): the first compilation
    "again": 0,
    "a: a partial full-shape mask": 1,  # ((3, 4), ()): new
    "a: another full-shape mask": 0,  # ((3, 4), ()): seen
    "a: a per-column mask": 1,  # ((1, 4), ()): new
    "a: wholly frozen": 0,  # ((), ()): a wholly frozen mask is stored as a scalar, like no mask
    "a: cleared": 0,  # ((), ())
    "b: a partial full-shape mask": 1,  # ((), (4, 2)): new
    "a and b: partial full-shape masks": 1,  # ((3, 4), (4, 2)): new
    "a and b: other partial full-shape masks": 0,  # ((3, 4), (4, 2)): seen
}


@pytest.mark.slow
def test_xla_compiles_once_per_combination_of_mask_shapes(tmp_path):
    dump, out = tmp_path / "dump", tmp_path / "out.json"
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run([sys.executable, str(CHILD), str(dump), str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {row["phase"]: row["compilations"] for row in rows} == EXPECTED, rows
