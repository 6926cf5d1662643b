"""MaskedOptimizer pays only for what is masked: per-variable modes, reset once, sparse gradients, XLA fit.

Each variable's update takes the path its mask implies (freezing._masks): no mask -> Keras' own update with
no masking op; wholly frozen -> no update at all; some entries -> the masked write. The tests spy on the
write path to show which path ran, and check bits against a plain Keras optimizer.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from freezing import MaskedOptimizer, _masks, _write_path, slots
from freezing._tuning import WriteTuning
from freezing.audit import changed_bits


@pytest.fixture(params=["small", "dispatch", "fused"])
def write(request, monkeypatch):
    """Run a test three ways: with the defaults (these small variables always take the masked update in a graph),
    with every variable dispatching on its mode, and with that plus every masked write as one XLA-compiled pass."""
    monkeypatch.setattr(_write_path, "DEFAULT_TUNING", WriteTuning(
        dispatch_above=1 << 40 if request.param == "small" else 1,
        fuse_above=1 if request.param == "fused" else 1 << 40))
    return request.param


def _fused(variable) -> dict:
    """The XLA-compiled writes the guard made for a variable (shared by its guarded methods)."""
    return variable.value.assign.fused


def _bits(a) -> bytes:
    return np.asarray(a).tobytes()


def _state(opt, v) -> list[np.ndarray]:
    """The variable and every slot shaped like it."""
    return [v.numpy().copy()] + [s.numpy().copy() for s in slots(opt, v).values() if tuple(s.shape) == tuple(v.shape)]


def _held(before, after, keep) -> bool:
    return all(not np.any(changed_bits(b, a) & ~np.broadcast_to(keep, b.shape)) for b, a in zip(before, after))


class Spy:
    """Counts calls of the masking ``where`` and of the inner optimizer's ``update_step``."""

    def __init__(self, monkeypatch, opt):
        self.wheres = self.updates = 0
        where = _masks.where

        def counting_where(*args, **kwargs):
            self.wheres += 1
            return where(*args, **kwargs)

        monkeypatch.setattr(_masks, "where", counting_where)
        path = opt._paths[0]
        update = path.plain

        def counting_update(*args, **kwargs):
            self.updates += 1
            return update(*args, **kwargs)

        monkeypatch.setattr(path, "plain", counting_update)


def _twins(shape=(5, 4), inner=lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1), **kw):
    rng = np.random.default_rng(0)
    init = rng.normal(size=shape).astype("float32")
    pw, mw = keras.Variable(init, name="w"), keras.Variable(init, name="w")
    plain, masked = inner(), MaskedOptimizer(inner(), **kw)
    plain.build([pw])
    masked.build([mw])
    grads = [tf.constant(rng.normal(size=shape).astype("float32")) for _ in range(4)]
    return plain, pw, masked, mw, grads


def test_an_unmasked_variable_takes_keras_own_update_with_no_masking_op(monkeypatch):
    plain, pw, masked, mw, grads = _twins()
    spy = Spy(monkeypatch, masked)
    for g in grads:
        plain.apply_gradients([(g, pw)])
        masked.apply_gradients([(g, mw)])
    assert spy.wheres == 0 and spy.updates == len(grads)
    assert all(_bits(a) == _bits(b) for a, b in zip(_state(plain, pw), _state(masked, mw)))


def test_a_wholly_frozen_variable_is_not_updated_at_all_and_its_slots_are_untouched(monkeypatch):
    plain, pw, masked, mw, grads = _twins()
    masked.apply_gradients([(grads[0], mw)])  # moments to drift with
    masked.set_mask(mw, False)
    assert _masks.stored_mode(masked._masks.keep[0]) == _masks.FROZEN
    before = _state(masked, mw)
    spy = Spy(monkeypatch, masked)
    for g in grads:
        masked.apply_gradients([(g, mw)])
    assert spy.updates == 0  # Adam never ran for it (AdamW's decay did, and the guard kept none of it)
    assert all(_bits(a) == _bits(b) for a, b in zip(before, _state(masked, mw)))
    assert int(masked.iterations.numpy()) == len(grads) + 1


