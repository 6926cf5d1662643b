"""MaskedOptimizer keeps no process-wide state on its write path: steps running at the same time in two
Python threads (eager, or two ``tf.function`` steps traced and run concurrently), and several wrapped
optimizers inside one traced step, each keep every frozen bit of their own variables.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer
from freezing.audit import changed_bits

SHAPE = (48, 40)


def _model(seed: int) -> tuple[keras.Variable, MaskedOptimizer, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = keras.Variable(rng.normal(size=SHAPE).astype("float32"), name=f"w{seed}")
    opt = MaskedOptimizer(keras.optimizers.Adam(0.01))
    opt.build([w])
    keep = rng.random(SHAPE) < 0.5
    opt.set_mask(w, keep)
    return w, opt, keep, w.numpy().copy()


def _run_two(step_of, steps: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Train two models at once from two threads (a barrier before every step), then return (before, after, keep)."""
    models = [_model(seed) for seed in (1, 2)]
    barrier, errors = threading.Barrier(2, timeout=120), []

    def train(i: int) -> None:
        w, opt, _, _ = models[i]
        step = step_of(w, opt)
        grad = tf.ones(SHAPE)
        try:
            for _ in range(steps):
                barrier.wait()
                step(grad)
        except Exception as e:  # noqa: BLE001 - reported below, with the other thread released
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    return [(before, w.numpy(), keep) for w, _, keep, before in models]


def _eager(w, opt):
    return lambda grad: opt.apply_gradients([(grad, w)])


def _graph(w, opt):
    @tf.function
    def step(grad):
        opt.apply_gradients([(grad, w)])

    return step


@pytest.mark.parametrize("step_of", [_eager, _graph], ids=["eager", "tf.function"])
def test_two_models_trained_at_once_in_two_threads_keep_every_frozen_bit(step_of):
    results = _run_two(step_of, steps=40)
    for before, after, keep in results:
        assert int((changed_bits(before, after) & ~keep).sum()) == 0
        assert changed_bits(before, after)[keep].all()  # and every trainable entry trained


def test_two_masked_optimizers_in_one_traced_step_each_stay_guarded():
    """A GAN's D and G step: two wrapped optimizers applied in one tf.function."""
    (d, opt_d, keep_d, d0), (g, opt_g, keep_g, g0) = _model(3), _model(4)

    @tf.function
    def step():
        opt_d.apply_gradients([(tf.ones(SHAPE), d)])
        opt_g.apply_gradients([(tf.ones(SHAPE), g)])

    for _ in range(3):
        step()
    for before, var, keep in ((d0, d, keep_d), (g0, g, keep_g)):
        moved = changed_bits(before, var.numpy())
        assert not (moved & ~keep).any() and moved[keep].all()
