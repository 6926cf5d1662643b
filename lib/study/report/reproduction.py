"""How close a rerun came to the committed results: its ``metrics.json`` against the one in git ``HEAD``.

After a notebook is rerun, ``against_committed`` compares every value of the new ``metrics.json`` with the
version committed at ``HEAD`` (``git show HEAD:results/<name>/metrics.json``), each the way its kind says: the
study declares the kind of every value where it writes ``metrics`` (``study.report.kinds``; the rerun's
declaration is used for both runs, so a run committed before a kind was declared is read the same way):

* timings and ratios of timings are compared as ratios rerun / committed (median and range), never as bits; the
  spread of a timing is not compared; a yes/no computed from timings that changed is counted with the timings;
* unordered samples are compared as multisets, and where they differ, by their distribution;
* messages are compared after their volatile parts (ports, addresses) are normalised;
* everything else is **bit-identical** (equal after the JSON round trip, NaN equal to NaN), **within** ``RTOL``
  (``|a - b| <= RTOL * max(|a|, |b|)``, measured numbers only; counts and constants are exact), or **differs**
  (the largest relative differences are named); ``headline`` is left out, since it repeats other values as text;
* the notebook finished, so every assertion cell passed; their number is counted from the executed notebook.

``verdict`` says it in a few words: "identical", "timings differ", "3 values differ; timings differ".

The committed run is the *baseline*: ``against_committed`` also records where it came from (``baseline``: the
commit it was made at, when, on which machine and package versions, read from the ``manifest.json`` committed
beside it), and when that machine or those versions differ from the rerun's, the verdict says so: then the bits
are not expected to match, only the findings.
The pipeline stores the result in the notebook's manifest entry (``reproduction``) and ``write_report`` renders
``REPRODUCTION.md`` from the manifest. ``compare({"a": 1.0}, {"a": 1.0000001})["within"] == 1``
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
import subprocess
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from study.report import kinds as kinds_
from study.report.cache import machine_line
from study.report.reporting import write_text

RTOL = 1e-3
"""The stated relative tolerance: agreement to about three significant digits, the precision the prose quotes."""
REPORT = "REPRODUCTION.md"
LEFT_OUT = ("headline", kinds_.KEY)
"""Top-level keys not compared: they restate other values as formatted text, or declare the kinds."""
LARGEST = 5
"""How many of the largest differences a comparison names."""
EXACT = ("constant", "count", "message", "timing_verdict")
"""Kinds that are equal or differ, never "within"."""
OTHER_MACHINE = "other machine or versions than the committed run"
NOT_EXPECTED = "bits not expected to match, only the findings"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _float(x: Any) -> float | None:
    """A number, or a non-finite number stored as text ("nan", "inf"), as float; else None."""
    if _is_number(x):
        return float(x)
    if isinstance(x, str) and x.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(x)
    return None


def _identical(a: Any, b: Any) -> bool:
    """Equal values: numbers by value (a count written 8.0 equals 8), NaN equals NaN, and ``null`` equals a number
    that is not finite (``metrics.json`` stores those as ``null``; files written before stored the text "nan"/"inf")."""
    fa, fb = _float(a), _float(b)
    if fa is not None and fb is not None:
        return (math.isnan(fa) and math.isnan(fb)) or fa == fb
    if ((a is None and fb is not None and not math.isfinite(fb))
            or (b is None and fa is not None and not math.isfinite(fa))):
        return True
    return type(a) is type(b) and a == b


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``: 0 for equal values, inf when one is NaN and the other not.

    >>> round(relative_difference(2.0, 2.002), 6), relative_difference(0.0, 0.0)
    (0.000999, 0.0)
    """
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    if a == b:
        return 0.0
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if math.isfinite(scale) else math.inf


