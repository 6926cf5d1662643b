"""Keras' own optimizer tests, run through ``freezing.MaskedOptimizer``.

The installed ``keras`` wheel ships its optimizer tests (``keras/src/optimizers/*_test.py``). This harness
imports them from the installed package (nothing is copied) and runs every test class again with the
optimizer under test wrapped, golden values and assertions unchanged, in three passes:

* ``nomask``  -- no mask set;
* ``alltrue`` -- an all-True mask (shaped like the variable) set on every variable at ``build``;
* ``half``    -- about half of every variable frozen at ``build``: entry ``i`` (flat index) of the ``k``-th
  variable the optimizer is built with trains when ``(i + k)`` is even. A single-entry variable (a scalar)
  is thus wholly trainable or wholly frozen, alternating from one variable to the next.

How the optimizer is wrapped: while a test runs, the names it looks up in its own module (``Adam``, ``SGD``,
``optimizers``, ``LossScaleOptimizer``, ...) are replaced by a *wrapped class*: calling it returns
``MaskedOptimizer(Original(*args, **kwargs))``, ``isinstance(x, Wrapped)`` holds for the original class and
for a ``MaskedOptimizer`` around it, and any other attribute (``from_config``...) is the original's. Optimizer
classes that a parameterised test received at import time (``optimizer_sparse_test.TEST_CASES``) are
substituted in the parameters the same way. ``keras.optimizers`` and Keras' internals are left alone, so
Keras deserialises the inner optimizer as itself.

What the harness checks, besides the test's own assertions (``half`` and ``alltrue`` passes):

* after every ``MaskedOptimizer.apply`` and ``finalize_variable_values``, every frozen entry of every masked
  variable, and of every optimizer slot shaped like it, has the bits it had before the call (eagerly with
  numpy; in a traced step with a ``tf.debugging.assert_equal`` on the bit patterns);
* ``assertAllClose``, ``assertAlmostEqual``, ``assertAllEqual`` and ``assertNotAllClose`` whose ``actual`` is a
  masked variable or slot (the object, or an array bit-identical to it) compare its trainable entries only.
  Where an update of one entry depends on other entries (Lamb, Adafactor, Muon, ScheduleFreeAdamW, or any
  ``clipnorm``/``global_clipnorm``), the trainable entries cannot meet Keras' golden values when half the
  entries are frozen: the harness then checks only that they are finite (and, for ``assertNotAllClose``,
  that they moved), and counts the assertion as "finiteness only".
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import tomllib

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras.src import optimizers as keras_optimizers  # noqa: E402

from freezing import MaskedOptimizer  # noqa: E402

HERE = Path(__file__).resolve().parent
PASSES = ("nomask", "alltrue", "half")
SEED = 0
"""Seeds Python, numpy and TensorFlow before every test: a few Keras tests draw unseeded random inputs, and with
half the weights frozen, test_tf_checkpointing's "the prediction moved by more than 1e-3" then holds for some
draws and not others."""

KERAS_TEST_MODULES = (
    "adadelta_test", "adafactor_test", "adagrad_test", "adam_test", "adamax_test", "adamw_test", "ftrl_test",
    "lamb_test", "lion_test", "muon_test", "nadam_test", "rmsprop_test", "schedule_free_adamw_test", "sgd_test",
    "optimizer_test", "optimizer_sparse_test", "loss_scale_optimizer_test", "multi_optimizer_test",
)
"""The optimizer test files of Keras 3.15.1; a file missing from the installed wheel is reported, not run."""

MULTI = getattr(keras_optimizers, "MultiOptimizer", None)  # Keras 3.15 has it; 3.5 does not
WRAPPERS = (keras_optimizers.LossScaleOptimizer,) + ((MULTI,) if MULTI is not None else ())

ELEMENTWISE = {"SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Ftrl", "Lion",
               "ScatterUpdateOptimizer"}
"""Optimizers whose update of one entry reads only that entry (and scalars): with half the entries frozen, the
trainable entries still meet Keras' golden values. ``ScatterUpdateOptimizer`` is optimizer_sparse_test's own."""

VARIANTS: dict[str, dict[str, Callable[[str], bool]]] = {
    # variant -> which optimizer classes the test's module sees wrapped (by class name)
    "masked": {"wrap": lambda name: name not in ("LossScaleOptimizer", "MultiOptimizer")},
    "lso_of_masked": {"wrap": lambda name: name != "LossScaleOptimizer"},  # LossScaleOptimizer(MaskedOptimizer(inner))
    "masked_of_lso": {"wrap": lambda name: name == "LossScaleOptimizer"},  # MaskedOptimizer(LossScaleOptimizer(inner))
    "multi_of_masked": {"wrap": lambda name: name not in ("MultiOptimizer", "LossScaleOptimizer")},
    "masked_of_multi": {"wrap": lambda name: name == "MultiOptimizer"},  # MaskedOptimizer(MultiOptimizer(...))
}
MODULE_VARIANTS = {
    "loss_scale_optimizer_test": ("lso_of_masked", "masked_of_lso"),
    "multi_optimizer_test": ("multi_of_masked", "masked_of_multi"),
}
"""Modules run in two nestings; every other module runs once, as ``masked``. In ``masked`` and
``multi_of_masked`` an optimizer the test builds with ``LossScaleOptimizer(...)`` wraps the masked one."""


# -- wrapped classes ------------------------------------------------------------------------------------------
class _WrappedMeta(type):
    """The metaclass of a wrapped class: calling it wraps, ``isinstance`` looks through ``MaskedOptimizer``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> MaskedOptimizer:
        return MaskedOptimizer(cls.__original__(*args, **kwargs))

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.__original__) or (
            isinstance(obj, MaskedOptimizer) and isinstance(obj.inner, cls.__original__))

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.__original__)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.__original__, name)


