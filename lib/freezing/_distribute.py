"""``MaskedOptimizer`` under ``tf.distribute``: what runs, and a clear error at construction or build for what does not.

Runs, exactly (every replica holds the frozen bits, and the replicas stay identical):

* ``MirroredStrategy`` (one machine, several devices): ``compile``/``fit``, masks set between steps
  or from a callback, ``MaskSchedule``, ``.keras`` save/load, custom loops with ``strategy.run``;
* ``MultiWorkerMirroredStrategy`` custom loops (``strategy.run`` with ``apply_gradients(...,
  trainable_masks=...)`` or stored masks);
* ``OneDeviceStrategy`` and the default strategy.

Each replica's write reads its own copy of the mask (its mode read off it): the guard reads the mask variable
inside the ``extended.update`` that writes the replica's copy of the variable (``freezing._write_path``); an eager
step's snapshot picks each replica's copy by device (``freezing._restore``).

Refused, with the reason in the message:

* ``ParameterServerStrategy``, ``CentralStorageStrategy``, TPU strategies: Keras 3 has no ``fit``
  for them, and their variable placement is not what the write path is built for (this repository's
  parameter server, ``downpour``, runs the optimizer on the parameter servers itself);
* under any strategy, an inner optimizer with ``use_ema`` or ``gradient_accumulation_steps``
  (plain Keras 3.15 fails the same way: a ``merge_call`` inside a ``cond``), ``state="sparse"``, and
  an inner optimizer created outside the strategy's scope (its updates would not reach every replica);

Not this library's to refuse: ``model.fit`` under ``MultiWorkerMirroredStrategy``. Keras 3.15's own
``fit`` fails there with any optimizer, before it builds the optimizer or changes a variable
(``ValueError: Attempt to convert a value (PerReplica ...)`` from the ``strategy.reduce`` in
``_maybe_symbolic_build``; keras-team/keras#20585, tensorflow/tensorflow#72388; patched past that, its
``reduce_per_replica`` fails next on the scalar logs). Use a custom loop there. A test runs plain
Keras ``fit`` in two worker processes and fails when it starts working.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from freezing._keras_api import strategy_of

SUPPORTED = ("MirroredStrategy", "MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy",
             "OneDeviceStrategy", "_DefaultDistributionStrategy")


def _strategy() -> Any:
    return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None


def _strategy_name(strategy: Any) -> str:
    return type(strategy).__name__


def check_construction(wrapper: Any) -> None:
    """Refuse, at construction, what no strategy can run and the strategies that are not supported."""
    strategy = _strategy()
    if strategy is None:
        return
    _check_kind(strategy, "construction")
    _check_options(wrapper, strategy, "construction")


def check_build(wrapper: Any, leaves: list[Any]) -> None:
    """Refuse, at build (before any step), what the strategy in force cannot run."""
    strategy = _strategy()
    if strategy is None:
        return
    _check_kind(strategy, "build")
    _check_options(wrapper, strategy, "build")
    for leaf in leaves:
        if leaf.use_ema or leaf.gradient_accumulation_steps:
            option = "use_ema" if leaf.use_ema else "gradient_accumulation_steps"
            raise ValueError(
                f"MaskedOptimizer (build): {option} on the inner optimizer is not supported under "
                f"{_strategy_name(strategy)}: Keras 3 itself fails there (a merge_call inside a cond); drop {option}"
            )
        owner = strategy_of(leaf)
        if owner is not strategy:
            raise ValueError(
                f"MaskedOptimizer (build): the inner optimizer {leaf.name!r} was created outside "
                f"{_strategy_name(strategy)}.scope(); create it (and the MaskedOptimizer) inside the scope"
            )


def _check_kind(strategy: Any, where: str) -> None:
    if _strategy_name(strategy) not in SUPPORTED and not isinstance(
            strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
                       tf.distribute.OneDeviceStrategy)):
        raise ValueError(
            f"MaskedOptimizer ({where}): {_strategy_name(strategy)} is not supported (Keras 3 has no fit for it, and "
            "its variable placement is not what the masked write is built for); supported: MirroredStrategy, "
            "MultiWorkerMirroredStrategy (custom loops), OneDeviceStrategy, the default strategy"
        )


def _check_options(wrapper: Any, strategy: Any, where: str) -> None:
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return
    if wrapper.state == "sparse":
        raise ValueError(f"MaskedOptimizer ({where}): state='sparse' is not supported under "
                         f"{_strategy_name(strategy)}; "
                         "use state='dense'")
