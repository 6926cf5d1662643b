"""Numbers in the reports' prose come from the run (``study.report.prose``)."""

import doctest
import json
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
    """Decimals, percentages and ratios in markdown must be placeholders (or code spans, for constants a
    reader copies), so that a rerun can never leave a stale number in a sentence."""
    nb = nbformat.read(notebook, as_version=4)
    typed = {i: prose.lint_prose(c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"}
    typed = {i: found for i, found in typed.items() if found}
    assert not typed, f"{notebook.name}: numbers typed into markdown cells (cell: numbers): {typed}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_quotes_its_findings_from_the_run(notebook):
    nb = nbformat.read(notebook, as_version=4)
    assert sum(prose.is_template(c.source) for c in nb.cells if c.cell_type == "markdown") >= 3


def _notebook(*markdown: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(m) for m in markdown] + [nbformat.v4.new_code_cell("x = 1")]
    return nb


def test_fill_notebook_fills_templates_keeps_them_and_can_fill_again():
    nb = _notebook("# Title\n\nDrift {{ metrics.drift | sci }} over {{ metrics.steps }} steps.", "No numbers.")
    assert prose.fill_notebook(nb, {"drift": 7.12e-7, "steps": 40}) == 1
    assert nb.cells[0].source == "# Title\n\nDrift 7.1e-7 over 40 steps."
    assert nb.cells[1].source == "No numbers." and "study" not in nb.cells[1].metadata
    assert prose.fill_notebook(nb, {"drift": 2.5e-6, "steps": 10}) == 1  # from the kept template
    assert nb.cells[0].source == "# Title\n\nDrift 2.5e-6 over 10 steps."


def test_a_missing_key_names_the_cell_the_expression_and_the_keys():
    nb = _notebook("## 4. Drift\n\nmoved {{ metrics.moved | num }} and {{ metrics.gone.deep | num }}")
    with pytest.raises(prose.ProseError) as e:
        prose.fill_notebook(nb, {"moved": 3, "other": 1})
    message = str(e.value)
    assert "markdown cell 0 (4. Drift)" in message
    assert "metrics.gone.deep" in message and "metrics has: moved, other" in message


def test_a_template_that_does_not_parse_is_an_error():
    with pytest.raises(prose.ProseError, match="cannot parse"):
        prose.fill("{{ metrics.x | }}", {"x": 1})


def test_a_non_number_given_to_a_number_filter_is_an_error():
    with pytest.raises(prose.ProseError, match="expected a number"):
        prose.fill("{{ metrics.x | sci }}", {"x": "seven"})


def test_fill_executed_writes_the_file_and_needs_the_metrics(tmp_path):
    path = tmp_path / "nb.ipynb"
    nbformat.write(_notebook("ratio {{ metrics.r | times }}"), path)
    with pytest.raises(prose.ProseError, match="wrote no metrics.json"):
        prose.fill_executed(path, tmp_path / "metrics.json")
    (tmp_path / "metrics.json").write_text(json.dumps({"r": 3.8912}))
    assert prose.fill_executed(path, tmp_path / "metrics.json") == 1
    assert nbformat.read(path, as_version=4).cells[0].source == "ratio 3.89×"


def test_lint_ignores_code_formulas_links_and_whole_numbers():
    text = "In `lr = 0.1`, $\\beta_1 = 0.9$, [v0.2](http://x/1.5), step 2 of 40: {{ metrics.a | pct }}"
    assert prose.lint_prose(text) == []
    assert prose.lint_prose("about 0.5 of it, 25% and 1e-5, 2.7-fold") == ["0.5", "25%", "1e-5", "2.7-fold"]


def test_the_smoke_reports_show_numbers_not_placeholders(smoke_results):
    for notebook in NOTEBOOKS:
        executed = nbformat.read(smoke_results / notebook.stem / f"{notebook.stem}.ipynb", as_version=4)
        filled = [c for c in executed.cells if c.cell_type == "markdown" and "study" in c.metadata]
        assert filled, notebook.stem
        for cell in filled:
            assert not prose.is_template(cell.source), (notebook.stem, cell.source[:200])
        page = (smoke_results / notebook.stem / f"{notebook.stem}.html").read_text(encoding="utf-8")
        assert not re.search(r"\{\{|\{%", page), notebook.stem
