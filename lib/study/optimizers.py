"""Optimizers by name, so studies and YAML parameters can say ``"adam"`` and get a fresh instance.

``make_optimizer("adam", 1e-3)`` returns a new ``keras.optimizers.Adam``. Unknown names raise a
``ValueError`` that lists every allowed name.
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from study.validation import check_choice

Factory = Callable[[float], keras.optimizers.Optimizer]

OPTIMIZERS: dict[str, Factory] = {
    "sgd": lambda lr: keras.optimizers.SGD(lr),
    "momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "nesterov": lambda lr: keras.optimizers.SGD(lr, momentum=0.9, nesterov=True),
    "adam": lambda lr: keras.optimizers.Adam(lr),
    "amsgrad": lambda lr: keras.optimizers.Adam(lr, amsgrad=True),
    "adamw": lambda lr: keras.optimizers.AdamW(lr, weight_decay=0.05),
    "adamax": lambda lr: keras.optimizers.Adamax(lr),
    "nadam": lambda lr: keras.optimizers.Nadam(lr),
    "rmsprop": lambda lr: keras.optimizers.RMSprop(lr),
    "rmsprop_centered": lambda lr: keras.optimizers.RMSprop(lr, momentum=0.5, centered=True),
    "adagrad": lambda lr: keras.optimizers.Adagrad(lr),
    "adadelta": lambda lr: keras.optimizers.Adadelta(lr),
    "ftrl": lambda lr: keras.optimizers.Ftrl(lr, l1_regularization_strength=0.01),
    "lion": lambda lr: keras.optimizers.Lion(lr),
    "lamb": lambda lr: keras.optimizers.Lamb(lr),
    "sgd_wd": lambda lr: keras.optimizers.SGD(lr, weight_decay=0.05),
    "muon": lambda lr: keras.optimizers.Muon(lr),
    "schedule_free_adamw": lambda lr: keras.optimizers.ScheduleFreeAdamW(lr),
}
"""Name -> factory. Weight-decay variants use a large decay (0.05) so that its drift is visible."""


def make_optimizer(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """Return a fresh optimizer by name. ``make_optimizer("nesterov", 0.01)`` -> SGD(momentum=0.9, nesterov=True)"""
    check_choice("optimizer", name, OPTIMIZERS)
    return OPTIMIZERS[name](learning_rate)
