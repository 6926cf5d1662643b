"""The parameter server's tests: quiet TensorFlow; ``alive(pid)`` for the no-orphan checks; the markers, so that
``pytest --pyargs downpour.tests`` runs them from an installed package, anywhere (``make test-downpour``)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """The markers the tests use, for a run outside the repository (whose pyproject.toml declares them too)."""
    config.addinivalue_line("markers", "cluster: starts local TensorFlow server processes")
    config.addinivalue_line("markers", "slow: long checks (make test-slow)")


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