_wrapped_cache: dict[type, type] = {}


def wrapped(original: type) -> type:
    """The wrapped stand-in for an optimizer class (one per class, so ``wrapped(A) is wrapped(A)``)."""
    if original not in _wrapped_cache:
        _wrapped_cache[original] = _WrappedMeta(
            original.__name__, (), {"__original__": original, "__qualname__": original.__qualname__,
                                     "__module__": original.__module__, "__doc__": original.__doc__})
    return _wrapped_cache[original]


def _is_optimizer_class(obj: Any) -> bool:
    return (isinstance(obj, type) and issubclass(obj, keras_optimizers.Optimizer)
            and obj is not keras_optimizers.Optimizer)


class OptimizersProxy(types.ModuleType):
    """``keras.src.optimizers`` as a test module sees it: chosen classes wrapped, ``get`` wrapping what it returns."""

    def __init__(self, wrap: Callable[[str], bool], wrap_get: bool):
        super().__init__("keras.src.optimizers")
        self._wrap, self._wrap_get = wrap, wrap_get

    def __getattr__(self, name: str) -> Any:
        value = getattr(keras_optimizers, name)
        if _is_optimizer_class(value) and self._wrap(value.__name__):
            return wrapped(value)
        if name == "get" and self._wrap_get:
            return _wrapping_get
        return value


def _wrapping_get(identifier: Any) -> Any:
    result = keras_optimizers.get(identifier)
    if isinstance(result, keras_optimizers.Optimizer) and not isinstance(result, MaskedOptimizer):
        return MaskedOptimizer(result)
    return result


def substitutions(module: types.ModuleType, variant: str) -> dict[str, Any]:
    """The names to replace in ``module``'s globals while one of its tests runs under ``variant``."""
    wrap = VARIANTS[variant]["wrap"]
    subs: dict[str, Any] = {}
    for name, value in vars(module).items():
        if value is keras_optimizers:
            # ``optimizers.get(...)`` builds the optimizer under test in optimizer_test only where a leaf is wrapped.
            subs[name] = OptimizersProxy(wrap, wrap_get=variant in ("masked", "multi_of_masked"))
        elif _is_optimizer_class(value) and value.__module__.startswith("keras.") and wrap(value.__name__):
            subs[name] = wrapped(value)
    return subs


def substitute_params(value: Any, variant: str) -> Any:
    """An optimizer class received as a test parameter, wrapped as the module's names are."""
    if _is_optimizer_class(value) and not issubclass(value, WRAPPERS) and VARIANTS[variant]["wrap"](value.__name__):
        return wrapped(value)
    return value


# -- masks, bit checks and per-test statistics ------------------------------------------------------------------
def pass_mask(pass_name: str, index: int, shape: tuple[int, ...]) -> np.ndarray:
    """The mask a pass sets on the ``index``-th variable an optimizer is built with (True = trains)."""
    size = int(np.prod(shape))
    if pass_name == "alltrue":
        return np.ones(shape, bool)
    return ((np.arange(size) + index) % 2 == 0).reshape(shape)