def _key(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


def distribution(sample: list[Any]) -> str:
    """A sample in a few words: the count of each value when there are few distinct ones, else mean and range.

    >>> distribution([1, 0, 1, 2]), distribution([0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5])
    ('4 values: 0×1, 1×2, 2×1 (mean 1)', '7 values: mean 3.5, range 0.5–6.5')
    """
    numbers = [float(x) for x in sample if _is_number(x)]
    counts = Counter(_key(x) for x in sample)
    mean = f"mean {statistics.fmean(numbers):.6g}" if numbers and len(numbers) == len(sample) else ""
    if len(counts) <= 6:
        shown = ", ".join(f"{k}×{n}" for k, n in sorted(counts.items(), key=lambda kv: (_float(json.loads(kv[0]))
                          if _float(json.loads(kv[0])) is not None else math.inf, kv[0])))
        return f"{len(sample)} values: {shown}" + (f" ({mean})" if mean else "")
    if mean:
        return f"{len(sample)} values: {mean}, range {min(numbers):.6g}–{max(numbers):.6g}"
    return f"{len(sample)} values, {len(counts)} distinct"


def _same_sorted_within(a: list[Any], b: list[Any], rtol: float) -> bool:
    if len(a) != len(b) or not all(_is_number(x) for x in a + b):
        return False
    return all(relative_difference(float(x), float(y)) <= rtol for x, y in zip(sorted(a), sorted(b)))


def compare(committed: dict[str, Any], rerun: dict[str, Any], rtol: float = RTOL,
            kinds: Mapping[str, str] | None = None, largest: int = LARGEST) -> dict[str, Any]:
    """Compare two ``metrics.json`` value by value, each as its kind says (see the module docstring).

    ``kinds`` defaults to the rerun's declaration (``metrics.json``'s ``"kinds"``), else the committed one's.

    >>> k = {"t_ms": "timing", "t_std": "timing_spread", "s": "sample"}
    >>> c = compare({"a": 1.0, "b": 2.0, "c": "x", "t_ms": 10.0, "t_std": 1.0, "s": [0, 1]},
    ...             {"a": 1.0, "b": 2.001, "c": "y", "t_ms": 12.0, "t_std": 3.0, "s": [1, 0]}, kinds=k)
    >>> c["values"], c["identical"], c["within"], c["differ"], c["timings"]["median_ratio"], verdict(c)
    (4, 2, 1, 1, 1.2, '1 value differs; 1 within 0.001; timings differ')
    """
    declared = kinds_.check(kinds if kinds is not None
                            else rerun.get(kinds_.KEY) or committed.get(kinds_.KEY) or {})
    old = kinds_.kind_of_leaves({k: v for k, v in committed.items() if k not in LEFT_OUT}, declared)
    new = kinds_.kind_of_leaves({k: v for k, v in rerun.items() if k not in LEFT_OUT}, declared)
    identical = within = normalised = samples = verdicts = verdicts_changed = 0
    flipped: list[dict[str, Any]] = []  # the timing verdicts that changed: named in the report
    left_out: Counter[str] = Counter()
    differing: list[tuple[float, str, Any, Any]] = []
    ratios: list[float] = []
    for path in sorted(set(old) & set(new)):
        (a, _), (b, kind) = old[path], new[path]
        if kind in ("timing_spread", "text"):
            left_out[kind] += 1
            continue
        if kind in kinds_.TIMINGS:
            fa, fb = _float(a), _float(b)
            if fa is not None and fb is not None and fa > 0 and fb >= 0 and math.isfinite(fa) and math.isfinite(fb):
                ratios.append(fb / fa)
            else:
                left_out["timing without a ratio"] += 1
            continue
        if kind == "timing_verdict":
            verdicts += 1
            if not _identical(a, b):
                verdicts_changed += 1
                flipped.append({"value": path, "committed": a, "rerun": b})
            continue
        if kind == "sample" and isinstance(a, list) and isinstance(b, list):
            samples += 1
            if Counter(map(_key, a)) == Counter(map(_key, b)):
                identical += 1
            elif _same_sorted_within(a, b, rtol):
                within += 1
            else:
                differing.append((math.inf, path, distribution(a), distribution(b)))
            continue
        if kind == "message" and isinstance(a, str) and isinstance(b, str) and not _identical(a, b):
            if kinds_.normalise_message(a) == kinds_.normalise_message(b):
                identical += 1
                normalised += 1
                continue
        if _identical(a, b):
            identical += 1
            continue
        fa, fb = _float(a), _float(b)
        rel = relative_difference(fa, fb) if fa is not None and fb is not None else math.inf
        if kind not in EXACT and rel <= rtol:
            within += 1
        else:
            differing.append((rel, path, a, b))
    differing.sort(key=lambda d: (-d[0], d[1]))
    compared = {p for p, (_, k) in new.items() if k not in ("timing_spread", "text", *kinds_.TIMINGS)}
    only_old = sorted(p for p in set(old) - set(new) if old[p][1] not in ("timing_spread", "text", *kinds_.TIMINGS))
    only_new = sorted(p for p in set(new) - set(old) if p in compared)
    kinds_seen = Counter(k for _, k in new.values())
    return {
        "rtol": rtol, "values": identical + within + len(differing), "identical": identical, "within": within,
        "differ": len(differing), "normalised_messages": normalised, "samples": samples,
        "largest": [{"value": p, "committed": a, "rerun": b, "relative": None if math.isinf(r) else r}
                    for r, p, a, b in differing[:largest]],
        "only_committed": len(only_old), "only_rerun": len(only_new),
        "timings": ({"values": len(ratios), "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                     "max_ratio": max(ratios)} if ratios else {"values": 0}),
        "timing_verdicts": {"values": verdicts, "changed": verdicts_changed, "which": flipped},
        "left_out": dict(sorted(left_out.items())),
        "kinds": dict(sorted(kinds_seen.items())),
        "kinds_declared": bool(declared),
    }


def verdict(rep: Mapping[str, Any]) -> str:
    """A comparison in a few words: "identical", "timings differ", "2 values differ; 1 within 0.001", ...

    Timings differ when any timing's ratio rerun / committed is not exactly 1, or a yes/no computed from timings
    changed. When ``rep["baseline"]["differs"]`` names a machine setting or package version that differs from the
    committed run's, the verdict ends with it (``OTHER_MACHINE``).

    >>> verdict({"differ": 2, "baseline": {"differs": ["onednn_in_build: false → true"]}})
    '2 values differ; other machine or versions than the committed run (onednn_in_build: false → true): bits not
    expected to match, only the findings'
    """
    parts = []
    if rep.get("differ"):
        parts.append(f"{rep['differ']} value{' differs' if rep['differ'] == 1 else 's differ'}")
    if rep.get("within"):
        parts.append(f"{rep['within']} within {rep.get('rtol', RTOL):g}")
    if rep.get("only_committed"):
        parts.append(f"{rep['only_committed']} only committed")
    if rep.get("only_rerun"):
        parts.append(f"{rep['only_rerun']} only rerun (new values)")
    t = rep.get("timings") or {}
    changed = (rep.get("timing_verdicts") or {}).get("changed", 0)
    if (t.get("values") and (t["min_ratio"] != 1 or t["max_ratio"] != 1)) or changed:
        parts.append("timings differ")
    differs = (rep.get("baseline") or {}).get("differs")
    if differs:
        parts.append(f"{OTHER_MACHINE} ({'; '.join(differs)}): {NOT_EXPECTED}")
    return "; ".join(parts) or "identical"


def committed_metrics(out: Path, name: str, profile: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """``out/<name>/metrics.json`` as committed in git ``HEAD``, and where it came from (``"HEAD 1a2b3c4d5e:
    results/x/metrics.json"``); ``(None, why)`` when ``out`` is not in a repository, nothing is committed there,
    or the committed run used another ``profile`` than the rerun (its manifest says which)."""
    out = Path(out).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=out if out.is_dir() else out.parent, capture_output=True,
                              text=True, check=True).stdout

    try:
        root = Path(git("rev-parse", "--show-toplevel").strip())
        folder = out.relative_to(root).as_posix()
        commit = git("rev-parse", "HEAD").strip()
        text = git("show", f"HEAD:{folder}/{name}/metrics.json")
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None, "nothing committed to compare with (the results folder is not tracked in git HEAD)"
    source = f"HEAD {commit[:10]}:{folder}/{name}/metrics.json"
    if profile is not None:
        try:
            committed_profile = json.loads(git("show", f"HEAD:{folder}/manifest.json"))[name]["profile"]
        except (subprocess.CalledProcessError, ValueError, KeyError, TypeError):
            committed_profile = None
        if committed_profile not in (None, profile):
            return None, f"{source} is a {committed_profile} run; this rerun is {profile}: not compared"
    try:
        return json.loads(text), source
    except ValueError:
        return None, f"{source} is not valid JSON"


def _git_show(out: Path, rev: str, relative: str) -> str | None:
    """``git show REV:<out relative to the repository root>/<relative>``, or None."""
    out = Path(out).resolve()
    cwd = out if out.is_dir() else out.parent
    try:
        root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True,
                                   check=True).stdout.strip())
        folder = out.relative_to(root).as_posix()
        return subprocess.run(["git", "show", f"{rev}:{folder}/{relative}"], cwd=cwd, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, ValueError, subprocess.CalledProcessError):
        return None


BASELINE_FIELDS = ("commit", "dirty", "finished_at", "profile", "machine", "packages")
"""What ``baseline`` records of the committed run, copied from its entry in the committed ``manifest.json``."""


def committed_run(out: Path, name: str, rev: str = "HEAD") -> dict[str, Any] | None:
    """Where the committed result of ``name`` came from: ``BASELINE_FIELDS`` of its entry in ``out/manifest.json``
    as committed at ``rev``; None when that manifest or entry is missing."""
    text = _git_show(out, rev, "manifest.json")
    try:
        entry = json.loads(text)[name] if text is not None else None
    except (ValueError, KeyError, TypeError):
        entry = None
    if not isinstance(entry, dict):
        return None
    return {k: entry[k] for k in BASELINE_FIELDS if k in entry}


def differences(baseline: Mapping[str, Any] | None, machine: Mapping[str, Any] | None,
                packages: Mapping[str, Any] | None) -> list[str]:
    """What differs between the committed run (``baseline``) and a rerun on ``machine`` with ``packages``: one
    ``"name: committed → rerun"`` per machine setting or package version (``platform`` included: the kernel and C
    library). What either run did not record is not compared (``baseline_line`` says "not recorded").

    >>> differences({"machine": {"cpu": "A", "onednn_in_build": False}, "packages": {"keras": "3.15.1"}},
    ...             {"cpu": "A", "onednn_in_build": True}, {"keras": "3.15.1"})
    ['onednn_in_build: false → true']
    >>> differences({"machine": {"cpu": "A"}, "packages": {"keras": "3.15.1"}}, {"cpu": "A"}, {"keras": "3.15.1"})
    []
    """
    found: list[str] = []
    for field, new in (("machine", machine), ("packages", packages)):
        old = (baseline or {}).get(field)
        if not isinstance(old, Mapping) or not isinstance(new, Mapping):
            continue
        found += [f"{k}: {json.dumps(old.get(k)) if not isinstance(old.get(k), str) else old.get(k)} → "
                  f"{json.dumps(new.get(k)) if not isinstance(new.get(k), str) else new.get(k)}"
                  for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return found


def baseline_line(baseline: Mapping[str, Any] | None, machine: Mapping[str, Any] | None = None) -> str:
    """The committed run in a few words: its commit, when, and on which machine ("the same machine" when it is
    ``machine``, the rerun's, which its own column already names).

    >>> base = {"commit": "0123456789abcdef", "finished_at": "2026-01-01T00:00:00+00:00",
    ...         "machine": {"cpu": "A", "cores": 2, "onednn_in_build": False}}
    >>> baseline_line(base)
    'made at 0123456789, 2026-01-01T00:00:00+00:00, on A, 2 cores, oneDNN build off (TF_ENABLE_ONEDNN_OPTS not set)'
    >>> baseline_line(base, {"cpu": "A", "cores": 2, "onednn_in_build": False})
    'made at 0123456789, 2026-01-01T00:00:00+00:00, on the same machine'
    """
    if not baseline:
        return "whose commit, date and machine were not recorded"
    local = " + local changes" if baseline.get("dirty") else ""
    where = machine_line(baseline.get("machine"))
    if machine is not None and where == machine_line(machine):
        where = "the same machine"
    return f"made at {str(baseline.get('commit', '?'))[:10]}{local}, {baseline.get('finished_at', '?')}, on {where}"


def assertion_cells(executed: Path) -> int:
    """How many code cells of an executed notebook hold an ``assert`` statement (all passed: the run finished)."""
    cells = json.loads(Path(executed).read_text(encoding="utf-8")).get("cells", [])
    count = 0
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        try:
            found = any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(source)))
        except SyntaxError:
            found = bool(re.search(r"(?m)^\s*assert\b", source))
        count += found
    return count


