"""Checkpoints of the ps with their JSON sidecar, each written whole or not at all, and checked on resume.

``CheckpointStore.save`` writes a ``tf.train.Checkpoint`` and the chief's bookkeeping (the sidecar, ``state.json``)
into a temporary folder, flushes both to disk, renames the folder to ``ckpt-<version>-<n>``, and only then
replaces ``latest.json`` (temporary file, then rename), which names the folder, its version and the sidecar's
SHA-256. A chief killed at any moment leaves either the previous checkpoint or the new one as the latest,
never a checkpoint without its sidecar. ``CheckpointStore.latest`` refuses (``ResumeRefused``, with what
disagrees) a pointer to a missing folder, a missing or changed sidecar, a sidecar of another version or job, or
checkpoint folders without a pointer; after the restore, the chief checks that the restored counter equals the
sidecar's version.

The job's history is not rolled back with its state: every start of a chief is appended to ``attempts.json``
(``CheckpointStore.start_attempt``), beside the checkpoints, so that two restarts from the same checkpoint are two
attempts, not one the second restore forgot.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from downpour.jsonio import read_json, write_json_atomic

POINTER = "latest.json"
ATTEMPTS = "attempts.json"
SIDECAR = "state.json"
PREFIX = "ckpt"


class ResumeRefused(ValueError):
    """``--resume`` cannot continue from this checkpoint folder; the message says what disagrees."""


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointStore:
    """Atomic checkpoints in ``directory``: ``save`` (checkpoint + sidecar) and ``latest`` (checked) / ``restore``.

    ``store = CheckpointStore("build/ckpt", keep=2, options=io); store.save(checkpoint, 40, {"records": [...]})``
    ``options``: the ``tf.train.CheckpointOptions`` for writing and reading (the chief writes every file itself).
    ``job``: a JSON-able description of the job, stored in each sidecar and compared on resume.
    """

    def __init__(self, directory: str | Path, keep: int = 2, options: Any = None, job: dict | None = None):
        self.directory = Path(directory)
        self.keep, self.options, self.job = keep, options, job

    def save(self, checkpoint: Any, version: int, sidecar: dict[str, Any]) -> Path:
        """Write checkpoint and sidecar of ``version`` atomically; returns the new checkpoint folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = self._folders()
        n = 1 + max((int(p.name.rsplit("-", 1)[1]) for p in existing), default=0)
        name = f"{PREFIX}-{version:012d}-{n}"
        tmp = self.directory / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        checkpoint.write(str(tmp / PREFIX), options=self.options)
        body = json.dumps({"version": version, "job": self.job, "state": sidecar}).encode()
        (tmp / SIDECAR).write_bytes(body)
        _fsync_tree(tmp)
        final = self.directory / name
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        write_json_atomic(self.directory / POINTER, {"folder": name, "version": version,
                                                     "sidecar_sha256": hashlib.sha256(body).hexdigest()})
        for old in [p for p in self._folders() if p.name != name][: max(0, len(existing) + 1 - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def start_attempt(self, attempt: dict[str, Any], resume: bool) -> list[dict[str, Any]]:
        """Append ``attempt`` (one start of a chief) to the job's ``attempts.json`` and return every attempt so far,
        written durably; a start without ``resume`` begins the list afresh."""
        self.directory.mkdir(parents=True, exist_ok=True)
        attempts = [*(read_json(self.directory / ATTEMPTS, []) if resume else []), attempt]
        write_json_atomic(self.directory / ATTEMPTS, attempts)
        return attempts

    def _folders(self) -> list[Path]:
        folders = [p for p in self.directory.glob(f"{PREFIX}-*-*") if p.is_dir()] if self.directory.is_dir() else []
        return sorted(folders, key=lambda p: int(p.name.rsplit("-", 1)[1]))

    def latest(self) -> tuple[str, int, dict[str, Any]] | None:
        """``(checkpoint prefix, version, sidecar state)`` of the latest checkpoint, checked; None when there is none.

        Raises ``ResumeRefused`` naming what disagrees.
        """
        pointer_path = self.directory / POINTER
        where = f"--resume: {self.directory}"
        if not pointer_path.is_file():
            if self._folders():
                raise ResumeRefused(f"{where} holds checkpoint folders but no {POINTER}: the chief that wrote them "
                                    "did not finish its first checkpoint; move them away to start afresh")
            return None
        try:
            pointer = json.loads(pointer_path.read_text())
            folder, version, digest = pointer["folder"], int(pointer["version"]), pointer["sidecar_sha256"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ResumeRefused(f"{where}/{POINTER} is unreadable ({e})") from None
        ckpt = self.directory / folder
        if not (ckpt / f"{PREFIX}.index").is_file():
            raise ResumeRefused(f"{where}/{POINTER} names {folder}, whose checkpoint is missing")
        sidecar_path = ckpt / SIDECAR
        if not sidecar_path.is_file():
            raise ResumeRefused(f"{where}: the checkpoint {folder} has no sidecar {SIDECAR}")
        body = sidecar_path.read_bytes()
        if hashlib.sha256(body).hexdigest() != digest:
            raise ResumeRefused(f"{where}: the sidecar of {folder} changed after it was written "
                                f"(its SHA-256 differs from {POINTER}'s)")
        try:
            sidecar = json.loads(body)
        except ValueError as e:
            raise ResumeRefused(f"{where}: the sidecar of {folder} is not JSON ({e})") from None
        if sidecar.get("version") != version:
            raise ResumeRefused(f"{where}: {POINTER} says version {version}, the sidecar of {folder} says "
                                f"{sidecar.get('version')}")
        if self.job is not None and sidecar.get("job") != self.job:
            changed = sorted(k for k in set(self.job) | set(sidecar.get("job") or {})
                             if self.job.get(k) != (sidecar.get("job") or {}).get(k))
            raise ResumeRefused(f"{where}: the checkpoint was written by another job (differs in {changed}); resume "
                                "with the same job, or use another checkpoint_dir")
        return str(ckpt / PREFIX), version, sidecar["state"]

    def restore(self, checkpoint: Any, version_variable: Any) -> tuple[int, dict[str, Any]] | None:
        """Restore the latest checkpoint into ``checkpoint`` and check the restored counter against the sidecar.

        Returns ``(version, sidecar state)``, or None when there is no checkpoint. Raises ``ResumeRefused``.
        """
        found = self.latest()
        if found is None:
            return None
        prefix, version, state = found
        checkpoint.read(prefix, options=self.options).assert_existing_objects_matched()
        restored = int(version_variable.numpy())
        if restored != version:
            raise ResumeRefused(f"--resume: the checkpoint {prefix} holds update counter {restored}, its sidecar "
                                f"says {version}")
        return version, state
