"""Shared test set-up: quiet TensorFlow, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 1200
_smoke: dict = {}  # the background smoke run: "proc", "out", "log"


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: start it only if a selected test needs it
def pytest_collection_modifyitems(session, config, items):
    """Start the one smoke run of the whole pipeline as soon as collection shows a test needs it.

    It runs in a child process while the unit tests run, so the two share the machine's cores instead of
    running one after the other; the first test that needs ``smoke_results`` waits for it.
    """
    needs = any("smoke_results" in getattr(item, "fixturenames", ()) for item in items)  # code blocks have none
    if _smoke or config.option.collectonly or not needs:
        return
    out = Path(tempfile.mkdtemp(prefix="freezing-smoke-")) / "results"
    log = open(out.parent / "pipeline.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "study.report", "--profile", "smoke", "--out", str(out), "--timeout", "600",
         "--records", str(out.parent / "records")],
        cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    _smoke.update(proc=proc, out=out, log=log)


def pytest_sessionfinish(session, exitstatus):
    """Stop a smoke run that is still going (an interrupted or failed session) and remove its folder."""
    proc = _smoke.get("proc")
    if proc is None:
        return
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the pipeline stops its kernel and leaves its output folder clean
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _smoke["log"].close()
    shutil.rmtree(_smoke["out"].parent, ignore_errors=True)


@pytest.fixture(scope="session")
def smoke_results() -> Path:
    """The results folder of one run of the whole pipeline on smoke parameters, shared by every test that reads
    a smoke run's outputs (the notebooks, the recipes, the reports, the rerun check). Started in the background
    at the end of collection (see ``pytest_collection_modifyitems``); this waits for it to finish."""
    proc = _smoke["proc"]
    try:
        proc.wait(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the smoke run of the pipeline did not finish within {SMOKE_TIMEOUT_S} s")
    log = _smoke["log"]
    log.seek(0)
    assert proc.returncode == 0, "the smoke run of the pipeline failed:\n" + log.read()[-4000:]
    return _smoke["out"]


@pytest.fixture
def alive():
    """``alive(pid)``: whether a process still exists (for the no-orphan checks)."""

    def check(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    return check
