"""Render an executed notebook as a clean, offline HTML report (inputs hidden, except the code to copy).

What the reader gets, and why:

* **Code to copy, and the checks**: a code cell's input is shown only when the cell is tagged ``show-input``
  (the technique on the page: the few lines a reader copies) or holds an ``assert`` (the assertion cells that
  check each finding against the run's numbers, which the intros describe). Set-up and sweeps stay hidden;
  their outputs (tables, figures, printed numbers) are what the report is for. Hidden cells get nbconvert's
  ``transient.remove_source`` flag in the report's copy only.
* **Title**: the notebook's first ``# `` heading (``<title>`` and browser tab), not nbconvert's "Notebook".
* **Summary first**: right after the title comes the notebook's ``## Summary`` section, moved up; a notebook
  without one gets a summary built from the openings of its labelled findings (``study.report.summary``).
* **No noise**: the executed ``.ipynb`` stays the honest record of the run (stderr, TensorFlow's log lines and
  warnings are kept there); only the *report* is filtered. ``clean_outputs`` drops ``stderr`` stream outputs and
  bare Python reprs (``PosixPath('...')``, ``<... object at 0x...>``, matplotlib artist reprs) that a cell's last
  expression left behind. The pipeline also starts the kernel with ``TF_CPP_MIN_LOG_LEVEL=2``.
* **Offline**: nothing is loaded from the network. nbconvert's ``lab`` template pulls require.js and MathJax
  from a CDN (and Mermaid / widget managers on demand); the ``study_report`` template below removes those
  blocks, so the page has no ``<script src>`` at all and opens from disk, e.g. from a zip or an air-gapped box.
* **Formulas**: LaTeX in markdown (``$...$``, ``$$...$$``, ``\\begin{...}``) and ``text/latex`` outputs is
  converted to MathML at render time with ``latex2mathml`` (pure Python, MIT, ~100 kB). Chosen over shipping
  MathJax: every current browser (Chromium 109+, Firefox, Safari) renders MathML natively, so the report needs
  no JavaScript, stays small, and stays one self-contained file; bundling MathJax 2 (``jupyter-server-mathjax``)
  would mean copying hundreds of files (fonts, extensions loaded at run time) next to every report in
  ``results/``, and it cannot be inlined into one file. The LaTeX source is kept in the MathML as an
  ``application/x-tex`` annotation; a formula latex2mathml cannot parse is shown as its LaTeX source in ``<code>``.
* **Alt text and captions**: every image output carries ``alt``: the caption ``reporting.save_figure`` attached to
  the output (``metadata["image/png"]["alt"]``), else "Figure N, section ...", never nbconvert's placeholder. A
  recorded caption is also shown as text under its figure.

``render_report(executed_ipynb, html_path)``; ``python -m study.report.html_report NB.ipynb OUT.html`` re-renders one.
"""

from __future__ import annotations

import ast
import copy
import html
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import nbformat
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

from study.report.summary import put_summary_first

SHOW_INPUT_TAG = "show-input"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")
PLACEHOLDER_ALT = "No description has been provided for this image"

_REPR_PATTERNS = [
    re.compile(r"(?:Pure)?(?:Posix|Windows)?Path\((?:'[^']*'|\"[^\"]*\")\)"),  # PosixPath('/a/b')
    re.compile(r"<[\w.]+(?: object)? at 0x[0-9a-fA-F]+>"),  # <foo.Bar object at 0x7f...>
    # [<matplotlib.lines.Line2D at 0x..>]
    re.compile(r"\[?(?:<matplotlib\.[\w.]+ (?:object )?at 0x[0-9a-fA-F]+>,?\s*)+\]?"),
    re.compile(r"<(?:Figure|Axes|AxesSubplot)\b[^<>]*>"),  # <Figure size 640x480 with 1 Axes>
    re.compile(r"Text\([^()]*\)"),  # Text(0.5, 1.0, 'title') from ax.set_title as a cell's last line
    re.compile(r"<IPython\.core\.display\.\w+ object>"),
]

_TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{# study_report: nbconvert's lab template, with every network fetch removed (see study.report.html_report). #}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
<style type="text/css">
math { font-size: 1.12em; }
math[display="block"] { display: block math; margin: 0.8em 0; overflow-x: auto; }
code.study-tex { white-space: pre-wrap; }
p.study-caption { font-size: 0.9em; color: #444; max-width: 60em; margin: 0.2em 0 1.2em 0; }
</style>
{%- endblock html_head_js_mathjax -%}
{% block data_png scoped %}{{ super() | with_alt(output | get_metadata('alt', 'image/png')) }}{{ output
    | get_metadata('caption', 'image/png') | figure_caption }}{% endblock data_png %}
{% block data_jpg scoped %}{{ super() | with_alt(output | get_metadata('alt', 'image/jpeg')) }}{{ output
    | get_metadata('caption', 'image/jpeg') | figure_caption }}{% endblock data_jpg %}
{% block data_svg scoped %}{{ super() | with_alt(output | get_metadata('alt', 'image/svg+xml')) }}{{ output
    | get_metadata('caption', 'image/svg+xml') | figure_caption }}
{%- endblock data_svg %}
{% block data_latex scoped %}
<div class="jp-RenderedLatex jp-OutputArea-output {{ extra_class }}" data-mime-type="text/latex">
{{ output.data['text/latex'] | latex_output_to_mathml }}
</div>
{%- endblock data_latex %}
"""


def latex_to_mathml(latex: str, display: bool) -> str:
    """MathML for one formula (LaTeX kept as an annotation); its escaped source in ``<code>`` if it cannot be parsed."""
    from latex2mathml.converter import convert

    source = latex.strip()
    try:
        mathml = convert(source, display="block" if display else "inline")
    except Exception:  # latex2mathml raises its own errors for unsupported or unbalanced input
        return f'<code class="study-tex">{html.escape(latex)}</code>'
    mathml = re.sub(r"<mi>&</mi>", "<mi>&amp;</mi>", mathml)  # latex2mathml leaves a bare & from "&"
    start = mathml.index(">") + 1
    end = mathml.rindex("</math>")
    annotation = f'<annotation encoding="application/x-tex">{html.escape(source, quote=False)}</annotation>'
    return f"{mathml[:start]}<semantics>{mathml[start:end]}{annotation}</semantics></math>"


def _latex_output_to_mathml(text: str) -> str:
    """A ``text/latex`` output (``$..$``, ``$$..$$``, ``\\[..\\]`` or an environment) as MathML."""
    text = text.strip()
    for left, right, display in (("$$", "$$", True), ("\\[", "\\]", True), ("$", "$", False), ("\\(", "\\)", False)):
        if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right):
            return latex_to_mathml(text[len(left):-len(right)], display)
    return latex_to_mathml(text, True)


class _MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer, with math written as MathML instead of left for MathJax."""

    def block_math(self, body: str) -> str:
        return latex_to_mathml(body, display=True)

    def inline_math(self, body: str) -> str:
        return latex_to_mathml(body, display=False)

    def latex_environment(self, name: str, body: str) -> str:
        return latex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

    def multiline_math(self, text: str) -> str:  # older mistune: the raw "$$...$$" paragraph
        stripped = text.strip()
        if stripped.startswith("$$") and stripped.endswith("$$"):
            return latex_to_mathml(stripped[2:-2], display=True)
        return text


def _with_alt(markup: str, alt: Any) -> str:
    """Put ``alt`` on the ``<img>`` in ``markup`` (nbconvert writes none, then its placeholder)."""
    if not alt:
        return markup
    attr = f'alt="{html.escape(str(alt), quote=True)}" '
    return re.sub(r"<img\s+(?![^>]*\balt=)", lambda m: m.group(0) + attr, markup, count=1)


def _figure_caption(caption: Any) -> str:
    """A figure's caption as visible text under it (the same text is its ``alt``)."""
    return f'<p class="study-caption">{html.escape(str(caption))}</p>' if caption else ""


class ReportExporter(HTMLExporter):
    """``HTMLExporter`` without prompts or network fetches, with MathML formulas and ``alt`` text from outputs.

    Inputs are hidden per cell by ``clean_outputs`` (all but ``show-input`` cells), not globally.
    """

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("exclude_input_prompt", True)
        kw.setdefault("exclude_output_prompt", True)
        super().__init__(extra_loaders=[jinja2.DictLoader({"study_report.html.j2": _TEMPLATE})],
                         template_file="study_report.html.j2", **kw)
        self.register_filter("with_alt", _with_alt)
        self.register_filter("figure_caption", _figure_caption)
        self.register_filter("latex_output_to_mathml", _latex_output_to_mathml)

    @jinja2.pass_context
    def markdown2html(self, context: Any, source: str) -> str:
        cell = context.get("cell", {})
        renderer = _MathMLRenderer(
            escape=False,
            attachments=cell.get("attachments", {}),
            embed_images=self.embed_images,
            path=context.get("resources", {}).get("metadata", {}).get("path", ""),
            anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links,
            **self.lexer_options,
        )
        return MarkdownWithMath(renderer=renderer).render(source)


@dataclass
class CleanReport:
    """What ``clean_outputs`` changed, for the pipeline's log line."""

    title: str
    stderr_dropped: int = 0
    reprs_dropped: int = 0
    alt_from_caption: int = 0
    alt_fallback: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)  # network URLs an output itself put in the page
    summary: str = "none"  # the summary first: "moved" (the notebook's own section), "built" (from its findings)


def _plain_heading(text: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links and images: keep their text
    text = re.sub(r"[`*_]+", "", text)
    return re.sub(r"\s+", " ", text).strip(" #")


def notebook_title(nb: Any, default: str = "") -> str:
    """The first ``# `` heading of the notebook's markdown cells, as plain text. ``notebook_title(nb, "01_x")``"""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            m = re.match(r"^ {0,3}#\s+(.+)$", line)
            if m:
                return _plain_heading(m.group(1)) or default
    return default


def _is_bare_repr(output: Any) -> bool:
    if output.get("output_type") not in ("execute_result", "display_data"):
        return False
    data = output.get("data", {})
    if set(data) != {"text/plain"}:
        return False
    text = data["text/plain"]
    text = "".join(text) if isinstance(text, list) else str(text)
    return any(p.fullmatch(text.strip()) for p in _REPR_PATTERNS)


def _alt(output: Any, mime: str) -> str | None:
    md = output.get("metadata", {})
    value = (md.get(mime) or {}).get("alt") if isinstance(md.get(mime), dict) else None
    value = value or md.get("alt")
    return str(value).strip() if value and str(value).strip() != PLACEHOLDER_ALT else None


def has_assertion(source: str) -> bool:
    """Whether a code cell holds an ``assert`` statement: an assertion cell, whose code the report shows (the
    intros say the assertions check each finding; a reader can see what they check)."""
    try:
        return any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(source)))
    except SyntaxError:
        return bool(re.search(r"(?m)^\s*assert\b", source))


