"""Run every notebook with papermill, render an HTML report, and record a manifest: ``python -m study.report``.

``python -m study.report --verify`` runs nothing and checks the committed results against the working tree
(``study.report.provenance``). ``python -m study.report --profile full --out results`` executes
``notebooks/NN_topic.ipynb`` with
``notebooks/params/NN_topic.full.yaml``, in a staging folder. Only a notebook that finished is moved into
``results/NN_topic/`` (executed notebook, HTML report with inputs hidden, the figures, tables and metrics.json it
wrote), and ``results/manifest.json`` records its git commit (and whether the working tree differed from it),
parameters, package versions, machine, data source and duration. A notebook shows its findings filled in from
its own run when its last cell has recorded ``metrics.json`` (``study.report.prose``); the pipeline checks that
no finding was left unfilled. A notebook that fails stops the run with its name and the error, exits non-zero,
and leaves the previous results untouched.

Reuse: before running, each notebook gets a key (``study.report.cache``: its sources, parameters, data, lock file,
installed packages, the machine, and the other studies' results it reads). A notebook is reused when this
machine's record (``study.report.records``, under ``build/records/``, not in git) says it ran with that key into
this folder and the folder still holds exactly what it wrote; then nothing of it is touched. A fresh clone has no
record, so every notebook runs. ``--force`` reruns everything.

After each rerun the pipeline compares the new ``metrics.json`` with the one committed in git ``HEAD``
(``study.report.reproduction``), records the comparison in the manifest entry, and rewrites ``REPRODUCTION.md``,
``SUMMARY.md``, ``COLUMNS.md`` and ``index.html`` (``study.report.site``), each atomically and only if its text
changed. A run that reruns nothing changes no file.

Interruption: SIGINT (Ctrl-C) or SIGTERM while a notebook runs stops its kernel and every process the kernel
started, deletes the staging folder, and exits with 128 + the signal number and one line saying so; the
results folder is then exactly as it was before that notebook (notebooks that finished earlier in the same run
stay). A signal that arrives while a finished notebook is being moved into place and recorded is held until
that short step is done, so a notebook's folder, the manifest and the pages always agree
(``study.report.execution``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from study.report import cache, provenance, reproduction
from study.report.execution import SIGNALS, Interrupted, Started, execute
from study.report.load import Load, report_note
from study.report.prose import ProseError, unfilled
from study.report.records import Records
from study.report.reporting import write_text
from study.report.site import write_pages

DEFAULT_NOTEBOOKS = Path("notebooks")
"""Where notebooks live, relative to the working directory (``--notebooks`` overrides it)."""
PROFILES = ("smoke", "full")
DEFAULT_TIMEOUT_S = 1200


class PipelineError(RuntimeError):
    """A notebook or its parameters failed; the message names which and why."""


def notebooks(only: list[str] | None = None, folder: Path = DEFAULT_NOTEBOOKS) -> list[Path]:
    """The notebooks to run, in order. ``notebooks(["01_adam_drift"])``"""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise PipelineError(f"--notebooks: {folder} is not a folder; run from the repository root or pass "
                            "--notebooks DIR")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return found
    names = {p.stem: p for p in found}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise PipelineError(f"--only: unknown notebook(s) {unknown}; allowed: {sorted(names)}")
    return [names[n] for n in only]


def load_parameters(notebook: Path, profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read ``notebooks/params/<name>.<profile>.yaml`` (+ overrides) and
    check names against the notebook's. ``load_parameters(nb, "smoke")``"""
    import papermill

    path = notebook.parent / "params" / f"{notebook.stem}.{profile}.yaml"
    if not path.is_file():
        raise PipelineError(f"{notebook.stem}: parameter file {path} is missing")
    try:
        params = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise PipelineError(f"{notebook.stem}: {path} is not valid YAML: {e}") from None
    if not isinstance(params, dict):
        raise PipelineError(f"{notebook.stem}: {path} must be a mapping of parameter: value")
    params.update(overrides or {})
    allowed = set(papermill.inspect_notebook(str(notebook)))
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise PipelineError(
            f"{notebook.stem}: unknown parameter(s) {unknown} (from {path} or --set); "
            f"allowed: {sorted(allowed - {'out_dir'})}"
        )
    return params


def declared_reads(notebook: Path) -> list[str]:
    """``cache.reads``: the results files a notebook declares it
    reads; a malformed declaration is a ``PipelineError``."""
    try:
        return cache.reads(notebook)
    except ValueError as e:
        raise PipelineError(str(e)) from None


def git_state(out: Path, source: Path) -> dict[str, Any]:
    """HEAD of the repository holding ``source``, and whether its working tree differs from it (``dirty``).

    Every path of the repository counts (``lib/``, ``requirements.txt``, the ``Makefile``, a new untracked file),
    except the results folder ``out`` itself, which the run is writing.
    ``git_state(Path("results"), Path("notebooks"))``
    """

    def git(*args: str, cwd: Path = source) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        root = Path(git("rev-parse", "--show-toplevel"))
        spec = ["--", ":/"]
        if out.resolve().is_relative_to(root):
            spec.append(f":(top,exclude){out.resolve().relative_to(root).as_posix()}")
        return {"commit": git("rev-parse", "HEAD", cwd=root),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=normal", *spec, cwd=root))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def check_findings(executed: Path) -> None:
    """Refuse an executed notebook that shows a finding without
    its numbers, or raw template syntax (``prose.unfilled``)."""
    import nbformat

    problems = unfilled(nbformat.read(executed, as_version=4))
    if problems:
        raise ProseError(f"{len(problems)} finding(s) not filled in; does the last cell call "
                         f"prose.show_findings(metrics)? {problems[0]}")


def render_html(executed: Path, html: Path, note: str | None = None) -> Any:
    """Write the executed notebook as an offline HTML report, code hidden. ``render_html(nb, out)``

    The .ipynb stays as executed (stderr and all); only the report is cleaned. ``note`` (Markdown: how the run was
    timed) is shown under the report's title. Returns what was cleaned.
    """
    from study.report.html_report import render_report

    _, report = render_report(executed, html, note=note)
    return report


def run_notebook(notebook: Path, profile: str, out: Path, timeout_s: int,
                 overrides: dict[str, Any] | None = None,
                 record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Execute one notebook into ``out/<name>/``; returns its manifest entry.
    ``run_notebook(nb, "smoke", Path("build"), 600)``

    Nothing under ``out`` outside ``out/.staging`` changes until the notebook and its report are complete. Then
    the folder is swapped into ``out/<name>`` and ``record(entry)`` (the manifest, the pages, this machine's
    record) runs, both with signals held, so an interruption never separates the folder from its record.
    """
    from papermill.exceptions import PapermillExecutionError

    params = load_parameters(notebook, profile, overrides)
    name = notebook.stem
    staging = out / ".staging" / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.perf_counter()
    processes = Started()  # what this notebook's run starts (its kernel and the kernel's children), nothing else
    try:
        with Load() as load:
            execute(notebook, staging / f"{name}.ipynb", {**params, "out_dir": str(staging.resolve())}, timeout_s)
        check_findings(staging / f"{name}.ipynb")
        cleaned = render_html(staging / f"{name}.ipynb", staging / f"{name}.html", note=report_note(load.result))
        duration = time.perf_counter() - started
        metrics_path = staging / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
        host, versions = machine(), {**cache.packages(), "platform": platform.platform()}
        entry = {
            "title": cleaned.title,
            "profile": profile,
            "parameters": params,
            "effective_parameters": metrics.get("config", "not recorded"),
            "data_source": metrics.get("data_source", "not recorded"),
            "duration_s": round(duration, 1),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **git_state(out, notebook.parent),
            "packages": versions,
            "machine": host,
            "load": load.result,
            "reproduction": reproduction.against_committed(out, name, staging, profile, host, versions),
        }
    except PapermillExecutionError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PipelineError(f"{name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}") from None
    except Exception as e:  # the kernel died, a timeout, the report could not be rendered, ...
        with SIGNALS.hold():
            processes.stop()
            shutil.rmtree(staging, ignore_errors=True)
        raise PipelineError(f"{name} failed: {type(e).__name__}: {e}") from e
    except BaseException:  # Interrupted (SIGINT/SIGTERM), SystemExit
        with SIGNALS.hold():
            processes.stop()
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if cleaned.stderr_dropped or cleaned.reprs_dropped or cleaned.alt_fallback:
        print(f"    report: left out {cleaned.stderr_dropped} stderr and {cleaned.reprs_dropped} repr output(s) "
              f"(kept in the .ipynb); {len(cleaned.alt_fallback)} figure(s) without a caption", flush=True)
    if cleaned.external:
        print(f"    report: warning: an output links to the network: {'; '.join(cleaned.external[:3])}", flush=True)
    final = out / name
    trash = out / ".staging" / f"{name}.old"
    with SIGNALS.hold():
        shutil.rmtree(trash, ignore_errors=True)
        if final.exists():
            final.rename(trash)
        staging.rename(final)
        if record is not None:
            record(entry)
        shutil.rmtree(trash, ignore_errors=True)
    return entry


_MACHINE: dict[str, Any] = {}


def machine() -> dict[str, Any]:
    """``cache.machine()``, probed once per process (it imports TensorFlow)."""
    if not _MACHINE:
        _MACHINE.update(cache.machine())
    return dict(_MACHINE)


def update_manifest(out: Path, name: str, entry: dict[str, Any]) -> Path:
    """Record one notebook's run in ``out/manifest.json``, keeping
    the others. ``update_manifest(out, "01_adam_drift", e)``"""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    manifest[name] = entry
    return write_text(path, json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")


def record_run(out: Path, name: str, entry: dict[str, Any]) -> None:
    """Update ``manifest.json``, then ``REPRODUCTION.md`` and the pages (``site.write_pages``) from it."""
    update_manifest(out, name, entry)
    reproduction.write_report(out)
    write_pages(out)


def mark_kept(out: Path, name: str, parts: dict[str, str], commit: str) -> None:
    """Record in the manifest that ``name``'s result was kept at ``commit`` under the same key (nothing is written
    when the manifest already says so, or has no entry with that key for it)."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    entry = manifest.get(name)
    if not isinstance(entry, dict) or (entry.get("key") or {}).get("key") != cache.key_of(parts):
        return
    if (entry.get("result") or {}).get("at") == commit:
        return
    made = entry.get("result") or {}
    entry["result"] = {"how": "kept", "at": commit,
                       "made_at": made.get("made_at", made.get("at", entry.get("commit")))}
    update_manifest(out, name, entry)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["seeds=[0, 1]", "steps=5"]`` -> ``{"seeds": [0, 1], "steps": 5}`` (values parsed as YAML)."""
    overrides = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise PipelineError(f"--set: expected NAME=VALUE, like --set steps=5; got {pair!r}")
        try:
            overrides[name.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise PipelineError(f"--set {name}: the value is not valid YAML: {e}") from None
    return overrides


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m study.report --profile smoke --out build/smoke``."""
    parser = argparse.ArgumentParser(prog="python -m study.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, help="which notebooks/params/*.<profile>.yaml to use")
    parser.add_argument("--out", type=Path, help="results folder, e.g. results or build/smoke (--verify: results)")
    parser.add_argument("--verify", action="store_true",
                        help="run nothing: check that every result in --out (default: results) was made from the "
                             "inputs at this working tree; exit 1 naming each stale study and what changed")
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS,
                        help="folder of NN_topic.ipynb notebooks and params/ (default: ./notebooks)")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (by name)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="per-cell execution timeout, seconds")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="override one parameter (VALUE is YAML, e.g. --set 'seeds=[0,1]'); repeatable")
    parser.add_argument("--force", action="store_true",
                        help="rerun every notebook, even those this machine already ran with the same key")
    parser.add_argument("--records", type=Path, default=None, metavar="DIR",
                        help="where this machine's record of finished runs lives (default: build/records beside "
                             "the notebooks folder)")
    args = parser.parse_args(argv)
    if args.verify:
        return provenance.main(args.out or Path("results"), args.notebooks)
    if args.profile is None or args.out is None:
        parser.error("--profile and --out are required (or --verify)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = args.out.resolve()
    records = Records(args.records or args.notebooks.resolve().parent / "build" / "records", out)
    current = None
    done: list[str] = []
    with SIGNALS.installed():
        try:
            overrides = parse_overrides(args.overrides)
            chosen = notebooks(args.only, args.notebooks)
            params = {nb.stem: load_parameters(nb, args.profile, overrides) for nb in chosen}  # all checked first
            for nb in chosen:
                declared_reads(nb)
            host = machine()
            for i, nb in enumerate(chosen, start=1):
                current = nb.stem
                # computed now, not before the run: a notebook may read results that earlier notebooks just wrote
                parts = cache.key_parts(nb, {**params[nb.stem], "profile": args.profile}, out=out, host=host)
                key = cache.key_of(parts)
                old = None if args.force else records.reusable(nb.stem, key)
                if old is not None:
                    print(f"[{i}/{len(chosen)}] {nb.stem} ({args.profile}) reused: this machine ran it with the same "
                          f"key (key {key[:12]}...) on {old.get('finished_at', '?')} -> {out / nb.stem}", flush=True)
                    with SIGNALS.hold():
                        mark_kept(out, nb.stem, parts, git_state(out, nb.parent)["commit"])
                    current = None
                    continue
                why = "--force" if args.force else records.why_not(nb.stem, key, parts)
                print(f"[{i}/{len(chosen)}] {nb.stem} ({args.profile}) runs ({why}) ...", flush=True)

                def record(entry: dict[str, Any], name: str = nb.stem, parts: dict[str, str] = parts) -> None:
                    entry = provenance.record(entry, parts, out / name, "rerun", entry["commit"])
                    record_run(out, name, entry)
                    records.save(name, key, parts)
                    done.append(name)

                entry = run_notebook(nb, args.profile, out, args.timeout, overrides, record=record)
                print(f"[{i}/{len(chosen)}] {nb.stem} done in {entry['duration_s']} s -> {out / nb.stem}; "
                      f"{reproduction.one_line(entry['reproduction'])}", flush=True)
                current = None
            if (out / "manifest.json").is_file() and not done:  # nothing ran: only pages that are missing
                with SIGNALS.hold():
                    if not all((out / page).is_file() for page in ("SUMMARY.md", "COLUMNS.md", "index.html")):
                        write_pages(out)
        except PipelineError as e:
            print(f"pipeline: {e}", file=sys.stderr)
            return 1
        except Interrupted as e:
            kept = f" Finished and kept: {', '.join(done)}." if done else ""
            if current is not None and current not in done:
                what = (f"while running {current}: stopped its kernel and discarded its partial outputs, so {out} "
                        f"is as it was before {current}.")
            elif done:
                what = f"between notebooks; {out} is consistent."
            else:
                what = f"before any notebook ran; {out} is unchanged."
            print(f"pipeline: interrupted by {e.name} {what}{kept} Run the same command again to redo the rest.",
                  file=sys.stderr, flush=True)
            return 128 + e.signum
        finally:
            staging = out / ".staging"
            if staging.is_dir() and not any(staging.iterdir()):
                staging.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
