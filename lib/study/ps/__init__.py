"""An asynchronous parameter server (Downpour SGD, Dean et al. 2012) for Keras models, losses and optimizers.

The runtime is TensorFlow's own: ``tf.distribute.Server`` tasks, ``ParameterServerStrategy`` and
``ClusterCoordinator`` carry every tensor. The model stays a Keras model; its values are plain ``tf.Variable`` s
on the ps tasks (large ones split over them), workers run it with ``keras.Model.stateless_call`` on fetched
values and read their own shard of the data from their own disk, and the ps applies each push with the job's
optimizer (Downpour's SGD or Adagrad, or a Keras optimizer per ps task with its slots next to their variables,
optionally ``freezing.MaskedOptimizer`` holding frozen entries exactly). Models with an ``Embedding`` (sparse
``IndexedSlices`` gradients, pushed as the rows they touch) and models with several inputs or outputs work;
what does not fit the model is refused before training (``docs/parameter_server.md`` lists what is supported).

Every task is one command, ``python -m study.ps`` with its ``TF_CONFIG`` (``study.ps.roles``); from Python,
``run_downpour(DownpourConfig(...))`` starts the tasks on this machine and always ends them.

Modules, each importing only those listed before it:

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
* ``roles``        ``python -m study.ps``: every task's entry point (``__main__``)
* ``examples``     example hooks: a small MLP, a gradient transform

Names are imported on first use, so ``python -m study.ps`` for a ps task loads no Keras.
``from study.ps import DownpourConfig, run_downpour``
"""

from __future__ import annotations

import importlib
from typing import Any

MODULES = ("study.ps.config", "study.ps.bind", "study.ps.console", "study.ps.cluster", "study.ps.faults",
           "study.ps.checkpoints", "study.ps.local", "study.ps.data", "study.ps.sparse", "study.ps.model",
           "study.ps.optimizer", "study.ps.variables", "study.ps.result", "study.ps.worker", "study.ps.chief",
           "study.ps.launcher", "study.ps.roles", "study.ps.__main__", "study.ps.examples")
"""Every module of the package, in dependency order (also what ``study.report.cache`` follows from ``python -m study.ps``)."""

_EXPORTS = {
    "DownpourConfig": "study.ps.config", "load_callable": "study.ps.config", "read_job": "study.ps.config",
    "DOWNPOUR_OPTIMIZERS": "study.ps.config", "KERAS_OPTIMIZERS": "study.ps.config",
    "LocalCluster": "study.ps.local", "free_ports": "study.ps.local", "port_in_use": "study.ps.local",
    "parse_tf_config": "study.ps.cluster", "wait_for_tasks": "study.ps.cluster",
    "PsVariables": "study.ps.variables", "PsOptimizer": "study.ps.optimizer",
    "build_model": "study.ps.model", "worker_function": "study.ps.worker", "local_steps_per_s": "study.ps.worker",
    "run_chief": "study.ps.chief", "run_downpour": "study.ps.launcher", "Faults": "study.ps.launcher",
    "DownpourResult": "study.ps.result", "CheckpointStore": "study.ps.checkpoints",
    "ResumeRefused": "study.ps.checkpoints",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'study.ps' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
