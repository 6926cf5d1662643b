"""The private-name scan: outside ``freezing/_keras_api.py`` no module of ``freezing`` or ``downpour`` names a private
attribute of Keras or TensorFlow, or imports a private module or name of theirs.

Read from each module's AST, and from the code of every doctest in it:

* attributes read or written (``opt._var_key``), methods defined (``def _clip_gradients`` in a class),
  identifier strings (``getattr(o, "_x")``);
* import statements: ``keras.src``, ``tensorflow.python``, any ``_`` part, any ``_`` name imported from them;
* names reached through ``_keras_api``'s constants (``setattr(cls, _keras_api.CLIP_GRADIENTS, ...)``): resolved to
  their values, and allowed only if ``_keras_api.check`` verifies them at start-up.

A name counts as Keras' or TensorFlow's when a Keras optimizer (with EMA and gradient accumulation), a variable,
a model or a ``tf.Graph`` has it. ``downpour`` has no compat module: nothing is tolerated there.
"""

from __future__ import annotations

import ast
import doctest
from pathlib import Path

import keras
import tensorflow as tf

from freezing import _keras_api

LIB = Path(__file__).resolve().parents[2] / "lib"
PACKAGES = ("keras", "tensorflow")
CHECKED = set(_keras_api.OPTIMIZER_NAMES) | {name for name, _ in _keras_api.OPTION_NAMES.values()} | {
    _keras_api.FUNCTIONS}
"""The private names ``_keras_api.check`` verifies when a ``MaskedOptimizer`` is built."""


def _theirs() -> set[str]:
    opt = keras.optimizers.Adam(use_ema=True, gradient_accumulation_steps=2)
    v = keras.Variable([1.0])
    opt.build([v])
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    names: set[str] = set()
    for obj in (opt, keras.optimizers.SGD(), v, v.value, model, tf.Graph()):
        names |= {n for n in dir(obj) if n.startswith("_") and not n.startswith("__")}
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _constant_names(attr: str) -> list[str]:
    """The private names a ``_keras_api`` constant stands for (a string, or the strings in a tuple, list or dict)."""
    value = getattr(_keras_api, attr, None)
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, (tuple, list, dict)) else []
    return [v for v in values if isinstance(v, str) and _private(v)]


def _doctest_code(text: str) -> str:
    try:
        examples = doctest.DocTestParser().get_examples(text)
    except ValueError:
        return ""
    return "\n".join(e.source for e in examples)


def scan(source: str, theirs: set[str]) -> list[str]:
    """Every private Keras/TensorFlow name ``source`` reaches, as ``"line: what"`` (doctests' lines count from 1)."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}  # a method can override Keras' own
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                private = any(_private(p) for p in parts[1:]) or parts[1:2] in (["src"], ["python"])
                if parts[0] in PACKAGES and private:
                    found.append((line, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] in PACKAGES and (any(_private(p) for p in parts[1:]) or parts[1:2] in (["src"], ["python"])
                                         or any(_private(a.name) for a in node.names)):
                found.append((line, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_keras_api":
            for name in _constant_names(node.attr):
                if name not in CHECKED:
                    found.append((line, f"{name} through _keras_api.{node.attr}, which _keras_api.check does "
                                        "not verify"))
        else:
            names = [node.attr] if isinstance(node, ast.Attribute) else [node.name] if id(node) in methods else [
                node.value] if isinstance(
                node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier() else []
            found += [(line, name) for name in names if _private(name) and name in theirs]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ">>>" in node.value:
            code = _doctest_code(node.value)
            if code:
                try:
                    found += [(line, f"doctest: {u}") for u in scan(code, theirs)]
                except SyntaxError:
                    pass
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (LIB / package).glob("*.py") if p.name != "_keras_api.py")


def test_the_scan_finds_each_kind_of_private_name():
    source = '''
"""A module.

>>> opt._trainable_variables_indices
{}
"""
from tensorflow.python.ops import variables
import keras.src.optimizers
from keras.optimizers import _private_thing
from freezing import _keras_api
setattr(X, _keras_api.OPTIMIZER_MAP, None)
setattr(X, _keras_api.CLIP_GRADIENTS, None)
k = opt._var_key
class W:
    def _apply_weight_decay(self):
        pass
def _name(path):
    pass
getattr(opt, "_iterations")
'''
    uses = [u.split(": ", 1)[1] for u in scan(source, _theirs())]
    assert sorted(uses) == sorted([
        "from tensorflow.python.ops import variables", "import keras.src.optimizers",
        "from keras.optimizers import _private_thing",
        "_optimizer_map through _keras_api.OPTIMIZER_MAP, which _keras_api.check does not verify",
        "_var_key", "_apply_weight_decay", "_iterations", "doctest: 1: _trainable_variables_indices"])


def test_the_scan_fails_on_a_module_with_a_planted_private_name(tmp_path):
    clean = "import keras\n\ndef f(opt):\n    return opt.iterations\n"
    assert scan(clean, _theirs()) == []
    planted = clean + "\ndef g(opt):\n    return opt._trainable_variables\n"
    assert scan(planted, _theirs()) == ["7: _trainable_variables"]


def test_no_freezing_module_but_the_compat_module_reaches_a_private_keras_or_tensorflow_name():
    theirs = _theirs()
    found = {p.name: scan(p.read_text(encoding="utf-8"), theirs) for p in _modules("freezing")}
    assert {name: uses for name, uses in found.items() if uses} == {}


def test_no_downpour_module_reaches_a_private_keras_or_tensorflow_name():
    theirs = _theirs()
    found = {p.name: scan(p.read_text(encoding="utf-8"), theirs) for p in _modules("downpour")}
    assert {name: uses for name, uses in found.items() if uses} == {}
