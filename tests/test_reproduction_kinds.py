"""The reproduction table compares like with like: each value as the kind its study declares.

On the committed ``metrics.json`` of every study, with the kinds the study declares (``METRIC_KINDS``, passed to
``save_metrics`` where the notebook writes its metrics): a rerun whose timings alone changed is "timings differ"
and nothing else; a reordered unordered sample changes nothing; 04's two committed cluster runs differ only where
asynchronous training really differs. Nothing here is inferred from key names.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from study.cnn import METRIC_KINDS as CNN
from study.drift.adam_drift import METRIC_KINDS as DRIFT
from study.gan.tables import METRIC_KINDS as GAN
from study.gradients.findings import METRIC_KINDS as GRADIENTS
from study.recipes import METRIC_KINDS as RECIPES
from study.report import kinds, reporting, reproduction

REPO = Path(__file__).resolve().parents[1]
STUDIES = {"01_adam_drift": DRIFT, "02_mnist_cnn_freezing": CNN, "03_gan_alternating": GAN,
           "04_gradients_and_ps": GRADIENTS, "05_recipes": RECIPES}


def committed(name: str) -> dict[str, Any]:
    return json.loads((REPO / "results" / name / "metrics.json").read_text())


def scale_timings(value: Any, declared: dict[str, str], factor: float, path: str = "", kind: str | None = None) -> Any:
    """``value`` with every number of a timing kind (timing,
    ratio of timings, their spread) multiplied by ``factor``."""
    own = kinds.match(path, declared) if path else None
    kind = own or kind
    if isinstance(value, dict):
        return {k: scale_timings(v, declared, factor, f"{path}/{k}" if path else k, kind) for k, v in value.items()}
    if isinstance(value, list) and kind != "sample":
        return [scale_timings(v, declared, factor, f"{path}[{i}]", kind) for i, v in enumerate(value)]
    if kind in ("timing", "timing_ratio", "timing_spread") and isinstance(value, float):
        return value * factor
    return value


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_changing_only_the_timings_says_timings_differ_and_nothing_else(name):
    old = committed(name)
    new = scale_timings(copy.deepcopy(old), STUDIES[name], 1.37)
    assert new != old  # the study has timings, and they changed
    rep = reproduction.compare(old, new, kinds=STUDIES[name])
    assert reproduction.verdict(rep) == "timings differ"
    assert rep["differ"] == rep["within"] == 0 and rep["identical"] == rep["values"] > 0
    assert rep["timings"]["min_ratio"] == pytest.approx(1.37) and rep["timings"]["max_ratio"] == pytest.approx(1.37)
    assert reproduction.verdict(reproduction.compare(old, copy.deepcopy(old), kinds=STUDIES[name])) == "identical"


def test_a_flipped_conclusion_from_timings_is_named_with_both_sides(tmp_path):
    old = committed("04_gradients_and_ps")
    new = copy.deepcopy(old)
    side = old["quoted"]["function_persistent_side"]
    new["quoted"]["function_persistent_side"] = "either" if side != "either" else "above"
    rep = reproduction.compare(old, new, kinds=GRADIENTS)
    assert rep["timing_verdicts"]["changed"] == 1 and rep["differ"] == 0
    assert rep["timing_verdicts"]["which"] == [{"value": "quoted/function_persistent_side", "committed": side,
                                                "rerun": new["quoted"]["function_persistent_side"]}]
    rep = {**rep, "compared_with": "HEAD 0000000000:results/04_gradients_and_ps/metrics.json", "baseline": {}}
    manifest = {"04_gradients_and_ps": {"commit": "0" * 40, "finished_at": "t", "reproduction": rep}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    text = reproduction.write_report(tmp_path).read_text()
    assert ("drawn from timings (a verdict, or a precision chosen from their spread), changed: "
            "`quoted/function_persistent_side`") in text


def test_the_spread_of_a_timing_is_not_a_timing():
    old = committed("05_recipes")
    rep = reproduction.compare(old, old, kinds=RECIPES)
    assert rep["left_out"]["timing_spread"] > 0
    new = copy.deepcopy(old)
    method = next(iter(new["new_columns"]["methods"].values()))
    method["step_time_ms_std"] *= 70  # a spread that moves: neither a timing ratio nor a difference
    rep = reproduction.compare(old, new, kinds=RECIPES)
    assert reproduction.verdict(rep) == "identical"
    assert rep["timings"]["max_ratio"] == 1.0


def test_reordering_an_unordered_sample_changes_nothing():
    old = committed("04_gradients_and_ps")
    new = copy.deepcopy(old)
    for label in new["ps_staleness"]:
        new["ps_staleness"][label] = sorted(new["ps_staleness"][label], reverse=True)
    assert new["ps_staleness"] != old["ps_staleness"]
    rep = reproduction.compare(old, new, kinds=GRADIENTS)
    assert reproduction.verdict(rep) == "identical" and rep["differ"] == 0
    new["ps_staleness"]["2 workers"][0] += 1  # a different distribution is one difference, shown as counts
    rep = reproduction.compare(old, new, kinds=GRADIENTS)
    assert reproduction.verdict(rep) == "1 value differs"
    assert rep["largest"][0]["value"] == "ps_staleness/2 workers" and "×" in rep["largest"][0]["rerun"]


def test_a_message_that_differs_only_in_its_port_is_identical():
    old = {"error": "UnavailableError: failed to connect to all addresses; last error: ipv4:127.0.0.1:40123"}
    new = {"error": "UnavailableError: failed to connect to all addresses; last error: ipv4:127.0.0.1:35711"}
    rep = reproduction.compare(old, new, kinds={"error": "message"})
    assert reproduction.verdict(rep) == "identical" and rep["normalised_messages"] == 1
    assert reproduction.verdict(reproduction.compare(old, {"error": "OSError: gone"}, kinds={"error": "message"})) \
        == "1 value differs"


def _show(commit: str) -> dict[str, Any]:
    return json.loads(subprocess.run(["git", "show", f"{commit}:results/04_gradients_and_ps/metrics.json"], cwd=REPO,
                                     capture_output=True, text=True, check=True).stdout)


def test_04_s_two_committed_cluster_runs_differ_only_where_asynchronous_training_does():
    """2fc9e69 and 9e75d2e ran the same code: the key-name table called 60 values different; 14 are."""
    try:
        old, new = _show("2fc9e69"), _show("9e75d2e")
    except subprocess.CalledProcessError:
        pytest.skip("a shallow clone: the two committed runs are not in its history")
    rep = reproduction.compare(old, new, kinds=GRADIENTS)
    assert reproduction.verdict(rep) == "14 values differ; timings differ"
    assert rep["normalised_messages"] == 1  # the fault's error message, up to its port
    differing = {d["value"] for d in reproduction.compare(old, new, kinds=GRADIENTS, largest=100)["largest"]}
    assert "ps_staleness/2 workers" in differing  # one sample, not 16 positions
    assert not {p for p in differing if kinds.match(p, GRADIENTS) in ("timing", "timing_ratio")}
    assert not any(p.startswith(("fetch_costs", "faults/faults[2]/seconds")) or "cpu" in p for p in differing)


def test_kinds_are_declared_where_metrics_are_written_and_checked(tmp_path):
    path = reporting.save_metrics({"t_ms": 3.0, "n": 2}, tmp_path, kinds={"t_ms": "timing", "n": "count"})
    assert json.loads(path.read_text())["kinds"] == {"t_ms": "timing", "n": "count"}
    with pytest.raises(ValueError, match=r"'n': 'number'.*one of timing, timing_ratio"):
        reporting.save_metrics({"n": 2}, tmp_path / "bad", kinds={"n": "number"})
    assert not (tmp_path / "bad").exists()  # nothing written
    rep = reproduction.compare({"t_ms": 3.0}, {"t_ms": 4.0, "kinds": {"t_ms": "timing"}})  # the rerun's declaration
    assert reproduction.verdict(rep) == "timings differ"


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_study_declares_its_timings(name):
    leaves = kinds.kind_of_leaves({k: v for k, v in committed(name).items() if k not in ("headline", "kinds")},
                                  STUDIES[name])
    found = {k for _, k in leaves.values()}
    assert {"timing", "constant"} <= found
    assert leaves["duration_s"][1] == "timing"


def test_the_report_modules_doctests_pass():
    import doctest

    from study.report import load

    for module in (kinds, reproduction, load):
        failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert attempted > 0 and failed == 0, module.__name__


def test_a_run_on_a_busy_machine_says_so():
    from study.report.load import describe, summarise

    busy = summarise(wall_s=100.0, cpu_s=90.0, busy_s=150.0, samples=[1.5, 2.0], cores=2)  # others: 60 of 200 s
    assert busy["idle"] is False and busy["others_share"] == 0.3
    idle = summarise(wall_s=100.0, cpu_s=90.0, busy_s=105.0, samples=[1.0], cores=2)
    assert idle["idle"] is True and describe(idle).startswith("otherwise idle: other processes used 7.5%")
    assert summarise(100.0, 90.0, None, [3.5], 2)["idle"] is False  # no /proc/stat: the load average decides


def test_04_s_spread_and_side_of_a_timing_ratio_are_not_the_ratio():
    assert kinds.match("quoted/function_persistent", GRADIENTS) == "timing_ratio"
    assert kinds.match("quoted/function_persistent_spread_low", GRADIENTS) == "timing_spread"
    assert kinds.match("quoted/function_persistent_side", GRADIENTS) == "timing_verdict"
    assert kinds.match("quoted/transfer_s", GRADIENTS) == kinds.match("quoted/link_gbit_s", GRADIENTS) == "constant"
    assert kinds.match("ps/2/worker_cpu_share_min", GRADIENTS) == "timing_ratio"
    assert kinds.match("ps/2/steps_per_s_std", GRADIENTS) == "timing_spread"


def test_metrics_json_is_strict_json_with_one_rule_for_non_finite_numbers(tmp_path):
    import numpy as np

    path = reporting.save_metrics({"a": np.float32("nan"), "b": float("inf"), "c": [np.float64("-inf")], "d": None},
                                  tmp_path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text  # numpy's NaN was written as a bare NaN token before
    assert json.loads(text) == {"a": None, "b": None, "c": [None], "d": None}  # numbers or null, never text
    assert reproduction.verdict(reproduction.compare({"a": "nan"}, {"a": float("nan")})) == "identical"
    # a file written before (non-finite numbers as text) compares equal with one written now (null)
    old, new = {"a": "nan", "b": "inf", "n": 8.0}, {"a": json.loads(text)["a"], "b": json.loads(text)["b"], "n": 8}
    assert reproduction.verdict(reproduction.compare(old, new, kinds={"n": "count"})) == "identical"
    assert reproduction.verdict(reproduction.compare({"b": 1.0}, {"b": None})) != "identical"  # a value lost is not
