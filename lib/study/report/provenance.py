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

MANIFEST_FIELDS: dict[str, str] = {
    "title": "the notebook's title (its first heading).",
    "profile": "which parameter file it ran with: `smoke` or `full` (`notebooks/params/NN_topic.<profile>.yaml`).",
    "parameters": "the overrides given on the command line (`--set NAME=VALUE`); `{}` when the run used its profile's "
                  "file as it is.",
    "parameters.*": "one override, as given.",
    "effective_parameters": "the settings the notebook actually used, as it resolved them (its profile's file, the "
                            "overrides, and its own defaults): `metrics.json`'s `config`.",
    "effective_parameters.*": "one setting, as the notebook resolved it.",
    "data_source": "the data the notebook read (the bundled 5,000 MNIST digits, full MNIST, or synthetic data).",
    "duration_s": "seconds from the start of the notebook's run to its report rendered (wall time).",
    "finished_at": "when the run finished (UTC, ISO 8601).",
    "commit": "the git commit the run happened at (`HEAD` then).",
    "dirty": "whether the working tree differed from that commit anywhere but the results folder (`lib/`, "
             "`requirements.txt`, the `Makefile`, untracked files).",
    "packages": "Python's version, the installed versions of the packages that make the numbers, and `platform` "
                "(operating system, kernel, C library).",
    "packages.*": "one version.",
    "machine": "the machine settings that change floating-point results (`study.report.cache.machine`).",
    "machine.cpu": "CPU model.",
    "machine.cores": "logical cores.",
    "machine.TF_ENABLE_ONEDNN_OPTS": "the environment variable as set, or `unset`.",
    "machine.onednn_in_build": "whether this TensorFlow build uses oneDNN (it reorders floating-point operations).",
    "machine.OMP_NUM_THREADS": "thread setting, recorded only when set (likewise `TF_NUM_INTRAOP_THREADS`, "
                               "`TF_NUM_INTEROP_THREADS`, `MKL_NUM_THREADS`).",
    "machine.TF_NUM_INTRAOP_THREADS": "thread setting, recorded only when set.",
    "machine.TF_NUM_INTEROP_THREADS": "thread setting, recorded only when set.",
    "machine.MKL_NUM_THREADS": "thread setting, recorded only when set.",
    "load": "how busy the machine was while the notebook ran (`study.report.load`).",
    "load.wall_s": "seconds the notebook's execution took (wall time; `duration_s` adds rendering the report).",
    "load.cpu_s": "CPU seconds the run itself used (the pipeline, the kernel and what the kernel started).",
    "load.cores": "logical cores of the machine.",
    "load.cores_used": "`cpu_s / wall_s`: how many cores the run kept busy on average.",
    "load.loadavg": "the 1-minute load average sampled every 5 s over the run (it counts the run's own threads).",
    "load.loadavg.mean": "its mean.",
    "load.loadavg.max": "its largest sample.",
    "load.loadavg.samples": "how many samples were taken.",
    "load.others_share": "CPU time everything else on the machine used while the run ran, as a share (0–1) of what "
                         "all cores could give in that time (`null` without `/proc/stat`).",
    "load.idle": "whether the machine was otherwise idle: `others_share` at most `IDLE_SHARE` = 0.10 "
                 "(`study.report.load`).",
    "reproduction": "how the run compared with the `metrics.json` committed before it (`study.report.reproduction`; "
                    "`REPRODUCTION.md` renders it).",
    "reproduction.compared_with": "`HEAD <hash>:<folder>/<study>/metrics.json`: the committed file it was compared "
                                  "with (`HEAD` when the rerun ran); `null` when there was nothing to compare with.",
    "reproduction.note": "why nothing was compared (only when `compared_with` is `null`).",
    "reproduction.baseline": "where that committed result was made, from the `manifest.json` committed beside it: "
                             "its `commit`, `dirty`, `finished_at`, `profile`, `machine`, `packages`.",
    "reproduction.baseline.*": "one field of the committed run's entry, as above.",
    "reproduction.baseline.differs": "each machine setting or package version that differs from the rerun's, "
                                     "as `name: committed → rerun`; empty when none does.",
    "reproduction.assertion_cells": "code cells of the executed notebook that hold an `assert`.",
    "reproduction.assertions_passed": "always true: a notebook whose assertion fails is not recorded.",
    "reproduction.rtol": "the relative tolerance of *within* (`study.report.reproduction.RTOL`).",
    "reproduction.values": "values compared: `identical + within + differ`.",
    "reproduction.identical": "values bit-identical (samples equal as multisets, messages equal once normalised).",
    "reproduction.within": "values not bit-identical but within `rtol`: `|a − b| ≤ rtol · max(|a|, |b|)`.",
    "reproduction.differ": "values that differ by more (or, for exact kinds, at all).",
    "reproduction.normalised_messages": "messages counted identical only once ports and addresses were normalised.",
    "reproduction.samples": "unordered samples compared as multisets (counted in `values` too).",
    "reproduction.largest": "the largest differences: `value` (its name), `committed`, `rerun`, `relative` "
                            "difference (`null` for text or samples).",
    "reproduction.largest[].value": "the value's name (dict keys joined by `/`, list items as `[i]`).",
    "reproduction.largest[].committed": "its committed value.",
    "reproduction.largest[].rerun": "its rerun value.",
    "reproduction.largest[].relative": "their relative difference.",
    "reproduction.only_committed": "values only the committed `metrics.json` has (not counted in `values`).",
    "reproduction.only_rerun": "values only the rerun's `metrics.json` has (not counted in `values`).",
    "reproduction.timings": "timings and ratios of timings, compared as ratios rerun / committed.",
    "reproduction.timings.values": "how many.",
    "reproduction.timings.median_ratio": "the median ratio rerun / committed (below 1: the rerun was faster).",
    "reproduction.timings.min_ratio": "the smallest ratio.",
    "reproduction.timings.max_ratio": "the largest ratio.",
    "reproduction.timing_verdicts": "values drawn from timings (yes/no verdicts, a side of 1, a precision chosen from "
                                    "a timing's spread): `values`, how many; `changed`, how many changed; `which`, "
                                    "those that changed.",
    "reproduction.timing_verdicts.values": "how many.",
    "reproduction.timing_verdicts.changed": "how many changed.",
    "reproduction.timing_verdicts.which": "each value that changed: its path, the committed and the rerun value.",
    "reproduction.timing_verdicts.which[]": "one changed value.",
    "reproduction.timing_verdicts.which[].value": "its path in `metrics.json`.",
    "reproduction.timing_verdicts.which[].committed": "its committed value.",
    "reproduction.timing_verdicts.which[].rerun": "its rerun value.",
    "reproduction.left_out": "values not compared, counted per reason: `timing_spread` (the spread of a timing), "
                             "`text`, `timing without a ratio` (`headline` and `kinds` are never compared and not "
                             "counted).",
    "reproduction.left_out.*": "one reason and its count.",
    "reproduction.kinds": "how many values of the rerun are of each kind (`study.report.kinds`).",
    "reproduction.kinds.*": "one kind and its count.",
    "reproduction.kinds_declared": "whether the study declared its kinds (else every value was compared as a "
                                   "plain value).",
    "key": "the key its result was made under (`study.report.cache`).",
    "key.key": "the full key: SHA-256 over every part, the repository's and the machine's.",
    "key.inputs": "SHA-256 over the parts in the repository only (`covers`): what `--verify` checks.",
    "key.machine": "digest of the machine part (`machine` above).",
    "key.packages": "digest of the installed package versions.",
    "key.covers": "each input part's digest: `notebook`, `parameters`, `requirements.txt`, `data`, "
                  "`module:<name>` per imported module, `read:<path>` per other study's result it reads.",
    "key.covers.*": "one part's SHA-256.",
    "result": "how the result in the folder came about.",
    "result.how": "`rerun` (this entry's run made it) or `kept` (a later run found the same key and kept it).",
    "result.at": "the commit of the last run that made (`rerun`) or kept (`kept`) it.",
    "result.made_at": "for `kept`: the commit of the run that made it (the same as `commit`).",
    "files": "the SHA-256 of every file of the study's folder as its run left it (`--verify` checks them).",
    "files.*": "one file's SHA-256.",
}
"""Every field of a study's entry in ``manifest.json``, by dotted path (``.*``: any key below it; ``[]``: each
item of a list). ``REPRODUCTION.md`` shows them; a test checks that every field of the committed manifest is here."""


