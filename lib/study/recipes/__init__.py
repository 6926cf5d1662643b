"""Study 05: freezing recipes in ``model.fit``, each measured against the way people do it today.

Five jobs people bring to this repository, each done the exact way (``MaskedOptimizer``, ``mask_fn``,
``MaskSchedule``) and the ways in use today, over several seeds:

1. ``new_columns_study``: extend a digits-0-4 classifier to 10 classes and train only the new output
   columns under AdamW: a gradient mask, a constraint that copies the old values back, the exact mask.
2. ``pruning_study``: magnitude-prune ``fc1`` of the Deep MNIST CNN and fine-tune with the Adam/AdamW
   state of dense training: a gradient mask, a re-zeroing constraint, the exact mask.
3. ``unfreezing_study``: gradual unfreezing (top layer first) in one ``fit`` with ``MaskSchedule``,
   against recompiling per stage (a fresh optimizer, or the same one) and flipping ``trainable``.
4. ``sparse_study``: fine-tune a fixed 1-5 % of entries picked by accumulated squared gradients
   (FISH-style), against full and last-layer fine-tuning.
5. ``subnetwork_study``: a random half of every layer's units trains at each step through ``mask_fn``,
   the naive gate against the exact mask.

"Moved" always means: the entry's bits changed (``freezing.audit.changed_bits``) although it was meant to
stay fixed. Every run starts with ``freezing.determinism.enable_determinism(seed)``, and a compiled model
is reused across seeds by assigning its weights and optimizer state, so reruns give bit-identical numbers.

One module per recipe (``new_columns``, ``pruning``, ``unfreezing``, ``sparse``, ``subnetwork``), the shared
set-up (``setup``: parameters, column glossary, MLP, pretraining), the summaries and headline (``summary``) and
the which-method table (``which_method``); this package re-exports their public names, so
``from study import recipes; recipes.pruning_study(...)`` is the one face the notebook uses.
"""

from __future__ import annotations

from study.intervals import CONFIDENCE  # noqa: F401
from study.recipes.labels import LABELS, OPTIMIZER_NAMES, method_label, optimizer_name  # noqa: F401
from study.recipes.new_columns import new_columns_study  # noqa: F401
from study.recipes.pruning import (  # noqa: F401
    CnnState,
    dense_cnn,
    load_cnn_state,
    magnitude_mask,
    pretrain_cnns,
    pruning_study,
    pruning_twin,
)
from study.recipes.setup import (  # noqa: F401
    COLUMNS,
    NEW_COLUMN_METHODS,
    OLD_CLASSES,
    PRUNE_METHODS,
    PRUNED_LAYER,
    SPARSE_METHODS,
    SUBNET_METHODS,
    UNFREEZE_METHODS,
    CopyBack,
    Pretrained,
    RecipesConfig,
    StepAudit,
    StudyResult,
    body_layers,
    extend_head,
    mlp,
    old_new,
    pretrain_mlps,
)
from study.recipes.sparse import fish_masks, sparse_study, squared_gradients  # noqa: F401
from study.recipes.subnetwork import RandomUnits, subnetwork_study  # noqa: F401
from study.recipes.summary import (  # noqa: F401
    METRIC_KINDS,
    headline,
    recipe_metrics,
    short_error,
    spread_caption,
    state_kept_text,
    summarize,
    value_ranges,
)
from study.recipes.unfreezing import trainable_traps, unfreezing_study  # noqa: F401
from study.recipes.which_method import method_table  # noqa: F401
from study.report.reporting import display_table  # noqa: F401
