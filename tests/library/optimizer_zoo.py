"""Every Keras optimizer configuration the library's tests run, by name, as data (no study package needed).

The library's tests run in the oldest supported environment too, where the study is not installed, so they
do not import the study's optimizer table. This zoo is a superset of it: it adds the optimizers whose
update of one entry reads others (Adafactor, Muon, ScheduleFreeAdamW) where this Keras has them.
"""

from __future__ import annotations

import keras

CONFIGS: dict[str, tuple[str, dict]] = {
    "sgd": ("SGD", {}),
    "momentum": ("SGD", {"momentum": 0.9}),
    "nesterov": ("SGD", {"momentum": 0.9, "nesterov": True}),
    "adam": ("Adam", {}),
    "amsgrad": ("Adam", {"amsgrad": True}),
    "adamw": ("AdamW", {"weight_decay": 0.05}),
    "adamax": ("Adamax", {}),
    "nadam": ("Nadam", {}),
    "rmsprop": ("RMSprop", {}),
    "rmsprop_centered": ("RMSprop", {"momentum": 0.5, "centered": True}),
    "adagrad": ("Adagrad", {}),
    "adadelta": ("Adadelta", {}),
    "ftrl": ("Ftrl", {"l1_regularization_strength": 0.01}),
    "lion": ("Lion", {}),
    "lamb": ("Lamb", {}),
    "sgd_wd": ("SGD", {"weight_decay": 0.05}),
}
"""Name -> (Keras class, options). Weight-decay variants use a large decay (0.05) so that its drift is visible."""

NON_ELEMENTWISE = {"adafactor": ("Adafactor", {}), "muon": ("Muon", {}),
                   "schedule_free_adamw": ("ScheduleFreeAdamW", {})}
"""Optimizers whose update of one entry reads other entries, where this Keras has them."""

OPTIMIZERS = {name: config for name, config in CONFIGS.items() if hasattr(keras.optimizers, config[0])}


def make_optimizer(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """A fresh optimizer by name, from ``CONFIGS`` or ``NON_ELEMENTWISE``."""
    cls, options = {**CONFIGS, **NON_ELEMENTWISE}[name]
    return getattr(keras.optimizers, cls)(learning_rate, **options)
