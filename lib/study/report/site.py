"""The pages over every study in a results folder: ``index.html``, ``SUMMARY.md`` and ``COLUMNS.md``.

``index.html``: one offline page over every study.

It opens with "start here": one line per study with its main finding, as the run filled it into the executed
notebook (``study.report.summary.main_finding``), and a link to the which-method table (the report section headed
"Which method ...", and its ``which_method.csv``). Then, per study (in ``manifest.json`` order): its title, how and when
it ran, its headline table (``metrics.json`` key
``headline``, a flat dict), thumbnails of its figures linking to the PNGs (alt text = the caption
``reporting.save_figure`` recorded), and links to its HTML report, executed notebook and tables. Plain HTML and
inline CSS, no script, relative links only, so it works opened from disk. The pipeline rewrites it (atomically)
after every notebook; ``python -m study.report.site results`` rebuilds it from what is there.

``SUMMARY.md``: each study's headline numbers, the command, time and machine. ``COLUMNS.md``: the data dictionary
of every CSV table, from the descriptions ``reporting.save_table(..., columns=...)`` recorded. ``write_pages``
writes all three; a page whose text is unchanged is not rewritten.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from study.report.cache import machine_line
from study.report.load import describe as describe_load
from study.report.reporting import NOT_DESCRIBED, figure_captions, read_json, table_columns, write_text
from study.report.summary import main_finding, section_anchor

INDEX = "index.html"
REPRODUCTION = "REPRODUCTION.md"
WHICH_METHOD = r"^which method"
"""A report section whose heading matches this (any case) is the which-method table "start here" links to."""
WHICH_METHOD_TABLE = "which_method.csv"

_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 1.5em 2em 3em; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; }
h2 { font-size: 1.3em; margin: 0 0 0.3em; }
section.study { border-top: 1px solid #ccc; padding: 1.2em 0 0.6em; }
p.meta { color: #555; font-size: 0.9em; margin: 0 0 0.8em; }
p.links a { margin-right: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.value { font-variant-numeric: tabular-nums; white-space: nowrap; }
.figures { display: flex; flex-wrap: wrap; gap: 14px; margin: 0; padding: 0; list-style: none; }
.figures figure { margin: 0; width: 320px; }
.figures img { width: 320px; height: 210px; object-fit: contain; border: 1px solid #ddd; background: #fff; }
.figures figcaption { font-size: 0.82em; color: #444; margin-top: 0.2em; }
.missing { color: #a00; }
section.start { background: #f6f8fa; border: 1px solid #d8dee4; padding: 0.6em 1.2em 0.4em; margin: 0.8em 0 1.2em; }
section.start li { margin: 0.35em 0; }
"""


def _url(*parts: str) -> str:
    """A relative URL from path parts, each percent-encoded (spaces, #, ? ...)."""
    return "/".join(quote(p) for p in parts)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def study_title(folder: Path, name: str, entry: dict[str, Any] | None = None) -> str:
    """The study's title: the manifest's, else the executed notebook's first ``# `` heading, else ``name``."""
    if entry and entry.get("title"):
        return str(entry["title"])
    nb_path = folder / f"{name}.ipynb"
    if nb_path.is_file():
        try:
            import nbformat

            from study.report.html_report import notebook_title

            return notebook_title(nbformat.read(nb_path, as_version=4), name)
        except Exception:  # an unreadable notebook only costs the nice title
            pass
    return name


def _png_description(path: Path) -> str | None:
    try:
        from PIL import Image

        with Image.open(path) as im:
            text = getattr(im, "text", {}) or {}
        value = text.get("Description")
        return str(value).strip() or None if value else None
    except Exception:
        return None


def figures(folder: Path) -> list[tuple[str, str]]:
    """``[(file, caption)]``: the PNGs in ``folder``, in the order the notebook saved them, with their captions."""
    captions = figure_captions(folder)
    pngs = {p.name for p in folder.glob("*.png") if p.is_file()}
    ordered = [f for f in captions if f in pngs] + sorted(pngs - set(captions))
    out = []
    for f in ordered:
        caption = captions.get(f) or _png_description(folder / f) or Path(f).stem.replace("_", " ").capitalize()
        out.append((f, caption))
    return out


def _notebook(folder: Path, name: str) -> Any:
    """The executed notebook ``folder/name.ipynb``, or None when it is missing or unreadable."""
    path = folder / f"{name}.ipynb"
    if not path.is_file():
        return None
    try:
        import nbformat

        return nbformat.read(path, as_version=4)
    except Exception:  # an unreadable notebook only costs its line in "start here"
        return None


def _inline(markdown: str) -> str:
    """One line of Markdown as HTML: escaped, with `code`, **bold** and *emphasis* kept."""
    out = _e(markdown)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<em>\1</em>", out)


