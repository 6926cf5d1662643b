"""Training data on the workers: each worker reads its own shard through ``tf.data``, from its own disk.

A job names a dataset function, ``data = "module:function"``, called as ``fn(split, **data_kwargs)`` with
``split`` ``"train"`` or ``"test"``. It returns an unbatched ``tf.data.Dataset`` of ``(x, y)`` built from file
readers (``FixedLengthRecordDataset``, ``TFRecordDataset``, ``experimental.CsvDataset``, ...), which read when
the dataset runs: on the worker, for training. The chief only builds the dataset's graph, so no training
sample passes through it and none becomes a graph constant (``dataset_graph_bytes`` in the result says how small
the graph is). A function that also takes ``worker`` and ``workers`` shards the training data itself (for
example one file per worker); otherwise every worker keeps every ``workers``-th element.

``idx`` reads MNIST's IDX format; ``write_idx`` writes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from downpour.config import DownpourConfig, load_callable

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


def dataset_function(config: DownpourConfig) -> Any:
    """The job's dataset function, with its keyword arguments bound; a ``ValueError`` when the job names none."""
    if config.data is None:
        raise ValueError("data: the job names no dataset function; give 'module:function' (for example "
                         "'downpour.data:idx' with data_kwargs {'folder': ...}, a folder of MNIST's IDX files)")
    fn = load_callable(config.data, "data")
    kwargs = dict(config.data_kwargs)
    return lambda split, **more: fn(split, **kwargs, **more)


def shards_itself(config: DownpourConfig) -> bool:
    """Whether the job's dataset function takes ``worker`` and ``workers`` (and so shards the data itself)."""
    if config.data is None:
        return False
    parameters = inspect.signature(load_callable(config.data, "data")).parameters
    return "worker" in parameters and "workers" in parameters


def worker_shard(config: DownpourConfig) -> Callable[[Any, int], Any]:
    """``shard(worker, workers)``: worker ``worker``'s part of the training data as ``(x, y, sample id)``, unbatched,
    in file order. Without self-sharding, sample id = position in the whole dataset, and worker ``w`` reads the ids
    ``i`` with ``i % workers == w``."""
    import tensorflow as tf

    fn, itself = dataset_function(config), shards_itself(config)

    def shard(worker: Any, workers: int) -> Any:
        if itself:
            ds = fn("train", worker=worker, workers=workers).enumerate()
            first = tf.cast(worker, tf.int64) * INDEX_STRIDE
            return ds.map(lambda i, xy: (xy[0], xy[1], first + i))
        return fn("train").enumerate().shard(workers, tf.cast(worker, tf.int64)).map(lambda i, xy: (xy[0], xy[1], i))

    return shard


def train_dataset(config: DownpourConfig) -> Callable[[Any, int], Any]:
    """``make(worker, workers)``: worker ``worker``'s shard of the training data as ``(x, y, sample id)`` batches,
    shuffled and repeated (``worker_shard``).

    ``make`` is called inside ``ClusterCoordinator.create_per_worker_dataset``, where ``worker`` is the call-time
    index that the coordinator fills in per worker (the job's code is resolved here, before tracing).
    """
    shard = worker_shard(config)

    def make(worker: Any, workers: int) -> Any:
        return (shard(worker, workers).shuffle(config.shuffle_buffer, seed=config.seed).repeat()
                .batch(config.batch, drop_remainder=True).prefetch(2))

    return make


def element_spec(config: DownpourConfig, split: str = "train") -> tuple[Any, Any]:
    """``(x spec, y spec)`` of one unbatched element of ``split`` (builds the dataset's graph; reads nothing). ``x``
    and ``y`` are ``tf.TensorSpec`` s or dicts / lists of them."""
    if config.data is None:
        import tensorflow as tf

        return tf.TensorSpec((28, 28, 1), tf.float32), tf.TensorSpec((), tf.int32)
    extra = {"worker": 0, "workers": 1} if split == "train" and shards_itself(config) else {}
    spec = dataset_function(config)(split, **extra).element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise ValueError(f"data: {config.data}({split!r}) must give (x, y) elements; got {spec}")
    return spec[0], spec[1]


def eval_arrays(config: DownpourConfig) -> tuple[Any, Any]:
    """The first ``eval_samples`` test samples as NumPy arrays (or dicts / lists of them), read by the chief."""
    import tensorflow as tf

    test = dataset_function(config)("test")
    xs, ys = [], []
    for x, y in test.take(config.eval_samples).batch(1000):
        xs.append(tf.nest.map_structure(lambda t: t.numpy(), x))
        ys.append(tf.nest.map_structure(lambda t: t.numpy(), y))
    if not xs:
        raise ValueError(f"data: the test split of {config.data} is empty")
    return (tf.nest.map_structure(lambda *parts: np.concatenate(parts), *xs),
            tf.nest.map_structure(lambda *parts: np.concatenate(parts), *ys))