def manifest_fields_markdown() -> list[str]:
    """``MANIFEST_FIELDS`` as a Markdown section (lines), for ``REPRODUCTION.md``."""
    rows = [f"| `{path}` | {text} |" for path, text in MANIFEST_FIELDS.items()]
    return ["## `manifest.json`, field by field", "",
            "`manifest.json` holds one entry per study, the provenance of its committed result; `--verify` reads it. "
            "`.*` stands for any key below a field; `[]` for each item of a list.", "",
            "| field | what it holds |", "|---|---|", *rows]


def undocumented(entry: Any, path: str = "") -> list[str]:
    """The fields of a manifest entry that ``MANIFEST_FIELDS`` does not describe (empty when all are).

    >>> undocumented({"title": "t", "load": {"idle": True, "new": 1}, "files": {"a.png": "..."}})
    ['load.new']
    """
    missing = []
    if isinstance(entry, dict):
        if path and f"{path}.*" in MANIFEST_FIELDS:
            return []
        for k, v in entry.items():
            child = f"{path}.{k}" if path else str(k)
            if child not in MANIFEST_FIELDS:
                missing.append(child)
            else:
                missing += undocumented(v, child)
    elif isinstance(entry, list) and path:
        for item in entry:
            if isinstance(item, dict):
                missing += [m for m in undocumented(item, f"{path}[]") if m not in missing]
    return missing


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
            problems.append(f"{name}: its result was made from other inputs than this working tree's; "
                            f"changed: {', '.join(changed)}")
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
