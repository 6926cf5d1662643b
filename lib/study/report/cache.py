"""The key of a notebook run, computed before running it: a notebook is reused only while its key is unchanged.

The key is a SHA-256 over (``key_parts``):

* the notebook file's bytes and its resolved parameters;
* the lock file ``requirements.txt`` and the versions actually installed (``packages``);
* the source bytes of every ``freezing`` / ``study`` module it imports (found statically with ``ast``,
  transitively, including package ``__init__.py`` files and modules named as ``"study.<module>"`` strings, which
  is how child processes are started: ``python -m downpour``);
* the content (SHA-256) of the data files the loader would read;
* the content of every file of the results folder the notebook declares it reads (``reads``: notebook 05 reads
  studies 01-04's ``metrics.json`` for its which-method table);
* the machine (``machine``: CPU model, cores, oneDNN in the build and ``TF_ENABLE_ONEDNN_OPTS``, thread settings).

``split_key`` separates what is in the repository (``inputs``: everything above but the installed packages and the
machine) from where it ran; ``results/manifest.json`` records both, and ``study.report.provenance`` recomputes the
inputs at ``HEAD`` (``python -m study.report --verify``).

Where the last key of each notebook is kept, and what else reuse requires, is ``study.report.records``.
``notebook_key(Path("notebooks/01_adam_drift.ipynb"), params)``
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

PACKAGES = ("freezing", "study", "downpour")
"""Top-level packages whose sources enter the key."""
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "keras", "numpy", "pandas", "matplotlib", "mlxtend", "papermill")
"""Installed distributions whose versions enter the key and the manifest."""
READS_KEY = "reads"
"""``notebook.metadata["study"]["reads"]``: files of the results folder a notebook reads (paths relative to it)."""
LIB = Path(__file__).resolve().parents[2]
"""The folder holding ``freezing/`` and ``study/`` (``lib/``)."""
_MODULE_STRING = re.compile(r"^(?:freezing|study|downpour)(?:\.[A-Za-z_]\w*)+")


def module_file(name: str, root: Path = LIB) -> Path | None:
    """The source file of module ``name`` under ``root`` (a package gives its ``__init__.py``), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(name: str) -> list[str]:
    """``"study.recipes.x"`` -> ``["study", "study.recipes", "study.recipes.x"]`` (importing runs each ``__init__``)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imported_names(source: str, module: str | None = None, is_package: bool = False) -> set[str]:
    """Module names under ``PACKAGES`` that ``source`` imports or names as a ``"study.x"`` string.

    ``module`` (the dotted name of the file ``source`` came from) resolves relative imports. Names may not
    exist; ``modules`` keeps those that do.
    """
    found: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if module is None:
                    continue
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                if keep <= 0:
                    continue
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from study import x`: x may be a module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_STRING.match(node.value.strip())
            if match:
                found.add(match.group(0))
    return {n for n in found if n.split(".")[0] in PACKAGES}


def notebook_source(notebook: Path) -> str:
    """The notebook's code cells joined, lines starting with ``%`` or ``!`` (IPython magics) dropped."""
    cells = json.loads(Path(notebook).read_text(encoding="utf-8")).get("cells", [])
    lines: list[str] = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines += [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        lines.append("")
    return "\n".join(lines)


def modules(notebook: Path, root: Path = LIB) -> dict[str, Path]:
    """Every ``freezing``/``study`` module the notebook imports, transitively: name -> source file, sorted.

    ``"study.drift.adam_drift" in modules(Path("notebooks/01_adam_drift.ipynb"))``
    """
    try:
        todo = set(imported_names(notebook_source(notebook)))
    except SyntaxError:  # a cell that is not plain Python: fall back to every module
        todo = {p.relative_to(root).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
                for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    found: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        for full in _with_parents(name):
            if full in found:
                continue
            path = module_file(full, root)
            if path is None:
                continue
            found[full] = path
            todo |= imported_names(path.read_text(encoding="utf-8"), full, path.name == "__init__.py") - set(found)
    return dict(sorted(found.items()))


def data_identity(parameters: dict[str, Any]) -> dict[str, Any]:
    """The SHA-256 of every data file the loader could read: ``data_path`` if set (a file, or each file of a
    folder), and the Keras MNIST cache; a missing path is recorded as missing."""
    from study.data import keras_cache_path
    from study.report.records import file_digest

    paths = {}
    for key in ("data_path", "data", "mnist_path"):
        value = parameters.get(key)
        if isinstance(value, str) and value:
            paths[key] = Path(value).expanduser()
    paths["keras_mnist"] = keras_cache_path()
    identity: dict[str, Any] = {}
    for key, path in paths.items():
        if path.is_dir():
            identity[key] = {"path": str(path), "files": {p.relative_to(path).as_posix(): file_digest(p)
                                                          for p in sorted(path.rglob("*")) if p.is_file()}}
        else:
            identity[key] = {"path": str(path), "sha256": file_digest(path) if path.is_file() else "missing"}
    return identity


def reads(notebook: Path) -> list[str]:
    """The files of the results folder ``notebook`` declares it reads (``metadata.study.reads``), e.g.
    ``["01_adam_drift/metrics.json"]``; a malformed declaration is an error naming the notebook."""
    meta = json.loads(Path(notebook).read_text(encoding="utf-8")).get("metadata", {})
    declared = (meta.get("study") or {}).get(READS_KEY, [])
    if not isinstance(declared, list) or not all(isinstance(p, str) and p and not Path(p).is_absolute()
                                                 and ".." not in Path(p).parts for p in declared):
        raise ValueError(f"{Path(notebook).name}: metadata.study.{READS_KEY} must be a list of paths inside the "
                         f"results folder, like [\"01_adam_drift/metrics.json\"]; got {declared!r}")
    return declared


def packages() -> dict[str, str]:
    """Python's version and the installed versions of ``DISTRIBUTIONS`` (those not installed are left out)."""
    versions = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def key_parts(notebook: Path, parameters: dict[str, Any], lock: Path | None = None, root: Path = LIB,
              out: Path | None = None, host: dict[str, Any] | None = None) -> dict[str, str]:
    """What the key covers, each part as a SHA-256 hex digest: ``notebook``, ``parameters``, ``requirements.txt``,
    ``packages``, ``machine``, ``data``, ``module:<name>`` per imported module and ``read:<path>`` per file of
    ``out`` the notebook reads. ``host`` is ``machine()`` (pass it to probe the machine once per run)."""
    from study.report.records import file_digest

    lock = lock if lock is not None else root.parent / "requirements.txt"

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def plain(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, default=str).encode()

    parts = {"notebook": digest(Path(notebook).read_bytes()),
             "parameters": digest(plain(parameters)),
             "requirements.txt": digest(lock.read_bytes()) if lock.is_file() else "missing",
             "packages": digest(plain(packages())),
             "machine": digest(plain(host if host is not None else machine())),
             "data": digest(plain(_contents(data_identity(parameters))))}
    for name, path in modules(notebook, root).items():
        parts[f"module:{name}"] = digest(path.read_bytes())
    for path in reads(notebook):
        target = Path(out) / path if out is not None else None
        parts[f"read:{path}"] = file_digest(target) if target is not None and target.is_file() else "missing"
    return parts


def notebook_key(notebook: Path, parameters: dict[str, Any], lock: Path | None = None, root: Path = LIB,
                 out: Path | None = None, host: dict[str, Any] | None = None) -> str:
    """The cache key of one notebook run (hex SHA-256 over ``key_parts``)."""
    return key_of(key_parts(notebook, parameters, lock, root, out, host))


def _contents(identity: dict[str, Any]) -> dict[str, Any]:
    """``data_identity`` without the absolute paths: the key follows the data's content, not where it lives."""
    return {k: {f: v for f, v in entry.items() if f != "path"} for k, entry in identity.items()}


MACHINE_PARTS = ("machine", "packages")
"""Parts of the key that describe where a notebook ran (this machine, its installed packages), not the repository."""


def split_key(parts: dict[str, str]) -> dict[str, Any]:
    """The key as the manifest records it: ``inputs`` (SHA-256 over every part but ``MACHINE_PARTS``: what is in
    the repository), ``machine`` and ``packages`` apart, the full ``key``, and ``covers``: each input part's digest,
    so that ``--verify`` can name what changed."""
    inputs = {k: v for k, v in parts.items() if k not in MACHINE_PARTS}
    return {"key": key_of(parts), "inputs": key_of(inputs), "machine": parts.get("machine"),
            "packages": parts.get("packages"), "covers": dict(sorted(inputs.items()))}


def key_of(parts: dict[str, str]) -> str:
    """The key from its parts (hex SHA-256 of their sorted JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def machine() -> dict[str, Any]:
    """CPU model, core count and the settings that change float results (oneDNN, thread counts). Cheap."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu or platform.processor() or platform.machine() or "unknown",
                            "cores": os.cpu_count(),
                            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset")}
    try:
        from freezing.determinism import onednn_in_build

        info["onednn_in_build"] = onednn_in_build()
    except ImportError:  # no TensorFlow
        info["onednn_in_build"] = None
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "MKL_NUM_THREADS"):
        if var in os.environ:
            info[var] = os.environ[var]
    return info


def machine_line(info: dict[str, Any] | None) -> str:
    """One short line for SUMMARY.md: ``"Intel Xeon ..., 2 cores, oneDNN on (TF_ENABLE_ONEDNN_OPTS not set)"``
    (the recorded value ``unset`` is written "not set", as the reports write every setting not given)."""
    if not info:
        return "machine not recorded"
    onednn = {True: "on", False: "off", None: "unknown"}[info.get("onednn_in_build")]
    opts = info.get("TF_ENABLE_ONEDNN_OPTS", "unset")
    return (f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores, oneDNN build {onednn} "
            f"(TF_ENABLE_ONEDNN_OPTS {'not set' if opts == 'unset' else opts})")
