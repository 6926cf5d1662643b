"""A study's summary and its main finding, read from the executed notebook (never typed in).

The findings of a study are the Markdown outputs of its cells tagged ``finding`` (``study.report.prose``): the
run's own numbers, filled into the notebook's prose. This module picks from them what a reader should see first.

* **The summary section** (``summary_span``): a ``## Summary`` heading and the cells under it, up to the next
  heading of level 1 or 2. ``html_report`` moves it right after the title.
* **A summary built from the findings** (``findings_summary``), for a notebook without such a section: the opening
  of each finding that carries a ``**Finding**`` label, in order, as a Markdown list.
* **The main finding** (``main_finding``): the first item of the summary section, else the first labelled
  finding; its first sentences, as one line for ``index.html``'s "start here".

``main_finding(nbformat.read("results/01_adam_drift/01_adam_drift.ipynb", as_version=4))``
"""

from __future__ import annotations

import re
from typing import Any

FINDING_TAG = "finding"
SUMMARY_HEADING = "summary"
"""The ``##`` heading (any case) whose section is the notebook's summary."""
MAX_CHARS = 160
"""A main finding or a summary item is cut after the sentence that passes this many characters."""

_HEADING = re.compile(r"(?m)^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_LABEL = re.compile(r"^\s*\*\*(?:Findings?|Finding:)[^*]*\*\*[.:]?\s*", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(\[])")


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _headings(cell: Any) -> list[tuple[int, str]]:
    if cell.get("cell_type") != "markdown":
        return []
    return [(len(m.group(1)), m.group(2)) for m in _HEADING.finditer(_text(cell.get("source", "")))]


def finding_text(cell: Any) -> str | None:
    """The Markdown a ``finding`` cell displayed (its first ``text/markdown`` output), or None."""
    if cell.get("cell_type") != "code" or FINDING_TAG not in cell.get("metadata", {}).get("tags", []):
        return None
    for output in cell.get("outputs", []):
        markdown = output.get("data", {}).get("text/markdown")
        if markdown:
            return _text(markdown).strip()
    return None


def summary_span(nb: Any) -> tuple[int, int] | None:
    """``(start, end)``: the cells of the ``## Summary`` section (heading cell included), or None without one."""
    cells = nb.cells
    for start, cell in enumerate(cells):
        if any(level <= 2 and title.strip(" .:").lower() == SUMMARY_HEADING for level, title in _headings(cell)):
            end = next((i for i in range(start + 1, len(cells)) if any(lvl <= 2 for lvl, _ in _headings(cells[i]))),
                       len(cells))
            return start, end
    return None


def opening(markdown: str, max_chars: int = MAX_CHARS) -> str:
    """The first sentences of ``markdown`` (label such as ``**Finding.**`` removed, lines joined), cut after the
    sentence that passes ``max_chars``. ``opening("**Finding.** A is 1. B is 2.", 5) == "A is 1."``"""
    text = re.sub(r"\s+", " ", _LABEL.sub("", markdown.strip())).strip()
    out = ""
    for sentence in _SENTENCE_END.split(text):
        out = f"{out} {sentence}".strip()
        if len(out) >= max_chars:
            break
    return out


def _items(markdown: str) -> list[str]:
    """The top-level items of a Markdown list (``*`` or ``-``), or the whole text when it is not a list."""
    items = re.split(r"(?m)^[*-]\s+", markdown.strip())
    items = [i.strip() for i in items if i.strip()]
    return items if re.match(r"^[*-]\s", markdown.strip()) else [markdown.strip()]


def labelled_findings(nb: Any) -> list[str]:
    """The Markdown of every finding that opens with a ``**Finding**`` / ``**Findings**`` label, in order."""
    texts = [finding_text(cell) for cell in nb.cells]
    return [t for t in texts if t and _LABEL.match(t)]


def findings_summary(nb: Any) -> str | None:
    """A Markdown list: the opening of each labelled finding, or None when the notebook has none."""
    openings = []
    for text in labelled_findings(nb):
        items = _items(_LABEL.sub("", text))
        openings.append(opening(items[0]))
    return "\n".join(f"- {o}" for o in openings if o) or None


def main_finding(nb: Any) -> str | None:
    """One line of Markdown: the first item of the summary section, else the first labelled finding's opening."""
    span = summary_span(nb)
    if span is not None:
        for cell in nb.cells[span[0]:span[1]]:
            text = finding_text(cell) or (_text(cell.get("source", "")) if cell.get("cell_type") == "markdown" else "")
            text = _HEADING.sub("", text).strip()
            if text:
                return opening(_items(text)[0])
    found = labelled_findings(nb)
    return opening(_items(_LABEL.sub("", found[0]))[0]) if found else None


BUILT_INTRO = "The opening of each finding below, in order, as this run filled it in."


def put_summary_first(nb: Any, at: int) -> str:
    """Move the summary section to cell index ``at`` (right after the title), or, without one, insert there a
    ``## Summary`` cell built from the labelled findings. Returns ``"moved"``, ``"built"`` or ``"none"``."""
    import nbformat

    span = summary_span(nb)
    if span is not None:
        start, end = span
        if start <= at:
            return "moved"  # already at the top
        section = nb.cells[start:end]
        nb.cells = nb.cells[:at] + section + nb.cells[at:start] + nb.cells[end:]
        return "moved"
    built = findings_summary(nb)
    if built is None:
        return "none"
    nb.cells.insert(at, nbformat.v4.new_markdown_cell(f"## Summary\n\n*{BUILT_INTRO}*\n\n{built}"))
    return "built"


def anchor(heading: str) -> str:
    """The ``id`` nbconvert gives a heading: its plain text with spaces as ``-`` (``"Which method?"`` ->
    ``"Which-method?"``)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*_]+", "", text).strip()
    return re.sub(r"\s+", "-", text)


def section_anchor(nb: Any, pattern: str) -> str | None:
    """The anchor of the first heading matching ``pattern`` (a regular expression, any case), or None."""
    for cell in nb.cells:
        for _, title in _headings(cell):
            if re.search(pattern, title, re.I):
                return anchor(title)
    return None
