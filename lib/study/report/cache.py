"""The pipeline's execution cache: a key per notebook, computed before running, and a probe of the machine.

A notebook is rerun only when its key differs from the one its last run recorded in ``manifest.json``. The key
is a SHA-256 over: the notebook file's bytes, its resolved parameters, the lock file ``requirements.txt``, the
source bytes of every ``freezing`` / ``study`` module it imports (found statically with ``ast``, transitively,
including package ``__init__.py`` files and modules named as ``"study.<module>"`` strings, which is how child
processes are started: ``python -m study.ps``), and the identity (size, mtime) of the data files the
loader would read. ``notebook_key(Path("notebooks/01_adam_drift.ipynb"), params)``
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

PACKAGES = ("freezing", "study")
"""Top-level packages whose sources enter the key."""
LIB = Path(__file__).resolve().parents[2]
"""The folder holding ``freezing/`` and ``study/`` (``lib/``)."""
_MODULE_STRING = re.compile(r"^(?:freezing|study)(?:\.[A-Za-z_]\w*)+")


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
    """Size and mtime of the data files the loader could read: ``data_path`` if set, else the Keras MNIST cache."""
    from study.data import keras_cache_path

    paths = {}
    for key in ("data_path", "data", "mnist_path"):
        value = parameters.get(key)
        if isinstance(value, str) and value:
            paths[key] = Path(value).expanduser()
    paths["keras_mnist"] = keras_cache_path()
    identity: dict[str, Any] = {}
    for key, path in paths.items():
        try:
            st = path.stat()
            identity[key] = {"path": str(path), "size": st.st_size, "mtime": int(st.st_mtime)}
        except OSError:
            identity[key] = {"path": str(path), "missing": True}
    return identity


def key_parts(notebook: Path, parameters: dict[str, Any], lock: Path | None = None,
              root: Path = LIB) -> dict[str, str]:
    """What the key covers, each part as a SHA-256 hex digest (``module:<name>`` per imported module)."""
    lock = lock if lock is not None else root.parent / "requirements.txt"

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    parts = {"notebook": digest(Path(notebook).read_bytes()),
             "parameters": digest(json.dumps(parameters, sort_keys=True, default=str).encode()),
             "requirements.txt": digest(lock.read_bytes()) if lock.is_file() else "missing",
             "data": digest(json.dumps(data_identity(parameters), sort_keys=True).encode())}
    for name, path in modules(notebook, root).items():
        parts[f"module:{name}"] = digest(path.read_bytes())
    return parts


def notebook_key(notebook: Path, parameters: dict[str, Any], lock: Path | None = None, root: Path = LIB) -> str:
    """The cache key of one notebook run (hex SHA-256 over ``key_parts``)."""
    parts = key_parts(notebook, parameters, lock, root)
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
        from tensorflow.python.util import _pywrap_util_port  # private; guarded

        info["onednn_in_build"] = bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # no TensorFlow, or the private module moved
        info["onednn_in_build"] = None
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "MKL_NUM_THREADS"):
        if var in os.environ:
            info[var] = os.environ[var]
    return info


def machine_line(info: dict[str, Any] | None) -> str:
    """One short line for SUMMARY.md: ``"Intel Xeon ..., 2 cores, oneDNN on (TF_ENABLE_ONEDNN_OPTS unset)"``."""
    if not info:
        return "machine not recorded"
    onednn = {True: "on", False: "off", None: "unknown"}[info.get("onednn_in_build")]
    return (f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores, oneDNN build {onednn} "
            f"(TF_ENABLE_ONEDNN_OPTS {info.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})")
