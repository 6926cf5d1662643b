"""Study 02: freezing the Deep MNIST CNN with SGD and Adam (any optimizer of study.optimizers by parameter), on real
digits.

1. ``finetune_study``: pretrain on digits 0-4, freeze ``conv1``/``conv2``, fine-tune ``fc1``/``fc2`` on
   digits 5-9 with the same optimizer (its state carries over, as when a run is frozen midway). Methods:
   a ``var_list`` by scope, ``trainable=False`` with and without recompiling (Keras' trap), a ``gate``
   on the features, and ``MaskedOptimizer(hold)``.
2. ``mask_study``: a fresh random per-element mask every step, a fraction ``p`` trainable; the naive
   stop_gradient mask against ``MaskedOptimizer`` ``hold`` and ``reset``.
3. ``block_study``: block-coordinate training, one layer at a time in turn every ``k`` steps.

Every loop is a ``tf.function`` that calls the library; drift is audited in-graph every step, with one
definition across the study: *changed entries* (bit for bit, ``freezing.audit``) and *max |ΔW|*.

Reproducibility: every seeded run starts with ``freezing.enable_determinism(seed)`` and restarts the
model's dropout generator at that seed (``training.reseed``); batches come from ``batch_indices(seed)``,
the data split from ``config.data_seed``. Within one run every method of a comparison sees the same
initial weights, the same batches in the same order and the same dropout masks.

The code lives in ``setup`` (parameters, run start), ``finetune`` (1), ``masks`` (2 and 3), ``tables``
(summaries, tables, headline) and ``plots`` (the figures); this package re-exports the public names of the first
four, so ``from study import cnn; cnn.mask_study(...)`` is the face notebook 02 uses, with ``study.cnn.plots``.
"""

from study.cnn.finetune import FINETUNE_RUN_COLUMNS, TRAP_COLUMNS, finetune_study, keras_trainable_traps  # noqa: F401
from study.cnn.masks import (  # noqa: F401
    STEP_COLUMNS,
    _masked_step,
    block_masks,
    block_study,
    mask_study,
    random_masks,
    run_keys,
)
from study.cnn.setup import (  # noqa: F401
    BLOCKS,
    DEFAULT_LEARNING_RATES,
    EXACT_FINETUNE_METHODS,
    FINETUNE_METHODS,
    MASK_METHODS,
    ONE_STEP_COLUMNS,
    CnnStudyConfig,
    one_step_audit,
)
from study.cnn.tables import (  # noqa: F401
    FINETUNE_SUMMARY_COLUMNS,
    HOLD_VS_RESET_COLUMNS,
    MASKED_SUMMARY_COLUMNS,
    METRIC_KINDS,
    NAIVE_VS_EXACT_COLUMNS,
    config_table,
    finetune_summary,
    formatted,
    headline,
    hold_vs_reset,
    hold_vs_reset_display,
    late_means,
    masked_runs,
    masked_summary,
    naive_vs_exact,
    naive_vs_exact_display,
    paired_contrast,
    pooled_over_p,
    run_contrast,
    same_weights,
    step_times,
    time_ratios,
    workload,
)
from study.report.reporting import display_table, format_count  # noqa: F401
