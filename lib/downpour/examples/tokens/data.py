"""The example's data: a synthetic review-like task with two inputs, as TFRecord files, one per worker.

Each record holds ``tokens`` (``LENGTH`` token ids out of ``VOCAB``), ``numeric`` (``FEATURES`` floats) and a 0/1
``label``. A positive record draws about a tenth of its tokens from ids 800-899 and a negative one from
900-999 (the "new" tokens, which a pre-trained vocabulary of ids 0-799 would not know); the rest are common
tokens; the first numeric feature leans towards the label. So the label can be learned from the new tokens'
embedding rows and the numeric input together.

``python -m downpour.examples.tokens.data build/tokens --workers 2`` writes ``train-0.tfrecord`` and
``train-1.tfrecord`` (each worker reads its own) and ``test.tfrecord``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

VOCAB = 1000
"""Token ids 0..999; ids 0..799 are the "pre-trained" vocabulary, 800..999 the new tokens."""
PRETRAINED = 800
LENGTH = 20
FEATURES = 3


def records(n: int, seed: int, length: int = LENGTH, vocab: int = VOCAB) -> tuple[Any, Any, Any]:
    """``n`` synthetic records: tokens ``(n, length)`` int64, numeric ``(n, FEATURES)`` float32, labels ``(n,)``.

    The last fifth of ``vocab`` are the new tokens, their first half for positive records (800-899 of 1,000)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    old = vocab * PRETRAINED // VOCAB
    half = (vocab - old) // 2
    labels = rng.integers(0, 2, n)
    tokens = rng.integers(0, old, (n, length))
    new = rng.random((n, length)) < 0.1
    tokens[new] = (old + half * (1 - labels)[:, None] + rng.integers(0, half, (n, length)))[new]
    numeric = rng.normal(size=(n, FEATURES)).astype(np.float32)
    numeric[:, 0] += 0.5 * (labels - 0.5)
    return tokens.astype(np.int64), numeric, labels.astype(np.int64)


def write(folder: str | Path, workers: int = 2, per_worker: int = 1000, test: int = 400, seed: int = 0,
          length: int = LENGTH, vocab: int = VOCAB) -> Path:
    """Write ``train-<w>.tfrecord`` for each worker ``w`` and ``test.tfrecord`` into ``folder``.

    ``write("build/tokens", workers=2)``
    """
    import tensorflow as tf

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {f"train-{w}.tfrecord": (per_worker, seed + 1 + w) for w in range(workers)}
    files["test.tfrecord"] = (test, seed)
    for name, (n, file_seed) in files.items():
        tokens, numeric, labels = records(n, file_seed, length, vocab)
        with tf.io.TFRecordWriter(str(folder / name)) as out:
            for t, x, y in zip(tokens, numeric, labels):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=t)),
                    "numeric": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))}))
                out.write(example.SerializeToString())
    return folder


def dataset(split: str, folder: str, worker: Any = None, workers: Any = None) -> Any:
    """``({"tokens", "numeric"}, label)`` records of ``split``, read when the dataset runs: for ``"train"`` the
    worker's own file ``train-<worker>.tfrecord`` (the job's dataset shards itself), for ``"test"`` ``test.tfrecord``.

    ``dataset("train", "build/tokens", worker=0, workers=2)``
    """
    import tensorflow as tf

    if split == "train":
        path = tf.strings.join([f"{folder}/train-", tf.strings.as_string(worker), ".tfrecord"])
    elif split == "test":
        path = f"{folder}/test.tfrecord"
    else:
        raise ValueError(f"dataset: split must be 'train' or 'test'; got {split!r}")
    features = {"tokens": tf.io.VarLenFeature(tf.int64),  # token sequences: their length is not fixed by the file
                "numeric": tf.io.FixedLenFeature([FEATURES], tf.float32),
                "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: Any) -> Any:
        row = tf.io.parse_single_example(record, features)
        return {"tokens": tf.sparse.to_dense(row["tokens"]), "numeric": row["numeric"]}, row["label"]

    return tf.data.TFRecordDataset(path).map(parse)


def main(argv: list[str] | None = None) -> int:
    """``python -m downpour.examples.tokens.data FOLDER [--workers 2]``: write the TFRecord files."""
    parser = argparse.ArgumentParser(prog="python -m downpour.examples.tokens.data", description=main.__doc__)
    parser.add_argument("folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--length", type=int, default=LENGTH, help="tokens per record (the model expects 20)")
    args = parser.parse_args(argv)
    folder = write(args.folder, args.workers, seed=args.seed, length=args.length)
    print(f"wrote {', '.join(sorted(p.name for p in folder.glob('*.tfrecord')))} into {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
