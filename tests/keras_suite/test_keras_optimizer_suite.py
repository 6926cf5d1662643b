"""Keras' own optimizer tests through ``MaskedOptimizer``, three passes each (see ``keras_suite_harness``).

For every TestCase class in the installed wheel's ``keras/src/optimizers/*_test.py`` this module defines one
subclass per variant and pass, named ``<KerasClass>_<pass>`` (``<KerasClass>_<variant>_<pass>`` for the
loss-scale and multi-optimizer tests, which run in both nestings), so a test id reads
``tests/keras_suite/test_keras_optimizer_suite.py::AdamTest_half::test_single_step``. Select passes with
``-k half`` or ``KERAS_SUITE_PASSES=nomask,half``. The tests on the lists in ``excused.toml`` and
``known_wrapper_defects.toml`` must fail with their recorded message (``conftest.py``); the last tests in this
module keep the lists from growing.
"""

from __future__ import annotations

import functools
import os
import unittest
from collections.abc import Mapping
from typing import Any
from unittest import mock

import keras
import keras_suite_harness as harness
import pytest

if keras.backend.backend() != "tensorflow":
    pytest.skip("the Keras optimizer suite runs on the TensorFlow backend", allow_module_level=True)

PINNED_EXCUSED_RUNS = 78  # test runs (test x variant x pass) that excused.toml covers
MAX_KNOWN_DEFECT_RUNS = 0  # test runs that known_wrapper_defects.toml covers: it may shrink, never grow

LISTS_WRITTEN_FOR = "3.15.1"  # the Keras whose test files and test names the two lists name
same_keras = pytest.mark.skipif(
    keras.__version__ != LISTS_WRITTEN_FOR,
    reason=f"the test-file list and the two expectation lists were written for Keras {LISTS_WRITTEN_FOR}, "
           f"this is {keras.__version__}: review them for it")

SELECTED_PASSES = tuple(p for p in os.environ.get("KERAS_SUITE_PASSES", ",".join(harness.PASSES)).split(",") if p)
MODULES, MISSING_MODULES = harness.import_keras_tests()


def _assertion(name: str):
    def method(self, actual, desired, *args, **kwargs):
        base = functools.partial(getattr(self._suite_keras_class, name), self)
        return harness.reduced(name, base, actual, desired, *args, **kwargs)

    method.__name__ = name
    return method


def _parameter_overrides(keras_class: type, variant: str) -> dict[str, Any]:
    """absl-parameterised tests whose parameters hold an optimizer class: the same test with it wrapped."""
    overrides = {}
    for name in unittest.TestLoader().getTestCaseNames(keras_class):
        fn = getattr(keras_class, name)
        code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not closure or not {"test_method", "testcase_params"} <= set(code.co_freevars):
            continue
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
        params, test_method = cells["testcase_params"], cells["test_method"]
        if not isinstance(params, Mapping):
            continue
        new = {k: harness.substitute_params(v, variant) for k, v in params.items()}
        if any(new[k] is not params[k] for k in params):
            overrides[name] = functools.wraps(fn)(
                lambda self, _m=test_method, _p=new: _m(self, **_p))
    return overrides


def _suite_class(module, keras_class: type, variant: str, pass_name: str) -> type:
    substitutions = harness.substitutions(module, variant)

    def setUp(self):
        stack = harness.start(pass_name)
        self.addCleanup(harness.finish, f"{type(self).__name__}::{self._testMethodName}")
        self.addCleanup(stack.close)
        stack.enter_context(mock.patch.dict(module.__dict__, substitutions))
        keras.utils.set_random_seed(harness.SEED)  # Keras' tests draw unseeded random inputs
        keras_class.setUp(self)

    body = {
        "__module__": __name__,
        "setUp": setUp,
        "_suite_keras_class": keras_class,
        "_suite_test_prefix": keras_class.__name__,
        "_suite_variant": variant,
        "_suite_pass": pass_name,
        **{name: _assertion(name) for name in ("assertAllClose", "assertNotAllClose", "assertAlmostEqual",
                                               "assertAllEqual")},
        **_parameter_overrides(keras_class, variant),
        # make test runs the half pass, the one that can fail where the others pass; CI adds the other two
        "pytestmark": [] if pass_name == "half" else [pytest.mark.slow],
    }
    suffix = pass_name if variant == "masked" else f"{variant}_{pass_name}"
    return type(keras_class)(f"{keras_class.__name__}_{suffix}", (keras_class,), body)


