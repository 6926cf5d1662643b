"""Set-up shared by the tests and the library's doctests."""

import os

import pytest

# ``freezing.enable_determinism`` exports these for the subprocesses a run starts. A test that calls it
# in-process must not hand them to later tests' subprocesses (kernels, cluster tasks), which would then
# run with op determinism they did not ask for.
_EXPORTED_BY_ENABLE_DETERMINISM = ("TF_DETERMINISTIC_OPS", "PYTHONHASHSEED")


@pytest.fixture(autouse=True)
def _restore_determinism_environment():
    before = {name: os.environ.get(name) for name in _EXPORTED_BY_ENABLE_DETERMINISM}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