def clean_outputs(nb: Any, default_title: str = "Study report") -> CleanReport:
    """Filter ``nb`` (in place) for the report: title, no stderr, no bare reprs, ``alt`` on every image, and
    every code cell's input hidden unless the cell is tagged ``show-input``."""
    report = CleanReport(title=notebook_title(nb, default_title))
    nb.metadata["title"] = report.title
    section, figure = report.title, 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            headings = re.findall(r"(?m)^ {0,3}#{1,6}\s+(.+)$", cell.source)
            if headings:
                section = _plain_heading(headings[-1])
            continue
        if cell.cell_type != "code":
            continue
        if SHOW_INPUT_TAG not in cell.get("metadata", {}).get("tags", []) and not has_assertion(cell.source):
            cell.setdefault("metadata", {}).setdefault("transient", {})["remove_source"] = True
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                report.stderr_dropped += 1
                continue
            if _is_bare_repr(output):
                report.reprs_dropped += 1
                continue
            for mime in IMAGE_TYPES:
                if mime in output.get("data", {}):
                    figure += 1
                    alt = _alt(output, mime)
                    caption = alt
                    if alt:
                        report.alt_from_caption += 1
                    else:
                        alt = f"Figure {figure}, in “{section}” (no caption recorded)"
                        report.alt_fallback.append(alt)
                    md = output.setdefault("metadata", {})
                    if not isinstance(md.get(mime), dict):
                        md[mime] = {}
                    md[mime]["alt"] = alt
                    if caption:
                        md[mime]["caption"] = caption  # shown under the figure, too
            kept.append(output)
        cell.outputs = kept
    return report


