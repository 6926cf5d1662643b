"""Where the documentation's code blocks run (pytest-codeblocks, ``--codeblocks`` in pyproject.toml's addopts).

A python block of README.md, docs/*.md or lib/freezing/README.md runs in a fresh temporary folder, so that what it
writes (``model.save("model.keras")``) never lands in the repository, whose untracked files would mark every
study's next run as made from a dirty tree. The parameter server's walk-through (lib/downpour/README.md) is
written for the repository root (``examples/...``, ``build/...``), so its blocks run there. Bash blocks run where
pytest was started (the repository root under ``make test``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
RUN_FROM_REPO = (REPO / "lib" / "downpour",)


def _runs_in_temporary_folder(item: pytest.Item) -> bool:
    block = getattr(item, "obj", None)
    if type(item).__module__ != "pytest_codeblocks.plugin" or getattr(block, "syntax", None) != "python":
        return False
    path = Path(item.path).resolve()
    return not any(path.is_relative_to(folder) for folder in RUN_FROM_REPO)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Run a documentation python block inside a temporary folder (see the module docstring)."""
    if not _runs_in_temporary_folder(item):
        return (yield)
    start = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="codeblock-") as folder:
        os.chdir(folder)
        try:
            return (yield)
        finally:
            os.chdir(start)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the doctests that show what only a newer Keras records (the oldest Keras CI tests records less)."""
    from freezing import _keras_api

    if _keras_api.records_compiled_trainable_state():
        return
    for item in items:
        if item.name == "freezing.stalls.trainable_changes":
            item.add_marker(pytest.mark.skip(reason="this Keras records no trainable flag at compile"))
