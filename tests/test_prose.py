"""Numbers in the reports' prose come from the run (``study.report.prose``)."""

import doctest
import re
from pathlib import Path

import nbformat
import pytest

from study.report import prose

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_prose_doctests():
    failed, attempted = doctest.testmod(prose, optionflags=doctest.ELLIPSIS)
    assert attempted >= 10 and failed == 0


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_measured_number_is_typed_into_the_prose(notebook):
    """Decimals, percentages and ratios in markdown cells and findings must be placeholders (or code spans, for
    constants a reader copies), so that a rerun can never leave a stale number in a sentence."""
    nb = nbformat.read(notebook, as_version=4)
    texts = {i: c.source for i, c in enumerate(nb.cells) if c.cell_type == "markdown"}
    texts.update(prose.finding_templates(nb))
    typed = {i: found for i, text in texts.items() if (found := prose.lint_prose(text))}
    assert not typed, f"{notebook.name}: numbers typed into the prose (cell: numbers): {typed}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_shows_its_findings_from_the_run_and_no_template_in_markdown(notebook):
    nb = nbformat.read(notebook, as_version=4)
    findings = prose.finding_templates(nb)
    assert len(findings) >= 3 and all(prose.is_template(t) for _, t in findings)
    assert all("finding" in nb.cells[i].metadata.get("tags", []) for i, _ in findings)
    assert not [c.source[:80] for c in nb.cells if c.cell_type == "markdown" and prose.is_template(c.source)]
    assert "prose.show_findings(metrics)" in [c for c in nb.cells if c.cell_type == "code"][-1].source


def test_a_missing_key_names_the_finding_the_expression_and_the_keys():
    with pytest.raises(prose.ProseError) as e:
        prose.fill("**Drift**: moved {{ metrics.moved | num }} and {{ metrics.gone.deep | num }}",
                   {"moved": 3, "other": 1},
                   prose._label("**Drift**: moved"))
    message = str(e.value)
    assert "finding “Drift”" in message
    assert "metrics.gone.deep" in message and "metrics has: moved, other" in message


def test_a_template_that_does_not_parse_is_an_error():
    with pytest.raises(prose.ProseError, match="cannot parse"):
        prose.fill("{{ metrics.x | }}", {"x": 1})
    with pytest.raises(prose.ProseError, match="cannot parse"):
        prose.finding("**Broken** {{ metrics.x | }}")


def test_a_non_number_given_to_a_number_filter_is_an_error():
    with pytest.raises(prose.ProseError, match="expected a number"):
        prose.fill("{{ metrics.x | sci }}", {"x": "seven"})


@pytest.mark.parametrize("template, value, expected", [
    ("at least {{ metrics.v | floor('pct', 0) }}", 0.9191, "at least 91%"),  # 05: was "at least 92%"
    ("at most {{ metrics.v | ceil('pct') }}", 0.0782, "at most 7.9%"),  # 05: was "at most 7.8%"
    ("at least {{ metrics.v | floor('num', 2) }}", 9.667, "at least 9.6"),  # 03: was "at least 9.7"
    ("up to {{ metrics.v | ceil('sci') }}", 1.12e-6, "up to 1.2e-6"),  # 01: was "up to 1.1e-6"
    ("at most {{ metrics.v | ceil('times', 2) }}", 4.24, "at most 4.3×"),
    ("at least {{ metrics.v | floor('fixed', 1) }}", -0.04, "at least -0.1"),
    ("at most {{ metrics.v | ceil('pct', 0) }}", 0.92, "at most 92%"),  # a value that prints exactly stays
    ("at most {{ metrics.v | ceil('num') }}", 12345678.0, "at most 1.24e7"),
])
def test_bounds_round_outward(template, value, expected):
    assert prose.fill(template, {"v": value}) == expected


def test_a_bound_in_an_unknown_style_is_an_error():
    with pytest.raises(prose.ProseError, match="the style must be one of"):
        prose.fill("{{ metrics.v | floor('percent') }}", {"v": 0.5})