def against_committed(out: Path, name: str, run_folder: Path, profile: str | None = None,
                      machine: Mapping[str, Any] | None = None,
                      packages: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The comparison the manifest records for a rerun of ``name`` (on ``profile``) whose outputs are in
    ``run_folder``; with the rerun's ``machine`` and ``packages``, ``baseline["differs"]`` lists what differs from
    the committed run's (``differences``)."""
    committed, source = committed_metrics(out, name, profile)
    executed = Path(run_folder) / f"{name}.ipynb"
    result: dict[str, Any] = {"compared_with": source if committed is not None else None,
                              "assertion_cells": assertion_cells(executed) if executed.is_file() else 0,
                              "assertions_passed": True}
    metrics_path = Path(run_folder) / "metrics.json"
    if committed is None or not metrics_path.is_file():
        result["note"] = source if committed is None else "the rerun wrote no metrics.json"
        return result
    result.update(compare(committed, json.loads(metrics_path.read_text())))
    rev = source.split(":", 1)[0].split()[-1] if source.startswith("HEAD ") else "HEAD"
    base = committed_run(out, name, rev)
    result["baseline"] = dict(base or {})
    if machine is not None or packages is not None:
        result["baseline"]["differs"] = differences(base, machine, packages)
    return result


def _num(x: Any) -> str:
    if _is_number(x):
        return f"{x:.6g}"
    text = x if isinstance(x, str) and x[:1].isdigit() else json.dumps(x)
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(rep: dict[str, Any] | None) -> str:
    """The comparison in one line, for the pipeline's log."""
    if not rep or rep.get("compared_with") is None:
        return (rep or {}).get("note", "not compared")
    t = rep.get("timings", {})
    timing = (f"; timings x{t['median_ratio']:.2f} (median of {t['values']}, range {t['min_ratio']:.2f}–"
              f"{t['max_ratio']:.2f})" if t.get("values") else "")
    return (f"against {rep['compared_with']}: {verdict(rep)} ({rep['identical']} of {rep['values']} values "
            f"bit-identical, {rep['within']} within {rep['rtol']:g}, {rep['differ']} differ{timing})")


def load_line(load: Mapping[str, Any] | None) -> str:
    """How busy the machine was while a run was timed, in one line (``study.report.load``)."""
    from study.report.load import describe

    return describe(load)


LEGEND = (
    ("study", "the notebook, as named in `manifest.json`."),
    ("rerun at", "the commit the rerun ran at (\"+ local changes\" when the working tree differed from it) and "
                 "when it finished (UTC)."),
    ("machine", "the rerun's machine: CPU model, cores, whether this TensorFlow build uses oneDNN, and "
                "`TF_ENABLE_ONEDNN_OPTS`."),
    ("compared with", "the baseline: the `metrics.json` committed in git `HEAD` when the rerun ran (the hash is "
                      "that `HEAD`, often the rerun's own commit), and where that committed result was made: its "
                      "own commit, when, and on which machine, from the `manifest.json` committed beside it."),
    ("verdict", "the comparison in a few words: \"identical\" (every compared value bit-identical and every "
                "timing ratio exactly 1), else what differs: \"N values differ\", \"N within 0.001\", \"N only "
                "committed, M only rerun\", \"timings differ\"; and \"" + OTHER_MACHINE + " (…): " + NOT_EXPECTED
                + "\" when the committed run's machine settings or package versions (`platform`, the kernel and "
                "C library, included) are not the rerun's, each named as committed → rerun."),
    ("values", "how many values were compared: bit-identical + within + differ. Values present in only one of the "
               "two runs, timings and what is left out are not counted."),
    ("bit-identical", "equal after the JSON round trip (NaN equals NaN); unordered samples equal as multisets; "
                      "messages equal once ports and addresses are normalised."),
    ("within", f"not bit-identical, but `|a − b| ≤ {RTOL:g} · max(|a|, |b|)`: measured numbers only; counts, "
               "constants and messages are exact or differ."),
    ("differ", "neither; the largest differences are listed under the table."),
    ("only committed / only rerun", "values whose name is in one run's `metrics.json` and not the other's (a "
                                    "metric added or removed between the two commits); in the verdict and under "
                                    "the table, not in values."),
    ("assertion cells", "code cells of the executed notebook that hold an `assert`; a notebook that finished "
                        "passed all of them."),
    ("timings, rerun / committed", "each timing and ratio of timings of the rerun divided by the committed one: "
                                   "the median and range over them, and how many there were; 1.00 is the same "
                                   "speed, below 1 the rerun was faster. Where values drawn from timings changed "
                                   "(a yes/no verdict, a side of 1, a precision chosen from a timing's spread), how "
                                   "many; the list under the table names them."),
    ("load while it ran", "how busy the machine was while the rerun was timed (`study.report.load`): "
                          "\"idle\" when other processes used at most 10% of the machine's cores (`IDLE_SHARE`); "
                          "the 1-minute load average (it counts the run's own threads too); the cores the run "
                          "itself used. Timings from a busy machine say little about the code."),
    ("left out", "not compared at all: `headline` (it restates other values as text), `kinds` (the declaration "
                 "itself), the spread of a timing (`timing_spread`: a standard deviation over timed windows or "
                 "seeds, as noisy as the timings themselves) and text. `manifest.json` counts them per study "
                 "under `reproduction.left_out`."),
)
"""Every column and term of the table, as the legend under it defines them."""


def write_report(out: Path) -> Path | None:
    """Write ``out/REPRODUCTION.md`` from the ``reproduction`` of every manifest entry (unless unchanged): the table,
    its legend (``LEGEND``), the largest differences, and ``manifest.json`` field by field
    (``provenance.MANIFEST_FIELDS``).

    A comparison recorded before ``baseline`` was (no ``baseline`` in the entry) gets it from git: the manifest
    committed at the ``HEAD`` it was compared with."""
    from study.report.provenance import manifest_fields_markdown

    path = Path(out) / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if not any(isinstance(e, dict) and e.get("reproduction") for e in manifest.values()):
        return None  # no rerun has been compared yet
    lines = ["# How close the last reruns came to the committed results", "",
             "Generated by `python -m study.report` each time it reruns a notebook; do not edit. For each study: its "
             "last rerun's `metrics.json` against the one committed in git `HEAD` when it ran (the *baseline*), "
             "which was made at an earlier commit, possibly on another machine: the *compared with* column says "
             "where and when, and the verdict says when the machine or the package versions differ. Each value is "
             "compared as the kind its study declares (`study.report.kinds`): timings and ratios of timings as "
             "ratios rerun / committed (median and range over them), never as bits; the spread of a timing not at "
             "all; unordered samples (such as a list of staleness values) as multisets, and by their distribution "
             "where they differ; messages after their ports and addresses are normalised; `headline` not at all, "
             "since it restates other values as text. Everything else is bit-identical, *within* a relative "
             f"difference of {RTOL:g} (`|a − b| ≤ {RTOL:g} · max(|a|, |b|)`, measured numbers only; counts and "
             "constants are exact), or differs. A notebook that finished passed every assertion cell. Where the "
             "machine differs from the committed run's, expect the findings to hold rather than every bit (see the "
             "README, \"Reruns, the cache and other machines\"). Every column is defined under the table.", "",
             "| study | rerun at | machine | compared with | verdict | values | bit-identical | within | differ "
             "| assertion cells | timings, rerun / committed | load while it ran |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    details = []
    for name, entry in manifest.items():
        entry = entry if isinstance(entry, dict) else {}
        rep = entry.get("reproduction")
        local = " + local changes" if entry.get("dirty") else ""
        when = f"{str(entry.get('commit', '?'))[:10]}{local}, {entry.get('finished_at', '?')}"
        host = machine_line(entry.get("machine"))
        load = load_line(entry.get("load"))
        if not rep:
            lines.append(f"| {name} | {when} | {host} | not recorded | | | | | | | | {load} |")
            continue
        passed = f"{rep.get('assertion_cells', 0)}, all passed" if rep.get("assertions_passed") else "failed"
        if rep.get("compared_with") is None:
            lines.append(f"| {name} | {when} | {host} | {rep.get('note', 'nothing')} | | | | | | {passed} | | {load} |")
            continue
        rep = dict(rep)
        if "baseline" not in rep:  # recorded before the baseline was: read it from the manifest committed with it
            rev = str(rep["compared_with"]).split(":", 1)[0].split()[-1]
            rep["baseline"] = dict(committed_run(out, name, rev) or {})
        base = dict(rep["baseline"])
        if "differs" not in base:
            base["differs"] = differences(rep["baseline"] or None, entry.get("machine"), entry.get("packages"))
        rep["baseline"] = base
        t = rep.get("timings", {})
        timing = (f"median {t['median_ratio']:.2f} (range {t['min_ratio']:.2f}–{t['max_ratio']:.2f}, "
                  f"{t['values']} timing{'s' if t['values'] != 1 else ''})" if t.get("values") else "none")
        v = rep.get("timing_verdicts") or {}
        if v.get("changed"):
            timing += f"; {v['changed']} of {v['values']} values drawn from timings changed (named below)"
        source = str(rep["compared_with"])  # "HEAD <commit>:<path>": the commit is this row's own, named beside it
        source = (f"`{source.split(':', 1)[1]}` as committed" if source.startswith("HEAD ") and ":" in source
                  else f"`{source}`")
        compared = f"the run {baseline_line(base or None, entry.get('machine'))} (read from {source})"
        lines.append(f"| {name} | {when} | {host} | {compared} | {verdict(rep)} | {rep['values']} | "
                     f"{rep['identical']} | {rep['within']} | {rep['differ']} | {passed} | {timing} | {load} |")
        extra = [f"{rep['only_committed']} value(s) only in the committed run"] if rep.get("only_committed") else []
        extra += [f"{rep['only_rerun']} value(s) only in the rerun"] if rep.get("only_rerun") else []
        if rep.get("normalised_messages"):
            extra.append(f"{rep['normalised_messages']} message(s) equal once ports and addresses are normalised")
        if rep.get("left_out"):
            extra.append("left out, not compared: " + ", ".join(f"{n} {k}" for k, n in rep["left_out"].items()))
        for f in (rep.get("timing_verdicts") or {}).get("which", []):  # a conclusion from timings that flipped
            extra.append(f"drawn from timings (a verdict, or a precision chosen from their spread), changed: "
                         f"`{f['value']}`: {_num(f['committed'])} → {_num(f['rerun'])} (the report states the rerun's)")
        if rep.get("largest") or extra:
            details += [f"**{name}**:" + (" the largest differences, committed → rerun (relative difference):"
                                          if rep.get("largest") else ""), ""]
            details += [f"- `{d['value']}`: {_num(d['committed'])} → {_num(d['rerun'])}"
                        + (f" ({d['relative']:.2g})" if d.get("relative") is not None else "")
                        for d in rep.get("largest", [])]
            details += [f"- {e}" for e in extra] + [""]
    legend = ["", "What each column and term means:", ""] + [f"- **{term}**: {text}" for term, text in LEGEND]
    text = "\n".join(lines + legend + ([""] + details if details else [""]) + [""] + manifest_fields_markdown()
                     + [""])
    return write_text(Path(out) / REPORT, text)