_BITS = {2: tf.int16, 4: tf.int32, 8: tf.int64}
_NP_BITS = {2: np.int16, 4: np.int32, 8: np.int64}


def np_bits(value: Any) -> np.ndarray:
    array = np.asarray(value.numpy() if isinstance(value, (keras.Variable, tf.Variable)) else value)
    return array.view(_NP_BITS[array.dtype.itemsize])


def tf_bits(value: Any) -> tf.Tensor:
    tensor = tf.identity(tf.convert_to_tensor(value))
    return tf.bitcast(tensor, _BITS[tensor.dtype.size])


@dataclasses.dataclass(eq=False)
class Masked:
    """A variable (or an optimizer slot shaped like one) with the mask a harness optimizer gave it."""

    variable: Any
    keep: np.ndarray  # full shape, True = trains
    elementwise: bool
    label: str
    optimizer: MaskedOptimizer
    follows: Any = None  # an EMA average: its frozen entries hold the weight's bits, not their own


@dataclasses.dataclass
class Run:
    """The state of one test: its pass, the masked variables, and what was checked."""

    pass_name: str
    entries: list[Masked] = dataclasses.field(default_factory=list)
    stats: Counter = dataclasses.field(default_factory=Counter)
    depth: int = 0  # assertion nesting (assertNotAllClose may call assertAllClose)

    def for_optimizer(self, optimizer: MaskedOptimizer) -> list[Masked]:
        return [e for e in self.entries if e.optimizer is optimizer]

    def lookup(self, actual: Any) -> tuple[np.ndarray, bool, str] | None:
        """The mask of ``actual`` when it is (or is bit-identical to) a masked variable or slot, else None."""
        if not self.entries:
            return None
        if isinstance(actual, (keras.Variable, tf.Variable)):
            found = [e for e in self.entries if e.variable is actual or getattr(e.variable, "value", None) is actual]
        else:
            try:
                array = np.asarray(keras.ops.convert_to_numpy(actual))
            except Exception:  # noqa: BLE001 - not array-like: nothing to reduce
                return None
            if array.dtype.kind != "f":
                return None
            found = []
            for e in self.entries:
                current = np.asarray(keras.ops.convert_to_numpy(e.variable))
                if current.shape == array.shape and current.dtype == array.dtype and np.array_equal(
                        current.view(_NP_BITS[current.dtype.itemsize]), np_bits(array)):
                    found.append(e)
            if len({e.keep.tobytes() for e in found}) > 1:
                self.stats["ambiguous"] += 1
        if not found:
            return None
        keep = np.logical_and.reduce([e.keep for e in found])
        return keep, all(e.elementwise for e in found), found[0].label


RUN: Run | None = None
"""The test in progress (tests run one at a time)."""

STATS: dict[str, Counter] = {}
"""Per finished test, keyed ``Class::method``: what it checked (read by the conftest for passed tests)."""


def _leaves(optimizer: Any) -> list[Any]:
    """The optimizers that own slots, looking through MaskedOptimizer, LossScaleOptimizer and MultiOptimizer."""
    inner = getattr(optimizer, "inner", None) or getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        return _leaves(inner)
    if MULTI is not None and isinstance(optimizer, MULTI):
        return [leaf for sub in optimizer.optimizers for leaf in _leaves(sub)]
    return [optimizer]


def _elementwise(optimizer: MaskedOptimizer) -> bool:
    return all(type(leaf).__name__ in ELEMENTWISE and leaf.clipnorm is None and leaf.global_clipnorm is None
               for leaf in _leaves(optimizer))


def _slots_of(optimizer: MaskedOptimizer, variable: Any) -> list[tuple[str, Any]]:
    """Optimizer slots shaped like ``variable``: entry ``i`` of a list attribute aligned with the built variables."""
    found = []
    for leaf in _leaves(optimizer):
        built = list(getattr(leaf, "_trainable_variables", []) or [])
        keys = [leaf._var_key(v) for v in built]
        if leaf._var_key(variable) not in keys:
            continue
        index = keys.index(leaf._var_key(variable))
        for name, value in vars(leaf).items():
            if isinstance(value, list) and len(value) == len(built) and name != "_trainable_variables":
                slot = value[index]
                if isinstance(slot, (keras.Variable, tf.Variable)) and tuple(slot.shape) == tuple(variable.shape) \
                        and slot is not variable:
                    found.append((f"{type(leaf).__name__}.{name}", slot))
    return found