def test_per_element_masks_take_the_masked_write(monkeypatch):
    shape = (40, 10)
    keep = np.random.default_rng(1).random(shape) < 0.5
    plain, pw, masked, mw, grads = _twins(shape)
    plain.apply_gradients([(grads[0], pw)])
    masked.apply_gradients([(grads[0], mw)])
    masked.set_mask(mw, keep)
    assert _masks.stored_mode(masked._masks.keep[0]) == _masks.ELEMENTS
    spy = Spy(monkeypatch, masked)
    before = _state(masked, mw)
    for g in grads[1:]:
        plain.apply_gradients([(g, pw)])
        masked.apply_gradients([(g, mw)])
    assert spy.wheres > 0 and spy.updates == len(grads) - 1
    after = _state(masked, mw)
    assert _held(before, after, keep)
    assert np.all(after[0][keep] != before[0][keep])


def test_the_masked_write_gives_the_plain_optimizer_bits_where_trainable():
    shape = (40, 10)
    rng = np.random.default_rng(2)
    for frozen_share in (0.5, 0.03):
        keep = rng.random(shape) >= frozen_share
        plain, pw, masked, mw, grads = _twins(shape)
        for g in grads[:2]:  # identical warm-up: the states agree before the masked step
            plain.apply_gradients([(g, pw)])
            masked.apply_gradients([(g, mw)])
        masked.set_mask(mw, keep)
        before = _state(masked, mw)
        plain.apply_gradients([(grads[2], pw)])
        masked.apply_gradients([(grads[2], mw)])
        for b, p, m in zip(before, _state(plain, pw), _state(masked, mw)):
            assert _bits(p[keep]) == _bits(m[keep]) and _bits(b[~keep]) == _bits(m[~keep])


def test_set_mask_switches_every_mode_inside_one_tf_function_without_retracing(write):
    shape = (20, 10)
    rng = np.random.default_rng(3)
    plain, pw, masked, mw, _ = _twins(shape)
    few = np.ones(shape, bool)
    few[0, :3] = False
    masks = [True, rng.random(shape) < 0.5, False, few, rng.random(shape) < 0.5, True]
    modes = [_masks.UNMASKED, _masks.ELEMENTS, _masks.FROZEN, _masks.ELEMENTS, _masks.ELEMENTS, _masks.UNMASKED]

    @tf.function
    def step(g):
        masked.apply_gradients([(g, mw)])

    for keep, mode in zip(masks, modes):
        masked.set_mask(mw, keep)
        assert _masks.stored_mode(masked._masks.keep[0]) == mode
        before = _state(masked, mw)
        step(tf.constant(rng.normal(size=shape).astype("float32")))
        assert _held(before, _state(masked, mw), keep)
    assert step.experimental_get_tracing_count() == 1
    assert bool(_fused(mw)) == (write == "fused")


def _count_traces(opt) -> list[int]:
    """Python calls of apply_gradients: inside fit they happen only while the train step is traced."""
    count = [0]
    apply_gradients = opt.apply_gradients

    def counting(*args, **kwargs):
        count[0] += 1
        return apply_gradients(*args, **kwargs)

    object.__setattr__(opt, "apply_gradients", counting)
    return count


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, name="fc1"), keras.layers.Dense(2, name="fc2")])


DATA = (np.random.default_rng(4).normal(size=(32, 4)).astype("float32"),
        np.random.default_rng(5).normal(size=(32, 2)).astype("float32"))


class CycleModes(keras.callbacks.Callback):
    """Before each batch: a mask of the next mode on every variable; after it, checks nothing frozen moved."""

    def __init__(self, opt, seed=0):
        super().__init__()
        self.opt, self.rng, self.violations, self.batch = opt, np.random.default_rng(seed), [], 0

    def on_train_batch_begin(self, batch, logs=None):
        if not self.opt.built:  # fit builds the optimizer inside its first step; build it now to set masks
            self.opt.build(self.model.trainable_variables)
        self.keeps = []
        for i, v in enumerate(self.model.trainable_variables):
            kind = (self.batch + i) % 4
            shape = tuple(v.shape)
            keep = {0: np.ones(shape, bool), 1: np.zeros(shape, bool), 2: self.rng.random(shape) < 0.5,
                    3: self.rng.random(shape) < 0.97}[kind]
            self.opt.set_mask(v, keep)
            self.keeps.append(keep)
        self.before = [_state(self.opt, v) for v in self.model.trainable_variables]
        self.batch += 1

    def on_train_batch_end(self, batch, logs=None):
        for v, before, keep in zip(self.model.trainable_variables, self.before, self.keeps):
            if not _held(before, _state(self.opt, v), keep):
                self.violations.append((self.batch, v.path))


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_fit_cycles_every_mode_exactly_with_one_trace(jit_compile, write):
    model, opt = _model(), MaskedOptimizer(keras.optimizers.AdamW(0.05, weight_decay=0.1))
    model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
    traces = _count_traces(opt)
    check = CycleModes(opt)
    model.fit(*DATA, epochs=3, batch_size=8, verbose=0, shuffle=False, callbacks=[check])
    assert check.batch == 12 and check.violations == []
    assert traces[0] == 1


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_fit_without_masks_gives_plain_keras_bits(jit_compile):
    def run(opt):
        model = _model(seed=1)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
        model.fit(*DATA, epochs=2, batch_size=8, verbose=0, shuffle=False)
        return b"".join(_bits(w.numpy()) for w in model.weights)

    assert run(keras.optimizers.AdamW(0.05, weight_decay=0.1)) == run(
        MaskedOptimizer(keras.optimizers.AdamW(0.05, weight_decay=0.1)))


