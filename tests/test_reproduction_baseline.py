"""REPRODUCTION.md says what each rerun was compared with: the committed run's own commit, date and machine, and
whether the bits could be expected to match; a legend defines every column; ``manifest.json`` is documented field
by field (``provenance.MANIFEST_FIELDS``), checked here against the committed manifest."""

import json
from pathlib import Path

from gitrepo import committed_repo, git

from study.report import provenance, reproduction

REPO = Path(__file__).resolve().parents[1]
HOST = {"cpu": "AMD EPYC", "cores": 2, "TF_ENABLE_ONEDNN_OPTS": "unset", "onednn_in_build": True}
PACKAGES = {"python": "3.11.7", "keras": "3.15.1", "platform": "Linux-x"}


def _repo(tmp_path: Path, machine: dict) -> Path:
    """A repository whose committed results/ hold one study, made on ``machine`` at an older commit."""
    committed = {"01_a": {"profile": "full", "commit": "b" * 40, "dirty": False,
                          "finished_at": "2026-01-01T00:00:00+00:00", "machine": machine, "packages": PACKAGES}}
    return committed_repo(tmp_path / "repo", {"results/01_a/metrics.json": json.dumps({"acc": 0.5, "n": 3}),
                                              "results/manifest.json": json.dumps(committed)})


def _rerun(tmp_path: Path, repo: Path, record_machine: bool = True, staging: str = "staging") -> str:
    run = tmp_path / staging
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"acc": 0.5, "n": 3}))
    rep = (reproduction.against_committed(repo / "results", "01_a", run, "full", HOST, PACKAGES) if record_machine
           else reproduction.against_committed(repo / "results", "01_a", run, "full"))
    head = git(repo, "rev-parse", "HEAD").strip()
    manifest = {"01_a": {"commit": head, "finished_at": "2026-02-02T00:00:00+00:00", "machine": HOST,
                         "packages": PACKAGES, "reproduction": rep}}
    (repo / "results" / "manifest.json").write_text(json.dumps(manifest))
    return reproduction.write_report(repo / "results").read_text()


def test_a_baseline_from_another_machine_is_named_and_the_verdict_says_so(tmp_path):
    repo = _repo(tmp_path, {**HOST, "onednn_in_build": False})
    run = tmp_path / "staging"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"acc": 0.5, "n": 3}))
    rep = reproduction.against_committed(repo / "results", "01_a", run, "full", HOST, PACKAGES)
    assert rep["baseline"]["commit"] == "b" * 40 and rep["baseline"]["finished_at"] == "2026-01-01T00:00:00+00:00"
    assert rep["baseline"]["differs"] == ["onednn_in_build: false → true"]
    assert reproduction.verdict(rep).startswith("other machine or versions than the committed run")
    assert "bits not expected to match" in reproduction.verdict(rep)
    text = _rerun(tmp_path, repo, staging="again")
    row = next(line for line in text.splitlines() if line.startswith("| 01_a |"))
    assert "made at bbbbbbbbbb, 2026-01-01T00:00:00+00:00, on AMD EPYC, 2 cores, oneDNN build off" in row
    assert "other machine or versions than the committed run (onednn_in_build: false → true)" in row


def test_a_baseline_from_the_same_machine_reads_identical(tmp_path):
    repo = _repo(tmp_path, HOST)
    row = next(line for line in _rerun(tmp_path, repo).splitlines() if line.startswith("| 01_a |"))
    assert "| identical |" in row and "other machine" not in row
    # the machine and the rerun's commit are named once per row: the committed run's machine is "the same machine"
    assert "made at bbbbbbbbbb, 2026-01-01T00:00:00+00:00, on the same machine" in row
    assert row.count("AMD EPYC") == 1 and "read from `results/01_a/metrics.json` as committed" in row


def test_a_comparison_recorded_without_its_baseline_gets_it_from_the_committed_manifest(tmp_path):
    repo = _repo(tmp_path, {**HOST, "cores": 16, "cpu": "Intel Xeon"})
    text = _rerun(tmp_path, repo, record_machine=False)
    manifest = json.loads((repo / "results" / "manifest.json").read_text())
    del manifest["01_a"]["reproduction"]["baseline"]  # as recorded before baselines were
    (repo / "results" / "manifest.json").write_text(json.dumps(manifest))
    text = reproduction.write_report(repo / "results").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 01_a |"))
    assert "made at bbbbbbbbbb" in row and "on Intel Xeon, 16 cores" in row
    assert "(cores: 16 → 2; cpu: Intel Xeon → AMD EPYC)" in row


def test_the_legend_defines_every_column_and_term(tmp_path):
    text = _rerun(tmp_path, _repo(tmp_path, HOST))
    header = next(line for line in text.splitlines() if line.startswith("| study |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    legend = {term for term, _ in reproduction.LEGEND}
    assert set(columns) <= legend, set(columns) - legend
    for term in ("only committed / only rerun", "within", "timings, rerun / committed", "load while it ran",
                 "left out"):
        assert f"- **{term}**: " in text
    left_out = dict(reproduction.LEGEND)["left out"]
    assert "`headline`" in left_out and "`timing_spread`" in left_out
    assert "10%" in dict(reproduction.LEGEND)["load while it ran"]


def test_every_field_of_the_committed_manifest_is_documented(tmp_path):
    manifest = json.loads((REPO / "results" / "manifest.json").read_text())
    for name, entry in manifest.items():
        assert provenance.undocumented(entry) == [], name
    text = _rerun(tmp_path, _repo(tmp_path, HOST))
    assert "## `manifest.json`, field by field" in text
    for field in ("load.others_share", "result.made_at", "key.inputs", "reproduction.baseline.differs",
                  "effective_parameters", "parameters"):
        assert f"| `{field}` |" in text
    assert "IDLE_SHARE` = 0.10" in provenance.MANIFEST_FIELDS["load.idle"]

