"""The study's files written whole or not at all, and JSON read back (standard library only).

``atomic_write`` writes through a temporary file in the same folder, renamed over the target: a reader sees the old
file or the new one, whole, and a failed write leaves no temporary file. ``read_json`` gives a default for a file
that is missing or half-written. The study keeps its own (not ``downpour.jsonio``): a study's provenance key
covers the source of every module it imports, so only notebook 04, which runs the parameter server, depends on it.

>>> import tempfile; folder = tempfile.mkdtemp()
>>> _ = atomic_write(f"{folder}/a.json", lambda tmp: open(tmp, "w").write('{"version": 3}'))
>>> read_json(f"{folder}/a.json"), read_json(f"{folder}/missing.json", {})
({'version': 3}, {})
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path`` (its folder is created).
    ``atomic_write("a.csv", df.to_csv)``"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the mode open() would
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: str | Path, default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` when the file is missing or not valid JSON. ``read_json("a.json", {})``"""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
