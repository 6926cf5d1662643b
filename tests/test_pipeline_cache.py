"""The execution cache of ``study.report.pipeline``: the key follows imports, and a second run reuses what is current.

Key tests use the real notebooks and a fake package tree; the end-to-end test runs two tiny notebooks through
``study.report.pipeline.main`` four times (first run, reuse, one notebook changed, ``--force``).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from study.report import cache, pipeline

REPO = Path(__file__).resolve().parents[1]


def test_notebook_01_imports_what_it_uses_and_not_the_other_studies():
    names = set(cache.modules(REPO / "notebooks" / "01_adam_drift.ipynb"))
    assert {"study.drift.adam_drift", "freezing.masked_optimizer", "freezing", "study", "study.report.reporting"} <= names
    assert "freezing.slots" in names  # through lib/freezing/__init__.py
    assert not names & {"study.gan.alternating", "study.cnn", "study.report.pipeline", "study.report.cache"}


def test_modules_started_as_subprocesses_by_name_are_followed():
    names = set(cache.modules(REPO / "notebooks" / "04_gradients_and_ps.ipynb"))
    assert {"study.ps.roles", "study.ps.chief", "study.ps.worker"} <= names  # started as `python -m study.ps`


def _tree(root: Path) -> Path:
    """A fake lib/ with freezing/ and study/ packages, and a notebook importing study.a."""
    (root / "freezing").mkdir(parents=True)
    (root / "freezing" / "__init__.py").write_text("from freezing.core import f\n")
    (root / "freezing" / "core.py").write_text("def f():\n    return 1\n")
    (root / "study" / "sub").mkdir(parents=True)
    (root / "study" / "__init__.py").write_text("")
    (root / "study" / "a.py").write_text("import freezing\nfrom .sub import x\nCHILD = ('-m', 'study.child')\n")
    (root / "study" / "sub" / "__init__.py").write_text("")
    (root / "study" / "sub" / "x.py").write_text("from ..b import g\n")
    (root / "study" / "b.py").write_text("def g():\n    return 2\n")
    (root / "study" / "child.py").write_text("print('child')\n")
    (root / "study" / "unrelated.py").write_text("def h():\n    return 3\n")
    (root / "requirements.txt").write_text("numpy==1\n")
    nb = new_notebook(cells=[new_markdown_cell("# t"), new_code_cell("%matplotlib inline\nfrom study import a")])
    path = root / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_key_changes_with_an_imported_module_only(tmp_path):
    nb = _tree(tmp_path)
    names = set(cache.modules(nb, tmp_path))
    assert names == {"freezing", "freezing.core", "study", "study.a", "study.sub", "study.sub.x", "study.b",
                     "study.child"}

    def key(params=None):
        return cache.notebook_key(nb, params or {"steps": 1}, tmp_path / "requirements.txt", tmp_path)

    first = key()
    assert key() == first
    (tmp_path / "study" / "unrelated.py").write_text("def h():\n    return 4\n")
    assert key() == first
    for changed in ("study/b.py", "freezing/core.py", "study/child.py"):
        (tmp_path / changed).write_text((tmp_path / changed).read_text() + "# changed\n")
        assert key() != first, changed
        first = key()
    assert key({"steps": 2}) != first
    (tmp_path / "requirements.txt").write_text("numpy==2\n")
    assert key() != first


def _tiny(folder: Path, name: str, value: int) -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [new_markdown_cell(f"# {name}"),
                new_code_cell("out_dir = '.'\nvalue = 1", metadata={"tags": ["parameters"]}),
                new_code_cell(f"from pathlib import Path\nfrom study.report import reporting\nversion = {value}\n"
                              "reporting.save_metrics({'value': value, 'version': version, "
                              "'headline': {'value': value}}, Path(out_dir))")]
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    (folder / "params" / f"{name}.smoke.yaml").write_text("value: 2\n")
    return path


def _snapshot(out: Path, name: str) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted((out / name).iterdir())}


def test_a_second_run_reuses_and_a_change_reruns_only_that_notebook(tmp_path, capsys):
    folder, out = tmp_path / "notebooks", tmp_path / "out"
    (folder / "params").mkdir(parents=True)
    _tiny(folder, "01_one", 1)
    two = _tiny(folder, "02_two", 1)
    argv = ["--profile", "smoke", "--out", str(out), "--notebooks", str(folder)]

    def run(*extra: str) -> dict:
        assert pipeline.main(argv + list(extra)) == 0
        return json.loads((out / "manifest.json").read_text())

    first = run()
    assert {e["status"] for e in first.values()} == {"rerun"}
    assert all(len(e["key"]) == 64 and e["machine"]["cores"] for e in first.values())
    before = {n: _snapshot(out, n) for n in first}
    capsys.readouterr()

    second = run()
    printed = capsys.readouterr().out
    assert printed.count("reused (key ") == 2
    assert {e["status"] for e in second.values()} == {"reused"}
    for name, entry in second.items():
        assert {k: v for k, v in entry.items() if k not in ("status", "checked_at", "checked_commit")} == \
            {k: v for k, v in first[name].items() if k != "status"}
        assert _snapshot(out, name) == before[name]
    assert (out / "SUMMARY.md").is_file() and (out / "index.html").is_file() and (out / "COLUMNS.md").is_file()

    _tiny(folder, "02_two", 2)  # the notebook's bytes change
    third = run()
    assert third["01_one"]["status"] == "reused" and third["02_two"]["status"] == "rerun"
    assert third["02_two"]["key"] != first["02_two"]["key"]
    assert json.loads((out / "02_two" / "metrics.json").read_text())["version"] == 2
    assert _snapshot(out, "01_one") == before["01_one"]
    assert two.is_file()

    forced = run("--force")
    assert {e["status"] for e in forced.values()} == {"rerun"}
    assert forced["01_one"]["finished_at"] >= first["01_one"]["finished_at"]
    assert _snapshot(out, "01_one") != before["01_one"]


def test_a_missing_output_or_another_profile_is_not_reused(tmp_path):
    folder, out = tmp_path / "notebooks", tmp_path / "out"
    (folder / "params").mkdir(parents=True)
    nb = _tiny(folder, "01_one", 1)
    key = cache.notebook_key(nb, pipeline.load_parameters(nb, "smoke"))
    (out / "01_one").mkdir(parents=True)
    (out / "01_one" / "01_one.ipynb").write_text("{}")
    (out / "01_one" / "metrics.json").write_text("{}")
    (out / "manifest.json").write_text(json.dumps({"01_one": {"key": key, "profile": "smoke"}}))
    assert pipeline.cached_entry(out, nb, "smoke", key) is not None
    assert pipeline.cached_entry(out, nb, "full", key) is None
    assert pipeline.cached_entry(out, nb, "smoke", "0" * 64) is None
    (out / "01_one" / "metrics.json").unlink()
    assert pipeline.cached_entry(out, nb, "smoke", key) is None