def test_fused_masked_writes_give_the_bits_of_tensorflow_ops(monkeypatch):
    """The fused write compiles only where(keep, t + d, t) and the write: no multiply-add to contract."""
    shape = (64, 48)
    keep = np.random.default_rng(9).random(shape) < 0.5
    out = {}
    for fuse_above in (1 << 40, 1):
        monkeypatch.setattr(_write_path, "DEFAULT_TUNING", WriteTuning(fuse_above=fuse_above))
        plain, pw, masked, mw, grads = _twins(shape, inner=lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1))
        masked.set_mask(mw, keep)
        step = tf.function(lambda g: masked.apply_gradients([(g, mw)]))
        for g in grads:
            step(g)
        assert bool(_fused(mw)) == (fuse_above == 1)
        out[fuse_above] = _state(masked, mw)
    assert all(_bits(a) == _bits(b) for a, b in zip(out[1 << 40], out[1]))


def test_xla_fit_with_masks_matches_the_graph_fit_to_rounding_and_holds_frozen_bits():
    keep = np.random.default_rng(6).random((4, 6)) < 0.5
    out = {}
    for jit in (False, True):
        model, opt = _model(seed=2), MaskedOptimizer(keras.optimizers.Adam(0.05))
        model.compile(optimizer=opt, loss="mse", jit_compile=jit)
        kernel = model.get_layer("fc1").kernel
        opt.set_mask(kernel, keep)
        before = kernel.numpy().copy()
        model.fit(*DATA, epochs=2, batch_size=8, verbose=0, shuffle=False)
        assert _bits(kernel.numpy()[~keep]) == _bits(before[~keep])
        out[jit] = kernel.numpy()
    # XLA contracts a * b + c into fused multiply-adds, so trainable entries may differ in the last bits
    np.testing.assert_allclose(out[True], out[False], rtol=1e-5, atol=1e-6)


def test_reset_resets_the_frozen_moments_once_at_set_mask_then_holds_like_hold():
    shape = (6, 5)
    keep = np.random.default_rng(7).random(shape) < 0.5
    plain, _, reset, rw, grads = _twins(shape, inner=lambda: keras.optimizers.Adam(0.1), policy="reset")
    _, _, hold, hw, _ = _twins(shape, inner=lambda: keras.optimizers.Adam(0.1), policy="hold")
    for opt, w in ((reset, rw), (hold, hw)):
        opt.apply_gradients([(grads[0], w)])
    reset.set_mask(rw, keep)
    m = slots(reset, rw)["momentum"].numpy()
    assert np.all(m[~keep] == 0) and np.all(m[keep] != 0)  # reset at once, before any step
    for name, slot in slots(hold, hw).items():  # the same reset by hand on the hold twin
        slot.assign(np.where(keep, slot.numpy(), 0.0))
    hold.set_mask(hw, keep)
    for g in grads[1:]:
        reset.apply_gradients([(g, rw)])
        hold.apply_gradients([(g, hw)])
    assert all(_bits(a) == _bits(b) for a, b in zip(_state(reset, rw), _state(hold, hw)))
    assert np.all(slots(reset, rw)["momentum"].numpy()[~keep] == 0)  # held at their reset value
    reset.set_mask(rw, True)
    reset.apply_gradients([(grads[1], rw)])
    assert np.all(slots(reset, rw)["momentum"].numpy() != 0)  # unfrozen, they resume from the reset value


