"""Every private Keras and TensorFlow name the library touches, in one place, checked before it is relied on.

Keras 3 gives optimizer authors a public surface (``build``, ``update_step``, ``assign``,
``add_variable_from_reference``, ``variables``) but no public way to ask which optimizer variables
belong to which model variable, whether a variable is excluded from weight decay, or which replica an
update runs on. Those answers come from the private names below. ``check`` runs when a
``MaskedOptimizer`` is built: if a Keras or TensorFlow release renames or removes one of them, building
fails with one message naming the version and the name, instead of a step that silently moves frozen
entries.

Nothing else in ``freezing`` reads a private Keras or TensorFlow attribute.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

METHOD, LIST, DICT, VARIABLE, STRATEGY, RATE = "a method", "a list", "a dict", "a variable", "a strategy", "a rate"
"""What a private name must be: callable; a list or tuple; a dict; a variable (has ``assign`` and a dtype); a
``tf.distribute`` strategy (has ``extended``) or None; a learning rate (a variable, or a callable schedule)."""

OPTIMIZER_NAMES = {
    "_var_key": (METHOD, "variable -> stable key (TensorFlow: the distributed container's id)"),
    "_trainable_variables": (LIST, "the variables the optimizer was built with"),
    "_trainable_variables_indices": (DICT, "variable key -> index into that list"),
    "_use_weight_decay": (METHOD, "variable -> whether weight decay applies to it"),
    "_distribution_strategy": (STRATEGY, "the tf.distribute strategy the optimizer was created under"),
    "_clip_gradients": (METHOD, "gradients -> clipped gradients (MaskedOptimizer forwards it)"),
    "_apply_weight_decay": (METHOD, "variables -> None, decays them (MaskedOptimizer overrides it)"),
    "_iterations": (VARIABLE, "the step counter (MaskedOptimizer forwards it)"),
    "_learning_rate": (RATE, "the learning rate, shared by every variable"),
    "_variables": (LIST, "every variable the optimizer owns"),
}
"""The private names of a built Keras optimizer relied on, with what each must be and why."""

OPTION_NAMES = {
    "use_ema": ("_model_variables_moving_average", "the EMA averages, one per built variable"),
    "gradient_accumulation_steps": ("_accumulated_gradients", "the gradient accumulators, one per built variable"),
}
"""Per-variable lists a built optimizer has only with an option on: option -> (name, what it holds)."""

CLIP_GRADIENTS, APPLY_WEIGHT_DECAY, ITERATIONS = "_clip_gradients", "_apply_weight_decay", "_iterations"
MOVING_AVERAGES = OPTION_NAMES["use_ema"][0]
"""The private names ``MaskedOptimizer`` itself defines (``freezing._surface``, ``freezing.masked_optimizer``):
Keras code calls them on ``model.optimizer`` (``SwapEMAWeights`` reads the EMA averages), so the wrapper answers
under Keras' names."""

OPTIMIZER_MAP, FLATTEN_LAYERS, FUNCTIONS = "_optimizer_map", "_flatten_layers", "_functions"
"""``MultiOptimizer``'s variable -> optimizer method, a model's every-layer method, a graph's functions by name."""


def _tf_private() -> tuple[Any, Any, Any]:
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return distribute_lib, ops, control_flow_util


def _is(value: Any, kind: str) -> bool:
    if kind == METHOD:
        return callable(value)
    if kind == LIST:
        return isinstance(value, (list, tuple))
    if kind == DICT:
        return isinstance(value, dict)
    if kind == VARIABLE:
        return hasattr(value, "assign") and hasattr(value, "dtype")
    if kind == STRATEGY:
        return value is None or hasattr(value, "extended")
    return callable(value) or _is(value, VARIABLE)  # RATE


def _refuse(versions: str, owner: str, name: str, what: str) -> RuntimeError:
    return RuntimeError(
        f"freezing: {versions}: {owner} {what}; this version of Keras or TensorFlow changed what MaskedOptimizer "
        f"relies on ({name!r}). Use the Keras range freezing declares (pip show freezing) or report it."
    )