READERS_INPUT = "filenames"
"""The input that names the files of TensorFlow's file-reading datasets (``TFRecordDataset``, ``CsvDataset``...)."""
PURE_OPS = frozenset({"Const", "Identity", "StringJoin", "AsString", "Cast", "Pack", "ConcatV2", "StringFormat",
                      "Add", "AddV2", "Reshape"})
"""Ops a file name may be computed with for ``dataset_files`` to work it out on the chief (no file is touched)."""


def dataset_files(make: Callable[[], Any]) -> list[str]:
    """The files a dataset reads, where its graph names them as constants or computes them from constants
    (``"train-" + as_string(worker)``): ``make()`` builds the dataset in a fresh graph; nothing is read.
    ``dataset_files(lambda: fn("train"))``"""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        make()
    tensors = []
    for op in graph.get_operations():
        names = [arg.name for arg in op.op_def.input_arg] if op.op_def is not None else []
        if READERS_INPUT in names:  # a reader that takes its files directly (CsvDataset)
            tensors.append(op.inputs[names.index(READERS_INPUT)])
        elif op.type == "TensorSliceDataset" and op.inputs and op.inputs[0].dtype == tf.string and any(
                "FlatMap" in c.type or "Interleave" in c.type for c in op.outputs[0].consumers()):
            tensors.append(op.inputs[0])  # TFRecordDataset, FixedLengthRecordDataset: one reader per file
    files: list[str] = []
    for tensor in tensors:
        value = tf.get_static_value(tensor)
        if value is None and _pure(tensor.op):
            with tf.compat.v1.Session(graph=graph) as session:
                value = session.run(tensor)
        if value is not None:
            files += [f.decode() if isinstance(f, bytes) else str(f) for f in np.atleast_1d(value)]
    return list(dict.fromkeys(files))


def _pure(op: Any, seen: set | None = None) -> bool:
    seen = set() if seen is None else seen
    if op.name in seen:
        return True
    seen.add(op.name)
    return op.type in PURE_OPS and all(_pure(t.op, seen) for t in op.inputs)


@dataclass(frozen=True)
class Leaf:
    """One input: its name, its shape per sample (None where any size fits) and its dtype name."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"({dims}{',' if len(self.shape) == 1 else ''})"


def model_inputs(model: Any) -> Any:
    """The model's inputs as a structure (a ``Leaf``, or a dict / list of them), or None when it declares none."""
    import tensorflow as tf

    try:
        inputs = model.input
    except (AttributeError, ValueError):
        return None
    return tf.nest.map_structure(lambda t: Leaf(str(getattr(t, "name", "input")), tuple(t.shape[1:]),
                                                tf.as_dtype(t.dtype).name), inputs)


