"""Write a study's figures, tables and metrics atomically, and summarise seeds as mean ± std.

Every write goes to a temporary file beside the target and is renamed into place, so an
interrupted run never leaves a half-written file in ``results/``.

Figures carry a caption: ``save_figure`` records it in ``out_dir/figures.json`` (file -> caption, in the
order the notebook saved them) and in the PNG's ``Description`` text chunk. The pipeline uses it as the
``alt`` text of the figure in the HTML report and on ``results/index.html``.

Tables carry a data dictionary: ``save_table(df, out, name, columns={"col": "meaning (unit)"})`` records every
column of the table (described or not) in ``out_dir/columns.json``; the pipeline writes ``results/COLUMNS.md``
from those records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from study.report.fileio import atomic_write, read_json  # noqa: F401 - re-exported: the report's IO helpers


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, unless the file holds exactly these bytes already: then it is
    left alone, mtime and all, so a run that changes nothing changes no file. ``write_text("SUMMARY.md", md)``"""
    path, data = Path(path), text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    return atomic_write(path, lambda p: Path(p).write_bytes(data))


COLUMNS_FILE = "columns.json"
"""``out_dir/columns.json``: ``{"tables": [{"file": "x.csv", "columns": {"col": "meaning (unit)" or null}}]}``."""
NOT_DESCRIBED = "(not described)"
"""What the data dictionary says of a column that ``save_table`` was given no description for."""


def save_table(table: pd.DataFrame, out_dir: str | Path, name: str,
               columns: Mapping[str, str] | None = None) -> Path:
    """Write ``table`` as ``out_dir/name.csv`` and record its columns for the data dictionary.

    ``save_table(df, out, "drift", columns={"max_abs_delta": "max |ΔW| of a frozen entry (weight units)"})``.
    ``columns`` maps column names to "meaning (unit)"; every column of the table is recorded in
    ``out_dir/columns.json`` in the table's order, those without a description as null (listed as
    ``NOT_DESCRIBED``), and descriptions of columns the table does not have are ignored, so one mapping can
    serve several tables. The pipeline turns the records into ``results/COLUMNS.md``.
    """
    if columns is not None and (not isinstance(columns, Mapping)
                                or not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items())):
        raise ValueError(f"save_table({name!r}): columns must map column names to descriptions (str: str); "
                         f"got {type(columns).__name__}")
    out_dir = Path(out_dir)
    path = atomic_write(out_dir / f"{name}.csv", lambda p: table.to_csv(p, index=False))
    described = dict(columns or {})
    _record_columns(out_dir, path.name, {str(c): described.get(str(c)) for c in table.columns})
    return path


