"""The pipeline's outputs a reader opens: HTML reports, index.html, SUMMARY.md; and safe interruption.

Fast tests build small notebooks and results folders by hand. The ``notebook``-marked tests run notebook 01 on
smoke parameters through ``python -m study.report`` and interrupt it with SIGINT / SIGTERM.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402
from bs4 import BeautifulSoup  # noqa: E402
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402
from test_reruns import differences, leaves, without_timings  # noqa: E402

from study.report import execution, html_report, pipeline, reporting, site, summary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PNG_1x1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def network_urls(page: str) -> list[str]:
    """Fetching tags (script, link, img, iframe, ...) whose ``src``/``href`` leave the machine."""
    return html_report.external_urls(page)


def test_the_url_scan_finds_what_nbconvert_loads_by_default():
    page = ('<script src="https://cdnjs.cloudflare.com/require.min.js"></script><link href="//fonts.example/x.css">'
            '<img src="data:image/png;base64,AAAA"><a href="https://example.org">text links are fine</a>'
            '<img src="01/x.png">')
    assert network_urls(page) == ["<script src=https://cdnjs.cloudflare.com/require.min.js>",
                                  "<link href=//fonts.example/x.css>"]


def _report_notebook() -> nbformat.NotebookNode:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [
        new_markdown_cell("# 07 · Frozen *entries* under `Adam`\n\nIntro with inline math $m_k = \\beta_1^k m_0$."),
        new_markdown_cell("## Section A\n\n"
                          "$$\\Delta_k = \\eta\\,\\frac{\\beta_1^k m_0}{\\sqrt{\\beta_2^k v_0}+\\varepsilon}.$$"),
        new_code_cell("hidden_setup_line = 1", outputs=[]),
        new_code_cell("opt = MaskedOptimizer(copy_me_line)", metadata={"tags": ["show-input"]}, outputs=[]),
        new_code_cell("x", outputs=[
            new_output("stream", name="stderr", text="WARNING: All log messages before absl::InitializeLog()\n"),
            new_output("stream", name="stderr", text="UserWarning: something noisy\n"),
            new_output("stream", name="stdout", text="kept line\n"),
            new_output("execute_result", data={"text/plain": "PosixPath('/tmp/staging/x.png')"}, execution_count=1),
            new_output("display_data", data={"image/png": PNG_1x1, "text/plain": "<Figure size 10x10 with 1 Axes>"},
                       metadata={"image/png": {"alt": "Drift of frozen entries, mean over seeds"}}),
        ]),
        new_markdown_cell("## Section B"),
        new_code_cell("y", outputs=[
            new_output("display_data", data={"image/png": PNG_1x1, "text/plain": "<Figure>"}),
            new_output("execute_result", data={"text/plain": "42"}, execution_count=2),
            new_output("display_data",
                       data={"text/latex": "$$a^2 + b^2$$", "text/plain": "<IPython.core.display.Math object>"}),
        ]),
    ]
    return nb


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("report")
    nb_path = folder / "07_study.ipynb"
    nbformat.write(_report_notebook(), nb_path)
    page, _ = html_report.render_report(nb_path, folder / "07_study.html")
    return page, nb_path


def test_report_title_is_the_first_heading(report_page):
    page, _ = report_page
    soup = BeautifulSoup(page, "html.parser")
    assert soup.title.string == "07 · Frozen entries under Adam"


def test_report_has_no_stderr_no_repr_but_keeps_stdout_and_values(report_page):
    page, nb_path = report_page
    assert "absl::InitializeLog" not in page and "UserWarning" not in page
    assert "PosixPath(" not in page
    assert "kept line" in page and ">42<" in page
    executed = nbformat.read(nb_path, as_version=4)  # the executed notebook is left as it was
    assert sum(o.get("name") == "stderr" for o in executed.cells[4].outputs) == 2


def test_report_shows_the_input_of_show_input_cells_only(report_page):
    page, nb_path = report_page
    text = BeautifulSoup(page, "html.parser").get_text()
    assert "MaskedOptimizer(copy_me_line)" in text  # the code to copy is on the page
    assert "hidden_setup_line" not in text  # every other input is hidden
    executed = nbformat.read(nb_path, as_version=4)  # the executed notebook keeps every input, unflagged
    assert "transient" not in executed.cells[2].metadata


def test_report_loads_nothing_from_the_network(report_page):
    page, _ = report_page
    assert network_urls(page) == []
    soup = BeautifulSoup(page, "html.parser")
    assert not soup.find_all("script", src=True)
    assert "cdnjs" not in page and "unpkg" not in page and "require.js" not in page


def test_report_formulas_are_mathml(report_page):
    page, _ = report_page
    soup = BeautifulSoup(page, "html.parser")
    maths = soup.find_all("math")
    displays = [m.get("display") for m in maths]
    assert displays.count("block") == 2 and displays.count("inline") == 1  # $$..$$, text/latex output, $..$
    assert soup.find("mfrac") is not None and soup.find("msqrt") is not None
    assert "$$" not in soup.get_text()
    sources = [a.get_text() for a in soup.find_all("annotation", encoding="application/x-tex")]
    assert len(sources) == 3 and any("\\varepsilon" in s for s in sources)  # the LaTeX travels with the MathML


def test_report_images_carry_alt_text(report_page):
    page, _ = report_page
    imgs = BeautifulSoup(page, "html.parser").find_all("img")
    alts = [img.get("alt") for img in imgs]
    assert alts[0] == "Drift of frozen entries, mean over seeds"
    assert alts[1].startswith("Figure 2, in “Section B”")
    assert all(alts) and html_report.PLACEHOLDER_ALT not in page
    # a recorded caption is also visible under its figure; a fallback alt is not shown as a caption
    captions = [p.get_text() for p in BeautifulSoup(page, "html.parser").find_all("p", class_="study-caption")]
    assert captions == ["Drift of frozen entries, mean over seeds"]


def test_a_formula_that_does_not_parse_is_shown_as_source():
    html = html_report.latex_to_mathml("\\frac{a}{", display=False)
    assert html.startswith('<code class="study-tex">') and "\\frac{a}{" in html


# --- save_figure captions --------------------------------------------------------------------------------


def _fig(suptitle=None, titles=()):
    fig, axes = plt.subplots(1, max(1, len(titles)), squeeze=False)
    for ax, title in zip(axes[0], titles):
        ax.set_title(title)
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def test_save_figure_records_the_caption(tmp_path):
    from PIL import Image

    fig = _fig(suptitle="ignored when a caption is given")
    path = reporting.save_figure(fig, tmp_path, "drift", caption="  Drift of frozen\nentries  ")
    plt.close(fig)
    assert path == tmp_path / "drift.png"
    assert reporting.figure_captions(tmp_path) == {"drift.png": "Drift of frozen entries"}
    with Image.open(path) as im:
        assert im.text["Description"] == "Drift of frozen entries"
    umask = os.umask(0o022)
    os.umask(umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask)  # not mkstemp's 0600


@pytest.mark.parametrize("suptitle, titles, expected", [
    ("Samples under Adam", ("a", "b"), "Samples under Adam"),
    (None, ("Loss per step",), "Loss per step"),
    (None, ("naive", "hold"), "Heat map: naive; hold"),
    (None, (), "Heat map"),
])
def test_save_figure_caption_falls_back_to_titles_never_to_a_placeholder(tmp_path, suptitle, titles, expected):
    fig = _fig(suptitle, titles)
    reporting.save_figure(fig, tmp_path, "heat_map")
    plt.close(fig)
    assert reporting.figure_captions(tmp_path)["heat_map.png"] == expected


def test_save_figure_keeps_the_order_and_updates_a_resaved_caption(tmp_path):
    for name, caption in (("b", "first"), ("a", "second"), ("b", "first, again")):
        fig = _fig()
        reporting.save_figure(fig, tmp_path, name, caption=caption)
        plt.close(fig)
    assert list(reporting.figure_captions(tmp_path).items()) == [("b.png", "first, again"), ("a.png", "second")]


# --- index.html and SUMMARY.md ---------------------------------------------------------------------------


def _fake_results(out: Path) -> Path:
    """A results folder as the pipeline leaves it: two studies, one of them with captions and a headline."""
    manifest = {}
    for name, title in (("01_first", "01 · First study"), ("02_second", "02 · Second & <last>")):
        folder = out / name
        folder.mkdir(parents=True)
        (folder / f"{name}.html").write_text("<html></html>")
        (folder / f"{name}.ipynb").write_text("{}")
        (folder / "table.csv").write_text("a\n1\n")
        manifest[name] = {"title": title, "profile": "smoke", "parameters": {}, "data_source": "synthetic",
                          "duration_s": 1.5, "finished_at": "2026-01-01T00:00:00+00:00", "commit": "0123456789abcdef",
                          "dirty": False, "packages": {"platform": "Linux", "tensorflow": "2.21.0", "keras": "3.15.1"}}
    first = out / "01_first"
    for png, caption in (("b plot.png", "Caption of b"), ("a_plot.png", "Caption of a")):
        fig = _fig()
        reporting.save_figure(fig, first, Path(png).stem, caption=caption)
        plt.close(fig)
    (first / "metrics.json").write_text(json.dumps({"headline": {"max |drift| <adam>": "0.0942 ± 0.00063", "n": 3}}))
    (out / "02_second" / "legacy_figure.png").write_bytes(base64.b64decode(PNG_1x1))
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_index_lists_each_study_with_title_thumbnails_headline_and_report(tmp_path):
    out = _fake_results(tmp_path)
    site.write_summary(out)
    page = site.write_index(out).read_text()
    soup = BeautifulSoup(page, "html.parser")
    sections = soup.find_all("section", class_="study")
    assert [s.h2.get_text() for s in sections] == ["01 · First study", "02 · Second & <last>"]

    first = sections[0]
    imgs = first.find_all("img")
    assert [(i["src"], i["alt"]) for i in imgs] == [("01_first/b%20plot.png", "Caption of b"),
                                                   ("01_first/a_plot.png", "Caption of a")]
    for img in imgs:
        assert img.parent.name == "a" and img.parent["href"] == img["src"]
    cells = [[td.get_text() for td in tr.find_all("td")] for tr in first.table.tbody.find_all("tr")]
    assert cells == [["max |drift| <adam>", "0.0942 ± 0.00063"], ["n", "3"]]
    assert first.find("a", string="HTML report")["href"] == "01_first/01_first.html"

    second = sections[1]
    assert second.img["alt"] == "Legacy figure"  # no caption recorded: the file name, never a placeholder
    assert "No headline recorded" in second.get_text()
    assert soup.find("a", href="SUMMARY.md") is not None


def test_index_works_from_disk_relative_links_only(tmp_path):
    out = _fake_results(tmp_path)
    page = site.write_index(out).read_text()
    assert network_urls(page) == []
    soup = BeautifulSoup(page, "html.parser")
    assert not soup.find_all("script")
    for tag in soup.find_all(["a", "img"]):
        url = tag.get("href") or tag.get("src")
        if url.startswith("#"):
            continue
        assert ":" not in url and not url.startswith("/"), url  # relative: no scheme, no absolute path
        target = out / unquote(url)
        assert target.exists(), url


def test_summary_keeps_headlines_and_links_the_index(tmp_path):
    out = _fake_results(tmp_path)
    text = site.write_summary(out).read_text()
    assert "[index.html](index.html)" in text
    assert "| max &#124;drift&#124; <adam> | 0.0942 ± 0.00063 |" in text
    assert "## 01_first: 01 · First study" in text


def test_manifest_summary_and_index_are_written_atomically(tmp_path, monkeypatch):
    out = _fake_results(tmp_path)
    written = []
    real = reporting.atomic_write

    def spy(path, write):
        written.append(Path(path).name)
        return real(path, write)

    monkeypatch.setattr(reporting, "atomic_write", spy)
    pipeline.record_run(out, "01_first", json.loads((out / "manifest.json").read_text())["01_first"])
    assert written == ["manifest.json", "SUMMARY.md", "COLUMNS.md", "index.html"]
    written.clear()
    pipeline.record_run(out, "01_first", json.loads((out / "manifest.json").read_text())["01_first"])
    assert written == []  # nothing changed, nothing written
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left behind



# --- the summary first, and "start here" -----------------------------------------------------------------


def _finding(markdown: str) -> nbformat.NotebookNode:
    """A ``finding`` cell as an executed notebook holds it: its source hidden, its filled Markdown as output."""
    return new_code_cell("prose.finding(...)", metadata={"tags": ["finding"]},
                         outputs=[new_output("display_data", data={"text/markdown": markdown, "text/plain": "<md>"})])


def _studied(summary_section: bool) -> nbformat.NotebookNode:
    cells = [new_markdown_cell("# 09 · A study\n\nIntro paragraph of the study."),
             new_markdown_cell("## Setup"), new_code_cell("setup = 1"),
             new_markdown_cell("## 1. Section one"),
             _finding("**Finding.** Adam moved 12 frozen entries. The rest held.\n"),
             new_markdown_cell("## 2. Which method should I use?"),
             _finding("**Findings.**\n- Hold moved 0 entries in every seed.\n- Reset moved 0 too.\n"),
             _finding("A finding without a label, left out of a built summary.")]
    if summary_section:
        cells += [new_markdown_cell("## Summary"),
                  _finding("* Masks alone drift under Adam: 12 entries moved.\n* `hold` keeps every bit.\n")]
    return new_notebook(cells=cells)


def _order(page: str, *needles: str) -> list[int]:
    text = " ".join(BeautifulSoup(page, "html.parser").get_text().split())
    return [text.index(n) for n in needles]


def test_report_moves_its_summary_section_right_after_the_title(tmp_path):
    path = tmp_path / "09_study.ipynb"
    nbformat.write(_studied(summary_section=True), path)
    page, report = html_report.render_report(path, note="*How this run was timed:* otherwise idle.")
    assert report.summary == "moved"
    title, summary, drift, note, intro, section = _order(page, "09 · A study", "Summary", "Masks alone drift",
                                                         "How this run was timed", "Intro paragraph", "Section one")
    assert title < summary < drift < note < intro < section
    assert page.count("Masks alone drift") == 1  # moved, not copied
    assert nbformat.read(path, as_version=4).cells[-2].source == "## Summary"  # the notebook itself is untouched


def test_report_without_a_summary_section_gets_one_built_from_its_labelled_findings(tmp_path):
    path = tmp_path / "09_study.ipynb"
    nbformat.write(_studied(summary_section=False), path)
    page, report = html_report.render_report(path)
    assert report.summary == "built"
    title, summary, first, second, intro = _order(page, "09 · A study", "Summary", "Adam moved 12 frozen entries.",
                                                  "Hold moved 0 entries in every seed.", "Intro paragraph")
    assert title < summary < first < second < intro
    text = " ".join(BeautifulSoup(page, "html.parser").get_text().split())
    assert text.count("A finding without a label") == 1  # only where the notebook put it
    assert text.count("Reset moved 0 too.") == 1  # a list finding opens the summary with its first item only


def test_main_finding_is_the_first_summary_item_else_the_first_labelled_finding():
    assert summary.main_finding(_studied(summary_section=True)) == "Masks alone drift under Adam: 12 entries moved."
    assert summary.main_finding(_studied(summary_section=False)) == "Adam moved 12 frozen entries. The rest held."
    assert summary.main_finding(new_notebook(cells=[new_markdown_cell("# Only a title")])) is None
    assert summary.opening("**Finding.** One is 1. Two is 2. Three is 3.", max_chars=10) == "One is 1. Two is 2."
    assert summary.section_anchor(_studied(True), r"^\d\. which method") == "2.-Which-method-should-I-use?"


def test_index_starts_here_with_each_studys_main_finding_and_the_which_method_table(tmp_path):
    out = _fake_results(tmp_path)
    nbformat.write(_studied(summary_section=True), out / "01_first" / "01_first.ipynb")
    nb = _studied(summary_section=False)
    nb.cells[5].source = "## Which method should I use?"
    nbformat.write(nb, out / "02_second" / "02_second.ipynb")
    (out / "02_second" / "which_method.csv").write_text("task,method\n")
    soup = BeautifulSoup(site.write_index(out).read_text(), "html.parser")
    start = soup.find("section", id="start-here")
    assert start is not None and start.find_previous("section") is None  # before every study's section
    assert soup.get_text().index("Start here") < soup.get_text().index("Generated by")  # before the run metadata
    lines = [" ".join(li.get_text().split()) for li in start.find_all("li")]
    assert lines == ["01 · First study: Masks alone drift under Adam: 12 entries moved.",
                     "02 · Second & <last>: Adam moved 12 frozen entries. The rest held."]
    assert [a["href"] for a in start.find_all("li")[0].find_all("a")] == ["#01_first"]
    links = [a["href"] for a in start.find_all("p")[-1].find_all("a")]
    assert links == ["02_second/02_second.html#Which-method-should-I-use?", "02_second/which_method.csv"]


def test_index_says_so_when_a_study_recorded_no_finding(tmp_path):
    out = _fake_results(tmp_path)  # its notebooks are empty files
    start = BeautifulSoup(site.write_index(out).read_text(), "html.parser").find("section", id="start-here")
    assert [" ".join(li.get_text().split()) for li in start.find_all("li")] == [
        "01 · First study: no finding recorded", "02 · Second & <last>: no finding recorded"]



def test_every_committed_study_has_a_main_finding_and_a_summary_to_put_first():
    manifest = json.loads((REPO / "results" / "manifest.json").read_text())
    assert manifest, "results/manifest.json lists no study"
    for name in manifest:
        nb = nbformat.read(REPO / "results" / name / f"{name}.ipynb", as_version=4)
        finding = summary.main_finding(nb)
        assert finding and "{{" not in finding, (name, finding)  # filled in by the run, not a template
        assert summary.put_summary_first(nb, 1) in ("moved", "built"), name
        assert summary.summary_span(nb)[0] == 1, name  # it is now right after the title cell

# --- signals ---------------------------------------------------------------------------------------------


def test_a_signal_during_hold_waits_for_the_block_then_interrupts():
    signals = execution._Signals()
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(execution.Interrupted) as info:
        with signals.installed():
            with signals.hold():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGINT)  # a second signal while stopping is ignored
                time.sleep(0.05)
                finished.append(True)
    assert finished == [True] and info.value.signum == signal.SIGTERM and info.value.name == "SIGTERM"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous  # handlers restored
    assert signals.received is None


def test_started_stops_the_whole_tree_it_started_even_new_sessions_and_nothing_else():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    earlier = subprocess.Popen(sleeper)  # a child this process had before: not the pipeline's to stop
    started = execution.Started()
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.time() + 20
        while len(psutil.Process(child.pid).children(recursive=True)) < 1 and time.time() < deadline:
            time.sleep(0.05)
        tree = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
        assert len(tree) == 2
        stopped = started.stop(grace_s=5)
        assert set(stopped) == {p.pid for p in tree}
        child.wait(timeout=10)
        assert not [p for p in tree if _running(p)]
        assert earlier.poll() is None, "a process the pipeline did not start was stopped"
    finally:
        for proc in (child, earlier):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- interrupting a real run -----------------------------------------------------------------------------


def tree_hash(folder: Path) -> str:
    """Every path under ``folder``: name, type and mode; for files also the bytes and the mtime (a rewrite with
    the same bytes still shows). Folders' own mtimes are left out: creating and removing ``.staging`` inside
    ``folder`` changes ``folder``'s mtime and nothing else."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        h.update(f"{p.relative_to(folder)}\0{st.st_mode}\0".encode())
        if p.is_file() and not p.is_symlink():
            h.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


