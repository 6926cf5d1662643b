"""The example's data: the Wisconsin diagnostic breast-cancer table (569 biopsies, 30 features, label 1 =
benign), which scikit-learn ships inside its wheel, split 80/20 stratified and standardised with the training
split's statistics, as two CSV files. Each worker reads ``train.csv`` from its own disk.

``python -m downpour.examples.tabular.data build/tabular`` writes ``build/tabular/train.csv`` and ``test.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

FEATURES = 30


def write(folder: str | Path, seed: int = 0) -> Path:
    """Write ``train.csv`` (455 rows) and ``test.csv`` (114 rows) into ``folder``: 30 standardised features, then
    the label. ``write("build/tabular")``"""
    import numpy as np
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    table = load_breast_cancer()
    x_train, x_test, y_train, y_test = train_test_split(table.data, table.target, test_size=0.2,
                                                        stratify=table.target, random_state=seed)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    header = ",".join([f"f{i}" for i in range(FEATURES)] + ["label"])
    for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        rows = np.column_stack([(x - mean) / std, y])
        np.savetxt(folder / f"{name}.csv", rows, delimiter=",", header=header, comments="",
                   fmt=["%.7g"] * FEATURES + ["%d"])
    return folder


def dataset(split: str, folder: str) -> Any:
    """``(features, label)`` rows of ``folder/<split>.csv``, read when the dataset runs (on the worker).

    ``dataset("train", "build/tabular")``
    """
    import tensorflow as tf

    if split not in ("train", "test"):
        raise ValueError(f"dataset: split must be 'train' or 'test'; got {split!r}")
    rows = tf.data.experimental.CsvDataset(str(Path(folder) / f"{split}.csv"),
                                           record_defaults=[tf.float32] * FEATURES + [tf.int32], header=True)
    return rows.map(lambda *columns: (tf.stack(columns[:FEATURES]), columns[FEATURES]))


def main(argv: list[str] | None = None) -> int:
    """``python -m downpour.examples.tabular.data FOLDER``: write the two CSV files."""
    parser = argparse.ArgumentParser(prog="python -m downpour.examples.tabular.data", description=main.__doc__)
    parser.add_argument("folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = write(args.folder, args.seed)
    print(f"wrote {folder / 'train.csv'} and {folder / 'test.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