@contextlib.contextmanager
def real_variable_writes() -> Iterator[None]:
    """The harness's own writes (storing masks) bypass a test's spies on ``tf.Variable.assign*``."""
    cls = type(tf.Variable(0.0))
    patches = [mock.patch.object(cls, name, _REAL_WRITES[name]) for name in _REAL_WRITES
               if vars(cls).get(name) is not _REAL_WRITES[name]]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


_REAL_WRITES = {name: vars(type(tf.Variable(0.0)))[name] if name in vars(type(tf.Variable(0.0)))
                else getattr(type(tf.Variable(0.0)), name) for name in ("assign", "assign_add", "assign_sub")}

_ORIGINAL = {name: getattr(MaskedOptimizer, name) for name in ("build", "apply", "finalize_variable_values")}


def _build(self: MaskedOptimizer, var_list: Any) -> None:
    was_built = self.built
    _ORIGINAL["build"](self, var_list)
    run = RUN
    if was_built or run is None or run.pass_name == "nomask":
        return
    elementwise = _elementwise(self)
    for index, variable in enumerate(list(var_list)):
        keep = pass_mask(run.pass_name, index, tuple(variable.shape))
        with tf.init_scope(), real_variable_writes():  # build may run while fit traces its step
            self.set_mask(variable, keep)
        label = f"{getattr(variable, 'path', None) or variable.name} (variable {index})"
        run.entries.append(Masked(variable, keep, elementwise, label, self))
        for name, slot in _slots_of(self, variable):
            follows = variable if name.endswith("._model_variables_moving_average") else None
            run.entries.append(Masked(slot, keep, elementwise, f"{name}[{label}]", self, follows))
    run.stats["masked_variables"] += len(list(var_list))


def _checked(method: str) -> Callable[..., Any]:
    def call(self: MaskedOptimizer, *args: Any, **kwargs: Any) -> Any:
        run = RUN
        if method == "apply" and not self.built and run is not None:
            variables = args[1] if len(args) > 1 else kwargs.get("trainable_variables")
            if variables is not None:
                self.build(list(variables))  # what apply does first: the masks exist before the first step
        watched = [e for e in (run.for_optimizer(self) if run else []) if not e.keep.all()]
        if not watched:
            return _ORIGINAL[method](self, *args, **kwargs)
        if tf.executing_eagerly():
            before = [np_bits(e.variable) for e in watched]
            result = _ORIGINAL[method](self, *args, **kwargs)
            for e, old in zip(watched, before):
                new = np_bits(e.variable)
                if e.follows is not None:  # a frozen entry's EMA average is its weight, bit for bit
                    old = np_bits(e.follows)
                changed = np.flatnonzero((old != new) & ~e.keep)
                run.stats["bit_checks_eager"] += 1
                if changed.size:
                    raise AssertionError(
                        f"keras_suite harness: {method} changed {changed.size} frozen entries of {e.label} "
                        f"(flat index {changed[:5].tolist()}; bits {old.reshape(-1)[changed[:3]].tolist()} -> "
                        f"{new.reshape(-1)[changed[:3]].tolist()})")
            return result
        before = [tf_bits(e.variable) for e in watched]
        result = _ORIGINAL[method](self, *args, **kwargs)
        for e, old in zip(watched, before):
            if e.follows is not None:  # a frozen entry's EMA average is its weight, bit for bit
                old = tf_bits(e.follows)
            frozen = tf.constant(~e.keep.reshape(-1))
            tf.debugging.assert_equal(
                tf.boolean_mask(tf.reshape(tf_bits(e.variable), [-1]), frozen),
                tf.boolean_mask(tf.reshape(old, [-1]), frozen),
                message=f"keras_suite harness: {method} changed frozen entries of {e.label} (traced step)")
            run.stats["bit_checks_traced"] += 1
        return result

    call.__name__ = method
    return call


