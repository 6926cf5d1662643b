"""The machine-local record of finished notebook runs: what lets ``make reproduce`` reuse a notebook.

A notebook is reused only when *this machine* ran it with the same key (``study.report.cache.notebook_key``:
sources, parameters, data, lock file, the other studies' results it reads, the machine and its packages) into
the same results folder, and the files it wrote there are still the ones it wrote (by SHA-256). The record lives
under ``build/records/`` (git-ignored), one JSON file per results folder, so a fresh clone, or results committed
from another machine, have no record and every notebook runs. ``results/manifest.json`` is not consulted: it is
the committed provenance of the results, not a cache.

``record = Records(Path("build/records"), Path("results")); record.reusable("01_adam_drift", key)``
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from study.report.reporting import atomic_write


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks. ``file_digest(Path("results/01_adam_drift/metrics.json"))``"""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (recursively): relative POSIX path -> SHA-256, sorted by path."""
    return {p.relative_to(folder).as_posix(): file_digest(p)
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Records:
    """The runs this machine finished into one results folder, kept in ``<records_dir>/<folder id>.json``.

    Each entry: the key, its parts (to say what changed when a notebook reruns), when it finished, and the digest
    of every file the run left in ``out/<name>``.
    """

    def __init__(self, records_dir: Path, out: Path) -> None:
        self.out = Path(out).resolve()
        folder_id = hashlib.sha256(str(self.out).encode()).hexdigest()[:16]
        self.path = Path(records_dir) / f"{self.out.name}-{folder_id}.json"

    def load(self) -> dict[str, Any]:
        """Every record of this results folder (an unreadable file counts as none: every notebook reruns)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("out") != str(self.out):
            return {}
        runs = data.get("runs")
        return runs if isinstance(runs, dict) else {}

    def reusable(self, name: str, key: str) -> dict[str, Any] | None:
        """The record of ``name`` when it can be reused: same key, and ``out/<name>`` holds exactly what it wrote."""
        record = self.load().get(name)
        if not isinstance(record, dict) or record.get("key") != key:
            return None
        folder = self.out / name
        if not folder.is_dir() or folder_digests(folder) != record.get("files"):
            return None
        return record

    def why_not(self, name: str, key: str, parts: dict[str, str]) -> str:
        """Why ``name`` cannot be reused, in a few words: "no record on this machine", "changed: module:study.x"."""
        record = self.load().get(name)
        if not isinstance(record, dict):
            return "no record of a run on this machine"
        if record.get("key") != key:
            old = record.get("parts") or {}
            changed = sorted(k for k in set(old) | set(parts) if old.get(k) != parts.get(k))
            return "changed: " + (", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
                                  if changed else "the key")
        return "its outputs in the results folder are not the ones it wrote"

    def save(self, name: str, key: str, parts: dict[str, str]) -> Path:
        """Record that ``name`` finished with ``key`` and wrote what ``out/<name>`` now holds (atomic write)."""
        runs = self.load()
        runs[name] = {"key": key, "parts": parts, "files": folder_digests(self.out / name),
                      "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        text = json.dumps({"out": str(self.out), "runs": dict(sorted(runs.items()))}, indent=1) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(self.path, lambda p: Path(p).write_text(text))