SUITE_CLASSES: list[type] = []
for _module_name, _module in MODULES.items():
    for _variant in harness.MODULE_VARIANTS.get(_module_name, ("masked",)):
        for _pass in SELECTED_PASSES:
            for _keras_class in harness.keras_test_classes(_module):
                _cls = _suite_class(_module, _keras_class, _variant, _pass)
                globals()[_cls.__name__] = _cls
                SUITE_CLASSES.append(_cls)


def test_this_keras_ships_its_optimizer_tests():
    """Keras 3.15.1's wheel ships keras/src/optimizers/*_test.py; older wheels (3.5.0 ... 3.15.0) and sdists ship none,
    so on the oldest supported Keras (make test-oldest) only the library's own tests run."""
    if not MODULES:
        pytest.skip(f"Keras {keras.__version__}'s wheel ships no optimizer tests (only 3.15.1's does): nothing to run")
    assert len(SUITE_CLASSES) >= len(MODULES) * len(SELECTED_PASSES), "a Keras test file defined no suite class"


def _all_suite_ids() -> set[tuple[str, str, str]]:
    """(Keras class::method, variant, pass) of every test the suite defines, with every pass."""
    ids = set()
    for module_name, module in MODULES.items():
        for variant in harness.MODULE_VARIANTS.get(module_name, ("masked",)):
            for keras_class in harness.keras_test_classes(module):
                for method in unittest.TestLoader().getTestCaseNames(keras_class):
                    for pass_name in harness.PASSES:
                        ids.add((f"{keras_class.__name__}::{method}", variant, pass_name))
    return ids


@same_keras
def test_every_keras_optimizer_test_file_is_found():
    assert not MISSING_MODULES, f"the installed keras ships none of: {MISSING_MODULES}"


def _covered(list_name: str) -> set[tuple[str, str, str]]:
    """(test, variant, pass) triples that ``list_name`` covers."""
    ids = _all_suite_ids()
    return {key for e in harness.load_expectations() if e.list_name == list_name
            for key in ids if e.applies(*key)}


@same_keras
def test_expectation_lists_name_existing_tests_once():
    ids = _all_suite_ids()
    seen: dict[tuple[str, str, str], str] = {}
    for e in harness.load_expectations():
        assert e.why.strip() and e.match.strip(), f"{e.list_name} {e.test}: every entry needs 'why' and 'match'"
        assert set(e.passes) <= set(harness.PASSES), f"{e.list_name} {e.test}: unknown pass in {e.passes}"
        covered = [key for key in ids if e.applies(*key)]
        assert covered, f"{e.list_name}: no test {e.test!r} in variants {e.variants} and passes {e.passes}"
        if e.variants is not None:
            assert set(e.variants) <= {v for (t, v, p) in ids if t == e.test}, f"{e.test}: unknown variant"
        for key in covered:
            assert key not in seen, f"{key} is listed twice ({seen[key]} and {e.list_name})"
            seen[key] = e.list_name


@same_keras
def test_excused_list_is_pinned():
    """An excuse is a claim to review: the number of excused runs changes only with this number."""
    assert len(_covered("excused")) == PINNED_EXCUSED_RUNS, (
        f"excused.toml covers {len(_covered('excused'))} test runs (test x variant x pass), pinned "
        f"{PINNED_EXCUSED_RUNS}: an excuse was added or removed; review it and update the pin")


@same_keras
def test_known_defects_list_does_not_grow():
    assert len(_covered("known_wrapper_defects")) <= MAX_KNOWN_DEFECT_RUNS, (
        f"known_wrapper_defects.toml covers {len(_covered('known_wrapper_defects'))} test runs, at most "
        f"{MAX_KNOWN_DEFECT_RUNS}: the list may only shrink (lower the number when it does)")
