"""Study 05's method ids (``gradient_mask``, ``recompile_same``, ...) as figures and tables show them.

The ids stay in the CSVs and ``metrics.json`` (``COLUMNS`` describes them); a reader sees ``method_label(id)``.
"""

from __future__ import annotations

LABELS = {"gradient_mask": "gradient mask", "constraint": "constraint (restores the frozen values)",
          "exact": "exact mask", "naive_gate": "naive gate", "mask_schedule": "MaskSchedule",
          "skip_frozen": "MaskSchedule + SkipFrozen",
          "recompile_fresh": "recompile, new optimizer", "recompile_same": "recompile, same optimizer",
          "trainable_flip": "flip trainable, no recompile", "full": "full fine-tuning", "last_layer": "last layer only",
          "sparse": "sparse (FISH), dense state", "sparse_state": "sparse (FISH), sparse state",
          "lora": "LoRA (enable_lora)"}
"""Method id -> the name a reader sees."""


def method_label(method: str) -> str:
    """A method's name as figures and tables show it (``LABELS``; an unknown id as it is).

    >>> method_label("recompile_same"), method_label("no_such_method")
    ('recompile, same optimizer', 'no_such_method')
    """
    return LABELS.get(method, method)


OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "momentum": "SGD with momentum"}
"""Optimizer id (as in the config and the CSVs) -> the name a reader sees."""


def optimizer_name(optimizer: str) -> str:
    """An optimizer's name as prose and tables show it (``OPTIMIZER_NAMES``; an unknown id as it is).

    >>> optimizer_name("adamw"), optimizer_name("lion")
    ('AdamW', 'lion')
    """
    return OPTIMIZER_NAMES.get(optimizer, optimizer)
