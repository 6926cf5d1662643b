"""Study 05, recipe 5: a random sub-network (half of every layer's units) trains at each step through
``mask_fn``, the naive gate against the exact mask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf

import freezing
from freezing.determinism import enable_determinism
from freezing.masked_optimizer import MaskedOptimizer
from study.data import MnistSplits
from study.optimizers import make_optimizer
from study.recipes.setup import (
    _POLICY,
    SUBNET_METHODS,
    RecipesConfig,
    StepAudit,
    StudyResult,
    _diagnosis_rows,
    _fit_steps,
    mlp,
)
from study.training import LOSS, accuracy, median_ms, restore, snapshot


class RandomUnits:
    """``mask_fn`` for ``MaskedOptimizer``: at every step each unit (output column) trains with probability ``p``.

    The mask has shape ``[units]``, which broadcasts to a Dense kernel ``(in, units)`` and its bias; it is
    drawn from a stateless RNG keyed by (seed, step, variable), so it is the same whenever it is recomputed.
    ``seed`` is a variable: ``reseed`` changes it without retracing. ``RandomUnits(model.trainable_variables, .5, 0)``
    """

    def __init__(self, variables: Sequence[Any], p: float, seed: int):
        self.index = {v.path: i for i, v in enumerate(variables)}
        self.p = float(p)
        self.seed = tf.Variable(seed, dtype=tf.int64, trainable=False, name="random_units_seed")

    def reseed(self, seed: int) -> None:
        """Draw a different sequence of masks. ``fn.reseed(1)``"""
        self.seed.assign(seed)

    def __call__(self, step: Any, variable: Any) -> tf.Tensor:
        key = tf.cast(step, tf.int64) * len(self.index) + self.index[variable.path]
        draw = tf.random.stateless_uniform([variable.shape[-1]], seed=tf.stack([tf.identity(self.seed), key]))
        return draw < self.p


# -- 5. random sub-network every step --------------------------------------------------------------------
def subnetwork_study(config: RecipesConfig, data: MnistSplits) -> StudyResult:
    """From scratch on all digits, a random ``subnet_p`` of each layer's
    units trains at every step. ``subnetwork_study(cfg, data)``"""
    rows, steps, diagnosis = [], [], []
    for method in SUBNET_METHODS:
        model = mlp(10, config.hidden)
        mask_fn = RandomUnits(model.trainable_variables, config.subnet_p, config.seeds[0])
        opt = MaskedOptimizer(make_optimizer("adam", config.learning_rate), policy=_POLICY[method], mask_fn=mask_fn)
        model.compile(optimizer=opt, loss=LOSS)
        opt.build(model.trainable_variables)
        opt_init = snapshot(opt.variables)
        for seed in config.seeds:
            enable_determinism(seed)
            model.set_weights(mlp(10, config.hidden).get_weights())
            restore(opt.variables, opt_init)
            mask_fn.reseed(seed)
            audit = StepAudit(model.trainable_variables, mask_fn, opt)
            _fit_steps(model, data.x_train, data.y_train, config.batch, config.subnet_steps, seed, [audit])
            if seed == config.seeds[0]:
                step = int(opt.iterations.numpy())
                frozen = {v.path: ~np.broadcast_to(mask_fn(step, v).numpy(), v.shape)
                          for v in model.trainable_variables}
                diagnosis += _diagnosis_rows("5 random units", method,
                                             freezing.diagnose(model, masks={k: ~m for k, m in frozen.items()}))
            for r in audit.rows:
                steps.append({"method": method, "seed": seed, **r})
            rows.append({"method": method, "seed": seed, "p": config.subnet_p,
                         "moved": sum(r["moved"] for r in audit.rows), "frozen": sum(r["frozen"] for r in audit.rows),
                         "accuracy": accuracy(model, data.x_test, data.y_test),
                         "step_time_ms": median_ms(audit.times), "extra_state_bytes": opt.mask_bytes()})
    table = pd.DataFrame(steps)
    table["cumulative_moved"] = table.groupby(["method", "seed"])["moved"].cumsum()
    return StudyResult(pd.DataFrame(rows), pd.DataFrame(diagnosis), {"steps": table})
