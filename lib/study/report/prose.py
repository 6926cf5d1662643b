"""Numbers in a report's prose, filled in from the run: markdown cells are Jinja templates over ``metrics.json``.

A finding's sentence quotes what the run measured, not a number typed when the notebook was written::

    **Adam's drift is predictable**: the closed form matches every frozen entry to
    {{ metrics.prediction_max_abs_error | sci }}, while the drift itself reaches
    {{ metrics.prediction_max_abs_drift | sci }}.

After papermill has executed a notebook (which writes ``metrics.json`` in its last cell), the pipeline calls
``fill_notebook``: every markdown cell holding ``{{ ... }}`` or ``{% ... %}`` is rendered with ``metrics`` (the
run's ``metrics.json``) in scope, in the executed ``.ipynb`` that goes to ``results/`` and so in its HTML report.
The template is kept in the cell's metadata (``study.template``) so that the filled notebook can be filled again.
The notebook in ``notebooks/`` keeps the template; opened interactively it shows the placeholders.

A placeholder naming a key the run did not record stops the run with one message (the cell, the expression,
the keys there are): a report can neither publish a stale number nor a sentence without its number. The
assertion cell before each finding still guards its direction and size.

Filters (besides Jinja's own): ``num`` (significant digits, plain notation), ``sci`` (``7.1e-07`` as
``7.1e-7``), ``fixed`` (decimals), ``pct`` (a fraction as a percentage), ``times`` (a ratio, ``3.89×``),
``pm`` (``mean | pm(std)``), ``count`` (an integer with thousands separators), ``signed`` (``+0.015``).
``lint_prose`` finds decimals, percentages and ratios typed into a notebook's prose instead.

``python -m study.report.prose NOTEBOOK.ipynb METRICS.json`` prints the filled markdown (or the error).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_KEY = "template"
_MARKER = re.compile(r"\{\{|\{%")


class ProseError(ValueError):
    """A markdown template names a value the run did not record, or cannot be parsed."""


def _number(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            return float(x)
        except (TypeError, ValueError):
            raise ProseError(f"expected a number, got {x!r}") from None
    return float(x)


def sci(x: Any, digits: int = 2) -> str:
    """``x`` in scientific notation with ``digits`` significant digits, without ``+``/leading zeros in the exponent.

    >>> sci(7.12e-07), sci(123456, 3), sci(0)
    ('7.1e-7', '1.23e5', '0')
    """
    x = _number(x)
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.{max(digits - 1, 0)}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def num(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits in plain notation (``sci`` outside 1e-4 to 1e7); ints as counts.

    >>> num(3.8912), num(0.000712, 2), num(1532), num(2.0), num(1.5e-9)
    ('3.89', '0.00071', '1,532', '2', '1.5e-9')
    """
    if isinstance(x, int) and not isinstance(x, bool):
        return count(x)
    x = _number(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if not 1e-4 <= abs(x) < 1e7:
        mantissa, exponent = sci(x, digits).split("e")
        return f"{mantissa.rstrip('0').rstrip('.') if '.' in mantissa else mantissa}e{exponent}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
    text = f"{round(x, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fixed(x: Any, decimals: int = 2) -> str:
    """``x`` with exactly ``decimals`` decimals. ``fixed(0.1234, 3) == '0.123'``

    >>> fixed(0.1234, 3), fixed(2, 1)
    ('0.123', '2.0')
    """
    return f"{_number(x):.{decimals}f}"


def pct(x: Any, decimals: int = 1) -> str:
    """A fraction as a percentage. ``pct(0.1234) == '12.3%'``

    >>> pct(0.1234), pct(1, 0)
    ('12.3%', '100%')
    """
    return f"{100 * _number(x):.{decimals}f}%"


def times(x: Any, digits: int = 3) -> str:
    """A ratio with a multiplication sign. ``times(3.8912) == '3.89×'``

    >>> times(3.8912), times(1.0)
    ('3.89×', '1×')
    """
    return f"{num(_number(x), digits)}×"


def _decimals(x: float, digits: int) -> int:
    """Decimals that show ``x`` to ``digits`` significant digits (0 for whole-number precision)."""
    return max(digits - 1 - math.floor(math.log10(abs(x))), 0) if x else 0


def pm(mean: Any, std: Any, digits: int = 3) -> str:
    """``mean ± std``: the std to two significant digits and the mean to the same decimal place (or to ``digits``
    significant digits, where that is finer); the std is left out when it is NaN (one seed).

    >>> pm(0.5123, 0.0104), pm(6.98, 0.12), pm(1.005, 0.065), pm(0.5, float("nan")), pm(1280.0, 0.0)
    ('0.512 ± 0.010', '6.98 ± 0.12', '1.005 ± 0.065', '0.5', '1,280 ± 0')
    """
    mean, std = _number(mean), _number(std)
    if std != std:
        return num(mean, digits)
    plain = all(math.isfinite(x) and (x == 0 or 1e-4 <= abs(x) < 1e7) for x in (mean, std))
    if not plain or std == 0:
        return f"{num(mean, digits)} ± {num(std, 2)}"
    d = max(_decimals(std, 2), _decimals(mean, digits))
    return f"{round(mean, d):,.{d}f} ± {round(std, d):,.{d}f}"


def count(x: Any) -> str:
    """An integer with thousands separators. ``count(3274634.0) == '3,274,634'``

    >>> count(3274634.0)
    '3,274,634'
    """
    x = _number(x)
    if x != int(x):
        raise ProseError(f"count: {x!r} is not a whole number; use num or fixed")
    return f"{int(x):,}"


def signed(x: Any, digits: int = 2) -> str:
    """A difference with its sign. ``signed(-0.0151) == '−0.015'``

    >>> signed(-0.0151), signed(0.2)
    ('−0.015', '+0.2')
    """
    x = _number(x)
    return ("−" if x < 0 else "+") + num(abs(x), digits)


FILTERS = {"sci": sci, "num": num, "fixed": fixed, "pct": pct, "times": times, "pm": pm, "count": count,
           "signed": signed}


def environment() -> jinja2.Environment:
    """The Jinja environment the reports use: strict (an unknown key is an error), no autoescaping, the filters."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters.update(FILTERS)
    return env


def is_template(source: str) -> bool:
    """Whether a markdown cell's text holds a placeholder. ``is_template("{{ metrics.x }}") is True``"""
    return bool(_MARKER.search(source))


def fill(source: str, metrics: Mapping[str, Any], where: str = "a markdown cell") -> str:
    """Render one markdown template with ``metrics`` in scope.

    >>> fill("drift {{ metrics.d | sci }} in {{ metrics.n }} steps", {"d": 7.12e-7, "n": 40})
    'drift 7.1e-7 in 40 steps'
    >>> fill("{{ metrics.missing }}", {"d": 1})
    Traceback (most recent call last):
    ...
    study.report.prose.ProseError: a markdown cell: 'dict object' has no attribute 'missing' (in {{ metrics.missing }}); metrics has: d
    """
    env = environment()
    try:
        return env.from_string(source).render(metrics=metrics)
    except jinja2.TemplateSyntaxError as e:
        raise ProseError(f"{where}: cannot parse the template at line {e.lineno}: {e.message}") from None
    except (jinja2.UndefinedError, ProseError, TypeError, ValueError) as e:
        expressions = [m.strip() for m in re.findall(r"\{\{(.*?)\}\}", source)]
        culprit = next((x for x in expressions if _fails(env, x, metrics)), None)
        shown = f" (in {{{{ {culprit} }}}})" if culprit else ""
        keys = ", ".join(sorted(metrics)) or "nothing"
        raise ProseError(f"{where}: {e}{shown}; metrics has: {keys}") from None


def _fails(env: jinja2.Environment, expression: str, metrics: Mapping[str, Any]) -> bool:
    try:
        env.from_string("{{ " + expression + " }}").render(metrics=metrics)
    except Exception:
        return True
    return False


def fill_notebook(nb: Any, metrics: Mapping[str, Any]) -> int:
    """Fill every templated markdown cell of ``nb`` (in place); returns how many were filled.

    The template goes to ``cell.metadata.study.template``; a cell filled before is filled again from it.
    """
    filled = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        template = cell.get("metadata", {}).get("study", {}).get(TEMPLATE_KEY, cell.source)
        if not is_template(template):
            continue
        heading = next((line.strip("# ") for line in template.splitlines() if line.startswith("#")), "")
        where = f"markdown cell {index}" + (f" ({heading})" if heading else "")
        cell.source = fill(template, metrics, where)
        cell.setdefault("metadata", {}).setdefault("study", {})[TEMPLATE_KEY] = template
        filled += 1
    return filled


def fill_executed(executed: str | Path, metrics_path: str | Path) -> int:
    """Fill the markdown of an executed notebook file in place from ``metrics_path``; returns the cells filled.

    A notebook with templates but no ``metrics.json`` is an error (its last cell did not write one).
    """
    import nbformat

    executed, metrics_path = Path(executed), Path(metrics_path)
    nb = nbformat.read(executed, as_version=4)
    if not any(c.cell_type == "markdown" and is_template(c.source) for c in nb.cells):
        return 0
    if not metrics_path.is_file():
        raise ProseError(f"{executed.name}: its prose quotes the run's numbers, but the run wrote no {metrics_path.name}")
    filled = fill_notebook(nb, json.loads(metrics_path.read_text()))
    nbformat.write(nb, executed)
    return filled


_STRIP = [
    re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S),  # placeholders
    re.compile(r"```.*?```", re.S),  # fenced code
    re.compile(r"`[^`]*`"),  # inline code: literal values a reader copies
    re.compile(r"\$\$.*?\$\$|\$[^$]*\$", re.S),  # formulas
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"<[^>]+>"),  # html tags
]
_TYPED = re.compile(r"(?<![\w.\[])(?:\d+(?:\.\d+)?(?:e-?\d+|\s?%|\s?×|-fold)|\d+\.\d+|\.\d+)(?![\w\]])")


def lint_prose(source: str) -> list[str]:
    """Numbers typed into prose that look measured: decimals, percentages, ratios, ``1e-5``.

    Code spans, formulas and placeholders are not prose; whole numbers (counts, step numbers) are left alone.

    >>> lint_prose("moved 3.89× further, 12 % of them, in `lr = 0.1` steps, {{ metrics.x | num }}")
    ['3.89×', '12 %']
    """
    text = source
    for pattern in _STRIP:
        text = pattern.sub(" ", text)
    return [m.group(0) for m in _TYPED.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    """``python -m study.report.prose notebooks/01_adam_drift.ipynb results/01_adam_drift/metrics.json``"""
    import nbformat

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m study.report.prose NOTEBOOK.ipynb METRICS.json", file=sys.stderr)
        return 2
    nb = nbformat.read(args[0], as_version=4)
    try:
        fill_notebook(nb, json.loads(Path(args[1]).read_text()))
    except ProseError as e:
        print(f"prose: {e}", file=sys.stderr)
        return 1
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and "study" in cell.get("metadata", {}):
            print(f"--- markdown cell {index}\n{cell.source}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
