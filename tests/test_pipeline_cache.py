"""Reuse in ``study.report.pipeline``: the key follows every input, and only this machine's record reuses a run.

Key tests use the real notebooks and a fake package tree; the end-to-end test runs two tiny notebooks, the second
reading the first's results, through ``study.report.pipeline.main`` four times (first run, reuse with no file
touched, the first notebook changed, ``--force``). ``git_state`` and ``reproduction`` run in a scratch repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from gitrepo import committed_repo, git
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from study.report import cache, pipeline, reproduction
from study.report.records import Records

REPO = Path(__file__).resolve().parents[1]


def test_notebook_01_imports_what_it_uses_and_not_the_other_studies():
    names = set(cache.modules(REPO / "notebooks" / "01_adam_drift.ipynb"))
    assert {"study.drift.adam_drift", "freezing.masked_optimizer", "freezing", "study",
            "study.report.reporting"} <= names
    assert "freezing.slots" in names  # through lib/freezing/__init__.py
    assert not names & {"study.gan.alternating", "study.cnn", "study.report.pipeline", "study.report.cache"}


def test_modules_started_as_subprocesses_by_name_are_followed():
    names = set(cache.modules(REPO / "notebooks" / "04_gradients_and_ps.ipynb"))
    assert {"downpour.roles", "downpour.chief", "downpour.worker"} <= names  # started as `python -m downpour`


def test_only_notebook_04_s_key_covers_the_parameter_server(tmp_path):
    """A change to any ``downpour`` module leaves study 01's key as it was (its report IO is the study's own) and
    changes study 04's, whose runs start ``python -m downpour``."""
    import shutil

    root = tmp_path / "lib"
    for package in ("freezing", "study", "downpour"):
        shutil.copytree(REPO / "lib" / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    lock = REPO / "requirements.txt"

    def keys() -> dict[str, str]:
        return {name: cache.notebook_key(REPO / "notebooks" / name, {}, lock, root)
                for name in ("01_adam_drift.ipynb", "04_gradients_and_ps.ipynb")}

    before = keys()
    assert not any(name.split(".")[0] == "downpour"
                   for name in cache.modules(REPO / "notebooks" / "01_adam_drift.ipynb"))
    for module in sorted((root / "downpour").glob("*.py")):
        module.write_text(module.read_text() + "# changed\n")
    after = keys()
    assert after["01_adam_drift.ipynb"] == before["01_adam_drift.ipynb"]
    assert after["04_gradients_and_ps.ipynb"] != before["04_gradients_and_ps.ipynb"]


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


def test_data_enters_the_key_by_content_not_by_size_or_time(tmp_path):
    data = tmp_path / "mnist.npz"
    data.write_bytes(b"0123456789")
    first = cache.data_identity({"data_path": str(data)})
    stat = data.stat()
    data.write_bytes(b"9876543210")  # same size, same mtime: only the content differs
    import os

    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.data_identity({"data_path": str(data)}) != first


def test_the_key_names_the_machine_and_the_installed_packages(tmp_path):
    nb = _tree(tmp_path)

    def key(host):
        return cache.notebook_key(nb, {}, tmp_path / "requirements.txt", tmp_path, host=host)

    here = cache.machine()
    assert {"cpu", "cores", "onednn_in_build", "TF_ENABLE_ONEDNN_OPTS"} <= set(here)
    assert key(here) == key(dict(here))
    assert key({**here, "cpu": "another CPU"}) != key(here)
    assert key({**here, "TF_ENABLE_ONEDNN_OPTS": "0"}) != key(here)
    parts = cache.key_parts(nb, {}, tmp_path / "requirements.txt", tmp_path, host=here)
    assert {"packages", "machine", "data", "requirements.txt"} <= set(parts)


def test_changing_04_s_metrics_changes_05_s_key(tmp_path):
    """Notebook 05's which-method table reads studies 01-04's metrics.json: they are part of its key."""
    nb = REPO / "notebooks" / "05_recipes.ipynb"
    assert "04_gradients_and_ps/metrics.json" in cache.reads(nb)
    host = cache.machine()
    (tmp_path / "04_gradients_and_ps").mkdir()
    metrics = tmp_path / "04_gradients_and_ps" / "metrics.json"
    metrics.write_text('{"fetch_costs": {"ratio": 3.8}}')

    def key():
        return cache.notebook_key(nb, {"seeds": [0]}, out=tmp_path, host=host)

    first = key()
    assert key() == first
    metrics.write_text('{"fetch_costs": {"ratio": 4.24}}')
    assert key() != first
    metrics.unlink()
    assert key() != first


def test_a_malformed_reads_declaration_is_one_clear_error(tmp_path):
    nb = new_notebook(metadata={"study": {"reads": ["../outside.json"]}})
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    try:
        cache.reads(path)
    except ValueError as e:
        assert "metadata.study.reads must be a list of paths inside the results folder" in str(e)
    else:
        raise AssertionError("a path outside the results folder was accepted")


def _tiny(folder: Path, name: str, value: int, reads: tuple[str, ...] = ()) -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                **({"study": {"reads": list(reads)}} if reads else {})})
    nb.cells = [new_markdown_cell(f"# {name}"),
                new_code_cell("out_dir = '.'\nvalue = 1", metadata={"tags": ["parameters"]}),
                new_code_cell(f"from pathlib import Path\nfrom study.report import reporting\nversion = {value}\n"
                              "reporting.save_metrics({'value': value, 'version': version, "
                              "'headline': {'value': value}}, Path(out_dir))")]
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    (folder / "params" / f"{name}.smoke.yaml").write_text("value: 2\n")
    return path


