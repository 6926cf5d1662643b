"""Study 04's training data for the parameter server: the study's MNIST as IDX files, which every worker of a
``downpour`` job reads through ``downpour.data:idx`` (each its own shard, from its own disk).

``python -m study.gradients.ps_data FOLDER [--seed N]`` writes them for a run by hand.
``DownpourConfig(**mnist_job_data("build/mnist", seed=0), workers=2)``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def write_study_mnist(folder: str | Path, seed: int = 0) -> Path:
    """The study's MNIST (``study.data.load_mnist(seed=seed)``: train and test splits) as IDX files in ``folder``."""
    from downpour.data import write_idx
    from study.data import load_mnist

    d = load_mnist(seed=seed)
    return write_idx(folder, d.x_train, d.y_train, d.x_test, d.y_test)


def mnist_job_data(folder: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write the study's MNIST into ``folder``; the job fields that read it: ``data`` and ``data_kwargs``."""
    return {"data": "downpour.data:idx", "data_kwargs": {"folder": str(write_study_mnist(folder, seed))}}


def main(argv: list[str] | None = None) -> int:
    """``python -m study.gradients.ps_data FOLDER [--seed N]``: write the study's MNIST as IDX files into FOLDER."""
    from downpour.data import IDX_NAMES

    parser = argparse.ArgumentParser(prog="python -m study.gradients.ps_data", description=main.__doc__)
    parser.add_argument("folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = write_study_mnist(args.folder, args.seed)
    print(f"wrote {', '.join(n for pair in IDX_NAMES.values() for n in pair)} into {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