def test_findings_are_filled_in_where_they_stand_when_the_run_records_its_metrics(capsys):
    """Outside a kernel the display falls back to text: first the pending line, then the filled-in finding."""
    prose._SHOWN.clear()
    prose._RECORDED.clear()
    prose.finding("**Drift** {{ metrics.d | sci }}")
    assert prose.PENDING in capsys.readouterr().out
    with pytest.raises(prose.ProseError, match="finding “Drift”"):
        prose.show_findings({"other": 1})  # nothing recorded for it: an error, and nothing filled in
    assert prose.show_findings({"d": 7.12e-7}) == 1
    assert "**Drift** 7.1e-7" in capsys.readouterr().out
    prose.finding("late {{ metrics.d | sci(3) }}")  # after the run recorded its metrics: filled in at once
    assert capsys.readouterr().out.strip() == "late 7.12e-7"
    prose._RECORDED.clear()


def test_a_notebook_run_the_plain_jupyter_way_shows_its_findings_filled_in(tmp_path):
    """nbclient alone, no pipeline: the display updates land in the executed notebook, and ``unfilled`` sees one
    finding that the last cell never filled in."""
    import nbclient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [new_code_cell("from study.report import prose"),
                new_code_cell('prose.finding(r"""**Drift** up to {{ metrics.d | ceil(\'sci\') }} in $W$.""")'),
                new_code_cell("metrics = {'d': 1.12e-6}\nprose.show_findings(metrics);"),
                new_code_cell('prose.finding("after the run: {{ metrics.d | sci }}")')]
    nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = [o["data"]["text/markdown"] for c in nb.cells for o in c.outputs if "text/markdown" in o.get("data", {})]
    assert shown == ["**Drift** up to 1.2e-6 in $W$.", "after the run: 1.1e-6"]
    assert prose.unfilled(nb) == []
    nb.cells[1].outputs[0]["data"]["text/markdown"] = prose.PENDING
    nb.cells.append(nbformat.v4.new_markdown_cell("raw {{ metrics.d }}"))
    assert len(prose.unfilled(nb)) == 2


def test_lint_ignores_code_formulas_links_and_whole_numbers():
    text = "In `lr = 0.1`, $\\beta_1 = 0.9$, [v0.2](http://x/1.5), step 2 of 40: {{ metrics.a | pct }}"
    assert prose.lint_prose(text) == []
    assert prose.lint_prose("about 0.5 of it, 25% and 1e-5, 2.7-fold") == ["0.5", "25%", "1e-5", "2.7-fold"]


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_the_smoke_reports_show_numbers_not_placeholders(smoke_results):
    for notebook in NOTEBOOKS:
        executed = nbformat.read(smoke_results / notebook.stem / f"{notebook.stem}.ipynb", as_version=4)
        assert prose.unfilled(executed) == [], notebook.stem
        shown = [o for c in executed.cells if "finding" in c.metadata.get("tags", []) for o in c.outputs]
        assert len(shown) == len(prose.finding_templates(nbformat.read(notebook, as_version=4))), notebook.stem
        page = (smoke_results / notebook.stem / f"{notebook.stem}.html").read_text(encoding="utf-8")
        assert not re.search(r"\{\{|\{%", page) and prose.PENDING not in page, notebook.stem


def test_every_printed_bound_is_checked_against_the_value_it_bounds(monkeypatch):
    from study.report import prose as prose_

    assert prose_.fill('between {{ metrics.lo | floor("num") }} and {{ metrics.hi | ceil("num") }} ms',
                       {"lo": 144.82142857, "hi": 162.49999}, "t") == "between 144 and 163 ms"
    assert prose_.fill('{{ metrics.r | floor("times", 3) }}', {"r": 0.64484}, "t") == "0.644×"
    monkeypatch.setitem(prose_.BOUND_STYLES, "num", lambda x, *a, rounding: prose_.num(x, *a))  # rounds to nearest
    with pytest.raises(prose_.ProseError, match=r"floor: printed 145 for 144\.82.*wrong side"):
        prose_.fill('{{ metrics.lo | floor("num") }}', {"lo": 144.82}, "t")


def test_equal_means_in_one_table_column_print_equally():
    import pandas as pd

    from study.report.reporting import display_table

    summary = pd.DataFrame({"method": ["var_list", "gate"], "acc_mean": [0.9446666, 0.9446667],
                            "acc_std": [0.0061101, 0.0100664]})
    shown = display_table(summary, {"acc": "accuracy"}, ["method"])["accuracy"].tolist()
    assert shown == ["0.9447 ± 0.0061", "0.9447 ± 0.0101"]