def _start_here(out: Path, names: list[str], manifest: dict[str, Any]) -> str:
    """The "start here" section: each study's main finding, and where the which-method table is."""
    items, which = [], []
    for name in names:
        folder = out / name
        nb = _notebook(folder, name)
        finding = main_finding(nb) if nb is not None else None
        title = _e(study_title(folder, name, manifest.get(name) or {}))
        text = _inline(finding) if finding else '<span class="missing">no finding recorded</span>'
        items.append(f'<li><a href="#{_e(name)}">{title}</a>: {text}</li>')
        section = section_anchor(nb, WHICH_METHOD) if nb is not None else None
        if section and (folder / f"{name}.html").is_file():
            which.append(f'<a href="{_url(name, name + ".html")}#{quote(section, safe="-?.,:()")}">'
                         f"{title}, section “{_e(section.replace('-', ' '))}”</a>")
        if (folder / WHICH_METHOD_TABLE).is_file():
            which.append(f'<a href="{_url(name, WHICH_METHOD_TABLE)}">{_e(WHICH_METHOD_TABLE)}</a>')
    line = (f'<p>Which method for which job: {" and ".join(which)}.</p>' if which else "")
    return ('<section class="start" id="start-here">\n<h2>Start here</h2>\n'
            "<p class=\"meta\">Each study's main finding, in the words and numbers its run filled in.</p>\n"
            f'<ul>\n{chr(10).join(items)}\n</ul>\n{line}\n</section>')


def _study_section(out: Path, name: str, entry: dict[str, Any]) -> str:
    folder = out / name
    title = study_title(folder, name, entry)
    parts = [f'<section class="study" id="{_e(name)}">', f"<h2>{_e(title)}</h2>"]
    if not folder.is_dir():
        parts.append(f'<p class="missing">{_e(name)}/ is missing from this folder.</p></section>')
        return "\n".join(parts)
    meta = [f"<code>{_e(name)}</code>"]
    if entry:
        meta.append(f"profile {_e(entry.get('profile', '?'))}")
        if "duration_s" in entry:
            meta.append(f"{_e(entry['duration_s'])} s")
        if entry.get("finished_at"):
            meta.append(f"finished {_e(entry['finished_at'])}")
        commit = str(entry.get("commit", "unknown"))
        meta.append(f"commit {_e(commit[:10])}{' + local changes' if entry.get('dirty') else ''}")
        if entry.get("data_source"):
            meta.append(f"data: {_e(entry['data_source'])}")
        meta.append(f"machine while it ran: {_e(describe_load(entry.get('load')))}")
    parts.append(f'<p class="meta">{" · ".join(meta)}</p>')

    links = []
    for file, label in ((f"{name}.html", "HTML report"), (f"{name}.ipynb", "executed notebook"),
                        ("metrics.json", "metrics.json")):
        if (folder / file).is_file():
            links.append(f'<a href="{_url(name, file)}">{_e(label)}</a>')
    if links:
        parts.append(f'<p class="links">{"".join(links)}</p>')

    metrics = read_json(folder / "metrics.json")
    headline = metrics.get("headline") if isinstance(metrics, dict) else None
    if isinstance(headline, dict) and headline:
        rows = "\n".join(f'<tr><td>{_e(k)}</td><td class="value">{_e(v)}</td></tr>' for k, v in headline.items())
        parts.append(f'<table><thead><tr><th scope="col">measurement</th><th scope="col">value</th></tr></thead>'
                     f"<tbody>\n{rows}\n</tbody></table>")
    else:
        parts.append('<p class="meta">No headline recorded (metrics.json has no <code>headline</code>).</p>')

    figs = figures(folder)
    if figs:
        items = []
        for file, caption in figs:
            href = _url(name, file)
            items.append(f'<li><figure><a href="{href}"><img src="{href}" alt="{_e(caption)}" loading="lazy"></a>'
                         f"<figcaption>{_e(caption)}</figcaption></figure></li>")
        parts.append(f'<ul class="figures">\n' + "\n".join(items) + "\n</ul>")
    tables = sorted(p.name for p in folder.glob("*.csv"))
    if tables:
        dictionary = (f' (<a href="{_url("COLUMNS.md")}#{quote(name)}">what the columns mean</a>)'
                      if (out / "COLUMNS.md").is_file() else "")
        parts.append('<p class="meta">Tables: ' + ", ".join(
            f'<a href="{_url(name, t)}">{_e(t)}</a>' for t in tables) + dictionary + "</p>")
    parts.append("</section>")
    return "\n".join(parts)


def render_index(out: Path) -> str:
    """The HTML of ``out/index.html`` (see the module docstring)."""
    out = Path(out)
    manifest = read_json(out / "manifest.json")
    manifest = manifest if isinstance(manifest, dict) else {}
    names = list(manifest)
    sections = [_study_section(out, name, manifest.get(name) or {}) for name in names]
    toc = "".join(f'<li><a href="#{_e(n)}">{_e(study_title(out / n, n, manifest.get(n) or {}))}</a></li>'
                  for n in names)
    summary = ' See also <a href="SUMMARY.md">SUMMARY.md</a>.' if (out / "SUMMARY.md").is_file() else ""
    if (out / REPRODUCTION).is_file():
        summary += (f' How close the last rerun on each machine came to the committed results: '
                    f'<a href="{REPRODUCTION}">{REPRODUCTION}</a>.')
    body = "\n".join(sections) if sections else "<p>No study has finished in this folder yet.</p>"
    start = _start_here(out, names, manifest) if names else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Study results</title>