def spec_leaves(spec: Any) -> Any:
    """A structure of ``tf.TensorSpec`` (per sample) -> the same structure of ``Leaf``."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda s: Leaf("", tuple(s.shape), s.dtype.name), spec)


def _kind(dtype: str) -> str:
    import tensorflow as tf

    d = tf.as_dtype(dtype)
    return "float" if d.is_floating else "integer" if d.is_integer else "bool" if d.is_bool else d.name


def mismatch(model: Any, x: Any, where: str) -> str | None:
    """One line saying how ``x`` (a structure of ``Leaf``: shapes per sample and dtypes) differs from the model's
    inputs, naming ``where`` the data comes from; None when it fits (a None dimension fits any size; an integer
    dtype fits any integer dtype, a float any float)."""
    import tensorflow as tf

    expected = model_inputs(model)
    if expected is None:
        return None
    if isinstance(x, dict) and isinstance(expected, dict):
        if set(x) != set(expected):
            return f"{where} gives the inputs {sorted(x)}; the model expects {sorted(expected)}"
        pairs = [(name, expected[name], x[name]) for name in sorted(x)]
    elif isinstance(x, dict):
        by_name = {leaf.name: leaf for leaf in tf.nest.flatten(expected)}
        if set(x) != set(by_name):
            return f"{where} gives the inputs {sorted(x)}; the model's inputs are named {sorted(by_name)}"
        pairs = [(name, by_name[name], x[name]) for name in sorted(x)]
    else:
        want, found = tf.nest.flatten(expected), tf.nest.flatten(x)
        if len(want) != len(found):
            return f"{where} gives {len(found)} input(s); the model expects {len(want)}"
        pairs = [(w.name, w, f) for w, f in zip(want, found)]
    for name, want, found in pairs:
        what = "x" if len(pairs) == 1 else f"x[{name!r}]"
        fits = len(want.shape) == len(found.shape) and all(
            a is None or b is None or a == b for a, b in zip(want.shape, found.shape))
        if not fits:
            return (f"{where} gives {what} of shape {found.describe()} per sample; the model's input {want.name!r} "
                    f"expects {want.describe()}")
        if _kind(found.dtype) != _kind(want.dtype):
            return f"{where} gives {what} as {found.dtype}; the model's input {want.name!r} expects {want.dtype}"
    return None


def split_files(config: DownpourConfig, split: str, worker: int = 0, workers: int = 1) -> list[str]:
    """The files ``split`` reads (for ``"train"``: worker ``worker``'s shard), as far as its graph names them."""
    if split == "train":
        shard = worker_shard(config)
        files = dataset_files(lambda: shard(worker, workers))
    else:
        files = dataset_files(lambda: dataset_function(config)(split))
    return files or [f"the files of data_kwargs {config.data_kwargs}"]


def check_split(model: Any, config: DownpourConfig, split: str) -> tuple[Any, Any]:
    """The ``(x, y)`` spec of ``split``; a ``ValueError`` (one line: files, expected and found shape) when ``x`` does
    not fit the model's inputs."""
    spec = element_spec(config, split)
    files = ", ".join(split_files(config, split))
    problem = mismatch(model, spec_leaves(spec[0]), f"data: the {split} split ({files})")
    if problem:
        raise ValueError(problem)
    return spec


def check_workers(model: Any, config: DownpourConfig, workers: int) -> None:
    """Read one batch of its shard on every worker, from its own disk, and check it against the model's inputs, then
    the worker's whole training data once (``first_unreadable``); a ``ValueError`` with one line naming the worker,
    its files and what is wrong (a file missing or unreadable, a shape that does not fit, a malformed record)."""
    import tensorflow as tf

    from downpour.faults import first_line

    shard = worker_shard(config)
    dtypes = tf.nest.map_structure(lambda s: s.dtype.name, element_spec(config)[0])
    for worker in range(workers):
        files = ", ".join(split_files(config, "train", worker, workers))

        def probe(worker: int = worker) -> Any:
            x, _, _ = next(iter(shard(tf.constant(worker, tf.int64), workers).batch(config.batch)))
            return tf.nest.map_structure(tf.shape, x)

        try:
            with tf.device(f"/job:worker/replica:0/task:{worker}/device:CPU:0"):
                shapes = tf.function(probe)()
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, tf.errors.DataLossError,
                tf.errors.OutOfRangeError) as e:
            empty = isinstance(e, tf.errors.OutOfRangeError)
            what = "has no training data" if empty else "cannot read its training data"
            raise ValueError(f"data: worker:{worker} {what} ({files}): {first_line(e)}") from None
        found = tf.nest.map_structure(lambda shape, dtype: Leaf("", tuple(int(d) for d in shape.numpy()[1:]), dtype),
                                      shapes, dtypes)
        problem = mismatch(model, found, f"data: worker:{worker} reads {files}, which")
        if problem:
            raise ValueError(problem)
        bad = first_unreadable(config, worker, workers)
        if bad is not None:
            record, error = bad
            raise ValueError(f"data: worker:{worker} reads {files}, whose record {record} (counting from 0) cannot be "
                             f"read: {first_line(error)}")


def first_unreadable(config: DownpourConfig, worker: int, workers: int) -> tuple[int, BaseException] | None:
    """Read the training data worker ``worker`` reads, whole, on that worker: None when every record reads, else the
    index of the first record that does not (in its file for a function that shards itself, else in the dataset)
    and the error. One pass over the data; a binary search over prefixes only when a record is malformed, so that
    a file broken at its end fails before training, not after hours of it."""
    import tensorflow as tf

    fn, itself = dataset_function(config), shards_itself(config)

    def records(take: Any) -> Any:
        ds = fn("train", worker=tf.constant(worker, tf.int64), workers=workers) if itself else fn("train")
        return ds.take(take).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)

    with tf.device(f"/job:worker/replica:0/task:{worker}/device:CPU:0"):
        count = tf.function(records)
        errors = (tf.errors.InvalidArgumentError, tf.errors.DataLossError)
        try:
            count(tf.constant(-1, tf.int64))
            return None
        except errors as e:
            error = e
        good, bad = 0, 1  # prefixes: all of `good` records read; one of the first `bad` does not
        while True:
            try:
                count(tf.constant(bad, tf.int64))
                good, bad = bad, 2 * bad
            except errors as e:
                error = e
                break
        while bad - good > 1:
            middle = (good + bad) // 2
            try:
                count(tf.constant(middle, tf.int64))
                good = middle
            except errors as e:
                bad, error = middle, e
        return bad - 1, error
