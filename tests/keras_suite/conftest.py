"""Set-up for Keras' own optimizer tests run through MaskedOptimizer (``test_keras_optimizer_suite.py``).

* Keras' root ``conftest.py`` is not in the wheel: its one marker, ``requires_trainable_backend``, is
  registered here and skips on the backends Keras skips it on (numpy, openvino).
* A test on ``excused.toml`` or ``known_wrapper_defects.toml`` (for its variant and pass) must fail, with a
  message containing the entry's ``match``: it is then reported as xfailed, with the list's name in the
  reason. If it passes, or fails with another message, it is reported as failed: delete the entry, or look.
* The terminal summary prints, per pass: passed / excused / known defects / skipped / failed, and what the
  passed tests checked (numeric assertions, those reduced to trainable entries, frozen-bit checks).
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

_expectations = None
_outcomes: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (variant, pass) -> outcome counts
_checks: dict[str, Counter] = defaultdict(Counter)  # pass -> what passed tests checked


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_trainable_backend: Keras' marker (its conftest is not shipped)")


def _suite(item):
    cls = getattr(item, "cls", None)
    if cls is None or not hasattr(cls, "_suite_pass"):
        return None
    return f"{cls._suite_test_prefix}::{item.name}", cls._suite_variant, cls._suite_pass


def pytest_collection_modifyitems(config, items):
    global _expectations
    import keras

    for item in items:
        if item.get_closest_marker("requires_trainable_backend") and keras.backend.backend() in ("numpy", "openvino"):
            item.add_marker(pytest.mark.skip(reason="requires a trainable backend"))
        suite = _suite(item)
        if suite is None:
            continue
        if _expectations is None:
            import keras_suite_harness

            _expectations = keras_suite_harness.load_expectations()
        item._suite_expectation = next((e for e in _expectations if e.applies(*suite)), None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    expectation = getattr(item, "_suite_expectation", None)
    if expectation is None or report.when != "call" or report.skipped:
        return
    tag = "excused" if expectation.list_name == "excused" else "known wrapper defect"
    if report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} passes but is on {expectation.list_name}.toml ({tag}: "
                           f"{expectation.why}); delete its entry (or this pass from it)")
        return
    message = call.excinfo.exconly() if call.excinfo is not None else str(report.longrepr)
    if expectation.match in message:
        report.outcome = "skipped"
        report.wasxfail = f"{tag} ({expectation.list_name}.toml entry {expectation.entry}): {expectation.match}"
    else:
        report.longrepr = (f"{report.longrepr}\n\n{item.nodeid} is on {expectation.list_name}.toml, expected to "
                           f"fail with {expectation.match!r}, but failed otherwise")


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.skipped or report.failed):
        return
    parts = report.nodeid.split("::")
    if len(parts) < 3 or "test_keras_optimizer_suite.py" not in parts[0]:
        return
    import keras_suite_harness as harness

    cls_name = parts[-2]
    cls = getattr(sys.modules.get("test_keras_optimizer_suite"), cls_name, None)
    if cls is None or not hasattr(cls, "_suite_pass"):
        return
    key = (cls._suite_variant, cls._suite_pass)
    if hasattr(report, "wasxfail"):
        _outcomes[key]["excused" if report.wasxfail.startswith("excused") else "known defects"] += 1
    elif report.skipped:
        _outcomes[key]["skipped"] += 1
    elif report.failed:
        _outcomes[key]["failed"] += 1
    elif report.when == "call":
        _outcomes[key]["passed"] += 1
        _checks[cls._suite_pass].update(harness.STATS.get(f"{cls_name}::{parts[-1]}", Counter()))


def pytest_terminal_summary(terminalreporter):
    if not _outcomes:
        return
    tr = terminalreporter
    tr.section("Keras optimizer tests through MaskedOptimizer")
    columns = ("passed", "excused", "known defects", "skipped", "failed")
    tr.write_line(f"{'pass':8} {'variant':16} " + " ".join(f"{c:>13}" for c in columns))
    passes = sorted({p for _, p in _outcomes}, key=["nomask", "alltrue", "half"].index)
    for pass_name in passes:
        total = Counter()
        for (variant, p), counts in sorted(_outcomes.items()):
            if p == pass_name:
                total.update(counts)
                tr.write_line(f"{p:8} {variant:16} " + " ".join(f"{counts[c]:>13}" for c in columns))
        tr.write_line(f"{pass_name:8} {'all':16} " + " ".join(f"{total[c]:>13}" for c in columns))
    tr.write_line("")
    tr.write_line("What the passed tests checked, per pass:")
    for pass_name in passes:
        c = _checks[pass_name]
        on_masked = c["on_masked_all_true"] + c["on_masked_trainable_only"] + c["on_masked_all_frozen"]
        tr.write_line(
            f"  {pass_name:8} numeric assertions {c['numeric_assertions']}; on a masked variable or slot "
            f"{on_masked}: all-True mask {c['on_masked_all_true']}, trainable entries only "
            f"{c['on_masked_trainable_only']} ({c['entries_compared']} entries; finiteness only "
            f"{c['finiteness_only']}), wholly frozen {c['on_masked_all_frozen']}; masked variables "
            f"{c['masked_variables']}; frozen-bit checks {c['bit_checks_eager']} eager + "
            f"{c['bit_checks_traced']} traced")
