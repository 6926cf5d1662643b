"""Freezing parts of a neural network in TensorFlow: scopes, gradient gates, optimizer slots, exact masks.

One module per idea:

* ``selection``        -- ``select_variables``: var_list by scope or pattern (TF2's get_collection).
* ``gates``            -- ``gate``: ``keep*x + (1-keep)*stop_gradient(x)``.
* ``slots``            -- ``slots``, ``reset_slots``, ``stash_slots``/``restore_slots``: the seed's manual fix.
* ``masked_optimizer`` -- ``MaskedOptimizer``: a Keras optimizer whose per-element masks any inner
                          optimizer honours exactly, in ``compile``/``fit``, custom loops and under
                          ``tf.distribute``; its parts: ``_masks`` (masks as state, the path each implies),
                          ``_write_path`` (the guard: frozen bits only ever copied; the table of the
                          per-variable paths and the one function that chooses; weight decay held and
                          folded into the update's write), ``_trace_check`` (no write but the guard's),
                          ``_restore`` (eager steps: the frozen bits selected back), ``_tuning`` (its
                          thresholds: speed only, not API), ``_keras_api`` (every private Keras/TensorFlow
                          name, checked at build), ``_surface`` (the inner optimizer's options seen
                          through the wrapper), ``_saving`` (config and state), ``_sizes`` (bytes held),
                          ``_sparse_state`` (state for a fixed selection only), ``_distribute`` (what each
                          strategy runs or refuses).
* ``loading``          -- ``load_model``: ``keras.saving.load_model`` that also restores the optimizer of a
                          model with its own ``compile`` (keras-hub tasks), masks and state included.
* ``schedule``         -- ``MaskSchedule``: staged unfreezing inside one ``fit`` call.
* ``skipping``         -- ``SkipFrozen`` (``fit``), ``variables_to_differentiate`` (custom loops): a tensor frozen
                          whole is not differentiated, as with ``trainable=False``; its state is kept
                          (``_skip_flags``: the flags it turned off, put back).
* ``audit``            -- ``FreezeAudit``: how many frozen entries moved, and by how much.
* ``diagnose``         -- ``diagnose``: every cause that can move entries you believe frozen, and the fix.
* ``determinism``      -- ``enable_determinism``: seeds plus op determinism, bit-reproducible on CPU.
* ``gradients``        -- compute all gradients in one pass, transform, apply (TF2 and TF1 graph mode).
* ``unwrap``, ``wrapper_chain`` -- the optimizer that owns the slots, through MaskedOptimizer and LossScaleOptimizer.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    import tensorflow  # noqa: F401  (freezing does not pick a TensorFlow build for you)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "freezing needs TensorFlow next to Keras 3: pip install tensorflow (or tensorflow-cpu, or a GPU build), "
        "or pip install 'freezing[tensorflow]'"
    ) from e
import keras

if keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the environment
    raise ImportError(
        f"freezing works on Keras' TensorFlow backend; this Keras runs on {keras.backend.backend()!r}: set "
        "KERAS_BACKEND=tensorflow before importing keras"
    )

from freezing._wrappers import unwrap, wrapper_chain
from freezing.audit import FreezeAudit
from freezing.determinism import enable_determinism
from freezing.diagnose import CAUSES, Cause, Diagnosis, diagnose
from freezing.gates import gate
from freezing.loading import load_model
from freezing.masked_optimizer import NORMS, POLICIES, STATES, MaskedOptimizer
from freezing.schedule import MaskSchedule
from freezing.selection import select_variables, variable_path
from freezing.skipping import SkipFrozen, variables_to_differentiate
from freezing.slots import SlotStash, reset_slots, restore_slots, slot_initial_value, slots, stash_slots
from freezing.stalls import STALL_CAUSES, StallWatch, find_stalls, trainable_changes

try:
    __version__ = version("freezing")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "CAUSES",
    "Cause",
    "Diagnosis",
    "FreezeAudit",
    "MaskSchedule",
    "MaskedOptimizer",
    "NORMS",
    "POLICIES",
    "STATES",
    "SkipFrozen",
    "STALL_CAUSES",
    "SlotStash",
    "StallWatch",
    "diagnose",
    "enable_determinism",
    "find_stalls",
    "gate",
    "load_model",
    "reset_slots",
    "restore_slots",
    "select_variables",
    "slot_initial_value",
    "slots",
    "stash_slots",
    "trainable_changes",
    "unwrap",
    "variable_path",
    "variables_to_differentiate",
    "wrapper_chain",
]
