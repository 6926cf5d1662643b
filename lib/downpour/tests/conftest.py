"""The parameter server's tests: quiet TensorFlow; ``alive(pid)`` for the no-orphan checks."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402


@pytest.fixture
def alive():
    """``alive(pid)``: whether a process still exists."""

    def check(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    return check
