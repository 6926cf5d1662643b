"""Run every notebook with papermill, render an HTML report, and record a manifest.

``python -m study.pipeline --profile full --out results`` executes ``notebooks/NN_topic.ipynb``
with ``notebooks/params/NN_topic.full.yaml``, in a staging folder. Only a notebook that finished
is moved into ``results/NN_topic/`` (executed notebook, HTML report with inputs hidden, the
figures, tables and metrics.json it wrote), and ``results/manifest.json`` records its git commit,
parameters, package versions, data source and duration. A notebook that fails stops the run with
its name and the error, exits non-zero, and leaves the previous results untouched.
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from study.reporting import atomic_write

DEFAULT_NOTEBOOKS = Path("notebooks")
"""Where notebooks live, relative to the working directory (``--notebooks`` overrides it)."""
PROFILES = ("smoke", "full")
PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "numpy", "pandas", "matplotlib", "mlxtend", "papermill")
DEFAULT_TIMEOUT_S = 1200


class PipelineError(RuntimeError):
    """A notebook or its parameters failed; the message names which and why."""


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


def render_html(executed: Path, html: Path) -> None:
    """Write the executed notebook as a shareable HTML report with the code hidden. ``render_html(nb, out)``"""
    import nbconvert
    import nbformat

    exporter = nbconvert.HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    atomic_write(html, lambda p: Path(p).write_text(body, encoding="utf-8"))


def run_notebook(notebook: Path, profile: str, out: Path, timeout_s: int,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute one notebook into ``out/<name>/``; returns its manifest entry. ``run_notebook(nb, "smoke", Path("build"), 600)``"""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    params = load_parameters(notebook, profile, overrides)
    name = notebook.stem
    staging = out / ".staging" / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(notebook), str(staging / f"{name}.ipynb"),
            parameters={**params, "out_dir": str(staging.resolve())},
            kernel_name="python3", cwd=str(notebook.parent), execution_timeout=timeout_s,
            progress_bar=sys.stderr.isatty(), log_output=True,
        )
        render_html(staging / f"{name}.ipynb", staging / f"{name}.html")
    except PapermillExecutionError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PipelineError(f"{name} failed in cell {e.exec_count}: {e.ename}: {e.evalue}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    duration = time.perf_counter() - started
    metrics_path = staging / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    final = out / name
    trash = out / ".staging" / f"{name}.old"
    shutil.rmtree(trash, ignore_errors=True)
    if final.exists():
        final.rename(trash)
    staging.rename(final)
    shutil.rmtree(trash, ignore_errors=True)
    return {
        "profile": profile,
        "parameters": params,
        "data_source": metrics.get("data_source", "not recorded"),
        "duration_s": round(duration, 1),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **_git_commit(out, notebook.parent),
        "packages": _versions(),
    }


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
             "Generated by `study.pipeline` from each notebook's `metrics.json` (key `headline`); do not edit.", ""]
    for name, entry in manifest.items():
        metrics_path = out / name / "metrics.json"
        headline = json.loads(metrics_path.read_text()).get("headline", {}) if metrics_path.is_file() else {}
        packages = entry["packages"]
        lines += [f"## {name}", "",
                  f"`python -m study.pipeline --profile {entry['profile']} --out {os.path.relpath(out)} --only {name}` "
                  f"({entry['duration_s']} s on {os.cpu_count()} CPU cores; {packages.get('platform', '')}; "
                  f"TensorFlow {packages.get('tensorflow-cpu', packages.get('tensorflow', '?'))}, "
                  f"Keras {packages.get('keras', '?')}; commit {entry['commit'][:10]}"
                  f"{' + local changes' if entry.get('dirty') else ''}). "
                  f"Report: [{name}.html]({name}/{name}.html).", "",
                  "| measurement | value |", "|---|---|"]
        lines += [f"| {k.replace('|', '&#124;')} | {str(v).replace('|', '&#124;')} |" for k, v in headline.items()]
        lines.append("")
    text = "\n".join(lines)
    return atomic_write(out / "SUMMARY.md", lambda p: Path(p).write_text(text))


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
    """Command line: ``python -m study.pipeline --profile smoke --out build/smoke``."""
    parser = argparse.ArgumentParser(prog="python -m study.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, required=True, help="which notebooks/params/*.<profile>.yaml to use")
    parser.add_argument("--out", type=Path, required=True, help="results folder, e.g. results or build/smoke")
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS,
                        help="folder of NN_topic.ipynb notebooks and params/ (default: ./notebooks)")
    parser.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (by name)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="per-cell execution timeout, seconds")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="override one parameter (VALUE is YAML, e.g. --set 'seeds=[0,1]'); repeatable")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("papermill").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = args.out.resolve()
    try:
        overrides = parse_overrides(args.overrides)
        chosen = notebooks(args.only, args.notebooks)
        for nb in chosen:  # check every parameter file before running anything
            load_parameters(nb, args.profile, overrides)
        for i, nb in enumerate(chosen, start=1):
            print(f"[{i}/{len(chosen)}] {nb.stem} ({args.profile}) ...", flush=True)
            entry = run_notebook(nb, args.profile, out, args.timeout, overrides)
            update_manifest(out, nb.stem, entry)
            write_summary(out)
            print(f"[{i}/{len(chosen)}] {nb.stem} done in {entry['duration_s']} s -> {out / nb.stem}", flush=True)
    except PipelineError as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 1
    finally:
        staging = out / ".staging"
        if staging.is_dir() and not any(staging.iterdir()):
            staging.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
