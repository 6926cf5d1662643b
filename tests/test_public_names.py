"""The study and the bench are clients of the library, Keras and TensorFlow through their public names only.

What the study needs, users need too: a private name it reaches for belongs in the library's public API (or,
for Keras and TensorFlow internals, behind ``freezing``'s compat module, ``freezing._keras_api``). This test reads
every module of the study, the bench and ``downpour`` (and the notebooks' code cells) and fails on

* an import of a private module or name: ``freezing._x``, ``keras.src``, ``tensorflow.python``, ``from m import _x``;
* a read of a private attribute of anything but ``self``/``cls``: ``opt._var_key``, ``freezing._wrappers``.

``os._exit`` (public, documented) and the study's own ``_study_*`` attributes are allowed, and so is one private
import in one file: ``bench/bench_masked_fit.py`` sets the write path's thresholds (``freezing._tuning``), which are
not API (they change speed, never bits) and which only the bench and the tests reach.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_ATTRIBUTES = {("os", "_exit")}
ALLOWED_IMPORTS = {("bench/bench_masked_fit.py", "from freezing._tuning import tune")}
PACKAGES = ("freezing", "keras", "tensorflow")


def _sources() -> list[tuple[str, str]]:
    files = sorted((ROOT / "lib" / "study").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py")) + sorted(
        (ROOT / "lib" / "downpour").rglob("*.py"))  # the parameter server, a package of its own, too
    out = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        out.append((str(nb.relative_to(ROOT)), code))
    return out


def private_uses(source: str) -> list[str]:
    """Every private import or attribute read in ``source``, as ``"line: what"``.

    >>> private_uses("import freezing._masks\\nx = opt._var_key(v)\\nos._exit(0)\\nself._ok = 1")
    ['1: import freezing._masks', '2: ._var_key on opt']
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base in ("self", "cls") or (base, node.attr) in ALLOWED_ATTRIBUTES or node.attr.startswith("_study"):
                continue
            found.append((node.lineno, f".{node.attr} on {base[:40]}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in PACKAGES and (any(p.startswith("_") for p in parts[1:])
                                             or alias.name.startswith(("keras.src", "tensorflow.python"))):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            names = [a.name for a in node.names]
            if parts[0] in PACKAGES and (any(p.startswith("_") for p in parts[1:])
                                         or any(n.startswith("_") for n in names)
                                         or node.module.startswith(("keras.src", "tensorflow.python"))):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_scan_finds_what_it_looks_for():
    source = ("from freezing._wrappers import unwrap\nfrom tensorflow.python.util import x\nimport keras.src.ops\n"
              "k = opt._trainable_variables_indices\nfig._study_caption = 1\n")
    assert [u.split(": ", 1)[1] for u in private_uses(source)] == [
        "from freezing._wrappers import unwrap", "from tensorflow.python.util import x", "import keras.src.ops",
        "._trainable_variables_indices on opt"]


@pytest.mark.parametrize("path,source", _sources(), ids=lambda x: x if isinstance(x, str) and "\n" not in x else "")
def test_no_private_names(path, source):
    uses = [u for u in private_uses(source) if (path, u.split(": ", 1)[1]) not in ALLOWED_IMPORTS]
    assert not uses, f"{path} reaches into private names (use the public API): " + "; ".join(uses)