def table_columns(out_dir: str | Path) -> dict[str, dict[str, str | None]]:
    """``{"drift.csv": {"col": "meaning (unit)" or None}}`` as ``save_table`` recorded them, in save order."""
    try:
        entries = json.loads((Path(out_dir) / COLUMNS_FILE).read_text()).get("tables", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {e["file"]: dict(e["columns"]) for e in entries
            if isinstance(e, dict) and "file" in e and isinstance(e.get("columns"), dict)}


def _record_columns(out_dir: Path, file: str, columns: dict[str, str | None]) -> None:
    tables = table_columns(out_dir)
    tables[file] = columns
    text = json.dumps({"tables": [{"file": f, "columns": c} for f, c in tables.items()]}, indent=2,
                      ensure_ascii=False)
    atomic_write(out_dir / COLUMNS_FILE, lambda p: Path(p).write_text(text + "\n", encoding="utf-8"))


FIGURES_FILE = "figures.json"
"""``out_dir/figures.json``: ``{"figures": [{"file": "x.png", "caption": "..."}, ...]}``, in save order."""


def figure_caption(fig: Any, name: str = "") -> str:
    """The figure's suptitle, else its axes' titles, else ``name`` made readable. ``figure_caption(fig, "a_b")``"""
    if hasattr(fig, "get_suptitle"):  # matplotlib >= 3.8
        text = fig.get_suptitle()
    else:
        suptitle = getattr(fig, "_suptitle", None)
        text = suptitle.get_text() if suptitle is not None else ""
    text = _one_line(text)
    if text:
        return text
    titles: list[str] = []
    for ax in getattr(fig, "axes", []):
        for loc in ("center", "left", "right"):
            title = _one_line(ax.get_title(loc=loc))
            if title and title not in titles:
                titles.append(title)
    readable = name.replace("_", " ").strip().capitalize()
    if len(titles) == 1:
        return titles[0]
    if titles:
        return f"{readable}: {'; '.join(titles)}" if readable else "; ".join(titles)
    return readable or "Figure"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def figure_captions(out_dir: str | Path) -> dict[str, str]:
    """``{"drift_heatmap.png": "caption", ...}`` as ``save_figure`` recorded them (empty if none)."""
    path = Path(out_dir) / FIGURES_FILE
    try:
        entries = json.loads(path.read_text()).get("figures", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {e["file"]: e["caption"] for e in entries if isinstance(e, dict) and "file" in e and "caption" in e}


def _record_caption(out_dir: Path, file: str, caption: str) -> None:
    captions = figure_captions(out_dir)
    captions[file] = caption
    text = json.dumps({"figures": [{"file": f, "caption": c} for f, c in captions.items()]}, indent=2,
                      ensure_ascii=False)
    atomic_write(out_dir / FIGURES_FILE, lambda p: Path(p).write_text(text + "\n", encoding="utf-8"))


def save_figure(fig: Any, out_dir: str | Path, name: str, dpi: int = 120, caption: str | None = None) -> Path:
    """Write a matplotlib figure as ``out_dir/name.png`` with a caption (its alt text in the reports).

    ``save_figure(fig, out, "drift_heatmap", caption="Drift of frozen entries per optimizer and policy")``.
    Without ``caption`` the figure's suptitle or axes titles are used (``figure_caption``). In a notebook
    with the inline backend the figure is shown right here, with the caption attached to the output
    (``metadata["image/png"]["alt"]``), and closed, so the end of the cell does not show it a second time.
    """
    out_dir = Path(out_dir)
    caption = _one_line(caption) if caption and caption.strip() else figure_caption(fig, name)
    path = atomic_write(out_dir / f"{name}.png", lambda p: fig.savefig(
        p, dpi=dpi, bbox_inches="tight", format="png", metadata={"Title": name, "Description": caption}))
    _record_caption(out_dir, path.name, caption)
    _show_inline(fig, caption)
    return path


def _show_inline(fig: Any, caption: str) -> None:
    """In a Jupyter kernel with the inline backend: display ``fig`` now with ``alt`` metadata, then close it."""
    try:
        import matplotlib
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None or "inline" not in matplotlib.get_backend():
        return
    if getattr(fig, "_study_shown_caption", None) == caption:
        return  # saved twice with the same caption: show it once
    from IPython.display import display

    metadata: dict[str, Any] = {}
    try:
        from matplotlib_inline.backend_inline import _fetch_figure_metadata

        metadata.update(_fetch_figure_metadata(fig) or {})
    except Exception:  # a private helper: its absence only loses the background hint
        pass
    metadata["alt"] = caption
    display(fig, metadata={"image/png": metadata})
    fig._study_shown_caption = caption
    import matplotlib.pyplot as plt

    plt.close(fig)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()  # a numpy NaN is a NaN too
    if isinstance(value, float) and not np.isfinite(value):
        return None  # JSON has no NaN or infinity
    return value


def save_metrics(metrics: dict[str, Any], out_dir: str | Path, kinds: Mapping[str, str] | None = None) -> Path:
    """Write ``metrics`` as ``out_dir/metrics.json`` (numpy scalars made plain). ``save_metrics({"acc": 0.9}, out)``

    ``kinds`` declares what each value is (``study.report.kinds``: ``{"**/step_ms": "timing", "config": "constant"}``);
    it is stored under ``"kinds"`` and says how a rerun is compared with this run. A bad declaration raises before
    anything is written. JSON has no NaN or infinity: ``null`` stands for every value that is not a finite number
    (not measured, not applicable, NaN, or infinite such as the slowdown of a run that never reached its target;
    the CSV tables beside it keep ``inf`` and ``nan``), and every number is a JSON number, never text. Files written
    before this stored non-finite numbers as the strings ``"nan"``/``"inf"``; ``reproduction`` compares either form
    with ``null`` as the same value. The file is strict JSON that any parser reads.
    """
    from study.report.kinds import KEY, check

    if kinds is not None:
        metrics = {**metrics, KEY: check(kinds)}
    text = json.dumps(_plain(metrics), indent=2, allow_nan=False)
    return atomic_write(Path(out_dir) / "metrics.json", lambda p: Path(p).write_text(text + "\n"))


def mean_std(table: pd.DataFrame, by: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean, std and seed count of ``values`` grouped by ``by``. ``mean_std(df, ["optimizer"], ["drift"])``"""
    grouped = table.groupby(list(by), sort=False)[list(values)]
    out = grouped.agg(["mean", "std", "count"])
    out.columns = [f"{v}_{stat}" for v, stat in out.columns]
    return out.reset_index()


def format_mean_std(mean: float, std: float, digits: int = 3, decimals: int | None = None) -> str:
    """``mean ± std`` for a table cell, in plain notation (``study.report.prose.pm``).
    ``format_mean_std(0.5, 0.01) == "0.5 ± 0.01"``"""
    from study.report.prose import pm

    return pm(mean, std, digits, decimals)  # plain notation, '1.5e-5' below 1e-4; one seed (NaN std): the mean alone


def common_decimals(means: Sequence[float], stds: Sequence[float], digits: int = 3) -> int | None:
    """The decimals every ``mean ± std`` of a column is shown with: the finest any row needs (None: each its own).

    >>> common_decimals([0.94467, 0.94467], [0.0061, 0.0101])
    4
    """
    from study.report.prose import pm_decimals

    found = [d for d in (pm_decimals(m, s, digits) for m, s in zip(means, stds)) if d is not None]
    return max(found) if found else None


def column_decimals(summary: pd.DataFrame, values: Sequence[str], digits: int = 3,
                    fallback: int | None = None) -> dict[str, int | None]:
    """The decimals ``display_table`` shows each ``<value>_mean ± <value>_std`` column of ``summary`` with (one
    precision per column, ``common_decimals``; ``fallback`` where no row has a spread): what a finding passes to
    ``pm(..., decimals=)``, ``fixed`` or ``signed(decimals=)`` to quote a table's numbers as the table shows them.

    >>> column_decimals(pd.DataFrame({"acc_mean": [0.9087, 0.9447], "acc_std": [0.0122, 0.0070]}), ["acc"])
    {'acc': 4}
    """
    found = {v: common_decimals(list(summary[f"{v}_mean"]), list(summary[f"{v}_std"]), digits) for v in values}
    return {v: fallback if d is None else d for v, d in found.items()}


def count_range(low: float, high: float) -> str:
    """A count's range over seeds: 'low–high' with thousands separators, one number where every seed agrees.

    >>> count_range(52095, 52096), count_range(0, 0)
    ('52,095–52,096', '0')
    """
    return f"{int(low):,}" if low == high else f"{int(low):,}–{int(high):,}"  # en dash


def format_count(mean: float, std: float) -> str:
    """A count as ``mean ± std`` with thousands separators. ``format_count(52094.7, 1.2) == "52,095 ± 1"``"""
    if std != std:
        return f"{mean:,.0f}"
    return f"{mean:,.0f} ± {std:,.0f}"


def display_table(summary: pd.DataFrame, values: Sequence[str] | Mapping[str, str], index: Sequence[str],
                  counts: Sequence[str] | Mapping[str, str] | None = (),
                  names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A readable table from a per-group summary with ``<value>_mean``/``_std`` (and ``_min``/``_max``) columns.

    ``values`` are shown as 'mean ± std', in order: a list of columns, or a mapping column -> heading; every row of a
    column at the same decimal places (``common_decimals``), so that equal means print equally.
    ``counts`` holds whole numbers: a list names columns of ``values`` shown as 'mean ± std' with thousands
    separators; a mapping column -> heading adds columns shown as their range over seeds, 'min–max' (one number
    when every seed agrees). ``names`` renames columns at the end.
    ``display_table(s, {"acc_new": "accuracy"}, ["method"], {"moved": "entries moved"})``;
    ``display_table(s, ["acc", "changed"], ["method"], counts=["changed"], names={"acc": "accuracy"})``
    """
    out = summary[list(index)].copy()
    headings = dict(values) if isinstance(values, Mapping) else {v: v for v in values}
    whole = set() if isinstance(counts, Mapping) else set(counts or ())
    for value, heading in headings.items():
        means, stds = list(summary[f"{value}_mean"]), list(summary[f"{value}_std"])
        if value in whole:
            out[heading] = [format_count(m, s) for m, s in zip(means, stds)]
        else:  # one precision per column: equal means print equally
            decimals = common_decimals(means, stds)
            out[heading] = [format_mean_std(m, s, decimals=decimals) for m, s in zip(means, stds)]
    for value, heading in (counts.items() if isinstance(counts, Mapping) else ()):
        lo, hi = summary[f"{value}_min"], summary[f"{value}_max"]
        out[heading] = [count_range(a, b) for a, b in zip(lo, hi)]
    return out.set_index(list(index)).rename(columns=dict(names or {}))


def for_display(table: pd.DataFrame, missing: str = "—") -> pd.DataFrame:
    """``table`` as a report shows it: whole-number float columns as integers, True/False as yes/no, missing
    cells as ``missing``.

    A column with a missing cell is stored as float (``40.0``, ``NaN``) in the DataFrame and the CSV; a reader
    should see ``40`` and a dash.

    >>> for_display(pd.DataFrame({"kept": [40.0, None], "share": [0.5, None], "exact": [True, False]})).to_dict("list")
    {'kept': [40, '—'], 'share': [0.5, '—'], 'exact': ['yes', 'no']}
    """
    out = table.copy()
    for column in out.columns:
        values = out[column]
        if values.dropna().map(lambda v: isinstance(v, (bool, np.bool_))).all() and values.notna().any():
            out[column] = values.map(lambda v: missing if v is None or v != v else ("yes" if v else "no"))
            continue
        if values.dtype.kind == "f" and values.dropna().apply(float.is_integer).all():
            values = values.astype("Int64")
        out[column] = values.astype(object).where(values.notna(), missing)
    return out


def _parameter_text(value: Any) -> str:
    """A parameter's value as a reader reads it: lists comma-separated, mappings as 'key: values; ...', None as
    'not set'. ``_parameter_text({"sgd": [0.05, 0.2]}) == "sgd: 0.05, 0.2"``"""
    if value is None:
        return "not set"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_parameter_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_parameter_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def parameters_table(parameters: Mapping[str, Any]) -> pd.DataFrame:
    """A study's resolved parameters as a two-column table for the report (names as in its YAML and papermill).

    >>> parameters_table({"seeds": (0, 1), "lrs": {"sgd": [0.05, 0.2]}, "data_path": None})["value"].tolist()
    ['0, 1', 'sgd: 0.05, 0.2', 'not set']
    """
    return pd.DataFrame({"value": [_parameter_text(v) for v in parameters.values()]},
                        index=pd.Index(list(parameters), name="parameter"))
