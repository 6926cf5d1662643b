"""A throwaway git repository for tests of what reads committed files (provenance, reproduction baselines)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """``git *args`` in ``repo``; its stdout. Raises on a non-zero exit."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def committed_repo(repo: Path, files: dict[str, str]) -> Path:
    """``repo`` as a new git repository holding ``files`` (path -> text) in one commit."""
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo
