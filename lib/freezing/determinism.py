"""Bit-reproducible runs on CPU: ``enable_determinism(seed)`` at the start of a run.

``enable_determinism(0)`` before a model is built makes two runs of the same program, on the same
machine with the same software, end with bit-identical weights. It

* seeds Python's ``random``, NumPy's global generator, TensorFlow's global seed and Keras' global
  ``SeedGenerator`` (``keras.utils.set_random_seed``), so weight initializers, dropout masks,
  ``fit``'s shuffling and unseeded ``tf.random`` ops draw the same numbers every run;
* calls ``tf.config.experimental.enable_op_determinism()``;
* returns, without setting them, the environment variables that give subprocesses the same settings
  (``TF_DETERMINISTIC_OPS=1``, ``PYTHONHASHSEED=<seed>``): this process's ``os.environ`` is left as it was.

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

The returned environment variables are for *later processes*, passed by the caller:
``subprocess.run(cmd, env={**os.environ, **enable_determinism(0)})``. ``PYTHONHASHSEED`` is read by
an interpreter only when it starts, so it fixes ``hash()`` of strings (and thus the iteration order
of sets of strings) in subprocesses, never in the current one (start Python with it set for that);
``TF_DETERMINISTIC_OPS=1`` makes TensorFlow in those subprocesses deterministic even if they do not
call this function. They still need seeds. They are returned rather than exported so that a library
call does not change what every later subprocess of the caller runs with.
"""

from __future__ import annotations

import keras
import tensorflow as tf

_MAX_SEED = 2**32 - 1  # np.random.seed and PYTHONHASHSEED accept no more


def enable_determinism(seed: int) -> dict[str, str]:
    """Seed every global generator and switch TensorFlow to deterministic ops, for bit-reproducible runs.

    Call it once at the start of a run, before building models or datasets; calling it again
    with the same seed restarts the same random streams. The settings stay in force for the rest
    of the process (TensorFlow has no public switch back). See the module docstring for what op
    determinism does on CPU and what stays nondeterministic.

    Args:
        seed: a Python ``int`` in ``[0, 2**32 - 1]`` (not a bool), the seed for Python, NumPy,
            TensorFlow and Keras, and the value of ``PYTHONHASHSEED`` for subprocesses.

    Returns:
        ``{"PYTHONHASHSEED": str(seed), "TF_DETERMINISTIC_OPS": "1"}``: the environment variables that give a
        subprocess the same settings; ``os.environ`` itself is not changed.

    Raises:
        ValueError: if ``seed`` is not an ``int`` in ``[0, 4294967295]``; nothing is changed then.

    Example:
        >>> import os
        >>> import tensorflow as tf
        >>> before = dict(os.environ)
        >>> env = enable_determinism(0)
        >>> first = tf.random.uniform([3]).numpy()
        >>> _ = enable_determinism(0)
        >>> bool((tf.random.uniform([3]).numpy() == first).all())
        True
        >>> env, dict(os.environ) == before  # for subprocesses; this process's environment is untouched
        ({'PYTHONHASHSEED': '0', 'TF_DETERMINISTIC_OPS': '1'}, True)
        >>> try:  # an op that cannot be deterministic refuses to run
        ...     tf.timestamp()
        ... except tf.errors.FailedPreconditionError:
        ...     print("refused")
        refused
        >>> enable_determinism(True)
        Traceback (most recent call last):
        ...
        ValueError: enable_determinism: seed must be an int in [0, 4294967295], not a bool; got True

        Undo it, so that the rest of this (test) process runs as before (TensorFlow has no public switch back;
        the library's compat module reaches its private one):

        >>> from freezing import _keras_api
        >>> _keras_api.disable_op_determinism()
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(
            f"enable_determinism: seed must be an int in [0, {_MAX_SEED}], not a bool; got {seed!r}"
        )
    keras.utils.set_random_seed(seed)  # Python random, NumPy, TensorFlow, Keras' SeedGenerator
    tf.config.experimental.enable_op_determinism()
    return {"PYTHONHASHSEED": str(seed), "TF_DETERMINISTIC_OPS": "1"}


def onednn_in_build() -> bool | None:
    """Whether this TensorFlow build has oneDNN kernels, which change the low bits of results across CPUs.

    A run is bit-reproducible on one machine (``enable_determinism``); between machines, oneDNN
    (``TF_ENABLE_ONEDNN_OPTS``, read by TensorFlow at import) picks kernels by CPU features, so record
    this next to results that are compared across machines.

    Returns:
        True or False, or None when this TensorFlow no longer answers (TensorFlow has no public way to ask).

    Example:
        >>> onednn_in_build() in (True, False, None)
        True
    """
    from freezing import _keras_api

    return _keras_api.onednn_in_build()
