"""The study's layout shows its five studies: one subpackage each, no import cycles, no study importing another.

Read from the sources with ``ast`` (``study.report.cache`` finds imports the same way), so nothing is imported.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import nbformat
import pytest

from study.report.cache import LIB, imported_names, modules, notebook_source

REPO = Path(__file__).resolve().parents[1]
STUDIES = {"01_adam_drift": "study.drift", "02_mnist_cnn_freezing": "study.cnn", "03_gan_alternating": "study.gan",
           "04_gradients_and_ps": "study.gradients", "05_recipes": "study.recipes"}
CORE = {"study", "study.data", "study.models", "study.training", "study.optimizers", "study.processes",
        "study.validation", "study.intervals"}
SHARED = ("study.report.prose", "study.report.reporting", "study.report")
"""What a study may import besides the core and itself: the prose filters and the writers of tables and figures."""


def _package(name: str) -> str:
    """``study.cnn.tables`` -> ``study.cnn``; core modules and ``study.report.*`` map to themselves."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or name in STUDIES.values() else name


def _imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``study`` modules an import statement of ``source`` names, anywhere in it (in a function too):
    ``from study.gradients import plots`` names ``study.gradients.plots``, and ``study.gradients`` only when ``plots``
    is no module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = ".".join(parts[:len(parts) - node.level + is_package] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found |= subs or {base}
    return {n for n in found if n in known and n != module}


def _graph() -> dict[str, set[str]]:
    """Every ``study`` module -> the ``study`` modules its import statements name."""
    files = {".".join(p.relative_to(LIB).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (LIB / "study").rglob("*.py")}
    return {name: _imports(path.read_text(), name, path.name == "__init__.py", set(files))
            for name, path in files.items()}


def test_every_study_has_its_package_with_its_figures():
    for package in STUDIES.values():
        folder = LIB.joinpath(*package.split("."))
        assert (folder / "__init__.py").is_file() and (folder / "plots.py").is_file(), package
    assert not [p.name for p in (LIB / "study").glob("*plot*.py")]  # no figures outside a study's package


def test_no_import_cycles():
    graph = _graph()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(node):] + [node]))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])


def test_studies_import_the_core_the_report_helpers_and_themselves_only():
    bad = []
    for name, deps in _graph().items():
        package = _package(name)
        for dep in deps:
            if package in STUDIES.values():
                allowed = dep in CORE or dep.startswith(SHARED) or _package(dep) == package
            elif name.startswith("study.report") or name in CORE:
                allowed = _package(dep) not in STUDIES.values()  # the core and report import no study
            else:
                allowed = True
            if not allowed:
                bad.append(f"{name} imports {dep}")
    assert not bad, bad


@pytest.mark.parametrize("notebook, package", STUDIES.items())
def test_each_notebook_imports_its_own_study_only(notebook, package):
    path = REPO / "notebooks" / f"{notebook}.ipynb"
    direct = {n for n in imported_names(notebook_source(path)) if n.startswith("study.")}
    studies = {_package(n) for n in direct} & set(STUDIES.values())
    assert studies == {package}, (notebook, sorted(direct))
    assert nbformat.read(path, as_version=4)  # and it is a notebook
    reached = {_package(n) for n in modules(path)} & set(STUDIES.values())
    assert reached == {package}, (notebook, sorted(reached))  # not through another module either


def test_no_wheel_or_archive_is_committed():
    tracked = subprocess.run(["git", "ls-files", "*.whl", "*.tar.gz", "*.zip"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked == []
