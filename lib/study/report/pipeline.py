"""Run every notebook with papermill, render an HTML report, and record a manifest.

``python -m study.report --profile full --out results`` executes ``notebooks/NN_topic.ipynb``
with ``notebooks/params/NN_topic.full.yaml``, in a staging folder. Only a notebook that finished
is moved into ``results/NN_topic/`` (executed notebook, HTML report with inputs hidden, the
figures, tables and metrics.json it wrote), and ``results/manifest.json`` records its git commit,
parameters, package versions, data source and duration. The numbers its markdown quotes are filled in from
the run's ``metrics.json`` (``study.report.prose``) before the report is rendered. A notebook that fails stops the run with
its name and the error, exits non-zero, and leaves the previous results untouched.

After every notebook the pipeline rewrites, each atomically, ``manifest.json``, ``SUMMARY.md`` (headlines),
``index.html`` (one offline page: titles, figure thumbnails, headline tables, links; ``study.report.site``) and
``COLUMNS.md`` (the data dictionary of every CSV, from ``reporting.save_table(..., columns=...)``). The HTML
reports are rendered by ``study.report.html_report``: titled, offline, formulas as MathML, no stderr, alt text on figures.

Interruption: SIGINT (Ctrl-C) or SIGTERM while a notebook runs stops its kernel and every process the kernel
started, deletes the staging folder, and exits with 128 + the signal number and one line saying so; the
results folder is then exactly as it was before that notebook (notebooks that finished earlier in the same run
stay committed). A signal that arrives while a finished notebook is being moved into place and recorded is held
until that short step is done, so a notebook's folder, the manifest, SUMMARY.md and index.html always agree.

Cache: before running, each notebook gets a key (``study.report.cache.notebook_key``: the notebook's bytes, its resolved
parameters, ``requirements.txt``, the source of every ``freezing``/``study`` module it imports, transitively, and
the data files' size and mtime). A notebook whose key, profile and outputs match its ``manifest.json`` entry is
not rerun: the entry keeps the original run's fields and gets ``status: "reused"``, ``checked_at`` and
``checked_commit``; a rerun entry has ``status: "rerun"``. ``--force`` reruns everything. Each entry records the
machine (``study.report.cache.machine``: CPU, cores, oneDNN), and SUMMARY.md, COLUMNS.md and index.html are rebuilt
at the end of every run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from study.report import cache
from study.report.prose import fill_executed
from study.report.reporting import atomic_write

DEFAULT_NOTEBOOKS = Path("notebooks")
"""Where notebooks live, relative to the working directory (``--notebooks`` overrides it)."""
PROFILES = ("smoke", "full")
PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "numpy", "pandas", "matplotlib", "mlxtend", "papermill")
DEFAULT_TIMEOUT_S = 1200


class PipelineError(RuntimeError):
    """A notebook or its parameters failed; the message names which and why."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the pipeline; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class _Signals:
    """SIGINT/SIGTERM -> ``Interrupted`` in the main thread, except inside ``hold()``, where it waits.

    Only the first signal counts: a second one while the pipeline cleans up is ignored, so the cleanup finishes.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._holding = 0

    def handler(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            return
        self.received = signum
        if not self._holding:
            raise Interrupted(signum)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Run the block to its end even if a signal arrives; raise ``Interrupted`` after it."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and self.received is not None:
            raise Interrupted(self.received)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handlers for SIGINT and SIGTERM (main thread only), restoring the previous ones after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.received = None
        previous = {sig: signal.signal(sig, self.handler) for sig in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(sig) is not signal.SIG_IGN}  # like Python: an ignored signal stays ignored
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            self.received = None


_SIGNALS = _Signals()


def notebooks(only: list[str] | None = None, folder: Path = DEFAULT_NOTEBOOKS) -> list[Path]:
    """The notebooks to run, in order. ``notebooks(["01_adam_drift"])``"""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise PipelineError(f"--notebooks: {folder} is not a folder; run from the repository root or pass --notebooks DIR")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return found
    names = {p.stem: p for p in found}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise PipelineError(f"--only: unknown notebook(s) {unknown}; allowed: {sorted(names)}")
    return [names[n] for n in only]


def load_parameters(notebook: Path, profile: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read ``notebooks/params/<name>.<profile>.yaml`` (+ overrides) and check names against the notebook's. ``load_parameters(nb, "smoke")``"""
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


def _git_commit(out: Path, source: Path) -> dict[str, Any]:
    """HEAD of the repository holding ``source``, and whether tracked files other than ``out`` differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=source, capture_output=True, text=True, check=True).stdout.strip()

    try:
        root = Path(git("rev-parse", "--show-toplevel"))
        spec = ["--", "."]
        if out.resolve().is_relative_to(root):
            spec.append(f":(exclude){out.resolve().relative_to(root)}")
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no", *spec))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def render_html(executed: Path, html: Path) -> Any:
    """Write the executed notebook as an offline HTML report, code hidden. ``render_html(nb, out)``

    The .ipynb stays as executed (stderr and all); only the report is cleaned. Returns what was cleaned.
    """
    from study.report.html_report import render_report

    _, report = render_report(executed, html)
    return report


def _descendants() -> list[Any]:
    """Every live process below this one (the kernel, and whatever the kernel started, in any session)."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def stop_children(grace_s: float = 5.0) -> list[int]:
    """Stop every descendant process: freeze the tree (no new forks), SIGTERM, then SIGKILL after ``grace_s``.

    Returns the pids it signalled. The kernel runs in its own session and so does anything started with
    ``start_new_session``; walking parent links finds them all as long as their parents are alive, which the
    SIGSTOP pass guarantees until the whole tree is known.
    """
    import psutil

    found: dict[int, Any] = {}
    while True:  # freeze, until a pass finds no new process
        new = [p for p in _descendants() if p.pid not in found]
        if not new:
            break
        for p in new:
            found[p.pid] = p
            try:
                p.suspend()
            except psutil.Error:
                pass
    procs = list(found.values())
    for p in procs:
        try:
            p.terminate()
            p.resume()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return sorted(found)