def _files(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``out``: (mtime in ns, bytes)."""
    return {p.relative_to(out).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_second_run_touches_nothing_and_a_study_s_results_rerun_its_reader(tmp_path, capsys):
    folder, out, records = tmp_path / "notebooks", tmp_path / "out", tmp_path / "records"
    (folder / "params").mkdir(parents=True)
    _tiny(folder, "01_one", 1)
    _tiny(folder, "02_reader", 1, reads=("01_one/metrics.json",))
    argv = ["--profile", "smoke", "--out", str(out), "--notebooks", str(folder), "--records", str(records)]

    def run(*extra: str) -> tuple[dict, str]:
        assert pipeline.main(argv + list(extra)) == 0
        return json.loads((out / "manifest.json").read_text()), capsys.readouterr().out

    first, printed = run()
    assert printed.count("runs (no record of a run on this machine)") == 2
    assert all(e["machine"]["cores"] and e["result"]["how"] == "rerun" and len(e["key"]["inputs"]) == 64
               and e["load"]["wall_s"] > 0 for e in first.values())
    assert list(records.iterdir()) and not list(out.glob("*/*.json.sha256"))  # the record lives outside out/
    assert "nothing committed to compare with" in (out / "REPRODUCTION.md").read_text()  # out/ is not in git
    before = _files(out)

    second, printed = run()
    assert printed.count("reused: this machine ran it with the same key") == 2
    assert _files(out) == before  # no file rewritten, not even the manifest, SUMMARY.md or index.html

    _tiny(folder, "01_one", 2)  # 01's notebook changes, and so does the metrics.json that 02 reads
    third, printed = run()
    assert "01_one (smoke) runs (changed: notebook)" in printed
    assert "02_reader (smoke) runs (changed: read:01_one/metrics.json)" in printed
    assert json.loads((out / "01_one" / "metrics.json").read_text())["version"] == 2
    assert third["02_reader"]["finished_at"] >= second["02_reader"]["finished_at"]

    fresh = Records(tmp_path / "elsewhere", out)  # a fresh clone, or this folder on another machine: no record
    host = cache.machine()
    for nb in sorted(folder.glob("*.ipynb")):
        params = {**pipeline.load_parameters(nb, "smoke"), "profile": "smoke"}
        key = cache.notebook_key(nb, params, out=out.resolve(), host=host)
        assert Records(records, out).reusable(nb.stem, key) is not None
        assert fresh.reusable(nb.stem, key) is None

    before = _files(out)
    forced, printed = run("--force")
    assert printed.count("runs (--force)") == 2
    assert _files(out)["01_one/metrics.json"][0] != before["01_one/metrics.json"][0]


def test_a_changed_output_is_not_reused(tmp_path):
    out = tmp_path / "out"
    (out / "01_one").mkdir(parents=True)
    (out / "01_one" / "metrics.json").write_text("{}")
    records = Records(tmp_path / "records", out)
    records.save("01_one", "k" * 64, {"notebook": "x"})
    assert records.reusable("01_one", "k" * 64) is not None
    assert records.reusable("01_one", "j" * 64) is None
    assert "changed: notebook" in records.why_not("01_one", "j" * 64, {"notebook": "y"})
    (out / "01_one" / "metrics.json").write_text('{"edited": 1}')
    assert records.reusable("01_one", "k" * 64) is None
    assert "not the ones it wrote" in records.why_not("01_one", "k" * 64, {"notebook": "x"})


def _repo(tmp_path: Path) -> Path:
    return committed_repo(tmp_path / "repo", {
        "lib/study/x.py": "x = 1\n", "notebooks/01_a.ipynb": "{}", "Makefile": "all:\n",
        "results/01_a/metrics.json": json.dumps({"acc": 0.5, "n": 3, "loss": 1.0, "step_ms": 10.0, "name": "a",
                                                 "headline": {"acc": "0.5"}})})


def test_dirty_covers_the_whole_repository_but_not_the_results_folder(tmp_path):
    repo = _repo(tmp_path)
    out, notebooks = repo / "results", repo / "notebooks"
    clean = pipeline.git_state(out, notebooks)
    assert clean == {"commit": git(repo, "rev-parse", "HEAD").strip(), "dirty": False}
    (out / "01_a" / "metrics.json").write_text("{}")  # the run itself writes here
    assert pipeline.git_state(out, notebooks)["dirty"] is False
    (repo / "lib" / "study" / "x.py").write_text("x = 2\n")  # a change under lib/, outside notebooks/
    assert pipeline.git_state(out, notebooks)["dirty"] is True
    git(repo, "checkout", "-q", "--", "lib")
    (repo / "lib" / "study" / "new.py").write_text("")  # an untracked module a notebook could import
    assert pipeline.git_state(out, notebooks)["dirty"] is True


def test_a_rerun_is_compared_with_the_committed_metrics(tmp_path):
    repo = _repo(tmp_path)
    run = tmp_path / "staging"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"acc": 0.5, "n": 3, "loss": 1.0004, "step_ms": 12.0, "name": "b",
                                                  "headline": {"acc": "0.6"}, "kinds": {"step_ms": "timing"}}))
    nb = new_notebook(cells=[new_code_cell("assert 1 == 1"), new_code_cell("x = 1"), new_code_cell("assert x")])
    nbformat.write(nb, run / "01_a.ipynb")
    rep = reproduction.against_committed(repo / "results", "01_a", run)
    assert rep["compared_with"].startswith("HEAD ") and rep["compared_with"].endswith(":results/01_a/metrics.json")
    assert (rep["values"], rep["identical"], rep["within"], rep["differ"]) == (4, 2, 1, 1)  # headline left out
    assert rep["largest"] == [{"value": "name", "committed": "a", "rerun": "b", "relative": None}]
    assert rep["timings"] == {"values": 1, "median_ratio": 1.2, "min_ratio": 1.2, "max_ratio": 1.2}
    assert rep["assertion_cells"] == 2 and rep["assertions_passed"] is True
    untracked = reproduction.against_committed(tmp_path / "elsewhere", "01_a", run)
    assert untracked["compared_with"] is None and "nothing committed" in untracked["note"]
    manifest = {"01_a": {"commit": "0123456789ab", "finished_at": "2026-01-01T00:00:00+00:00", "reproduction": rep}}
    (repo / "results" / "manifest.json").write_text(json.dumps(manifest))
    text = reproduction.write_report(repo / "results").read_text()
    assert "| 01_a | 0123456789, 2026-01-01T00:00:00+00:00 |" in text
    assert "| 1 value differs; 1 within 0.001; timings differ | 4 | 2 | 1 | 1 | 2, all passed | median 1.20 (range " \
           "1.20–1.20, 1 timing) | not recorded |" in text
    assert '- `name`: "a" → "b"' in text
