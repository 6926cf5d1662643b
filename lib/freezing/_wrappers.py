"""Walking an optimizer's wrappers: the one place the library looks through ``MaskedOptimizer.inner`` and
``LossScaleOptimizer.inner_optimizer`` (``compile`` may wrap an optimizer in a LossScaleOptimizer)."""

from __future__ import annotations

from typing import Any


def wrapper_chain(optimizer: Any) -> list[Any]:
    """``[optimizer, its inner optimizer, ..., the innermost one]``, following ``inner`` and ``inner_optimizer``.

    >>> import keras
    >>> from freezing import MaskedOptimizer
    >>> [type(o).__name__ for o in wrapper_chain(MaskedOptimizer(keras.optimizers.SGD()))]
    ['MaskedOptimizer', 'SGD']
    >>> [type(o).__name__ for o in wrapper_chain(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))]
    ['LossScaleOptimizer', 'Adam']
    """
    chain = [optimizer]
    while True:
        inner = getattr(optimizer, "inner", None) or getattr(optimizer, "inner_optimizer", None)
        if inner is None:
            return chain
        optimizer = inner
        chain.append(optimizer)


def unwrap(optimizer: Any) -> Any:
    """The innermost optimizer: the one that owns the slots. ``unwrap(MaskedOptimizer(adam)) is adam``

    >>> import keras
    >>> from freezing import MaskedOptimizer
    >>> adam = keras.optimizers.Adam()
    >>> unwrap(MaskedOptimizer(adam)) is adam, unwrap(adam) is adam
    (True, True)
    """
    return wrapper_chain(optimizer)[-1]
