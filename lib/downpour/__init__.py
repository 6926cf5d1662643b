"""An asynchronous parameter server (Downpour SGD, Dean et al. 2012) for Keras models, losses and optimizers.

The runtime is TensorFlow's own: ``tf.distribute.Server`` tasks, ``ParameterServerStrategy`` and
``ClusterCoordinator`` carry every tensor. The model stays a Keras model; its values are plain ``tf.Variable`` s
on the ps tasks (large ones split over them), workers run it with ``keras.Model.stateless_call`` on fetched
values and read their own shard of the data from their own disk, and the ps applies each push with the job's
optimizer (Downpour's SGD or Adagrad, or a Keras optimizer per ps task with its slots next to their variables,
optionally ``freezing.MaskedOptimizer`` holding frozen entries exactly). Models with an ``Embedding`` (sparse
``IndexedSlices`` gradients, pushed as the rows they touch) and models with several inputs or outputs work;
what does not fit the model is refused before training (``lib/downpour/README.md`` lists what is supported).

Every task is one command, ``python -m downpour`` with its ``TF_CONFIG`` (``downpour.roles``); from Python,
``run_downpour(DownpourConfig(...))`` starts the tasks on this machine and always ends them.

Modules, each importing only those listed before it:

* ``checks``       argument checks with one message each (no dependencies)
* ``jsonio``       files written whole or not at all, JSON read back (no dependencies)
* ``config``       the job, ``DownpourConfig``: plain data, validated; ``"module:function"`` hooks
* ``bind``         listen on one address (TensorFlow alone listens on every interface); the checked shim
* ``console``      one line per event in the terminal, TensorFlow's output in a log file; Ctrl-C
* ``cluster``      ``TF_CONFIG``, reachability, one server per ps or worker task
* ``faults``       exit codes; which errors mean a lost ps task
* ``checkpoints``  checkpoint + JSON sidecar, atomic; checked on ``--resume``
* ``local``        ``LocalCluster``: every task as a child process here
* ``data``         dataset functions: each worker reads its own shard; IDX files; data checked against the model
* ``sparse``       dense and ``IndexedSlices`` gradients: accumulate, push the touched rows, local steps
* ``model``        build the model, the loss (several outputs too), evaluate on values
* ``optimizer``    the optimizer on the ps (``PsOptimizer``): one per ps task, masks next to their shards
* ``variables``    the model's values on the ps (``PsVariables``): fetch, push, placement
* ``result``       ``DownpourResult``: what a job measured, typed
* ``worker``       the Downpour worker loop; the same loop in one process
* ``chief``        the coordinator: check, schedule, poll, checkpoint, evaluate, exit codes
* ``launcher``     ``run_downpour``: a job on a ``LocalCluster``, with ``Faults`` injected
* ``supervisor``   ``python -m downpour local``: every task of a job here, each started again when it dies
* ``roles``        ``python -m downpour``: every task's entry point (``__main__``)
* ``examples``     example hooks (a small MLP, a gradient transform, a random mask) and the README's two
                   example jobs with their data: ``examples.tabular``, ``examples.tokens``

Names are imported on first use, so ``python -m downpour`` for a ps task loads no Keras. The package depends on
TensorFlow, Keras and ``freezing`` only (``lib/downpour/pyproject.toml``); its README is the walk-through.
``from downpour import DownpourConfig, run_downpour``
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

MODULES = ("downpour.checks", "downpour.jsonio", "downpour.config", "downpour.bind", "downpour.console",
           "downpour.cluster", "downpour.faults", "downpour.checkpoints", "downpour.local", "downpour.data",
           "downpour.sparse",
           "downpour.model", "downpour.optimizer", "downpour.variables", "downpour.result", "downpour.worker",
           "downpour.chief", "downpour.launcher", "downpour.supervisor", "downpour.roles", "downpour.__main__",
           "downpour.examples")
"""Every module of the package, in dependency order."""

_EXPORTS = {
    "DownpourConfig": "downpour.config", "load_callable": "downpour.config", "read_job": "downpour.config",
    "DOWNPOUR_OPTIMIZERS": "downpour.config", "KERAS_OPTIMIZERS": "downpour.config",
    "LocalCluster": "downpour.local", "free_ports": "downpour.local", "port_in_use": "downpour.local",
    "parse_tf_config": "downpour.cluster", "wait_for_tasks": "downpour.cluster",
    "PsVariables": "downpour.variables", "PsOptimizer": "downpour.optimizer",
    "build_model": "downpour.model", "worker_function": "downpour.worker", "local_steps_per_s": "downpour.worker",
    "run_chief": "downpour.chief", "run_downpour": "downpour.launcher", "Faults": "downpour.launcher",
    "DownpourResult": "downpour.result", "CheckpointStore": "downpour.checkpoints",
    "ResumeRefused": "downpour.checkpoints",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'downpour' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
