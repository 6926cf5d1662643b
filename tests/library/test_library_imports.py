"""The library (``import freezing``) needs TensorFlow, Keras and NumPy only, not the study packages.

Keras 3 itself imports pandas, scikit-learn and matplotlib when they are installed (optional
``try: import pandas`` in its data adapters and wrappers), so "pandas is in sys.modules after
``import freezing``" says nothing about freezing. Instead, each check runs in a fresh interpreter:

* what importing every freezing module adds to what ``import tensorflow, keras, numpy`` loaded,
  plus every top-level package a freezing module's own ``import`` statements ask for (which sees
  ``import pandas`` even though Keras has loaded pandas already);
* with the study packages made unimportable, every freezing module imports and works.
"""

import json
import os
import subprocess
import sys

STUDY_PACKAGES = ["pandas", "matplotlib", "papermill", "sklearn", "mlxtend", "yaml", "nbformat", "study"]

_IMPORT_EVERY_MODULE = """
import importlib, pkgutil
import freezing
for _info in pkgutil.iter_modules(freezing.__path__):
    importlib.import_module("freezing." + _info.name)
"""

_WHAT_FREEZING_LOADS = """
import builtins, json, sys
import numpy, keras, tensorflow
baseline = set(sys.modules)
requested = set()
_real_import = builtins.__import__

def _recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__") or ""
    if level == 0 and (importer == "freezing" or importer.startswith("freezing.")):
        requested.add(name.partition(".")[0])
    return _real_import(name, globals, locals, fromlist, level)

builtins.__import__ = _recording_import
try:
""" + "\n".join("    " + line for line in _IMPORT_EVERY_MODULE.strip().splitlines()) + """
finally:
    builtins.__import__ = _real_import
loaded = sorted({name.partition(".")[0] for name in set(sys.modules) - baseline})
print(json.dumps({"loaded": loaded, "requested": sorted(requested)}))
"""

_WITHOUT_STUDY_PACKAGES = """
import importlib.abc, json, sys
BLOCKED = set(json.loads(sys.argv[1]))

class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked in this test", name=name)
        return None

sys.meta_path.insert(0, _Blocker())
for _name in BLOCKED:
    assert _name not in sys.modules, _name
""" + _IMPORT_EVERY_MODULE + """
import keras, numpy as np, tensorflow as tf
w = tf.Variable([1.0, 2.0, 3.0])
with tf.GradientTape() as tape:
    y = tf.reduce_sum(freezing.gate(w, [0.0, 1.0, 1.0]) * 10.0)
layer = keras.layers.Dense(2, name="fc")
layer.build((None, 3))
paths = [freezing.variable_path(v) for v in freezing.select_variables(layer, pattern="kernel")]
leaked = sorted(n for n in sys.modules if n.partition(".")[0] in BLOCKED)
print(json.dumps({"grad": tape.gradient(y, w).numpy().tolist(), "paths": paths, "leaked": leaked}))
"""


def _run(code: str, *args: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_freezing_loads_and_imports_no_study_package():
    found = _run(_WHAT_FREEZING_LOADS)
    assert "freezing" in found["loaded"] and "tensorflow" in found["requested"]  # the probe works
    assert not set(STUDY_PACKAGES) & set(found["loaded"]), f"import freezing loaded {found['loaded']}"
    assert not set(STUDY_PACKAGES) & set(found["requested"]), f"freezing modules import {found['requested']}"


def test_freezing_imports_and_works_without_study_packages():
    result = _run(_WITHOUT_STUDY_PACKAGES, json.dumps(STUDY_PACKAGES))
    assert result == {"grad": [0.0, 10.0, 10.0], "paths": ["fc/kernel"], "leaked": []}


def _import_graph() -> dict[str, set[str]]:
    """freezing's modules -> the freezing modules each imports, at top level or in a function (read from the AST)."""
    import ast
    from pathlib import Path

    import freezing

    root = Path(freezing.__file__).parent
    names = {p.stem for p in root.glob("*.py")}
    graph = {}
    for path in root.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "freezing":
                parts = node.module.split(".")
                deps |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("freezing.")}
        graph[path.stem] = deps - {path.stem, "__init__"}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                found.append(path[path.index(dep):] + [dep])
            elif dep not in done:
                visit(dep, path + [dep])
        done.add(node)

    for node in sorted(graph):
        visit(node, [node])
    return found


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_freezing_module_imports_itself_round_a_circle():
    """Not even through an import inside a function (``_sizes`` -> ``slots`` -> ``masked_optimizer`` -> ``_sizes``)."""
    assert _cycles(_import_graph()) == []


def test_the_package_ships_its_type_marker():
    """PEP 561: ``py.typed`` sits in the package and the wheel ships it (setuptools' package data)."""
    from pathlib import Path

    import tomllib

    import freezing

    root = Path(__file__).resolve().parents[2]
    assert (Path(freezing.__file__).parent / "py.typed").is_file()
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["freezing"]