def check(optimizer: keras.optimizers.Optimizer) -> None:
    """Raise one ``RuntimeError`` naming the versions and the private name that is missing or not what it must be.

    Every private name in ``OPTIMIZER_NAMES`` (and ``OPTION_NAMES`` for the options that are on) is checked for
    what it is -- a method, a list of one variable per built variable, a dict, a variable -- not only that it
    exists, and so are the TensorFlow internals the write path reads.

    Args:
        optimizer: a built Keras optimizer (the one whose variables are read).

    Raises:
        RuntimeError: a private name this library relies on is missing or has changed kind.

    >>> opt = keras.optimizers.Adam(); opt.build([keras.Variable([1.0])]); check(opt)
    """
    versions = f"Keras {keras.__version__}, TensorFlow {tf.__version__}"
    owner = type(optimizer).__name__
    for name, (kind, what) in OPTIMIZER_NAMES.items():
        if not hasattr(optimizer, name):
            raise _refuse(versions, owner, name, f"has no {name!r} ({kind}: {what})")
        value = getattr(optimizer, name)
        if not _is(value, kind):
            raise _refuse(versions, owner, name, f"has {name!r} as {type(value).__name__}, not {kind} ({what})")
    n = len(optimizer._trainable_variables)
    for option, (name, what) in OPTION_NAMES.items():
        if getattr(optimizer, option, None):
            value = getattr(optimizer, name, None)
            if not _is(value, LIST) or len(value) != n:
                raise _refuse(versions, owner, name, f"with {option} has no {name!r} as a list of {n} ({what})")
    try:
        distribute_lib, ops, control_flow_util = _tf_private()
        for module, name in ((distribute_lib, "get_update_replica_id"), (ops, "get_default_graph"),
                             (control_flow_util, "GraphOrParentsInXlaContext")):
            if not callable(getattr(module, name)):
                raise AttributeError(f"{module.__name__}.{name} is not a function")
        if not isinstance(getattr(ops.Graph(), FUNCTIONS), dict):
            raise AttributeError(f"tf.Graph.{FUNCTIONS} is not a dict")
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"freezing: {versions}: a TensorFlow internal MaskedOptimizer relies on is gone "
                           f"({e})") from None


# -- variables ---------------------------------------------------------------------------------------
def is_keras_variable(value: Any) -> bool:
    """Whether ``value`` is a Keras variable on the TensorFlow backend (its ``value`` is a ``tf.Variable``).

    Not ``isinstance(value, keras.Variable)``: in Keras 3.5 a layer's and an optimizer's variables are instances
    of the backend's class, which the exported ``keras.Variable`` subclasses, so that test is False for them.

    >>> is_keras_variable(keras.Variable([1.0])), is_keras_variable(tf.Variable([1.0])), is_keras_variable(1.0)
    (True, False, False)
    """
    return not isinstance(value, tf.Variable) and isinstance(getattr(value, "value", None), tf.Variable)


def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras variable (its ``value``), or ``variable`` itself.

    Not ``isinstance(variable, keras.Variable)``: in Keras 3.5 the variables an optimizer creates are not
    instances of the exported ``keras.Variable`` class.

    >>> v = keras.Variable([1.0]); tf_variable(v) is v.value, tf_variable(v.value) is v.value
    (True, True)
    """
    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    return value if isinstance(value, tf.Variable) else variable


def key(variable: Any) -> int:
    """A stable key of a variable: the same for a Keras variable, its ``tf.Variable`` and each replica's copy.

    >>> v = keras.Variable([1.0]); key(v) == key(v.value)
    True
    """
    variable = tf_variable(variable)
    container = getattr(variable, "_distributed_container", None)
    if container is None:
        try:  # a replica's copy inside a tf.function: the container hangs off the handle
            container = getattr(variable.handle, "_distributed_container", None)
        except (AttributeError, ValueError):  # a DistributedVariable outside a replica context has no handle
            container = None
    return (variable if container is None else container())._unique_id


def components(variable: Any) -> list[Any]:
    """The ``tf.Variable`` objects that hold ``variable``'s values: one, or one per replica under a strategy."""
    value = tf_variable(variable)
    values = getattr(value, "values", None)  # a tf.distribute DistributedVariable
    return list(values) if isinstance(values, (tuple, list)) else [value]


def trainable_variables(optimizer: Any) -> list[Any]:
    """The variables a built optimizer was built with, in order."""
    return list(optimizer._trainable_variables)


def knows(optimizer: Any, variable: Any) -> bool:
    """Whether a built optimizer was built with ``variable``."""
    return bool(optimizer.built) and optimizer._var_key(variable) in optimizer._trainable_variables_indices


def index(optimizer: Any, variable: Any) -> int:
    """The position of ``variable`` among the variables ``optimizer`` was built with (``KeyError`` if none)."""
    return optimizer._trainable_variables_indices[optimizer._var_key(variable)]


