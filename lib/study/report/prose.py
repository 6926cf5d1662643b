"""A report's findings, quoted from its own run: Markdown templates over ``metrics.json``, shown by code cells.

A finding's sentence quotes what the run measured, not a number typed when the notebook was written. In a
notebook, a code cell shows it::

    prose.finding(r'''
    **Adam's drift is predictable**: the closed form matches every frozen entry to
    {{ metrics.prediction_max_abs_error | sci }}, while the drift itself reaches
    {{ metrics.prediction_max_abs_drift | num(2) }}.
    ''')

and the notebook's last cell, once it has recorded ``metrics`` (what it writes to ``metrics.json``), calls
``show_findings(metrics)``: every finding shown so far is filled in where it stands (an IPython display update),
and a finding shown after that is filled in at once. So the numbers appear the same way in JupyterLab after "Run
All", under papermill or nbclient, and in the HTML report, with no step after the run; ``unfilled`` finds a
finding left without its numbers (or raw template syntax) in an executed notebook, and the pipeline refuses one.

A placeholder naming a key the run did not record stops the last cell with one message (the finding, the
expression, the keys there are): a report can neither publish a stale number nor a sentence without its number.
The assertion cell before each finding still guards its direction and size.

Filters (besides Jinja's own): ``num`` (significant digits, plain notation), ``sci`` (``7.1e-07`` as
``7.1e-7``), ``fixed`` (decimals), ``pct`` (a fraction as a percentage), ``times`` (a ratio, ``3.89×``),
``pm`` (``mean | pm(std)``), ``count`` (an integer with thousands separators), ``signed`` (``+0.015``), and for
bounds, which must round outward: ``floor`` ("at least": ``{{ m.min | floor("pct", 0) }}`` gives ``91%`` for
0.9191) and ``ceil`` ("at most", "up to": ``{{ m.max | ceil("sci") }}`` gives ``1.2e-6`` for 1.12e-6). Each bound is
checked as it is printed: the number shown is read back (``printed_value``) and must not lie inside the value it
bounds, or the finding fails with ``ProseError``. A range over runs ("from ... to ...", "between ... and ...") is two
bounds: its low end is a ``floor``, its high end a ``ceil``.
``lint_prose`` finds decimals, percentages and ratios typed into a notebook's prose instead.

``python -m study.report.prose NOTEBOOK.ipynb METRICS.json`` prints the notebook's findings filled in (or the error).
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

import jinja2

_MARKER = re.compile(r"\{\{|\{%")
FINDING_TAG = "finding"
"""The tag of a code cell that shows a finding (``finding(...)``): tests lint its template like prose."""
PENDING = "*(This finding quotes this run's numbers: it is filled in when the notebook's last cell has run.)*"
"""What a finding shows until ``show_findings`` fills it in."""
ROUNDINGS = {"nearest": None, "floor": ROUND_FLOOR, "ceil": ROUND_CEILING}


class ProseError(ValueError):
    """A markdown template names a value the run did not record, or cannot be parsed."""


def _number(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            return float(x)
        except (TypeError, ValueError):
            raise ProseError(f"expected a number, got {x!r}") from None
    return float(x)


def _rounding(rounding: str) -> str | None:
    if rounding not in ROUNDINGS:
        raise ProseError(f"rounding: expected one of {sorted(ROUNDINGS)}, got {rounding!r}")
    return ROUNDINGS[rounding]


def _directed(x: float, decimals: int, rounding: str) -> Decimal:
    """``x`` rounded to ``decimals`` decimals toward -inf (``ROUND_FLOOR``) or +inf (``ROUND_CEILING``), from its
    shortest decimal representation, so that a value that prints exactly is never moved."""
    return Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-decimals), rounding=rounding)


def sci(x: Any, digits: int = 2, rounding: str = "nearest") -> str:
    """``x`` in scientific notation with ``digits`` significant digits, without ``+``/leading zeros in the exponent.

    >>> sci(7.12e-07), sci(123456, 3), sci(0), sci(1.12e-6, rounding="ceil"), sci(9.96e-3, rounding="ceil")
    ('7.1e-7', '1.23e5', '0', '1.2e-6', '1.0e-2')
    """
    x, mode = _number(x), _rounding(rounding)
    if x == 0:
        return "0"
    if mode is None or not math.isfinite(x):
        mantissa, exponent = f"{x:.{max(digits - 1, 0)}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    exponent = Decimal(repr(x)).adjusted()
    mantissa = _directed(x / 10 ** exponent, max(digits - 1, 0), mode)
    if abs(mantissa) >= 10:  # 9.96 rounded up: 10.0 -> 1.0, one power higher
        exponent += 1
        mantissa = _directed(float(mantissa) / 10, max(digits - 1, 0), mode)
    return f"{mantissa:.{max(digits - 1, 0)}f}e{exponent}"


def num(x: Any, digits: int = 3, rounding: str = "nearest") -> str:
    """``x`` with ``digits`` significant digits in plain notation (``sci`` outside 1e-4 to 1e7); ints as counts.

    >>> num(3.8912), num(0.000712, 2), num(1532), num(2.0), num(1.5e-9), num(9.667, 2, "floor"), num(9.7, 2, "floor")
    ('3.89', '0.00071', '1,532', '2', '1.5e-9', '9.6', '9.7')
    """
    mode = _rounding(rounding)
    if isinstance(x, int) and not isinstance(x, bool):
        return count(x)
    x = _number(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if not 1e-4 <= abs(x) < 1e7:
        mantissa, exponent = sci(x, digits, rounding).split("e")
        return f"{mantissa.rstrip('0').rstrip('.') if '.' in mantissa else mantissa}e{exponent}"
    decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
    text = (f"{round(x, decimals):,.{decimals}f}" if mode is None
            else f"{_directed(x, decimals, mode):,.{decimals}f}")
    return text.rstrip("0").rstrip(".") if "." in text else text


def fixed(x: Any, decimals: int = 2, rounding: str = "nearest") -> str:
    """``x`` with exactly ``decimals`` decimals. ``fixed(0.1234, 3) == '0.123'``

    >>> fixed(0.1234, 3), fixed(2, 1), fixed(0.1231, 2, "ceil")
    ('0.123', '2.0', '0.13')
    """
    x, mode = _number(x), _rounding(rounding)
    if mode is None or not math.isfinite(x):
        return f"{x:.{decimals}f}"
    return f"{_directed(x, decimals, mode):.{decimals}f}"


def pct(x: Any, decimals: int = 1, rounding: str = "nearest") -> str:
    """A fraction as a percentage. ``pct(0.1234) == '12.3%'``

    >>> pct(0.1234), pct(1, 0), pct(0.9191, 0, "floor"), pct(0.0782, 1, "ceil"), pct(0.92, 0, "ceil")
    ('12.3%', '100%', '91%', '7.9%', '92%')
    """
    x, mode = _number(x), _rounding(rounding)
    if mode is None or not math.isfinite(x):
        return f"{100 * x:.{decimals}f}%"
    hundredfold = (Decimal(repr(x)) * 100).quantize(Decimal(1).scaleb(-decimals), rounding=mode)
    return f"{hundredfold:.{decimals}f}%"


def times(x: Any, digits: int = 3, rounding: str = "nearest") -> str:
    """A ratio with a multiplication sign. ``times(3.8912) == '3.89×'``

    >>> times(3.8912), times(1.0), times(4.2449, 2, "floor")
    ('3.89×', '1×', '4.2×')
    """
    return f"{num(_number(x), digits, rounding)}×"


def _decimals(x: float, digits: int) -> int:
    """Decimals that show ``x`` to ``digits`` significant digits (0 for whole-number precision)."""
    return max(digits - 1 - math.floor(math.log10(abs(x))), 0) if x else 0


def pm_decimals(mean: Any, std: Any, digits: int = 3) -> int | None:
    """The decimals ``pm`` shows ``mean ± std`` with (None where it uses another notation). Give the largest over a
    column to ``pm(..., decimals=)`` so that every row of it shows the same precision."""
    mean, std = _number(mean), _number(std)
    plain = all(math.isfinite(x) and (x == 0 or 1e-4 <= abs(x) < 1e7) for x in (mean, std))
    if std != std or not plain or std == 0:
        return None
    return max(_decimals(std, 2), _decimals(mean, digits))


def pm(mean: Any, std: Any, digits: int = 3, decimals: int | None = None) -> str:
    """``mean ± std``: the std to two significant digits and the mean to the same decimal place (or to ``digits``
    significant digits, where that is finer); the std is left out when it is NaN (one seed). ``decimals`` fixes
    the decimal places instead (a table column, so that equal means print equally).

    >>> pm(0.5123, 0.0104), pm(6.98, 0.12), pm(1.005, 0.065), pm(0.5, float("nan")), pm(1280.0, 0.0)
    ('0.512 ± 0.010', '6.98 ± 0.12', '1.005 ± 0.065', '0.5', '1,280 ± 0')
    >>> pm(0.94467, 0.0101, decimals=4), pm(0.94467, 0.0061, decimals=4), pm(0.4, 3.6e-8)
    ('0.9447 ± 0.0101', '0.9447 ± 0.0061', '0.400 ± 3.6e-8')
    """
    mean, std = _number(mean), _number(std)
    if std != std:
        return num(mean, digits) if decimals is None else f"{round(mean, decimals):,.{decimals}f}"
    d = pm_decimals(mean, std, digits) if decimals is None else decimals
    if d is None:
        if std != 0 and math.isfinite(mean) and 1e-4 <= abs(mean) < 1e7:  # a spread far below the mean's digits
            d = _decimals(mean, digits)
            return f"{round(mean, d):,.{d}f} ± {num(std, 2)}"
        return f"{num(mean, digits)} ± {num(std, 2)}"
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


def signed(x: Any, digits: int = 2, decimals: int | None = None, rounding: str = "nearest") -> str:
    """A difference with its sign, to ``digits`` significant digits or exactly ``decimals`` decimals (as a table
    column shows it); ``rounding`` as ``num``'s, applied to the signed value. ``signed(-0.0151) == '−0.015'``

    >>> signed(-0.0151), signed(0.2), signed(-0.37213, decimals=3), signed(-0.0336, 2, 3, "floor")
    ('−0.015', '+0.2', '−0.372', '−0.034')
    """
    x = _number(x)
    if x < 0:  # the magnitude rounds the other way
        rounding = {"floor": "ceil", "ceil": "floor"}.get(rounding, rounding)
    magnitude = num(abs(x), digits, rounding) if decimals is None else fixed(abs(x), decimals, rounding)
    return ("−" if x < 0 else "+") + magnitude


TIMING_TOLERANCE = 0.02
"""How far from 1 every measured ratio of two timed methods must be before the prose names the faster one: on this
shared 2-core machine an ordering with a smaller margin has flipped between reruns (02's masked_hold against the
gate, 0.14%; 04's persistent tape, 0.65× in one run and 0.96–1.00 in the three before)."""


def timing_side(low: Any, high: Any, tolerance: float = TIMING_TOLERANCE) -> str:
    """Which way a timing comparison goes, from the range of the ratio ``a / b`` over every interleaved round (or
    seed): ``"slower"`` when every ratio is above ``1 + tolerance``, ``"faster"`` when every one is below
    ``1 - tolerance``, else ``"about equal"`` (the rounds disagree, or the margin is within the machine's noise).
    NaN bounds (not measured) give ``"about equal"``.

    >>> timing_side(1.08, 1.3), timing_side(0.6, 0.7), timing_side(0.95, 1.04), timing_side(0.9986, 0.9990)
    ('slower', 'faster', 'about equal', 'about equal')
    """
    low, high = _number(low), _number(high)
    if low > 1 + tolerance:
        return "slower"
    if high < 1 - tolerance:
        return "faster"
    return "about equal"


BOUND_STYLES: dict[str, Callable[..., str]] = {"num": num, "sci": sci, "fixed": fixed, "pct": pct, "times": times,
                                               "signed": signed}
"""The formats a bound can be written in: ``floor``/``ceil`` take one of these names, then its arguments."""


def floor(x: Any, style: str = "num", *args: Any) -> str:
    """A lower bound ("at least"): ``x`` in ``style`` (``num``, ``sci``, ``fixed``, ``pct``, ``times``, with that
    format's arguments), rounded toward -inf, so the printed bound is never above the value.

    >>> floor(0.9191, "pct", 0), floor(9.667, "num", 2), floor(0.92, "pct", 0)
    ('91%', '9.6', '92%')
    """
    return _bound(x, style, args, "floor")


def ceil(x: Any, style: str = "num", *args: Any) -> str:
    """An upper bound ("at most", "up to"): like ``floor``, rounded toward +inf.

    >>> ceil(0.0782, "pct"), ceil(1.12e-6, "sci"), ceil(7.8e-2, "pct")
    ('7.9%', '1.2e-6', '7.8%')
    """
    return _bound(x, style, args, "ceil")


def printed_value(text: str) -> float:
    """The number a formatted string shows: ``printed_value("1,234.5×") == 1234.5``; ``"12.5%"`` is 0.125.

    >>> printed_value("7.2e-7"), printed_value("91%"), printed_value("−0.015"), printed_value("1,532")
    (7.2e-07, 0.91, -0.015, 1532.0)
    """
    plain = text.strip().replace(",", "").replace("−", "-").rstrip("×")
    if plain.endswith("%"):
        return float(Decimal(plain[:-1]) / 100)
    return float(plain)


def _bound(x: Any, style: str, args: tuple[Any, ...], rounding: str) -> str:
    """``x`` formatted as a bound, and checked: the printed number is never on the wrong side of ``x``."""
    if style not in BOUND_STYLES:
        raise ProseError(f"{rounding}: the style must be one of {sorted(BOUND_STYLES)}, got {style!r}")
    text = BOUND_STYLES[style](x, *args, rounding=rounding)
    value = _number(x)
    if math.isfinite(value):
        shown = printed_value(text)
        if (shown > value) if rounding == "floor" else (shown < value):
            raise ProseError(f"{rounding}: printed {text} for {value!r}, on the wrong side of it")
    return text


FILTERS = {"sci": sci, "num": num, "fixed": fixed, "pct": pct, "times": times, "pm": pm, "count": count,
           "signed": signed, "floor": floor, "ceil": ceil, "timing_side": timing_side}


def environment() -> jinja2.Environment:
    """The Jinja environment the reports use: strict (an unknown key is an error), no autoescaping, the filters."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters.update(FILTERS)
    return env


def is_template(source: str) -> bool:
    """Whether a markdown cell's text holds a placeholder. ``is_template("{{ metrics.x }}") is True``"""
    return bool(_MARKER.search(source))


def fill(source: str, metrics: Mapping[str, Any], where: str = "a finding") -> str:
    """Render one Markdown template with ``metrics`` in scope.

    >>> fill("drift {{ metrics.d | sci }} in {{ metrics.n }} steps", {"d": 7.12e-7, "n": 40})
    'drift 7.1e-7 in 40 steps'
    >>> fill("{{ metrics.missing }}", {"d": 1})  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    study.report.prose.ProseError: a finding: 'dict object' has no attribute 'missing' (in {{ metrics.missing }});
    metrics has: d
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


def _label(template: str) -> str:
    """A finding's name for messages: its first bold phrase, else its first words."""
    bold = re.search(r"\*\*(.+?)\*\*", template, re.S)
    text = bold.group(1) if bold else template.strip()
    text = re.sub(r"\s+", " ", text)
    return f"finding “{text[:70]}{'…' if len(text) > 70 else ''}”"


_SHOWN: list[tuple[str, Any]] = []
"""The findings shown in this kernel and not yet filled in: (template, its display handle)."""
_RECORDED: dict[str, Any] = {}
"""The metrics ``show_findings`` filled them in with: a finding shown after that is filled in at once."""


def _markdown(text: str) -> Any:
    """IPython's ``Markdown`` whose plain-text form is the text itself, not ``<...Markdown object>``: what a console
    or a plain ``python`` run prints, and what an output's ``text/plain`` holds."""
    from IPython.display import Markdown

    class Finding(Markdown):
        def __repr__(self) -> str:
            return self.data

    return Finding(text)


def finding(template: str) -> None:
    """Show a finding here: a Markdown template over the run's ``metrics`` (see the module docstring).

    Until ``show_findings(metrics)`` has run, the finding shows ``PENDING``; afterwards it is filled in at once.
    A template that does not parse is an error here, before the run goes on.
    """
    from IPython.display import display

    try:
        environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise ProseError(f"{_label(template)}: cannot parse the template at line {e.lineno}: {e.message}") from None
    if _RECORDED:
        display(_markdown(fill(template, _RECORDED, _label(template))))
        return
    _SHOWN.append((template, display(_markdown(PENDING), display_id=True)))


def show_findings(metrics: Mapping[str, Any]) -> int:
    """Fill in every finding shown so far with ``metrics`` (what the run records in ``metrics.json``), where it
    stands; returns how many. A placeholder naming a key that ``metrics`` lacks raises ``ProseError`` naming it."""
    filled = [(handle, fill(template, metrics, _label(template))) for template, handle in _SHOWN]  # all checked first
    from IPython import get_ipython

    for handle, text in filled:
        if get_ipython() is None:  # a plain python run: nothing to update in place, so print the filled finding
            print(text)
        elif handle is not None:
            handle.update(_markdown(text))
    _SHOWN.clear()
    _RECORDED.clear()
    _RECORDED.update(metrics)
    return len(filled)


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def unfilled(nb: Any) -> list[str]:
    """Where an executed notebook shows template syntax or a finding still waiting for its numbers: markdown cells
    and every output's text. ``unfilled(nbformat.read("results/01_adam_drift/01_adam_drift.ipynb", 4)) == []``"""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and is_template(cell.source):
            found.append(f"markdown cell {index} holds template syntax: {cell.source.strip()[:80]!r}")
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts = [_text(v) for k, v in output.get("data", {}).items() if k.startswith("text/")]
            texts += [_text(output["text"])] if "text" in output else []
            for text in texts:
                if is_template(text) or PENDING in text:
                    what = "a finding without its numbers" if PENDING in text else "template syntax"
                    found.append(f"cell {index} shows {what}: {text.strip()[:80]!r}")
                    break
    return found


def finding_templates(nb: Any) -> list[tuple[int, str]]:
    """The template of every finding cell of a notebook (a code cell calling ``finding`` with a string literal):
    (cell index, template). ``finding_templates(nbformat.read("notebooks/01_adam_drift.ipynb", 4))``"""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "finding(" not in cell.source:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "finding"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.append((index, node.args[0].value))
    return found


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
    metrics = json.loads(Path(args[1]).read_text())
    try:
        filled = [(index, fill(template, metrics, _label(template))) for index, template in finding_templates(nb)]
    except ProseError as e:
        print(f"prose: {e}", file=sys.stderr)
        return 1
    for index, text in filled:
        print(f"--- cell {index}\n{text.strip()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
