"""``bench/run.py``: the published table (BENCH.md and the JSON) and its refusals, on fake benchmarks
(nothing timed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIT = {"comparisons": {"hold": {"variant": "hold", "reference": "plain", "ratio_median": 1.04, "ratio_min": 0.98,
                                "ratio_max": 1.045, "cpu_ratio_median": 1.02, "cpu_ratio_min": 0.99,
                                "cpu_ratio_max": 1.07, "target": 1.05},
                       "hold_one": {"variant": "hold_one", "reference": "plain", "ratio_median": 1.08,
                                    "ratio_min": 1.03, "ratio_max": 1.2, "cpu_ratio_median": 1.01,
                                    "cpu_ratio_min": 0.9, "cpu_ratio_max": 1.1, "target": 1.02}},
       "memory": {"hold_mask_bytes_per_masked_entry": 1.0, "hold_unmasked_bytes": 0, "mask_fn_mask_bytes": 8,
                  "inner_bytes_equal": True, "sparse_over_dense_fc1_bytes": 0.0178}}


def test_the_table_has_every_ratio_its_range_and_whether_its_target_is_met(run):
    rows, notes = run._rows({"masked_fit": FIT})
    assert [r["label"] for r in rows] == ["fit: hold / plain", "fit: hold_one / plain"]
    assert [run._met(r) for r in rows] == ["met", "met in CPU time only"]
    text = run._markdown({"masked_fit": FIT}, {
        "commit": "abc", "dirty": False, "finished_at": "now", "seconds": 3.0,
        "machine": {"processor": "CPU X", "machine": "x86_64", "cpus": 2},
        "load": {"wall_s": 3.0, "cpu_s": 3.0, "cores": 2, "cores_used": 1.0, "loadavg": None, "others_share": 0.5,
                 "idle": False}, "versions": {"tensorflow": "2.x", "keras": "3.x"}})
    assert "| fit: hold / plain | 1.040 (0.98–1.05) | 1.020 (0.99–1.07) | ≤ 1.05: met |" in text
    assert "≤ 1.02: met in CPU time only" in text and "not idle: other processes used 50.0%" in text
    assert "0.0178" in "\n".join(notes) and "commit: `abc`" in text
    assert "| fit: hold_one / plain | 1.080 (1.03–1.20) |" in text
    undecided = {**rows[0], "wall": (1.04, 0.98, 1.10)}  # the target inside the range over rounds
    assert run._met(undecided) == "undecided: inside the range over rounds (median at or under it)"


def test_ranges_are_rounded_outward_so_they_hold_the_median(run):
    fit = {"comparisons": {"x": {**FIT["comparisons"]["hold"], "ratio_median": 1.049, "ratio_min": 1.049,
                                 "ratio_max": 1.081}}}
    text = run._markdown({"masked_fit": fit}, {"commit": "c", "dirty": False, "finished_at": "t", "seconds": 1.0,
                               "machine": {"processor": "p", "machine": "m", "cpus": 2}, "load": None,
                               "versions": {"tensorflow": "2", "keras": "3"}})
    assert "| 1.049 (1.04–1.09) |" in text  # 1.049 rounded to nearest would print 1.05, above its own median


def test_publish_replaces_the_directory_and_a_crash_leaves_it_as_it_was(run, tmp_path, monkeypatch, capsys):
    target = tmp_path / "bench"
    monkeypatch.setattr(run, "BENCHMARKS", {"masked_fit": lambda: dict(FIT)})
    assert run.main(["--publish", str(target)]) == 0
    published = (target / "BENCH.md").read_text()
    assert "fit: hold / plain" in published
    assert json.loads((target / "masked_fit.json").read_text())["comparisons"]["hold"]["ratio_median"] == 1.04
    assert json.loads((target / "context.json").read_text())["load"]["wall_s"] >= 0

    def crash():
        raise RuntimeError("boom")

    monkeypatch.setattr(run, "BENCHMARKS", {"masked_fit": crash})
    assert run.main(["--publish", str(target)]) == 1
    assert (target / "BENCH.md").read_text() == published        # nothing half-written, nothing replaced
    assert "left as it was" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench"]  # no staging left behind


def test_bad_arguments_name_what_is_allowed_and_exit_2(run, tmp_path, capsys):
    assert run.main(["no_such_bench"]) == 2
    assert "unknown benchmark(s) ['no_such_bench']; allowed: masked_fit" in capsys.readouterr().err
    assert run.main(["masked_fit", "--publish", str(tmp_path / "b")]) == 2
    assert "runs every benchmark" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert run.main(["--publish"]) == 2


PS = {"scaling_2_over_1": [1.708, 1.5676, 1.5877], "cpu_time_scaling_2_over_1": [1.775, 1.755, 1.787],
      "overhead_ps_over_local": [1.609, 1.5435, 1.522], "cpu_overhead_ps_over_local": [1.281, 1.224, 1.228],
      "scaling_4_over_1": [1.364, 1.48]}
PS_SPARSE = {"adagrad_bytes_sparse_over_dense": [0.0534, 0.0534, 0.0534],
             "adagrad_fetched_bytes_sparse_over_dense": [0.0534, 0.0534, 0.0534],
             "adagrad_steps_per_s_sparse_over_dense": [1.185, 1.394, 1.164],
             "adam_bytes_sparse_over_dense": [0.0534, 0.0534, 0.0534],
             "adam_fetched_bytes_sparse_over_dense": [0.0534, 0.0534, 0.0534],
             "adam_steps_per_s_sparse_over_dense": [1.134, 1.144, 1.254]}


def test_the_parameter_server_rows_are_published_with_their_ranges_and_a_floor_for_scaling(run):
    """2 workers ÷ 1 (a floor, >= 1.6), the ps step ÷ the local step (<= 1.3), sparse ÷ dense pushes: each the median
    over bench_ps.py's repeats with its range; the byte ratios as notes."""
    results = {"parameter_server": PS, "parameter_server_sparse": PS_SPARSE}
    rows, notes = run._rows(results)
    by = {r["label"]: r for r in rows}
    scaling = by["parameter server: 2 workers / 1 worker, steps per second"]
    assert scaling["wall"] == (1.5877, 1.5676, 1.708) and scaling["cpu"] == (1.775, 1.755, 1.787)
    assert run._met(scaling) == "undecided: inside the range over rounds (median under it)"
    assert run._met({**scaling, "wall": (1.7, 1.65, 1.75)}) == "met"
    assert run._met({**scaling, "wall": (1.4, 1.3, 1.5)}) == "met in CPU time only"  # CPU median 1.775 >= 1.6
    assert run._met({**scaling, "wall": (1.4, 1.3, 1.5), "cpu": (1.5, 1.4, 1.55)}) == "NOT met"
    overhead = by["parameter server: ps step / local one-core step, time per step"]
    assert run._met(overhead) == "met in CPU time only"  # wall 1.543 > 1.3 everywhere, CPU median 1.228
    text = run._markdown(results, {"commit": "c", "dirty": False, "finished_at": "t", "seconds": 1.0,
                                   "machine": {"processor": "p", "machine": "m", "cpus": 2}, "load": None,
                                   "versions": {"tensorflow": "2", "keras": "3"}})
    assert ("| parameter server: 2 workers / 1 worker, steps per second | 1.588 (1.56–1.71) | 1.775 (1.75–1.79) "
            "| ≥ 1.6: undecided: inside the range over rounds (median under it) |") in text
    assert "| parameter server, Embedding: sparse / dense pushes, steps per second (Adam) | 1.144 (1.13–1.26) |" in text
    assert ("- parameter server, Embedding (Downpour's Adagrad): bytes pushed per update, sparse / dense pushes: "
            "0.053 (0.053–0.054)") in text
    assert len([n for n in notes if n.startswith("parameter server")]) == 4
    assert run._rows({})[0] == []  # no parameter-server results, no rows