_FETCHING_TAGS = ("script", "link", "img", "iframe", "source", "embed", "object", "audio", "video", "track", "input")


def external_urls(page: str) -> list[str]:
    """``<tag attr=url>`` for every fetching tag whose ``src``/``href``/``data``/``poster`` leaves the machine."""
    from bs4 import BeautifulSoup

    found = []
    for tag in BeautifulSoup(page, "html.parser").find_all(_FETCHING_TAGS):
        for attr in ("src", "href", "data", "poster", "srcset"):
            value = str(tag.get(attr) or "").strip()
            if re.match(r"(?i)^(https?:)?//", value):
                found.append(f"<{tag.name} {attr}={value}>")
    return found


def _after_title(nb: Any) -> int:
    """The index right after the title heading. A title cell that goes on after its ``# `` line (an intro) is split
    in two, in the report's copy, so that what goes first comes before the intro."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.splitlines()
        h = next((k for k, line in enumerate(lines) if re.match(r"^ {0,3}#\s", line)), None)
        if h is None:
            continue
        rest = "\n".join(lines[h + 1:]).strip()
        if rest:
            cell.source = "\n".join(lines[:h + 1])
            nb.cells.insert(i + 1, nbformat.v4.new_markdown_cell(rest))
        return i + 1
    return 0


def render_report(executed: str | Path, html_path: str | Path | None = None,
                  nb: Any = None, note: str | None = None) -> tuple[str, CleanReport]:
    """Render ``executed`` (an .ipynb, left untouched) as HTML; write it to ``html_path`` if given. ``note``
    (Markdown, e.g. how the run was timed) is shown right after the cell holding the title."""
    executed = Path(executed)
    nb = copy.deepcopy(nb) if nb is not None else nbformat.read(executed, as_version=4)
    report = clean_outputs(nb, default_title=executed.stem)
    at = _after_title(nb)
    if note:
        nb.cells.insert(at, nbformat.v4.new_markdown_cell(note))
    report.summary = put_summary_first(nb, at)  # the summary before the note and everything else
    body, _ = ReportExporter().from_notebook_node(nb, resources={"metadata": {"name": report.title}})
    report.external = external_urls(body)
    if html_path is not None:
        from study.report.reporting import atomic_write

        atomic_write(html_path, lambda p: Path(p).write_text(body, encoding="utf-8"))
    return body, report


def main(argv: list[str] | None = None) -> int:
    """``python -m study.report.html_report results/01_adam_drift/01_adam_drift.ipynb out.html``"""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m study.report.html_report EXECUTED.ipynb OUT.html", file=sys.stderr)
        return 2
    _, report = render_report(args[0], args[1])
    print(f"{args[1]}: “{report.title}”; dropped {report.stderr_dropped} stderr and {report.reprs_dropped} repr "
          f"output(s); {len(report.alt_fallback)} image(s) without a caption")
    return 0


if __name__ == "__main__":
    sys.exit(main())
