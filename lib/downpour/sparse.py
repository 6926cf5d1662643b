"""Gradients that are dense tensors or ``tf.IndexedSlices`` (the rows of an ``Embedding`` a batch touched).

A worker accumulates ``n_push`` steps' gradients, takes local steps with them and pushes their sum; a gradient
that arrives as ``tf.IndexedSlices`` stays that way: accumulating concatenates rows, a push sends each touched
row once (``dedupe``), split by the rows each ps shard holds (``split_rows``), and a local step is a scatter.
``payload_bytes`` counts what a push sends. Every function works on both kinds and inside ``tf.function``.

``add(tf.IndexedSlices(...), tf.IndexedSlices(...))``
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def is_sparse(g: Any) -> bool:
    """Whether ``g`` is a ``tf.IndexedSlices``."""
    import tensorflow as tf

    return isinstance(g, tf.IndexedSlices)


def dense(g: Any) -> Any:
    """``g`` as a dense tensor (an ``IndexedSlices`` scattered into zeros; duplicate rows add up)."""
    import tensorflow as tf

    return tf.convert_to_tensor(g)


def add(a: Any, b: Any) -> Any:
    """``a + b``: two ``IndexedSlices`` concatenate their rows, anything else is added densely."""
    import tensorflow as tf

    if is_sparse(a) and is_sparse(b):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([tf.cast(a.indices, tf.int64), tf.cast(b.indices, tf.int64)], 0),
                                a.dense_shape)
    return dense(a) + dense(b)


def dedupe(g: Any) -> Any:
    """``g`` with each row once (duplicates summed), indices int64; a dense ``g`` unchanged."""
    import tensorflow as tf

    if not is_sparse(g):
        return g
    rows, position = tf.unique(tf.cast(g.indices, tf.int64))
    values = tf.math.unsorted_segment_sum(g.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, tf.cast(g.dense_shape, tf.int64))


def map_values(fn: Callable[[Any], Any] | None, g: Any) -> Any:
    """``fn`` applied to a dense gradient, or to the values of the rows an ``IndexedSlices`` holds (so an
    elementwise transform ``T(g)`` means the same for both)."""
    import tensorflow as tf

    if fn is None:
        return g
    if is_sparse(g):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


def local_step(w: Any, g: Any, lr: float, keep: Any = None) -> Any:
    """``w - lr * g`` (a scatter for an ``IndexedSlices``); entries where ``keep`` is False are left as they are."""
    import tensorflow as tf

    if is_sparse(g):
        indices = tf.reshape(tf.cast(g.indices, tf.int64), (-1, 1))
        new = tf.tensor_scatter_nd_sub(w, indices, lr * g.values)
    else:
        new = w - lr * g
    if keep is None:
        return new
    return tf.where(tf.broadcast_to(keep, tf.shape(w)), new, w)


def split_rows(g: Any, sizes: Sequence[int]) -> list[Any]:
    """One piece of ``g`` per shard, the shards splitting axis 0 into ``sizes`` rows: ``tf.split`` for a dense ``g``;
    for an ``IndexedSlices``, the rows each shard holds, renumbered from that shard's first row."""
    import tensorflow as tf

    if len(sizes) == 1:
        return [g]
    if not is_sparse(g):
        return tf.split(g, list(sizes), axis=0)
    pieces, start = [], 0
    indices = tf.cast(g.indices, tf.int64)
    for size in sizes:
        inside = (indices >= start) & (indices < start + size)
        shape = tf.concat([tf.constant([size], tf.int64), tf.cast(g.dense_shape[1:], tf.int64)], 0)
        pieces.append(tf.IndexedSlices(tf.boolean_mask(g.values, inside), tf.boolean_mask(indices, inside) - start,
                                       shape))
        start += size
    return pieces


def gather_rows(shards: Sequence[Any], ids: Any) -> tuple[Any, Any]:
    """Rows ``ids`` (unique int64) of a variable split along axis 0 over ``shards``, each gathered on its shard's
    device: a full-size tensor with those rows filled and zeros elsewhere (rows nobody reads), and the bytes that
    came over (the rows and their int64 indices)."""
    import tensorflow as tf

    full = [sum(int(s.shape[0]) for s in shards), *[int(d) for d in shards[0].shape[1:]]]
    table = tf.zeros(full, shards[0].dtype)
    moved = tf.constant(0, tf.int64)
    start = 0
    for shard in shards:
        size = int(shard.shape[0])
        inside = tf.boolean_mask(ids, (ids >= start) & (ids < start + size))
        with tf.device(shard.device):
            rows = tf.gather(shard, inside - start)
        table = tf.tensor_scatter_nd_update(table, tf.reshape(inside, (-1, 1)), rows)
        moved += tf.size(rows, tf.int64) * rows.dtype.size + tf.size(inside, tf.int64) * 8
        start += size
    return table, moved


def payload_bytes(pieces: Sequence[Any]) -> Any:
    """Bytes of the tensors in ``pieces`` (an ``IndexedSlices``: its values and int64 row indices), int64."""
    import tensorflow as tf

    total = tf.constant(0, tf.int64)
    for g in pieces:
        if is_sparse(g):
            total += tf.size(g.values, tf.int64) * g.values.dtype.size + tf.size(g.indices, tf.int64) * 8
        else:
            total += tf.size(g, tf.int64) * g.dtype.size
    return total


def spec(piece_shape: Sequence[int], dtype: Any, sparse: bool) -> Any:
    """The ``tf.function`` input signature of one shard's gradient: a ``TensorSpec``, or an ``IndexedSlicesSpec``
    with int64 row indices."""
    import tensorflow as tf

    if sparse:
        return tf.IndexedSlicesSpec(shape=tuple(piece_shape), dtype=dtype, indices_dtype=tf.int64,
                                    dense_shape_dtype=tf.int64, indices_shape=[None])
    return tf.TensorSpec(tuple(piece_shape), dtype)
