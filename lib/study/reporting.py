"""Write a study's figures, tables and metrics atomically, and summarise seeds as mean ± std.

Every write goes to a temporary file beside the target and is renamed into place, so an
interrupted run never leaves a half-written file in ``results/``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path``. ``atomic_write("a.csv", df.to_csv)``"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_table(table: pd.DataFrame, out_dir: str | Path, name: str) -> Path:
    """Write ``table`` as ``out_dir/name.csv``. ``save_table(df, "results/01_adam_drift", "drift")``"""
    return atomic_write(Path(out_dir) / f"{name}.csv", lambda p: table.to_csv(p, index=False))


def save_figure(fig: Any, out_dir: str | Path, name: str, dpi: int = 120) -> Path:
    """Write a matplotlib figure as ``out_dir/name.png``. ``save_figure(fig, out, "drift_heatmap")``"""
    return atomic_write(Path(out_dir) / f"{name}.png", lambda p: fig.savefig(p, dpi=dpi, bbox_inches="tight", format="png"))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def save_metrics(metrics: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``metrics`` as ``out_dir/metrics.json`` (numpy scalars made plain). ``save_metrics({"acc": 0.9}, out)``"""
    text = json.dumps(_plain(metrics), indent=2)
    return atomic_write(Path(out_dir) / "metrics.json", lambda p: Path(p).write_text(text + "\n"))


def mean_std(table: pd.DataFrame, by: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean, std and seed count of ``values`` grouped by ``by``. ``mean_std(df, ["optimizer"], ["drift"])``"""
    grouped = table.groupby(list(by), sort=False)[list(values)]
    out = grouped.agg(["mean", "std", "count"])
    out.columns = [f"{v}_{stat}" for v, stat in out.columns]
    return out.reset_index()


def format_mean_std(mean: float, std: float, digits: int = 3) -> str:
    """``1.234e-02 ± 5.0e-04`` style text for a table cell. ``format_mean_std(0.5, 0.01) == "0.5 ± 0.01"``"""
    if std != std:  # a single seed: no spread to show
        return f"{mean:.{digits}g}"
    return f"{mean:.{digits}g} ± {std:.2g}"
