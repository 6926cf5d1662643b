"""One source of truth: what a variable's step does is read off its mask, so no restored state can bring a mask
and a mode that disagree. State from an earlier freezing (a mode stored beside each mask) loads when the two
agree and is refused, with nothing written, when they do not; sparse selections are checked against their
variables and masks the same way.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer

KEEP = [True, False, True, False]


def _built(name: str = "adam", **kwargs) -> tuple[keras.Variable, MaskedOptimizer]:
    w = keras.Variable([1.0, 2.0, 3.0, 4.0], name="w")
    opt = MaskedOptimizer(keras.optimizers.get(name), **kwargs)
    opt.build([w])
    return w, opt


def _steps(opt: MaskedOptimizer, w: keras.Variable, n: int = 3) -> None:
    for _ in range(n):
        opt.apply_gradients([(tf.ones(4), w)])


def _frozen_moved(before: np.ndarray, w: keras.Variable) -> int:
    return int((before[~np.array(KEEP)] != w.numpy()[~np.array(KEEP)]).sum())


@pytest.mark.parametrize("route", ["set_weights", "load_own_variables"])
def test_an_earlier_versions_state_whose_mode_says_no_mask_beside_a_partial_mask_is_refused(route):
    w, opt = _built()
    before_state = [a.copy() for a in opt.get_weights()]
    inner = [np.asarray(v.numpy()) for v in opt.inner.variables]
    legacy = inner + [np.array(KEEP), np.array([0], np.int32)]  # mode 0, "no mask": what 1ae0156 trained unmasked
    load = opt.set_weights if route == "set_weights" else (
        lambda values: opt.load_own_variables({str(i): v for i, v in enumerate(values)}))
    with pytest.raises(ValueError, match=r"'w' they disagree: the mode says 'no mask', the mask 'some entries frozen'"):
        load(legacy)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before_state, opt.get_weights()))  # nothing written
    legacy[-1] = np.array([2], np.int32)  # the same state with the mode it should have had: loads, and holds
    load(legacy)
    before = w.numpy().copy()
    _steps(opt, w)
    assert _frozen_moved(before, w) == 0 and opt.get_mask(w).tolist() == KEEP


def test_a_partial_mask_set_through_set_weights_is_held_with_no_mode_to_agree_with():
    w, opt = _built()
    opt.set_weights([np.asarray(v.numpy()) for v in opt.inner.variables] + [np.array(KEEP)])
    before = w.numpy().copy()
    _steps(opt, w)
    assert _frozen_moved(before, w) == 0 and (before[np.array(KEEP)] != w.numpy()[np.array(KEEP)]).all()


def test_an_earlier_checkpoint_whose_mode_says_no_mask_restores_the_mask_and_holds_it(tmp_path):
    w, src = _built()
    src.set_mask(w, KEEP)
    src._masks.mode = tf.Variable(np.array([0], np.int32), name="modes")  # the earlier layout, disagreeing
    path = tf.train.Checkpoint(optimizer=src).write(str(tmp_path / "ckpt"))
    w2, dst = _built()
    tf.train.Checkpoint(optimizer=dst).read(path).expect_partial()
    assert dst.get_mask(w2).tolist() == KEEP
    before = w2.numpy().copy()
    _steps(dst, w2)
    assert _frozen_moved(before, w2) == 0


def test_restored_masks_that_train_every_entry_or_none_are_stored_as_the_cheap_scalar():
    w, opt = _built()
    inner = [np.asarray(v.numpy()) for v in opt.inner.variables]
    opt.set_weights(inner + [np.ones(4, bool)])
    assert opt.get_mask(w) is None and opt.mask_bytes() == 1
    opt.set_weights(inner + [np.zeros(4, bool)])
    assert opt.get_mask(w).tolist() == [False] * 4 and opt.mask_bytes() == 1
    before = w.numpy().copy()
    _steps(opt, w)
    assert w.numpy().tobytes() == before.tobytes()


def test_a_sparse_variables_mask_and_selection_are_checked_on_load():
    w = keras.Variable([1.0, 2.0, 3.0, 4.0], name="w")
    opt = MaskedOptimizer("adam", state="sparse")
    opt.set_mask("w", KEEP)
    opt.build([w])
    good = opt.get_weights()
    n_inner = len(opt.inner.variables)
    partial = [a.copy() for a in good]
    partial[n_inner] = np.array([False, True, True, True])
    with pytest.raises(ValueError, match=r"'w' has sparse state: its trainable entries are its selection"):
        opt.set_weights(partial)
    outside = [a.copy() for a in good]
    outside[-1] = np.array([0, 9], np.int32)
    with pytest.raises(ValueError, match=r"sparse selection of 'w' must be distinct flat positions in 0..3"):
        opt.set_weights(outside)
    repeated = [a.copy() for a in good]
    repeated[-1] = np.array([2, 2], np.int32)
    with pytest.raises(ValueError, match=r"sparse selection of 'w'.*got \[2, 2\]"):
        opt.set_weights(repeated)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(good, opt.get_weights()))
    opt.set_weights(good)
