"""How close a rerun came to the committed results: its ``metrics.json`` against the one in git ``HEAD``.

After a notebook is rerun, ``against_committed`` compares every value of the new ``metrics.json`` with the
version committed at ``HEAD`` (``git show HEAD:results/<name>/metrics.json``), leaf by leaf:

* values that are not timings (see ``is_timing``) are **bit-identical** (equal after the JSON round trip, NaN
  equal to NaN), **within** ``RTOL`` (``|a - b| <= RTOL * max(|a|, |b|)``, numbers only), or **differ** (the
  largest relative differences are named); ``headline`` is left out, since it repeats other values as text;
* timings are compared as ratios, rerun / committed (median and range), never as bits;
* the notebook finished, so every assertion cell passed; their number is counted from the executed notebook.

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
from pathlib import Path
from typing import Any

from study.report.cache import machine_line
from study.report.reporting import write_text

RTOL = 1e-3
"""The stated relative tolerance: agreement to about three significant digits, the precision the prose quotes."""
REPORT = "REPRODUCTION.md"
LEFT_OUT = ("headline",)
"""Top-level keys not compared: they restate other values as formatted text."""
LARGEST = 5
"""How many of the largest differences a comparison names."""
TIMING = re.compile(r"time|duration|finished_at|_m?s(?![a-z0-9])", re.IGNORECASE)
"""A key names a timing when it contains "time", "duration" or "finished_at", or the unit suffix "_s" or "_ms"
(at the end of the key or before a non-alphanumeric character: "duration_s", "step_ms)"; not "_std" or "_steps")."""


def is_timing(key: str) -> bool:
    """``is_timing("step_time_ms")`` and ``is_timing("duration_s")`` are True; ``is_timing("acc_std")`` is False."""
    return bool(TIMING.search(str(key)))


def leaves(value: Any, path: str = "", timing: bool = False) -> dict[str, tuple[Any, bool]]:
    """Every leaf of a JSON value: ``"a/b[2]"`` -> (value, whether a key on its path names a timing).

    >>> leaves({"acc": [0.5, 0.75], "step_ms": 3.0})
    {'acc[0]': (0.5, False), 'acc[1]': (0.75, False), 'step_ms': (3.0, True)}
    """
    if isinstance(value, dict):
        found: dict[str, tuple[Any, bool]] = {}
        for k, v in value.items():
            found.update(leaves(v, f"{path}/{k}" if path else str(k), timing or is_timing(k)))
        return found
    if isinstance(value, list):
        found = {}
        for i, v in enumerate(value):
            found.update(leaves(v, f"{path}[{i}]", timing))
        return found
    return {path: (value, timing)}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _identical(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``: 0 for equal values, inf when one is NaN and the other not.

    >>> round(relative_difference(2.0, 2.002), 6), relative_difference(0.0, 0.0)
    (0.000999, 0.0)
    """
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def compare(committed: dict[str, Any], rerun: dict[str, Any], rtol: float = RTOL) -> dict[str, Any]:
    """Count identical, close and differing values of two ``metrics.json`` (see the module docstring).

    >>> c = compare({"a": 1.0, "b": 2.0, "c": "x", "t_ms": 10.0}, {"a": 1.0, "b": 2.001, "c": "y", "t_ms": 12.0})
    >>> c["values"], c["identical"], c["within"], c["differ"], c["timings"]["median_ratio"]
    (3, 1, 1, 1, 1.2)
    """
    old = leaves({k: v for k, v in committed.items() if k not in LEFT_OUT})
    new = leaves({k: v for k, v in rerun.items() if k not in LEFT_OUT})
    identical = within = 0
    differing: list[tuple[float, str, Any, Any]] = []
    ratios: list[float] = []
    for path in sorted(set(old) & set(new)):
        (a, timing), (b, _) = old[path], new[path]
        if timing:
            if _is_number(a) and _is_number(b) and a > 0 and b >= 0 and math.isfinite(a) and math.isfinite(b):
                ratios.append(b / a)
            continue
        if _identical(a, b):
            identical += 1
        elif _is_number(a) and _is_number(b) and relative_difference(a, b) <= rtol:
            within += 1
        else:
            rel = relative_difference(a, b) if _is_number(a) and _is_number(b) else math.inf
            differing.append((rel, path, a, b))
    differing.sort(key=lambda d: (-d[0], d[1]))
    only_old = sorted(p for p in set(old) - set(new) if not old[p][1])
    only_new = sorted(p for p in set(new) - set(old) if not new[p][1])
    return {
        "rtol": rtol, "values": identical + within + len(differing), "identical": identical, "within": within,
        "differ": len(differing),
        "largest": [{"value": p, "committed": a, "rerun": b, "relative": None if math.isinf(r) else r}
                    for r, p, a, b in differing[:LARGEST]],
        "only_committed": len(only_old), "only_rerun": len(only_new),
        "timings": ({"values": len(ratios), "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                     "max_ratio": max(ratios)} if ratios else {"values": 0}),
    }


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


def against_committed(out: Path, name: str, run_folder: Path, profile: str | None = None) -> dict[str, Any]:
    """The comparison the manifest records for a rerun of ``name`` (on ``profile``) whose outputs are in
    ``run_folder``."""
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
    return result


def _num(x: Any) -> str:
    if _is_number(x):
        return f"{x:.6g}"
    text = json.dumps(x)
    return text if len(text) <= 40 else text[:37] + "..."


def one_line(rep: dict[str, Any] | None) -> str:
    """The comparison in one line, for the pipeline's log."""
    if not rep or rep.get("compared_with") is None:
        return (rep or {}).get("note", "not compared")
    t = rep.get("timings", {})
    timing = (f"; timings x{t['median_ratio']:.2f} (median of {t['values']})" if t.get("values") else "")
    return (f"against {rep['compared_with']}: {rep['identical']} of {rep['values']} values bit-identical, "
            f"{rep['within']} within {rep['rtol']:g}, {rep['differ']} differ{timing}")


def write_report(out: Path) -> Path | None:
    """Write ``out/REPRODUCTION.md`` from the ``reproduction`` of every manifest entry (unless unchanged)."""
    path = Path(out) / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    if not any(isinstance(e, dict) and e.get("reproduction") for e in manifest.values()):
        return None  # no rerun has been compared yet
    lines = ["# How close the last reruns came to the committed results", "",
             "Generated by `python -m study.report` each time it reruns a notebook; do not edit. For each study: its "
             "last rerun's `metrics.json` against the one committed in git `HEAD` when it ran. Every value is "
             "compared except timings, which are compared as ratios (rerun / committed), and `headline`, which "
             f"restates other values as text. *Within* means a relative difference of at most {RTOL:g} "
             f"(`|a − b| ≤ {RTOL:g} · max(|a|, |b|)`) that is not bit-identical. A notebook that finished passed "
             "every assertion cell. Where the machine differs from the committed run's, expect the findings to "
             "hold rather than every bit (see the README, \"Reruns, the cache and other machines\").", "",
             "| study | rerun at | machine | compared with | values | bit-identical | within | differ "
             "| assertion cells | timings, rerun / committed |", "|---|---|---|---|---|---|---|---|---|---|"]
    details = []
    for name, entry in manifest.items():
        entry = entry if isinstance(entry, dict) else {}
        rep = entry.get("reproduction")
        local = " + local changes" if entry.get("dirty") else ""
        when = f"{str(entry.get('commit', '?'))[:10]}{local}, {entry.get('finished_at', '?')}"
        host = machine_line(entry.get("machine"))
        if not rep:
            lines.append(f"| {name} | {when} | {host} | not recorded | | | | | | |")
            continue
        passed = f"{rep.get('assertion_cells', 0)}, all passed" if rep.get("assertions_passed") else "failed"
        if rep.get("compared_with") is None:
            lines.append(f"| {name} | {when} | {host} | {rep.get('note', 'nothing')} | | | | | {passed} | |")
            continue
        t = rep.get("timings", {})
        timing = (f"median {t['median_ratio']:.2f} (range {t['min_ratio']:.2f}–{t['max_ratio']:.2f}, "
                  f"{t['values']} timings)" if t.get("values") else "none")
        lines.append(f"| {name} | {when} | {host} | `{rep['compared_with']}` | {rep['values']} | {rep['identical']} | "
                     f"{rep['within']} | {rep['differ']} | {passed} | {timing} |")
        extra = [f"{rep['only_committed']} value(s) only in the committed run"] if rep.get("only_committed") else []
        extra += [f"{rep['only_rerun']} value(s) only in the rerun"] if rep.get("only_rerun") else []
        if rep.get("largest") or extra:
            details += [f"**{name}**: the largest differences, committed → rerun (relative difference):", ""]
            details += [f"- `{d['value']}`: {_num(d['committed'])} → {_num(d['rerun'])}"
                        + (f" ({d['relative']:.2g})" if d.get("relative") is not None else "")
                        for d in rep.get("largest", [])]
            details += [f"- {e}" for e in extra] + [""]
    text = "\n".join(lines + ([""] + details if details else [""]))
    return write_text(Path(out) / REPORT, text)