def start(pass_name: str) -> contextlib.ExitStack:
    """Begin a test: a fresh Run, and MaskedOptimizer's build/apply/finalize hooked for masks and bit checks."""
    global RUN
    RUN = Run(pass_name)
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(MaskedOptimizer, "build", _build))
    stack.enter_context(mock.patch.object(MaskedOptimizer, "apply", _checked("apply")))
    stack.enter_context(mock.patch.object(MaskedOptimizer, "finalize_variable_values",
                                          _checked("finalize_variable_values")))
    return stack


def finish(test_key: str) -> None:
    global RUN
    if RUN is not None:
        STATS[test_key] = RUN.stats
    RUN = None


# -- the assertion methods, reduced to trainable entries ---------------------------------------------------------
def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (keras.Variable, tf.Variable)) or tf.is_tensor(x):
        return np.asarray(keras.ops.convert_to_numpy(x))
    return np.asarray(x)


def reduced(name: str, base: Callable[..., Any], actual: Any, desired: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``base(actual, desired, ...)`` on the trainable entries when ``actual`` is masked; count it."""
    run = RUN
    if run is None or run.depth:
        return base(actual, desired, *args, **kwargs)
    run.depth += 1
    try:
        run.stats["numeric_assertions"] += 1
        found = run.lookup(actual)
        if found is None:
            return base(actual, desired, *args, **kwargs)
        keep, elementwise, label = found
        a = _numpy(actual)
        d = np.broadcast_to(_numpy(desired), a.shape) if np.size(_numpy(desired)) else _numpy(desired)
        if keep.all():
            run.stats["on_masked_all_true"] += 1
            return base(actual, desired, *args, **kwargs)
        if not keep.any():
            run.stats["on_masked_all_frozen"] += 1  # nothing to compare: the bit checks cover its entries
            return None if name != "assertNotAllClose" else base(actual, desired, *args, **kwargs)
        run.stats["on_masked_trainable_only"] += 1
        run.stats["entries_compared"] += int(keep.sum())
        trainable = a[keep]
        if not np.all(np.isfinite(trainable)) and np.all(np.isfinite(d[keep])):
            raise AssertionError(f"keras_suite harness: trainable entries of {label} are not finite: {a}")
        if name == "assertNotAllClose":
            return base(trainable, d[keep], *args, **kwargs)
        if not elementwise:
            run.stats["finiteness_only"] += 1
            return None
        return base(trainable, d[keep], *args, **kwargs)
    finally:
        run.depth -= 1


# -- the expectation lists ----------------------------------------------------------------------------------------
EXPECTATION_LISTS = ("excused", "known_wrapper_defects")


@dataclasses.dataclass(frozen=True)
class Expectation:
    """One test of one ``[[entry]]`` of ``excused.toml`` or ``known_wrapper_defects.toml``."""

    list_name: str  # "excused" or "known_wrapper_defects"
    entry: int  # the entry's index in its file
    test: str  # "KerasClass::method"
    passes: tuple[str, ...]
    variants: tuple[str, ...] | None  # None: every variant the test runs in
    why: str
    match: str  # a substring of the failure's "ExceptionType: message"

    def applies(self, test: str, variant: str, pass_name: str) -> bool:
        return self.test == test and pass_name in self.passes and (self.variants is None or variant in self.variants)


def load_expectations() -> list[Expectation]:
    out = []
    for list_name in EXPECTATION_LISTS:
        data = tomllib.loads((HERE / f"{list_name}.toml").read_text())
        for index, entry in enumerate(data.get("entry", [])):
            unknown = set(entry) - {"tests", "passes", "variants", "why", "match"}
            if unknown:
                raise ValueError(f"{list_name}.toml entry {index}: unknown keys {sorted(unknown)}")
            for test in entry["tests"]:
                out.append(Expectation(
                    list_name, index, test, tuple(entry.get("passes", PASSES)),
                    tuple(entry["variants"]) if "variants" in entry else None, entry["why"], entry["match"]))
    return out


def import_keras_tests() -> tuple[dict[str, types.ModuleType], list[str]]:
    """The Keras test modules the installed wheel ships, and the names of those it does not."""
    found, missing = {}, []
    for name in KERAS_TEST_MODULES:
        try:
            found[name] = importlib.import_module(f"keras.src.optimizers.{name}")
        except ModuleNotFoundError:
            missing.append(name)
    return found, missing


def keras_test_classes(module: types.ModuleType) -> list[type]:
    import unittest

    return [obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, unittest.TestCase) and obj.__module__ == module.__name__]