def _execute(notebook: Path, executed: Path, parameters: dict[str, Any], timeout_s: int) -> None:
    """papermill in a worker thread, so that signals reach the main thread (nbclient, when it runs in the main
    thread, replaces the SIGINT/SIGTERM handlers with its own, and restores SIG_DFL for SIGTERM afterwards).

    On any exception in the main thread (``Interrupted``), the kernel's process tree is stopped before it is
    re-raised, so nothing is left running and nothing writes into staging any more.
    """
    import papermill

    box: dict[str, BaseException] = {}

    def work() -> None:
        try:
            papermill.execute_notebook(
                str(notebook), str(executed), parameters=parameters,
                kernel_name="python3", cwd=str(notebook.parent), execution_timeout=timeout_s,
                progress_bar=sys.stderr.isatty(), log_output=True,
            )
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    worker = threading.Thread(target=work, name=f"papermill:{notebook.stem}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        stop_children()
        worker.join(30)  # papermill notices the dead kernel and returns
        raise
    if "error" in box:
        raise box["error"]


def run_notebook(notebook: Path, profile: str, out: Path, timeout_s: int,
                 overrides: dict[str, Any] | None = None,
                 record: Callable[[dict[str, Any]], None] | None = None,
                 key: str | None = None) -> dict[str, Any]:
    """Execute one notebook into ``out/<name>/``; returns its manifest entry. ``run_notebook(nb, "smoke", Path("build"), 600)``

    Nothing under ``out`` outside ``out/.staging`` changes until the notebook and its report are complete. Then
    the folder is swapped into ``out/<name>`` and ``record(entry)`` (the manifest, SUMMARY.md, index.html) runs,
    both with signals held (``_Signals.hold``), so an interruption never separates the folder from its record.
    """
    from papermill.exceptions import PapermillExecutionError

    params = load_parameters(notebook, profile, overrides)
    name = notebook.stem
    staging = out / ".staging" / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.perf_counter()
    try:
        _execute(notebook, staging / f"{name}.ipynb", {**params, "out_dir": str(staging.resolve())}, timeout_s)
        fill_executed(staging / f"{name}.ipynb", staging / "metrics.json")  # the prose's numbers, from this run
        cleaned = render_html(staging / f"{name}.ipynb", staging / f"{name}.html")
        duration = time.perf_counter() - started
        metrics_path = staging / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
        entry = {
            "title": cleaned.title,
            "profile": profile,
            "parameters": params,
            "data_source": metrics.get("data_source", "not recorded"),
            "duration_s": round(duration, 1),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **_git_commit(out, notebook.parent),
            "packages": _versions(),
            "machine": _machine(),
            "key": key if key is not None else cache.notebook_key(notebook, params),
            "status": "rerun",
        }
    except PapermillExecutionError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PipelineError(f"{name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}") from None
    except Exception as e:  # the kernel died, a timeout, the report could not be rendered, ...
        with _SIGNALS.hold():
            stop_children()
            shutil.rmtree(staging, ignore_errors=True)
        raise PipelineError(f"{name} failed: {type(e).__name__}: {e}") from e
    except BaseException:  # Interrupted (SIGINT/SIGTERM), SystemExit
        with _SIGNALS.hold():
            stop_children()
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if cleaned.stderr_dropped or cleaned.reprs_dropped or cleaned.alt_fallback:
        print(f"    report: left out {cleaned.stderr_dropped} stderr and {cleaned.reprs_dropped} repr output(s) "
              f"(kept in the .ipynb); {len(cleaned.alt_fallback)} figure(s) without a caption", flush=True)
    if cleaned.external:
        print(f"    report: warning: an output links to the network: {'; '.join(cleaned.external[:3])}", flush=True)
    final = out / name
    trash = out / ".staging" / f"{name}.old"
    with _SIGNALS.hold():
        shutil.rmtree(trash, ignore_errors=True)
        if final.exists():
            final.rename(trash)
        staging.rename(final)
        if record is not None:
            record(entry)
        shutil.rmtree(trash, ignore_errors=True)
    return entry


_MACHINE: dict[str, Any] = {}


def _machine() -> dict[str, Any]:
    """``cache.machine()``, probed once per process (it imports TensorFlow)."""
    if not _MACHINE:
        _MACHINE.update(cache.machine())
    return dict(_MACHINE)


def cached_entry(out: Path, notebook: Path, profile: str, key: str) -> dict[str, Any] | None:
    """The manifest entry of ``notebook`` if its last run can be reused: same key and profile, outputs present."""
    path = out / "manifest.json"
    try:
        entry = json.loads(path.read_text()).get(notebook.stem) if path.is_file() else None
    except (OSError, ValueError):
        return None
    folder = out / notebook.stem
    if (not isinstance(entry, dict) or entry.get("key") != key or entry.get("profile") != profile
            or not (folder / f"{notebook.stem}.ipynb").is_file() or not (folder / "metrics.json").is_file()):
        return None
    return entry


def reuse(out: Path, notebook: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Mark ``entry`` reused in the manifest (original fields kept, ``checked_at``/``checked_commit`` added)."""
    checked = _git_commit(out, notebook.parent)
    entry = {**entry, "status": "reused",
             "checked_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "checked_commit": checked["commit"] + (" + local changes" if checked.get("dirty") else "")}
    with _SIGNALS.hold():
        update_manifest(out, notebook.stem, entry)
    return entry


def record_run(out: Path, name: str, entry: dict[str, Any]) -> None:
    """Update ``manifest.json``, then rewrite ``SUMMARY.md`` and ``index.html`` from it (each write atomic)."""
    from study.report.site import write_index

    update_manifest(out, name, entry)
    write_summary(out)
    write_index(out)


def update_manifest(out: Path, name: str, entry: dict[str, Any]) -> Path:
    """Record one notebook's run in ``out/manifest.json``, keeping the others. ``update_manifest(out, "01_adam_drift", e)``"""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    manifest[name] = entry
    text = json.dumps(dict(sorted(manifest.items())), indent=2) + "\n"
    return atomic_write(path, lambda p: Path(p).write_text(text))


def write_summary(out: Path) -> Path:
    """Write ``out/SUMMARY.md``: each notebook's headline numbers, the command, time and machine. ``write_summary(out)``"""
    manifest = json.loads((out / "manifest.json").read_text())
    lines = ["# Results summary", "",
             "Generated by `study.report.pipeline` from each notebook's `metrics.json` (key `headline`); do not edit. "
             "Figures, headlines and reports on one page, offline: [index.html](index.html). "
             "What every column of every table means, with units: [COLUMNS.md](COLUMNS.md).", ""]
    for name, entry in manifest.items():
        metrics_path = out / name / "metrics.json"
        headline = json.loads(metrics_path.read_text()).get("headline", {}) if metrics_path.is_file() else {}
        packages = entry["packages"]
        title = entry.get("title")
        lines += [f"## {name}" + (f": {title}" if title and title != name else ""), "",
                  f"`python -m study.report --profile {entry['profile']} --out {os.path.relpath(out)} --only {name}` "
                  f"({entry['duration_s']} s; {packages.get('platform', '')}; "
                  f"TensorFlow {packages.get('tensorflow-cpu', packages.get('tensorflow', '?'))}, "
                  f"Keras {packages.get('keras', '?')}; commit {entry['commit'][:10]}"
                  f"{' + local changes' if entry.get('dirty') else ''}; {cache.machine_line(entry.get('machine'))}"
                  f"{'; reused, checked at ' + entry['checked_at'] if entry.get('status') == 'reused' else ''}). "
                  f"Report: [{name}.html]({name}/{name}.html); on [index.html](index.html#{name}).", "",
                  "| measurement | value |", "|---|---|"]
        lines += [f"| {k.replace('|', '&#124;')} | {str(v).replace('|', '&#124;')} |" for k, v in headline.items()]
        lines.append("")
    text = "\n".join(lines)
    return atomic_write(out / "SUMMARY.md", lambda p: Path(p).write_text(text, encoding="utf-8"))


def _record(out: Path, name: str, entry: dict[str, Any]) -> None:
    """``record_run``, then ``COLUMNS.md``; the index once more when ``COLUMNS.md`` is new, so that it links it."""
    from study.report.site import write_index

    new = not (out / "COLUMNS.md").is_file()
    record_run(out, name, entry)
    write_columns(out)
    if new:
        write_index(out)


def write_columns(out: Path) -> Path:
    """Write ``out/COLUMNS.md``: the data dictionary of every study's CSV tables, from what the run recorded.

    Per study (manifest order) and table: each column with the description ``reporting.save_table(...,
    columns=...)`` recorded, or "(not described)". A CSV that ``save_table`` did not record is listed from its
    header. ``write_columns(Path("results"))``
    """
    import csv

    from study.report.reporting import NOT_DESCRIBED, table_columns

    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {}
    lines = ["# Columns of every table", "",
             "Generated by `study.report.pipeline` from the descriptions each notebook gave "
             "`study.report.reporting.save_table(..., columns=...)`; do not edit. Units are in parentheses.", ""]
    for name, entry in manifest.items():
        folder = out / name
        recorded = table_columns(folder)
        files = [f for f in recorded if (folder / f).is_file()]
        files += sorted(p.name for p in folder.glob("*.csv") if p.name not in recorded)
        title = entry.get("title") if isinstance(entry, dict) else None
        lines += [f'<a id="{name}"></a>', "", f"## {name}" + (f": {title}" if title and title != name else ""), ""]
        if not files:
            lines += ["No tables.", ""]
        for file in files:
            columns = recorded.get(file)
            if columns is None:
                with open(folder / file, newline="", encoding="utf-8") as f:
                    columns = dict.fromkeys(next(csv.reader(f), []))
            lines += [f"### [{file}]({name}/{file})", "", "| column | meaning (unit) |", "|---|---|"]
            lines += [f"| `{c.replace('|', chr(92) + '|')}` | {(d or NOT_DESCRIBED).replace('|', '&#124;')} |"
                      for c, d in columns.items()]  # GFM: a pipe inside a table cell, even in code, is \|
            lines.append("")
    text = "\n".join(lines)
    return atomic_write(out / "COLUMNS.md", lambda p: Path(p).write_text(text, encoding="utf-8"))


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
    parser.add_argument("--profile", choices=PROFILES, required=True, help="which notebooks/params/*.<profile>.yaml to use")
    parser.add_argument("--out", type=Path, required=True, help="results folder, e.g. results or build/smoke")
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS,
                        help="folder of NN_topic.ipynb notebooks and params/ (default: ./notebooks)")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (by name)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="per-cell execution timeout, seconds")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="override one parameter (VALUE is YAML, e.g. --set 'seeds=[0,1]'); repeatable")
    parser.add_argument("--force", action="store_true",
                        help="rerun every notebook, even those whose cache key matches the manifest")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = args.out.resolve()
    current = None
    done: list[str] = []
    with _SIGNALS.installed():
        try:
            overrides = parse_overrides(args.overrides)
            chosen = notebooks(args.only, args.notebooks)
            keys = {}
            for nb in chosen:  # check every parameter file before running anything
                keys[nb.stem] = cache.notebook_key(nb, load_parameters(nb, args.profile, overrides))
            for i, nb in enumerate(chosen, start=1):
                current = nb.stem
                key = keys[nb.stem]
                old = None if args.force else cached_entry(out, nb, args.profile, key)
                if old is not None:
                    reuse(out, nb, old)
                    done.append(nb.stem)
                    print(f"[{i}/{len(chosen)}] {nb.stem} ({args.profile}) reused (key {key[:12]}..., ran at commit "
                          f"{str(old.get('commit', '?'))[:10]} on {old.get('finished_at', '?')}) -> {out / nb.stem}",
                          flush=True)
                    current = None
                    continue
                print(f"[{i}/{len(chosen)}] {nb.stem} ({args.profile}) ...", flush=True)
                entry = run_notebook(nb, args.profile, out, args.timeout, overrides, key=key,
                                     record=lambda e, name=nb.stem: (_record(out, name, e), done.append(name)))
                print(f"[{i}/{len(chosen)}] {nb.stem} done in {entry['duration_s']} s -> {out / nb.stem}", flush=True)
                current = None
            if chosen and (out / "manifest.json").is_file():  # the pages, from the manifest as it now is
                from study.report.site import write_index

                with _SIGNALS.hold():
                    write_summary(out)
                    write_columns(out)
                    write_index(out)
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
