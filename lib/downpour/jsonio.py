"""Files written whole or not at all, and JSON read back (standard library only).

``atomic_write`` writes through a temporary file in the same folder, renamed over the target: a reader sees the old
file or the new one, whole, and a failed write leaves no temporary file. ``write_json_atomic`` does that for JSON,
flushed to disk first where it must survive a power cut; ``read_json`` gives a default for a file that is missing or
half-written by a writer that does not use them.

>>> import tempfile; folder = tempfile.mkdtemp()
>>> _ = write_json_atomic(f"{folder}/a.json", {"version": 3})
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


def atomic_write(path: str | Path, write: Callable[[str], None], durable: bool = False) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path`` (its folder is created); ``durable``: flush the
    file to disk (``fsync``) before the rename. ``atomic_write("a.csv", df.to_csv)``"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the mode open() would
        write(tmp)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | Path, data: Any, durable: bool = True) -> Path:
    """Write ``data`` as JSON to ``path`` with ``atomic_write``; ``durable`` (default): flushed to disk first."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data)), durable=durable)


def read_json(path: str | Path, default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` when the file is missing or not valid JSON. ``read_json("a.json", {})``"""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
