"""Bit-reproducible runs on CPU: ``enable_determinism(seed)`` at the start of a run.

``enable_determinism(0)`` before a model is built makes two runs of the same program, on the same
machine with the same software, end with bit-identical weights. It

* seeds Python's ``random``, NumPy's global generator, TensorFlow's global seed and Keras' global
  ``SeedGenerator`` (``keras.utils.set_random_seed``), so weight initializers, dropout masks,
  ``fit``'s shuffling and unseeded ``tf.random`` ops draw the same numbers every run;
* calls ``tf.config.experimental.enable_op_determinism()``;
* sets ``TF_DETERMINISTIC_OPS=1`` and ``PYTHONHASHSEED=<seed>`` in ``os.environ``.

What ``enable_op_determinism`` does, on CPU in particular:

* Ops that have no deterministic implementation *raise* instead of running nondeterministically.
  Most of them are GPU kernels (``bincount``, the sparse-dense matmul and the fused softmax
  cross-entropy, for example, raise ``UnimplementedError`` there); on CPU the ones that refuse
  are those that are nondeterministic by nature: ``tf.timestamp``
  (``FailedPreconditionError``), ``tf.random.Generator.from_non_deterministic_state`` and any
  random op without a seed (``RuntimeError``; the global seed set here gives every op one).
  TensorFlow notes that, due to bugs, some ops may be nondeterministic without raising.
* ``tf.data`` is made deterministic: the ``deterministic`` argument of ``Dataset.map``,
  ``Dataset.batch``, ``interleave`` and the ``experimental_deterministic`` option are forced to
  True, so parallel ``map`` keeps the input order; a ``map``/``interleave`` whose function has
  stateful ops (random ops included) runs serially, ignoring ``num_parallel_calls``; and
  ``prefetch`` and other parallel stages run serially when a function in the pipeline has
  (non-legacy-random) stateful ops. Input pipelines can become much slower.
* Only outputs and side effects of ops become deterministic, not timing or memory use.

What stays outside its reach:

* ``tf.compat.v1.Session`` (the TF1 graph-mode API, used by ``gradients.compute_tf1`` and by the
  graph-mode paths of ``slots``) and ``ParameterServerStrategy`` are documented by TensorFlow as
  possible sources of nondeterminism; asynchronous training, where workers update shared
  variables in an order set by timing, is not reproducible whatever the flags.
* Randomness outside TensorFlow: ``numpy.random.default_rng()`` and ``random.Random()`` instances
  ignore the global seeds (pass them a seed), as do ``/dev/urandom``, threads and processes.
* Results are reproducible on the same hardware with the same software and thread settings.
  Eigen and oneDNN (``TF_ENABLE_ONEDNN_OPTS``, which TensorFlow reads only at import, so this
  function cannot change it) choose how to split sums by CPU features and thread count, so a
  different CPU or a different number of intra-op threads may change the last bits. Different
  TensorFlow or Keras versions may too.

The two environment variables act on *later processes*: ``PYTHONHASHSEED`` is read by an
interpreter only when it starts, so it fixes ``hash()`` of strings (and thus the iteration order of
sets of strings) in subprocesses this run starts, never in the current one (start Python with it
set for that); ``TF_DETERMINISTIC_OPS=1`` makes TensorFlow in those subprocesses (for example
cluster workers) deterministic even if they do not call this function. They still need seeds.
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf

_MAX_SEED = 2**32 - 1  # np.random.seed and PYTHONHASHSEED accept no more


def enable_determinism(seed: int) -> None:
    """Seed every global generator and switch TensorFlow to deterministic ops, for bit-reproducible runs.

    Call it once at the start of a run, before building models or datasets; calling it again
    with the same seed restarts the same random streams. The settings stay in force for the rest
    of the process (TensorFlow has no public switch back). See the module docstring for what op
    determinism does on CPU and what stays nondeterministic.

    Args:
        seed: a Python ``int`` in ``[0, 2**32 - 1]`` (not a bool), the seed for Python, NumPy,
            TensorFlow and Keras, and the value of ``PYTHONHASHSEED`` for subprocesses.

    Returns:
        None.

    Raises:
        ValueError: if ``seed`` is not an ``int`` in ``[0, 4294967295]``; nothing is changed then.

    Example:
        >>> import os
        >>> import tensorflow as tf
        >>> saved = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "TF_DETERMINISTIC_OPS")}
        >>> enable_determinism(0)
        >>> first = tf.random.uniform([3]).numpy()
        >>> enable_determinism(0)
        >>> bool((tf.random.uniform([3]).numpy() == first).all())
        True
        >>> os.environ["PYTHONHASHSEED"], os.environ["TF_DETERMINISTIC_OPS"]
        ('0', '1')
        >>> try:  # an op that cannot be deterministic refuses to run
        ...     tf.timestamp()
        ... except tf.errors.FailedPreconditionError:
        ...     print("refused")
        refused
        >>> enable_determinism(True)
        Traceback (most recent call last):
        ...
        ValueError: enable_determinism: seed must be an int in [0, 4294967295], not a bool; got True

        Undo it, so that the rest of this (test) process runs as before:

        >>> from tensorflow.python.framework import config as tf_config
        >>> tf_config.disable_op_determinism()
        >>> for key, value in saved.items():
        ...     if value is None:
        ...         del os.environ[key]
        ...     else:
        ...         os.environ[key] = value
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(
            f"enable_determinism: seed must be an int in [0, {_MAX_SEED}], not a bool; got {seed!r}"
        )
    os.environ["PYTHONHASHSEED"] = str(seed)  # only subprocesses started from now on see it
    os.environ["TF_DETERMINISTIC_OPS"] = "1"  # likewise; this process is switched just below
    keras.utils.set_random_seed(seed)  # Python random, NumPy, TensorFlow, Keras' SeedGenerator
    tf.config.experimental.enable_op_determinism()