SMOKE_01 = ["--profile", "smoke", "--only", "01_adam_drift", "--timeout", "600"]


def _pipeline_cmd(out: Path) -> list[str]:
    """01 on smoke parameters, forced: the copied results hold 01 under the same cache key, so it would be reused."""
    return [sys.executable, "-m", "study.report", *SMOKE_01, "--out", str(out), "--force",
            "--records", str(out.parent / "records")]


def _env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def complete_01(smoke_results) -> Path:
    """A results folder holding a complete smoke run of notebook 01: the test session's one smoke run."""
    return smoke_results


@pytest.mark.notebook
@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_smoke_run_of_01_writes_a_clean_report_and_index(complete_01):
    page = (complete_01 / "01_adam_drift" / "01_adam_drift.html").read_text()
    soup = BeautifulSoup(page, "html.parser")
    assert soup.title.string == "01 · Why frozen entries still move under Adam"
    assert network_urls(page) == [] and not soup.find_all("script", src=True)
    assert soup.find("math", display="block") is not None and soup.find("mfrac") is not None  # Adam's drift formula
    assert "PosixPath(" not in page and html_report.PLACEHOLDER_ALT not in page
    assert not soup.select('[data-mime-type="application/vnd.jupyter.stderr"]')
    captions = reporting.figure_captions(complete_01 / "01_adam_drift")
    assert set(captions) == {p.name for p in (complete_01 / "01_adam_drift").glob("*.png")}
    alts = [img["alt"] for img in soup.find_all("img")]
    assert alts and all(alts) and set(alts) <= set(captions.values())
    text = soup.get_text()
    assert "tf.compat.v1.Session(graph=graph) as sess" in text  # the seed's TF1 code, tagged show-input, is shown
    assert "adam_drift.AdamDriftConfig.from_parameters" not in text  # set-up cells are not
    index = BeautifulSoup((complete_01 / "index.html").read_text(), "html.parser")
    section = index.find("section", id="01_adam_drift")
    assert section.find("h2").get_text() == "01 · Why frozen entries still move under Adam"
    assert {img["alt"] for img in section.find_all("img")} == set(captions.values())
    assert "[index.html](index.html)" in (complete_01 / "SUMMARY.md").read_text()


