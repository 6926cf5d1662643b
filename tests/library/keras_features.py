"""What the installed Keras has, for tests that run on every Keras the library declares (3.5.0 to 3.15.1)."""

from __future__ import annotations

import keras
import pytest


def has(name: str) -> bool:
    """Whether ``keras.optimizers`` has ``name`` (Muon, ScheduleFreeAdamW and MultiOptimizer came after 3.5)."""
    return hasattr(keras.optimizers, name)


def needs(*names: str) -> pytest.MarkDecorator:
    """Skip a test on a Keras that lacks one of these optimizers, saying which."""
    missing = [n for n in names if not has(n)]
    return pytest.mark.skipif(bool(missing),
                              reason=f"Keras {keras.__version__} has no keras.optimizers.{', '.join(missing)}")


OVERWRITE_WITH_GRADIENT = hasattr(keras.optimizers.Optimizer, "_overwrite_variable_with_gradient")
"""Whether Keras overwrites ``overwrite_with_gradient`` variables with their gradient (after 3.5)."""

def _variable_takes_a_constraint() -> bool:
    try:
        keras.Variable(0.0, constraint=None)
    except TypeError:
        return False
    return True


VARIABLE_CONSTRAINTS = _variable_takes_a_constraint()
"""Whether ``keras.Variable`` takes a ``constraint`` (Keras 3.5's does not; layers apply constraints there)."""