<style>{_CSS}</style>
</head>
<body>
<header>
<h1>Study results</h1>
{start}
<p class="meta">Generated by <code>python -m study.report</code> from <code>manifest.json</code> and each study's
<code>metrics.json</code>; do not edit. Everything here is local: it opens from disk.{summary}</p>
<ol>{toc}</ol>
</header>
<main>
{body}
</main>
</body>
</html>
"""


def write_index(out: str | Path) -> Path:
    """Write ``out/index.html`` atomically (unless unchanged). ``write_index("results")``"""
    out = Path(out)
    return write_text(out / INDEX, render_index(out))


def write_summary(out: Path) -> Path:
    """Write ``out/SUMMARY.md``: each notebook's headline numbers,
    the command, time and machine. ``write_summary(out)``"""
    manifest = json.loads((out / "manifest.json").read_text())
    lines = ["# Results summary", "",
             "Generated by `python -m study.report` from each notebook's `metrics.json` (key `headline`); do not edit. "
             "Figures, headlines and reports on one page, offline: [index.html](index.html). "
             "What every column of every table means, with units: [COLUMNS.md](COLUMNS.md)."
             + (" How close the last rerun on each machine came to the committed results: "
                "[REPRODUCTION.md](REPRODUCTION.md)." if (out / REPRODUCTION).is_file() else ""), ""]
    for name, entry in manifest.items():
        metrics_path = out / name / "metrics.json"
        headline = json.loads(metrics_path.read_text()).get("headline", {}) if metrics_path.is_file() else {}
        packages = entry["packages"]
        title = entry.get("title")
        lines += [f"## {name}" + (f": {title}" if title and title != name else ""), "",
                  f"`python -m study.report --profile {entry['profile']} --out {os.path.relpath(out)} --only {name}` "
                  f"({entry['duration_s']} s; {packages.get('platform', '')}; "
                  f"TensorFlow {packages.get('tensorflow-cpu', packages.get('tensorflow', '?'))}, "
                  f"Keras {packages.get('keras', '?')}; commit {entry['commit'][:10]}"
                  f"{' + local changes' if entry.get('dirty') else ''}; {machine_line(entry.get('machine'))}"
                  f"; machine while it ran: {describe_load(entry.get('load'))}). "
                  f"Report: [{name}.html]({name}/{name}.html); on [index.html](index.html#{name}).", "",
                  "| measurement | value |", "|---|---|"]
        lines += [f"| {k.replace('|', '&#124;')} | {str(v).replace('|', '&#124;')} |" for k, v in headline.items()]
        lines.append("")
    return write_text(out / "SUMMARY.md", "\n".join(lines))


def write_columns(out: Path) -> Path:
    """Write ``out/COLUMNS.md``: the data dictionary of every study's CSV tables, from what the run recorded.

    Per study (manifest order) and table: each column with the description ``reporting.save_table(...,
    columns=...)`` recorded, or "(not described)". A CSV that ``save_table`` did not record is listed from its
    header. ``write_columns(Path("results"))``
    """
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {}
    lines = ["# Columns of every table", "",
             "Generated by `python -m study.report` from the descriptions each notebook gave "
             "`study.report.reporting.save_table(..., columns=...)`; do not edit. Units are in parentheses.", ""]
    for name, entry in manifest.items():
        folder = out / name
        recorded = table_columns(folder)
        files = [f for f in recorded if (folder / f).is_file()]
        files += sorted(p.name for p in folder.glob("*.csv") if p.name not in recorded)
        title = entry.get("title") if isinstance(entry, dict) else None
        lines += [f'<a id="{name}"></a>', "", f"## {name}" + (f": {title}" if title and title != name else ""), ""]
        if not files:
            lines += ["No tables.", ""]
        for file in files:
            columns = recorded.get(file)
            if columns is None:
                with open(folder / file, newline="", encoding="utf-8") as f:
                    columns = dict.fromkeys(next(csv.reader(f), []))
            lines += [f"### [{file}]({name}/{file})", "", "| column | meaning (unit) |", "|---|---|"]
            lines += [f"| `{c.replace('|', chr(92) + '|')}` | {(d or NOT_DESCRIBED).replace('|', '&#124;')} |"
                      for c, d in columns.items()]  # GFM: a pipe inside a table cell, even in code, is \|
            lines.append("")
    return write_text(out / "COLUMNS.md", "\n".join(lines))


def write_pages(out: str | Path) -> None:
    """``SUMMARY.md``, ``COLUMNS.md``, then ``index.html`` (which links the other two) from ``out/manifest.json``."""
    out = Path(out)
    write_summary(out)
    write_columns(out)
    write_index(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m study.report.site results``: rebuild ``results/index.html`` from what is in the folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m study.report.site RESULTS_DIR", file=sys.stderr)
        return 2
    print(write_index(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
