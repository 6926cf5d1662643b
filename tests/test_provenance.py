"""Provenance anyone can check: ``python -m study.report --verify`` against the manifest's keys.

Two tiny notebooks, recorded as the pipeline records them (and, in the slow test, run through it); ``--verify``
passes, then fails naming the study and the input that changed when a notebook, its parameters or the results it
reads change, and when a result file is edited by hand.
``test_the_committed_results_were_made_from_this_tree`` is the real gate: it runs ``--verify`` on the repository's
own ``results/``, so ``make test`` fails while a committed result is stale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline_cache import _tiny

from study.report import pipeline, provenance

REPO = Path(__file__).resolve().parents[1]


def _recorded(tmp_path: Path) -> tuple[Path, Path]:
    """Two tiny notebooks and a results folder whose manifest records them as the pipeline does (no run)."""
    folder, out = tmp_path / "notebooks", tmp_path / "out"
    (folder / "params").mkdir(parents=True)
    _tiny(folder, "01_one", 1)
    _tiny(folder, "02_reader", 1, reads=("01_one/metrics.json",))
    manifest = {}
    for name in ("01_one", "02_reader"):
        (out / name).mkdir(parents=True)
        (out / name / "metrics.json").write_text(json.dumps({"value": 2, "name": name}))
        parts = provenance.current_parts(folder / f"{name}.ipynb", "smoke", out)
        manifest[name] = provenance.record({"profile": "smoke"}, parts, out / name, "rerun", "abc")
    (out / "manifest.json").write_text(json.dumps(manifest))
    return folder, out


def test_verify_names_each_stale_study_and_what_changed(tmp_path):
    folder, out = _recorded(tmp_path)
    assert provenance.verify(out, folder) == []
    (folder / "params" / "01_one.smoke.yaml").write_text("value: 3\n")  # a parameter changed, not rerun
    assert provenance.verify(out, folder) == [
        "01_one: its result was made from other inputs than this working tree's; changed: parameters"]
    (folder / "params" / "01_one.smoke.yaml").write_text("value: 2\n")
    (out / "02_reader" / "metrics.json").write_text('{"value": 5}')  # a result edited by hand
    assert provenance.verify(out, folder) == ["02_reader: files differ from what its run wrote: metrics.json"]
    _tiny(folder, "02_reader", 9, reads=("01_one/metrics.json",))  # the notebook changed as well
    assert provenance.verify(out, folder)[0] == (
        "02_reader: its result was made from other inputs than this working tree's; changed: notebook")
    (out / "01_one" / "metrics.json").write_text('{"value": 6}')  # 01 rewritten: 02 read the old one
    assert "changed: notebook, read:01_one/metrics.json" in " ".join(provenance.verify(out, folder))


@pytest.mark.slow  # runs the pipeline three times (about 30 s)
def test_verify_passes_then_names_each_stale_study_and_what_changed(tmp_path, capsys):
    folder, out = tmp_path / "notebooks", tmp_path / "out"
    (folder / "params").mkdir(parents=True)
    _tiny(folder, "01_one", 1)
    _tiny(folder, "02_reader", 1, reads=("01_one/metrics.json",))
    argv = ["--profile", "smoke", "--out", str(out), "--notebooks", str(folder), "--records", str(tmp_path / "rec")]
    assert pipeline.main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["01_one"]
    assert entry["key"]["inputs"] != entry["key"]["key"] and entry["key"]["machine"] and entry["key"]["packages"]
    assert {"notebook", "parameters", "requirements.txt", "data", "module:study.report.reporting"} <= set(
        entry["key"]["covers"])
    assert "read:01_one/metrics.json" in manifest["02_reader"]["key"]["covers"]
    assert entry["result"]["how"] == "rerun" and "metrics.json" in entry["files"]
    assert entry["load"]["wall_s"] > 0 and entry["load"]["idle"] in (True, False)
    capsys.readouterr()

    verify = ["--verify", "--out", str(out), "--notebooks", str(folder)]
    assert pipeline.main(verify) == 0
    assert "all 2 studies" in capsys.readouterr().out

    (folder / "params" / "01_one.smoke.yaml").write_text("value: 3\n")  # a parameter changed, not rerun
    assert pipeline.main(verify) == 1
    printed = capsys.readouterr().out
    assert "01_one: its result was made from other inputs than this working tree's; changed: parameters" in printed
    assert "02_reader" not in printed
    (folder / "params" / "01_one.smoke.yaml").write_text("value: 2\n")

    (out / "02_reader" / "metrics.json").write_text('{"value": 5}')  # a result edited by hand
    assert pipeline.main(verify) == 1
    assert "02_reader: files differ from what its run wrote: metrics.json" in capsys.readouterr().out

    assert pipeline.main(argv) == 0  # rerun: current again
    capsys.readouterr()
    _tiny(folder, "01_one", 7)  # the notebook changes: 01 is stale, and 02 still reads 01's old result
    problems = provenance.verify(out, folder)
    assert problems == ["01_one: its result was made from other inputs than this working tree's; changed: notebook"]


def test_the_committed_results_were_made_from_this_tree():
    """The gate: every study in results/ was made from the notebooks, parameters and sources of this working tree."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "study.report", "--verify"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (
        "committed results are stale; rerun what is named (make reproduce) and commit results/:\n" + done.stdout
        + done.stderr[-2000:])
