"""Independent seeded jobs in worker processes, with the results of one process, in the order given.

The GAN sweep (03) and the optimizer matrix of 01 run many small trainings whose TensorFlow ops are too small to
keep both cores busy: one process uses little more than one core. Their jobs share nothing, and each starts
from its own seed (``freezing.enable_determinism``), so they can run side by side in ``spawn``-ed processes and
give the same bits as run one after the other with the same thread count (``tests/test_gan_study.py`` checks it
for the GAN sweep). Measured on 2 cores: two processes of one thread each ran the GAN's iteration in 9-10 ms
each, where two processes of two threads took 19 ms each.

``map_in_processes(train, [(a, 1), (b, 2)], processes=2)`` is ``[train(a, 1), train(b, 2)]``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def _start_worker(threads: int | None) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads is not None:  # before TensorFlow runs its first op, or the setting is refused
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def map_in_processes(fn: Callable[..., Any], jobs: Sequence[tuple], processes: int, threads: int | None = None,
                     on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``[fn(*job) for job in jobs]``, computed by up to ``processes`` worker processes.

    Args:
        fn: a module-level function (it is pickled by reference); it must not depend on what ran before it in
            the same process: seed inside it.
        jobs: the argument tuples, one per call; they and the results are pickled.
        processes: how many worker processes; 1 without ``threads`` runs every job here, in this process.
        threads: TensorFlow's intra- and inter-op threads in each worker. Given, every job runs in a worker,
            even with ``processes=1``: the thread count can change float results, so the same ``threads`` gives
            the same bits for any ``processes``. Small ops run faster on one thread per process, side by side,
            than on two threads that contend with another process for two cores.
        on_result: called as ``on_result(index, result)`` for each job in the order of ``jobs`` (so progress
            output is the same for any ``processes``).

    Returns:
        The results, in the order of ``jobs``.

    Raises:
        ValueError: if ``processes`` is not a positive integer. An exception in a job is raised here.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes: expected an integer >= 1; got {processes!r}")
    results: list[Any] = []
    if threads is None and (processes == 1 or len(jobs) <= 1):
        for i, job in enumerate(jobs):
            results.append(fn(*job))
            if on_result is not None:
                on_result(i, results[-1])
        return results
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no TensorFlow state forked
    with ProcessPoolExecutor(max_workers=max(1, min(processes, len(jobs))), mp_context=context,
                             initializer=_start_worker, initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for i, future in enumerate(futures):
            results.append(future.result())
            if on_result is not None:
                on_result(i, results[-1])
    return results
