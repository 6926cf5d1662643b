"""Property test: MaskedOptimizer keeps frozen entries bit-exact for every optimizer and policy.

Random shapes, random masks that change every step, and the edge masks (all-0, all-1, scalar).
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from optimizer_zoo import OPTIMIZERS, make_optimizer

from freezing import FreezeAudit, MaskedOptimizer, slot_initial_value, slots

MASK_KINDS = ("random", "all0", "all1", "scalar0", "scalar1")
PROPERTY = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _mask(kind: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    if kind == "random":
        return rng.random(shape) < 0.5
    if kind.startswith("scalar"):
        return np.asarray(kind == "scalar1")
    return np.full(shape, kind == "all1")


def _grad(shape: tuple, rng: np.random.Generator) -> tf.Tensor:
    return tf.constant(rng.normal(size=shape).astype(np.float32))


case = st.fixed_dictionaries({
    "shape": array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
    "kinds": st.lists(st.sampled_from(MASK_KINDS), min_size=1, max_size=4),
    "seed": st.integers(0, 2**16),
})


@pytest.mark.parametrize("policy", ["hold", "reset"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@PROPERTY
@given(case=case)
def test_frozen_entries_never_change(name, policy, case):
    rng = np.random.default_rng(case["seed"])
    shape = case["shape"]
    w = tf.Variable(rng.normal(size=shape).astype(np.float32), name="w")
    b = tf.Variable(rng.normal(size=(3,)).astype(np.float32), name="b")
    opt = MaskedOptimizer(make_optimizer(name, 0.05), policy)
    opt.build([w, b])
    # warm the slots up so that there is state to drift with
    opt.apply_gradients([(_grad(shape, rng), w), (_grad((3,), rng), b)])
    audit = FreezeAudit([w, b], optimizer=opt)
    n_frozen = 0
    for kind in case["kinds"]:
        keep = _mask(kind, shape, rng)
        frozen = ~np.broadcast_to(keep, shape)
        n_frozen += int(frozen.sum())
        with audit.step(frozen=[frozen, np.zeros(3, bool)]):
            opt.apply_gradients([(_grad(shape, rng), w), (_grad((3,), rng), b)], trainable_masks=[keep, None])
        if policy == "reset":
            for slot_name, slot in slots(opt, w).items():
                assert np.all(slot.numpy()[frozen] == slot_initial_value(opt, slot_name)), slot_name
    rows = [r for r in audit.rows() if r["tensor"] == "w"]
    moved = [r for r in audit.rows() if r["changed"] > 0]
    assert sum(r["frozen"] for r in rows) == n_frozen  # the audit saw every frozen entry
    assert sum(r["changed"] for r in rows) == 0, moved
    if policy == "hold":
        assert audit.changed == 0, moved


def _twins(name: str, policy: str, shape: tuple, rng: np.random.Generator):
    """A plain optimizer and a MaskedOptimizer, each with its own copy of the same variable."""
    init = rng.normal(size=shape).astype(np.float32)
    plain_w, masked_w = tf.Variable(init, name="w"), tf.Variable(init, name="w")
    plain, masked = make_optimizer(name, 0.05), MaskedOptimizer(make_optimizer(name, 0.05), policy)
    plain.build([plain_w])
    masked.build([masked_w])
    return plain, plain_w, masked, masked_w


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


def _assert_same_bits(a, b, where=None, what=""):
    a, b = _bits(a), _bits(b)
    if where is not None:
        a, b = a[where], b[where]
    np.testing.assert_array_equal(a, b, err_msg=what)


# With no entry frozen every policy takes the same plain path; make test checks "hold", make test-slow the others.
OTHER_POLICIES = [pytest.param(p, marks=pytest.mark.slow) for p in ("reset", "none")]


@pytest.mark.parametrize("policy", ["hold", *OTHER_POLICIES])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@PROPERTY
@given(case=case, mask_kind=st.sampled_from(["none", "all1", "scalar1", "float1"]))
def test_unmasked_steps_are_bit_identical_to_the_plain_optimizer(name, policy, case, mask_kind):
    rng = np.random.default_rng(case["seed"])
    shape = case["shape"]
    plain, plain_w, masked, masked_w = _twins(name, policy, shape, rng)
    mask = {"none": None, "all1": np.ones(shape, bool), "scalar1": True,
            "float1": np.ones(shape, np.float32)}[mask_kind]
    for _ in case["kinds"]:
        g = _grad(shape, rng)
        plain.apply_gradients([(g, plain_w)])
        masked.apply_gradients([(g, masked_w)], trainable_masks=None if mask is None else [mask])
    _assert_same_bits(plain_w.numpy(), masked_w.numpy(), what="value")
    for slot_name, slot in slots(plain, plain_w).items():
        _assert_same_bits(slot.numpy(), slots(masked, masked_w)[slot_name].numpy(), what=slot_name)


# Lamb scales each step by the norm of the whole update (its trust ratio), which is read from the
# slots after they are written: holding the frozen entries' moments changes that norm, so Lamb's
# trainable entries legitimately differ from the plain step. Every other optimizer is elementwise.
ELEMENTWISE = sorted(set(OPTIMIZERS) - {"lamb"})


@pytest.mark.parametrize("policy", ["hold", pytest.param("reset", marks=pytest.mark.slow)])  # reset: make test-slow
@pytest.mark.parametrize("name", ELEMENTWISE)
@PROPERTY
@given(case=case)
def test_a_masked_step_equals_the_plain_step_where_trainable(name, policy, case):
    rng = np.random.default_rng(case["seed"])
    shape = case["shape"]
    plain, plain_w, masked, masked_w = _twins(name, policy, shape, rng)
    g = _grad(shape, rng)  # identical warm-up on both, so the states agree before the masked step
    plain.apply_gradients([(g, plain_w)])
    masked.apply_gradients([(g, masked_w)])
    before = masked_w.numpy().copy()
    keep = np.broadcast_to(_mask(case["kinds"][0], shape, rng), shape)
    g = _grad(shape, rng)
    plain.apply_gradients([(g, plain_w)])
    masked.apply_gradients([(g, masked_w)], trainable_masks=[keep])
    _assert_same_bits(plain_w.numpy(), masked_w.numpy(), where=keep, what="trainable values")
    _assert_same_bits(before, masked_w.numpy(), where=~keep, what="frozen values")
    for slot_name, slot in slots(plain, plain_w).items():
        if tuple(slot.shape) == tuple(shape):
            _assert_same_bits(slot.numpy(), slots(masked, masked_w)[slot_name].numpy(), where=keep, what=slot_name)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@PROPERTY
@given(case=case)
def test_policy_none_is_the_inner_optimizer_on_gated_gradients(name, case):
    rng = np.random.default_rng(case["seed"])
    shape = case["shape"]
    plain, plain_w, masked, masked_w = _twins(name, "none", shape, rng)
    for kind in case["kinds"]:
        keep = np.broadcast_to(_mask(kind, shape, rng), shape)
        g = _grad(shape, rng)
        plain.apply_gradients([(tf.where(keep, g, 0.0), plain_w)])
        masked.apply_gradients([(g, masked_w)], trainable_masks=[keep])
    _assert_same_bits(plain_w.numpy(), masked_w.numpy(), what="value")