def uses_weight_decay(optimizer: Any, variable: Any) -> bool:
    """Whether ``optimizer`` decays ``variable`` (weight decay set, and the variable not excluded)."""
    return bool(optimizer.weight_decay) and bool(optimizer._use_weight_decay(variable))


def clip_gradients(optimizer: Any, grads: Sequence[Any]) -> Any:
    """The optimizer's own gradient clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``)."""
    return getattr(optimizer, CLIP_GRADIENTS)(grads)


def apply_weight_decay(optimizer: Any, variables: Sequence[Any]) -> None:
    """The optimizer's own weight decay of ``variables`` (its rule: Muon has its own)."""
    getattr(optimizer, APPLY_WEIGHT_DECAY)(variables)


def strategy_of(optimizer: Any) -> Any:
    """The ``tf.distribute`` strategy the optimizer was created under."""
    return getattr(optimizer, "_distribution_strategy", None)


def per_variable_lists(optimizer: Any) -> dict[str, Sequence[Any]]:
    """Every attribute of a built optimizer that is a list with one optimizer variable (or None) per built variable.

    Keras keeps an optimizer's per-variable state in such lists (``_momentums``, ``_velocities``, Adafactor's
    ``_r``/``_c``/``_v``, ``_model_variables_moving_average``, ``_accumulated_gradients``); finding them by
    alignment rather than by name covers optimizers this library has never seen.
    """
    n = len(optimizer._trainable_variables)
    shared = {id(getattr(optimizer, a, None)) for a in ("_iterations", "_learning_rate")}
    owned = {id(v) for v in optimizer.variables} - shared
    found = {}
    for attr, value in vars(optimizer).items():
        if attr in ("_trainable_variables", "_variables") or isinstance(value, (str, bytes)):
            continue
        if not isinstance(value, Sequence) or len(value) != n or n == 0:
            continue
        if all(x is None or id(x) in owned for x in value) and any(x is not None for x in value):
            found[attr] = value
    return found


FACTORS = {"_r": -1, "_c": -2}
"""Adafactor's factored second moments, by list name -> the axis of the variable each averages over: ``_r``
holds one statistic per row (the mean over the last axis), ``_c`` one per column (over the second last).
On a square kernel both have the same shape, so only the name says which is which."""


def factor_axis(optimizer: Any, attr: str) -> int | None:
    """The axis of a variable that the per-variable list ``attr`` of ``optimizer`` averages over, when it is a
    factored statistic whose role is known (Adafactor's ``_r``/``_c``); None for any other list.

    >>> factor_axis(keras.optimizers.Adafactor(), "_r"), factor_axis(keras.optimizers.Adafactor(), "_v")
    (-1, None)
    """
    if isinstance(optimizer, keras.optimizers.Adafactor):
        return FACTORS.get(attr)
    return None


OUTSIDE_UPDATE_STEP = ("_model_variables_moving_average", "_accumulated_gradients")
"""Per-variable lists that ``update_step`` does not write: the EMA averages and the gradient accumulators."""


def ema_averages(optimizer: Any) -> list[Any]:
    """The EMA averages (``use_ema=True``), one per built variable (None where there is none), or []."""
    return list(getattr(optimizer, "_model_variables_moving_average", None) or []) if optimizer.use_ema else []


def moving_averages(optimizer: Any) -> list[Any]:
    """The optimizer's own list of EMA averages, as Keras' ``SwapEMAWeights`` reads it (AttributeError without EMA)."""
    return getattr(optimizer, MOVING_AVERAGES)


def initial_accumulator(optimizer: Any, slot_name: str) -> float:
    """The value an accumulator slot starts from: Keras' ``initial_accumulator_value`` (Adagrad, Ftrl), or
    ``tf.compat.v1``'s private ``_initial_accumulator_value`` / ``_initial_gradient_squared_accumulator_value``."""
    if (slot_name == "gradient_squared_accumulator"
            and hasattr(optimizer, "_initial_gradient_squared_accumulator_value")):
        return float(optimizer._initial_gradient_squared_accumulator_value)
    if slot_name in ("accumulator", "accum"):
        for attr in ("initial_accumulator_value", "_initial_accumulator_value"):
            if hasattr(optimizer, attr):
                return float(getattr(optimizer, attr))
    return 0.0


