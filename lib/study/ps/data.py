"""Training data on the workers: each worker reads its own shard through ``tf.data``, from its own disk.

A job names a dataset function, ``data = "module:function"``, called as ``fn(split, **data_kwargs)`` with
``split`` ``"train"`` or ``"test"``. It returns an unbatched ``tf.data.Dataset`` of ``(x, y)`` built from file
readers (``FixedLengthRecordDataset``, ``TFRecordDataset``, ``experimental.CsvDataset``, ...), which read when
the dataset runs: on the worker, for training. The chief only builds the dataset's graph, so no training
sample passes through it and none becomes a graph constant (``dataset_graph_bytes`` in the result says how small
the graph is). A function that also takes ``worker`` and ``workers`` shards the training data itself (for
example one file per worker); otherwise every worker keeps every ``workers``-th element.

``idx`` reads MNIST's IDX format; ``write_idx`` writes it, and ``python -m study.ps.data FOLDER`` writes the
study's MNIST there (``run_downpour`` does this when a job names no data).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from study.ps.config import DownpourConfig, load_callable

IDX_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
"""The IDX file names per split, as MNIST ships them."""
INDEX_STRIDE = 2 ** 32
"""A worker-sharded function's sample ids are ``worker * INDEX_STRIDE + position in its shard``."""


def idx(split: str, folder: str, height: int = 28, width: int = 28) -> Any:
    """``(image, label)`` pairs from the IDX files of ``split`` in ``folder``: float32 ``(height, width, 1)`` in
    [0, 1] and int32 labels, read from disk when the dataset runs. ``idx("train", "build/mnist")``"""
    import tensorflow as tf

    if split not in IDX_NAMES:
        raise ValueError(f"idx: split must be 'train' or 'test'; got {split!r}")
    images, labels = (str(Path(folder) / name) for name in IDX_NAMES[split])

    def image(record: Any) -> Any:
        pixels = tf.reshape(tf.io.decode_raw(record, tf.uint8), (height, width, 1))
        return tf.cast(tf.cast(pixels, tf.float64) / 255.0, tf.float32)  # as numpy's x / 255.0, bit for bit

    def label(record: Any) -> Any:
        return tf.cast(tf.reshape(tf.io.decode_raw(record, tf.uint8), ()), tf.int32)

    x = tf.data.FixedLengthRecordDataset(images, height * width, header_bytes=16).map(image)
    y = tf.data.FixedLengthRecordDataset(labels, 1, header_bytes=8).map(label)
    return tf.data.Dataset.zip((x, y))


def write_idx(folder: str | Path, x_train: Any, y_train: Any, x_test: Any, y_test: Any) -> Path:
    """Write images (uint8, or floats in [0, 1]) and labels as the four IDX files ``idx`` reads; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, (x, y) in (("train", (x_train, y_train)), ("test", (x_test, y_test))):
        x = np.asarray(x)
        if x.dtype != np.uint8:
            x = np.rint(x * 255.0).astype(np.uint8)
        x = x.reshape(len(x), *x.shape[1:3])
        y = np.asarray(y).astype(np.uint8)
        for name, array in zip(IDX_NAMES[split], (x, y)):
            header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
            (folder / name).write_bytes(header + array.tobytes())
    return folder


def write_study_mnist(folder: str | Path, seed: int = 0) -> Path:
    """The study's MNIST (``study.data.load_mnist(seed=seed)``: train and test splits) as IDX files in ``folder``."""
    from study.data import load_mnist

    d = load_mnist(seed=seed)
    return write_idx(folder, d.x_train, d.y_train, d.x_test, d.y_test)


def dataset_function(config: DownpourConfig) -> Any:
    """The job's dataset function, with its keyword arguments bound; a ``ValueError`` when the job names none."""
    if config.data is None:
        raise ValueError("data: the job names no dataset function; give 'module:function' (for example "
                         "'study.ps.data:idx' with data_kwargs {'folder': ...}; `python -m study.ps.data FOLDER` "
                         "writes the study's MNIST there), or start the job with run_downpour, which does that")
    fn = load_callable(config.data, "data")
    kwargs = dict(config.data_kwargs)
    return lambda split, **more: fn(split, **kwargs, **more)


def shards_itself(config: DownpourConfig) -> bool:
    """Whether the job's dataset function takes ``worker`` and ``workers`` (and so shards the data itself)."""
    if config.data is None:
        return False
    parameters = inspect.signature(load_callable(config.data, "data")).parameters
    return "worker" in parameters and "workers" in parameters


def train_dataset(config: DownpourConfig) -> Callable[[Any, int], Any]:
    """``make(worker, workers)``: worker ``worker``'s shard of the training data as ``(x, y, sample id)`` batches,
    shuffled and repeated.

    ``make`` is called inside ``ClusterCoordinator.create_per_worker_dataset``, where ``worker`` is the call-time
    index that the coordinator fills in per worker (the job's code is resolved here, before tracing). Without
    self-sharding, sample id = position in the whole dataset, and worker ``w`` reads the ids ``i`` with
    ``i % workers == w``.
    """
    import tensorflow as tf

    fn, itself = dataset_function(config), shards_itself(config)

    def make(worker: Any, workers: int) -> Any:
        worker = tf.cast(worker, tf.int64)
        if itself:
            ds = fn("train", worker=worker, workers=workers).enumerate()
            ds = ds.map(lambda i, xy: (xy[0], xy[1], worker * INDEX_STRIDE + i))
        else:
            ds = fn("train").enumerate().shard(workers, worker).map(lambda i, xy: (xy[0], xy[1], i))
        return (ds.shuffle(config.shuffle_buffer, seed=config.seed).repeat()
                .batch(config.batch, drop_remainder=True).prefetch(2))

    return make


def input_spec(config: DownpourConfig) -> tuple[tuple[int | None, ...], Any]:
    """``(shape, dtype)`` of one input ``x`` of the training data (builds the dataset's graph; reads nothing)."""
    if config.data is None:
        import tensorflow as tf

        return (28, 28, 1), tf.float32
    spec = dataset_function(config)("train", **({"worker": 0, "workers": 1} if shards_itself(config) else {}))
    x_spec = spec.element_spec[0]
    return tuple(x_spec.shape), x_spec.dtype


def eval_arrays(config: DownpourConfig) -> tuple[np.ndarray, np.ndarray]:
    """The first ``eval_samples`` test samples as NumPy arrays, read by the chief to evaluate snapshots."""
    test = dataset_function(config)("test")
    xs, ys = [], []
    for x, y in test.take(config.eval_samples).batch(1000):
        xs.append(x.numpy())
        ys.append(y.numpy())
    if not xs:
        raise ValueError(f"data: the test split of {config.data} is empty")
    return np.concatenate(xs), np.concatenate(ys)


def main(argv: list[str] | None = None) -> int:
    """``python -m study.ps.data FOLDER [--seed N]``: write the study's MNIST as IDX files into FOLDER."""
    parser = argparse.ArgumentParser(prog="python -m study.ps.data", description=main.__doc__)
    parser.add_argument("folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = write_study_mnist(args.folder, args.seed)
    print(f"wrote {', '.join(n for pair in IDX_NAMES.values() for n in pair)} into {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
