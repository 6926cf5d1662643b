"""Check that committed results still belong to the code: ``python -m study.report --verify``.

For each study in ``results/manifest.json`` the pipeline records (``record``):

* ``key``: the key its result was made under (``cache.split_key``): ``inputs``, the part that is in the repository
  (the notebook, its parameters, ``requirements.txt``, the source of every module it imports, its data, the other
  results it reads), with ``covers`` naming each input part's digest; ``machine`` and ``packages`` apart;
* ``result``: ``"rerun"`` (made by that run) or ``"kept"`` (a later run found the same key and kept it), with the
  commit each happened at;
* ``files``: the SHA-256 of every file of its folder, as the run left it;
* ``effective_parameters``: the settings the notebook resolved (``metrics.json``'s ``config``).

``verify`` recomputes every input part at the working tree (no notebook runs; a few seconds) and compares: a study
whose notebook, parameters, imported modules, lock file, data or read results changed since its result was made,
or whose files are not the ones the run left, is named with what changed. ``machine`` and ``packages`` are shown
when they differ from this machine's, but do not fail: they say where the result was made, not whether the
repository still produces it. ``verify(Path("results"), Path("notebooks")) == []`` when every result is current.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from study.report import cache
from study.report.records import folder_digests


def parameters(notebook: Path, profile: str) -> dict[str, Any]:
    """The parameters the pipeline gives ``notebook`` on ``profile`` (its YAML file), without starting Jupyter."""
    path = notebook.parent / "params" / f"{notebook.stem}.{profile}.yaml"
    return yaml.safe_load(path.read_text()) or {} if path.is_file() else {}


def current_parts(notebook: Path, profile: str, out: Path) -> dict[str, str]:
    """The key parts of ``notebook`` at the working tree, as the pipeline would compute them (machine left out)."""
    return cache.key_parts(notebook, {**parameters(notebook, profile), "profile": profile}, out=out, host={})


def verify(out: Path, notebooks: Path) -> list[str]:
    """One line per study whose committed result no longer matches its inputs (empty when all match)."""
    out, notebooks = Path(out).resolve(), Path(notebooks).resolve()
    path = out / "manifest.json"
    if not path.is_file():
        return [f"{path}: no manifest: nothing to verify"]
    manifest = json.loads(path.read_text())
    problems = []
    for name, entry in manifest.items():
        recorded = (entry or {}).get("key") if isinstance(entry, dict) else None
        notebook = notebooks / f"{name}.ipynb"
        if not isinstance(recorded, dict) or not isinstance(recorded.get("covers"), dict):
            problems.append(f"{name}: the manifest records no key for it (made before keys were recorded): rerun it")
            continue
        if not notebook.is_file():
            problems.append(f"{name}: {notebook} is missing")
            continue
        now = {k: v for k, v in current_parts(notebook, entry.get("profile", "full"), out).items()
               if k not in cache.MACHINE_PARTS}
        old = recorded["covers"]
        changed = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
        if changed:
            problems.append(f"{name}: its result was made from other inputs than this working tree's; changed: {', '.join(changed)}")
        files = entry.get("files")
        folder = out / name
        if isinstance(files, dict):
            have = folder_digests(folder) if folder.is_dir() else {}
            edited = sorted(f for f in set(files) | set(have) if files.get(f) != have.get(f))
            if edited:
                shown = ", ".join(edited[:5]) + (f" and {len(edited) - 5} more" if len(edited) > 5 else "")
                problems.append(f"{name}: files differ from what its run wrote: {shown}")
        else:
            problems.append(f"{name}: the manifest records no file digests for it: rerun it")
    return problems


def record(entry: dict[str, Any], parts: dict[str, str], folder: Path, result: str, commit: str) -> dict[str, Any]:
    """``entry`` with its key, how its result came about and its files' digests (see the module docstring)."""
    entry = dict(entry)
    entry["key"] = cache.split_key(parts)
    entry["result"] = {"how": result, "at": commit}
    entry["files"] = folder_digests(folder)
    return entry


def main(out: Path, notebooks: Path) -> int:
    """``--verify``: print what is stale and return 1, else say every result is current and return 0."""
    problems = verify(out, notebooks)
    manifest = Path(out) / "manifest.json"
    if problems:
        print(f"verify: {len(problems)} problem(s) with the committed results in {out}:")
        for p in problems:
            print(f"  {p}")
        print(f"Rerun the studies named (python -m study.report --profile PROFILE --out {out} --only NAME ...; "
              "for results/: make reproduce) and commit what they write.")
        return 1
    count = len(json.loads(manifest.read_text())) if manifest.is_file() else 0
    print(f"verify: all {count} studies in {out} were made from the inputs at this working tree "
          "(notebooks, parameters, imported sources, lock file, data, the results they read) and are as their "
          "runs left them.")
    return 0