def multi_optimizer_for(optimizer: Any, variable: Any) -> Any:
    """The optimizer of a ``keras.optimizers.MultiOptimizer`` that updates ``variable``."""
    return getattr(optimizer, OPTIMIZER_MAP)(variable)


def flatten_layers(model: Any) -> list[Any]:
    """Every layer of a model, nested ones included."""
    return list(getattr(model, FLATTEN_LAYERS)())


COMPILED_TRAINABLE_STATE = "_compiled_trainable_state"
"""A compiled model's ``{layer: trainable}`` at ``compile`` (Keras 3.15 ``Trainer.compile``): what its
``_warn_if_trainable_state_changed`` compares with, a warning that is never reached (it follows a ``raise``)."""


@functools.cache
def records_compiled_trainable_state() -> bool:
    """Whether this Keras records each layer's ``trainable`` at ``compile`` (Keras 3.15 does; Keras 3.5 does not).

    Read from the source of ``keras.Model.compile``, so that asking creates no model (no name counter moves).
    Where Keras records nothing, a ``trainable`` change after ``compile`` cannot be told from the model alone.
    """
    try:
        return COMPILED_TRAINABLE_STATE in inspect.getsource(keras.Model.compile)
    except (OSError, TypeError):  # no source shipped: assume it does not
        return False


def compiled_trainable_state(model: Any) -> dict[Any, bool] | None:
    """Each layer's ``trainable`` when the model was compiled, or None (not compiled, or a Keras without it)."""
    state = getattr(model, COMPILED_TRAINABLE_STATE, None)
    return state if isinstance(state, dict) else None


# -- graph and distribution context -------------------------------------------------------------------
def in_xla() -> bool:
    """Whether the graph being traced is compiled by XLA (``jit_compile=True``)."""
    if tf.executing_eagerly():
        return False
    _, ops, control_flow_util = _tf_private()
    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def replica_id() -> int:
    """The replica a write runs for: the update's (inside a ``MirroredStrategy``'s ``extended.update``), else
    the replica context's, else 0."""
    distribute_lib, _, _ = _tf_private()
    update = distribute_lib.get_update_replica_id()
    if isinstance(update, int):  # the default strategy puts the variable or its device there instead
        return update
    context = tf.distribute.get_replica_context()
    rid = None if context is None else tf.get_static_value(context.replica_id_in_sync_group)
    return 0 if rid is None else int(rid)


def called_graphs(op: Any) -> list[Any]:
    """The graphs of the functions an op runs (``If``/``Case`` branches, ``While`` bodies, a nested
    ``tf.function``), found by name in the op's graph or the graphs around it (``Graph._functions``)."""
    names = []
    for attr in ("then_branch", "else_branch", "branches", "body", "cond", "f"):
        try:
            value = op.get_attr(attr)
        except ValueError:
            continue
        names += [v.name for v in value] if isinstance(value, list) else [getattr(value, "name", None)]
    found = []
    for name in names:
        graph = op.graph
        while graph is not None and name is not None:
            function = getattr(graph, FUNCTIONS).get(name)
            if function is not None:
                inner = getattr(function, "graph", None)
                if inner is not None:
                    found.append(inner)
                break
            graph = getattr(graph, "outer_graph", None)
    return found


def default_graph() -> Any:
    """The graph being built (a ``FuncGraph`` inside ``tf.function`` or a branch of control flow)."""
    _, ops, _ = _tf_private()
    return ops.get_default_graph()


# -- the TensorFlow build ----------------------------------------------------------------------------
def onednn_in_build() -> bool | None:
    """Whether this TensorFlow build has oneDNN (MKL) kernels; None if the private probe is gone.

    >>> onednn_in_build() in (True, False, None)
    True
    """
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def disable_op_determinism() -> None:
    """Switch op determinism off again (TensorFlow's private ``config.disable_op_determinism``; tests use it to
    undo ``freezing.enable_determinism``)."""
    from tensorflow.python.framework import config

    config.disable_op_determinism()


def variable_shape(variable: Any) -> Any:
    """The shape of ``variable`` as it is when the graph runs (``VariableShape`` on its handle), never folded from a
    read's static shape, which can be stale for a variable whose shape changes (a stored mask on a remote task).

    >>> v = tf.Variable(True, shape=tf.TensorShape(None)); _ = v.assign([[True, False]])
    >>> variable_shape(v).numpy().tolist()
    [1, 2]
    """
    return tf.raw_ops.VariableShape(input=tf_variable(variable).handle, out_type=tf.int64)