@pytest.mark.notebook
@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_interrupting_a_run_leaves_results_as_they_were_and_a_rerun_completes(complete_01, tmp_path, signum):
    """Interrupt a run of 01 in the middle: the results folder is byte-for-byte unchanged and no child survives.
    After SIGTERM (SIGINT takes the same path in ``pipeline``, so its rerun would test nothing new) the rerun
    completes, and its metrics.json equals the uninterrupted session run's, timings aside, bit for bit."""
    out = tmp_path / "results"
    shutil.copytree(complete_01, out)
    before = tree_hash(out)
    proc = subprocess.Popen(_pipeline_cmd(out), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        me = psutil.Process(proc.pid)
        staging = out / ".staging" / "01_adam_drift"
        deadline = time.time() + 180
        kernel = []
        while time.time() < deadline and proc.poll() is None:
            kids = me.children(recursive=True)
            kernel = [k for k in kids if "ipykernel" in " ".join(_cmdline(k))]
            if staging.is_dir() and kernel:
                break
            time.sleep(0.1)
        assert staging.is_dir() and kernel, "the run never reached its kernel"
        time.sleep(2)  # let the kernel start executing cells and writing into staging
        children = me.children(recursive=True)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"pipeline: interrupted by {signal.Signals(signum).name} while running 01_adam_drift")
    assert stderr.count("pipeline: interrupted") == 1 and "Traceback" not in stderr
    time.sleep(0.5)
    assert not [p.pid for p in children if _running(p)], "a kernel or other child process survived"
    assert tree_hash(out) == before
    assert not (out / ".staging").exists()

    if signum != signal.SIGTERM:
        return
    rerun = subprocess.run(_pipeline_cmd(out), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not (out / ".staging").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["01_adam_drift"]["finished_at"] >= json.loads(
        (complete_01 / "manifest.json").read_text())["01_adam_drift"]["finished_at"]
    assert (out / "01_adam_drift" / "01_adam_drift.html").is_file() and (out / "index.html").is_file()
    first, second = (without_timings(json.loads((folder / "01_adam_drift" / "metrics.json").read_text()))
                     for folder in (complete_01, out))
    assert leaves(first) > 20  # the comparison is not vacuous
    diffs = differences(first, second)
    assert diffs == [], f"{len(diffs)} non-timing values differ between two runs:\n" + "\n".join(diffs[:30])


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def test_report_shows_assertion_cells_and_how_the_run_was_timed(tmp_path):
    from study.report.load import report_note, summarise

    nb = new_notebook(cells=[new_markdown_cell("# 08 · Timed"), new_markdown_cell("Intro: assertion cells check it."),
                             new_code_cell("hidden_setup = 1"), new_code_cell("assert hidden_setup == 1, 'checked'")])
    path = tmp_path / "08_timed.ipynb"
    nbformat.write(nb, path)
    busy = summarise(100.0, 90.0, 150.0, [1.5, 2.0], 2)
    page, _ = html_report.render_report(path, note=report_note(busy))
    text = BeautifulSoup(page, "html.parser").get_text()
    assert "assert hidden_setup == 1, 'checked'" in text and "hidden_setup = 1" not in text
    assert "the machine was not idle" in text and "other processes used 30.0% of the 2 cores" in text
    assert text.index("08 · Timed") < text.index("not idle") < text.index("Intro: assertion cells")
    idle = report_note(summarise(100.0, 90.0, 95.0, [0.9], 2))
    assert idle.startswith("*How this run was timed:* otherwise idle: other processes used 2.5%")