@pytest.mark.parametrize("frozen_rows", [[4], [4, 7]], ids=["one_row", "two_rows"])
@pytest.mark.parametrize("inner", ["sgd", "adagrad", "adam"])
def test_indexed_slices_stay_sparse_through_the_masked_write(inner, frozen_rows):
    vocab, dim = 10, 3
    rows = np.array([1, 4, 4, 7])
    keep = np.ones((vocab, 1), bool)
    keep[frozen_rows] = False

    def make(opt_fn):
        keras.utils.set_random_seed(0)
        layer = keras.layers.Embedding(vocab, dim)
        layer.build((None,))
        return layer, opt_fn()

    def grads(layer):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant(rows)) ** 2)
        g = tape.gradient(loss, layer.embeddings)
        assert isinstance(g, tf.IndexedSlices)
        return g

    plain_layer, plain = make(lambda: keras.optimizers.get(inner))
    layer, opt = make(lambda: MaskedOptimizer(keras.optimizers.get(inner)))
    table = layer.embeddings
    opt.build([table])
    opt.set_mask(table, keep)
    assert _masks.stored_mode(opt._masks.keep[0]) == _masks.ELEMENTS
    writes = []
    guarded = table.value
    for name in ("assign", "assign_add", "assign_sub", "scatter_update", "scatter_add", "scatter_sub"):
        def spy(*args, name=name, write=getattr(guarded, name), **kwargs):
            writes.append(name)
            return write(*args, **kwargs)
        object.__setattr__(guarded, name, spy)
    before = table.numpy().copy()
    for _ in range(3):
        plain.apply_gradients([(grads(plain_layer), plain_layer.embeddings)])
        opt.apply_gradients([(grads(layer), table)])
    after = table.numpy()
    assert _bits(after[frozen_rows]) == _bits(before[frozen_rows])  # the frozen rows
    others = [r for r in range(vocab) if r not in frozen_rows]  # each row's gradient depends on that row only
    assert _bits(after[others]) == _bits(plain_layer.embeddings.numpy()[others])
    if inner in ("sgd", "adagrad"):  # Keras writes these as scatters: the masked write stays one
        assert writes and set(writes) <= {"scatter_add", "scatter_sub", "scatter_update"}


def test_indexed_slices_gradients_stay_sparse_when_frozen_entries_are_zeroed_for_norms():
    table = keras.Variable(np.ones((6, 2), "float32"), name="table")
    g = tf.IndexedSlices(tf.ones((3, 2)), tf.constant([0, 2, 5]), tf.constant([6, 2]))
    keep = np.array([[True], [True], [False], [True], [True], [True]])
    zeroed = _masks.zero_where_frozen(g, tf.constant(keep), table)
    assert isinstance(zeroed, tf.IndexedSlices)
    assert tf.convert_to_tensor(zeroed).numpy().tolist() == [[1, 1], [0, 0], [0, 0], [0, 0], [0, 0], [1, 1]]
    opt = MaskedOptimizer(keras.optimizers.SGD(1.0, clipnorm=1.0))  # clipping: frozen gradients are zeroed first
    opt.build([table])
    opt.set_mask(table, keep)
    opt.apply_gradients([(g, table)])
    assert table.numpy()[2].tolist() == [1.0, 1.0] and table.numpy()[0][0] < 1.0


def test_reset_with_a_mask_per_step_reads_each_slots_start_value_once(monkeypatch):
    """``policy="reset"`` with per-call masks, eagerly: finding the start value of every slot is done once, not by a
    scan of every variable's slots for every slot at every step (O(V^3) Python work per step)."""
    from freezing import masked_optimizer

    calls = [0]
    real = masked_optimizer.slots

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(masked_optimizer, "slots", counting)
    variables = [keras.Variable(np.ones((3, 2), "float32"), name=f"w{i}") for i in range(6)]
    opt = MaskedOptimizer(keras.optimizers.Adam(0.1), policy="reset")
    opt.build(variables)
    keep = np.array([[True, False]] * 3)
    for _ in range(3):
        opt.apply_gradients([(tf.ones((3, 2)), v) for v in variables], trainable_masks=[keep] * len(variables))
    assert calls[0] <= len(variables)  # one slots() call per variable, in all
    assert all(np.all(slots(opt, v)["momentum"].numpy()[:, 1] == 0) for v in variables)  # and the reset happened
