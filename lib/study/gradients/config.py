"""Study 04's parameters: ``GradientStudyConfig``, every parameter of notebook 04 with its default, validated.

It also names every table's columns (``COLUMNS``, for ``reporting.save_table``), the staleness study's
optimizers (``STALENESS_OPTIMIZERS``) and the faults the cluster run can inject (``FAULTS``); the other modules of
``study.gradients`` import these from here and never import each other in a circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from study.validation import check_choices, check_int_list, check_positive_int, check_range

STALENESS_OPTIMIZERS = ("sgd", "adam", "adagrad", "adamw", "muon")
"""The optimizers ``study.gradients.staleness`` writes out element-wise."""
RATE_SERIES = tuple(round(m * 10.0 ** e, 6) for e in range(-4, 0) for m in (1, 2, 5)) + (1.0,)
"""Learning rates of the staleness grids: the 1-2-5 series from 0.0001 to 1, so that every optimizer's grid has the
same spacing (each rate 2 or 2.5 times the one before) and none has a wider gap where its best rate may lie."""
RATE_RANGES = {"sgd": (0.005, 1.0), "adam": (0.0001, 0.05), "adagrad": (0.01, 1.0), "adamw": (0.0001, 0.05),
               "muon": (0.0005, 0.02)}
"""Each optimizer's stretch of ``RATE_SERIES``: wide enough that the rate the validation split chooses at every
delay of the full run lies inside it, not at an edge."""
FAULTS = ("worker", "chief", "ps")
COLUMNS = {  # every table of study 04: column -> meaning (unit)
    # fetch_costs
    "mode": "how the gradients are computed: TF1 graph (Session), TF2 eager, or TF2 inside tf.function",
    "method": "the way all gradients are fetched (one pass, one call per variable, or a recomputed pass per variable)",
    "ms": "median wall time to get all gradients of the Deep MNIST CNN for one batch, over `repeats` rounds in which "
          "the mode's methods are called in turn (ms)",
    "ratio_to_one_pass": "median over the rounds of this method's ms / the one-pass method's ms in the same round "
                         "(ratio)",
    "ms_min": "fastest round (ms)",
    "ms_max": "slowest round (ms)",
    "ratio_low": "lowest over the rounds of this method's ms / the one-pass method's ms in the same round (ratio)",
    "ratio_high": "highest over the rounds of that ratio (ratio)",
    "rounds": "rounds timed, each calling every method of the mode once, in rotated order (count)",
    # quadratic_trace
    "step": "step of the compute-transform-apply loop on y = 0.5 (x - 3)^2; 0 is the start (count)",
    "x": "x at the start of the step (after the previous step's update)",
    "dy_dx": "the gradient dy/dx at that x, which the step transforms and applies",
    "error": "|x after the step - (x before - lr * T(dy/dx))|; 0 means the update is exact (x units)",
    # ps_runs and n_push_sweep
    "run": "label of the cluster run",
    "model": "the Keras model trained (module:function of its builder)",
    "workers": "worker tasks that computed gradients (count)",
    "ps": "parameter-server tasks holding the variables (count)",
    "n_fetch": "a worker fetches fresh parameters every n_fetch of its steps (steps)",
    "n_push": "a worker pushes its summed gradients every n_push of its steps (steps)",
    "steps": "minibatches computed by all workers together (count)",
    "applied_updates": "pushes applied on the ps tasks (count; one per n_push steps of a worker)",
    "steps_per_s": "minibatches per second of all workers together, after the warm-up, over the chief's timed span "
                   "(chief's clock; 1/s)",
    "steps_per_s_windows": "minibatches per second of all workers together over the span of their timed functions, "
                           "the mean of 4 equal windows of it (workers' clocks; 1/s)",
    "steps_per_s_std": "std of the rates of those 4 windows (workers' clocks; 1/s)",
    "steps_per_s_window_min": "rate of the slowest of those 4 windows (workers' clocks; 1/s)",
    "steps_per_s_window_max": "rate of the fastest of those 4 windows (workers' clocks; 1/s)",
    "updates_per_s": "updates applied per second after the warm-up (1/s)",
    "staleness_mean": "mean over pushes of the updates other workers applied between a push's fetch and the push "
                      "(updates)",
    "staleness_max": "largest staleness of a push (updates)",
    "final_accuracy": "test accuracy of the parameters on the ps at the end (fraction, 0-1)",
    "worker_cpu_share_min": "smallest share of one core a worker process got over the timed window (fraction of a "
                            "core)",
    "worker_cpu_s_per_step": "CPU seconds of all worker processes per minibatch, timed window, read from /proc (s)",
    "ps_cpu_s_per_step": "CPU seconds of all ps processes per minibatch, timed window, read from /proc (s)",
    "samples_shared_between_workers": "training samples read by more than one worker (count; 0 = disjoint shards)",
    # ps_frozen
    "shards_on": "the ps tasks holding the variable's shards, in order",
    "frozen_entries": "entries its mask freezes (count)",
    "frozen_bits_changed": "frozen entries whose value differs in any bit between the start and the end of the run "
                           "(count; 0 = exactly frozen)",
    "trainable_entries": "entries its mask lets train (count)",
    "trainable_changed": "trainable entries whose value changed during the run (count)",
    # ps_placement
    "variable": "path of the Keras variable",
    "shard": "which shard of the variable (a variable over 256 KiB is split over the ps tasks)",
    "task": "the ps task that holds the shard",
    "shard shape": "shape of the shard (a split variable's shards each hold part of its first axis)",
    "bytes": "size of the shard (bytes)",
    # staleness_curves, staleness_rate_grid, staleness_dai_check, staleness_gaps, staleness_best_per_tau
    "optimizer": "optimizer of the in-process staleness study",
    "learning_rate": "learning rate of the run (for the check: the optimizer's rate chosen on the validation split "
                     "without delay)",
    "tau": "delay: the gradient applied at update t was computed on the parameters of update t - tau (updates)",
    "seed": "seed of the run (weights and minibatches)",
    "updates": "updates applied so far (count)",
    "accuracy": "test accuracy after that many updates (fraction, 0-1)",
    "val_accuracy": "validation accuracy after that many updates; it alone chooses learning rates (fraction, 0-1)",
    "val_mean": "mean over seeds of the final validation accuracy (fraction, 0-1)",
    "test_mean": "mean over seeds of the final test accuracy (fraction, 0-1)",
    "test_std": "std over seeds of the final test accuracy (fraction)",
    "chosen": "whether the validation split chose this rate for this tau (the best val_mean of the grid)",
    "chosen_undelayed": "whether the validation split chose this rate at tau = 0 (the rate the undelayed comparisons "
                        "use)",
    "seeds": "seeds run (count)",
    "reached": "seeds whose run reached staleness_target test accuracy (count)",
    "slowdown_mean": "mean over seeds of updates to reach the target / the same seed's updates at tau = 0 (ratio; "
                     "inf if a seed never reached it)",
    "slowdown_std": "std over seeds of that ratio; empty when a seed never reached the target (ratio)",
    "slowdown_ci_low": "low end of the slowdown's 95% Student-t interval over seeds; empty unless every seed reached "
                       "the target (ratio)",
    "slowdown_ci_high": "high end of that interval (ratio)",
    "both_reached": "seeds whose runs of both a and b reached staleness_target test accuracy (count)",
    "slowdown_gap_mean": "mean over seeds of a's slowdown minus b's, paired by seed, each at its rate chosen on the "
                         "validation split without delay (ratio of updates; negative: a slows down less); empty "
                         "unless every seed of both reached the target",
    "slowdown_gap_ci_low": "low end of that difference's 95% Student-t interval (ratio of updates)",
    "slowdown_gap_ci_high": "high end of that difference's 95% Student-t interval (ratio of updates)",
    "drop_mean": "mean over seeds of final test accuracy at tau = 0 minus final test accuracy at this tau, the same "
                 "seed (absolute, fraction of test images)",
    "drop_std": "std over seeds of that drop (fraction)",
    "drop_ci_low": "low end of the drop's 95% Student-t interval over seeds (fraction)",
    "drop_ci_high": "high end of the drop's 95% Student-t interval over seeds (fraction)",
    "a": "the optimizer whose accuracy lost is compared",
    "b": "the optimizer it is compared with (each at its rate chosen on the validation split without delay)",
    "mean": "mean over seeds of a's accuracy lost minus b's, paired by seed (fraction; negative: a loses less)",
    "std": "std over seeds of that paired difference (fraction)",
    "se": "standard error of the mean difference, std / sqrt(seeds) (fraction)",
    "ci_low": "low end of the difference's 95% Student-t interval (fraction)",
    "ci_high": "high end of the difference's 95% Student-t interval (fraction)",
    **{name: f"{name}'s final test accuracy at the rate the validation split chose for this tau, mean over seeds "
             f"(fraction)" for name in STALENESS_OPTIMIZERS},
    **{f"{name}_std": f"std over seeds of {name}'s final test accuracy at that rate (fraction)"
       for name in STALENESS_OPTIMIZERS},
    **{f"{name}_lr": f"{name}'s learning rate chosen on the validation split for this tau"
       for name in STALENESS_OPTIMIZERS},
    **{f"{name}_val": f"{name}'s mean final validation accuracy at that rate, which chose it (fraction)"
       for name in STALENESS_OPTIMIZERS},
    # fault_accounting
    "fault": "the task killed",
    "updates when killed (seen)": "the update counter as the launcher last read it before the kill (count)",
    "updates when killed (exact)": "the counter when the task died, read on a ps task that survived (count; empty "
                                   "where it cannot be read)",
    "in the last checkpoint": "updates in the checkpoint the job resumed from (count; empty for a worker: no "
                              "restart from a checkpoint)",
    "lost": "updates applied before the kill but not in the resumed checkpoint (count)",
    "lost is exact": "whether lost is counted exactly (from the surviving ps task) or estimated from the launcher's "
                     "last reading",
    "how it came back": "what restarted after the kill",
}



@dataclass(frozen=True)
class GradientStudyConfig:
    """Parameters of study 04 and their defaults (the full run), validated. ``GradientStudyConfig(repeats=3)``"""

    # 1-2. gradient fetching and the exact update
    batch: int = 50
    repeats: int = 5
    # 3-5. Downpour SGD on a local cluster: the Deep MNIST CNN, n_fetch = n_push = ps_n unless swept
    ps_model: str = "study.models:deep_mnist_cnn"
    worker_counts: Sequence[int] = (1, 2)
    ps_tasks: int = 2
    ps_steps: int = 256
    ps_batch: int = 50
    ps_learning_rate: float = 0.05
    ps_n: int = 4
    ps_steps_per_function: int = 8
    ps_eval_every: int = 8
    n_push_sweep: Sequence[int] = (1, 8)
    n_push_sweep_steps: int = 128
    fault_model: str = "downpour.examples:mnist_mlp"
    fault_steps: int = 240
    faults: Sequence[str] = ("worker", "chief", "ps")
    # 7. Adam on the ps with frozen entries: an MLP, a random share masked_keep of fc1's kernel trains
    masked_steps: int = 96
    masked_keep: float = 0.5
    # 6. staleness in one process
    taus: Sequence[int] = (0, 1, 2, 4, 8)
    staleness_optimizers: Sequence[str] = STALENESS_OPTIMIZERS
    staleness_learning_rates: dict[str, list[float]] = field(
        default_factory=lambda: {o: [r for r in RATE_SERIES if low <= r <= high]
                                 for o, (low, high) in RATE_RANGES.items()})
    staleness_steps: int = 300
    staleness_eval_every: int = 10
    staleness_target: float = 0.85
    seeds: Sequence[int] = tuple(range(16))

    def __post_init__(self) -> None:
        for name in ("batch", "repeats", "ps_tasks", "ps_steps", "ps_batch", "ps_n", "ps_steps_per_function",
                     "ps_eval_every", "n_push_sweep_steps", "fault_steps", "masked_steps", "staleness_steps",
                     "staleness_eval_every"):
            check_positive_int(name, getattr(self, name))
        check_int_list("worker_counts", self.worker_counts, minimum=1)
        if list(self.n_push_sweep):  # empty: no sweep
            check_int_list("n_push_sweep", self.n_push_sweep, minimum=1)
        check_choices("faults", self.faults, FAULTS)
        check_int_list("taus", self.taus, minimum=0)
        if 0 not in self.taus:
            raise ValueError(f"taus: must include 0 (the baseline each delay is compared with); got {list(self.taus)}")
        check_int_list("seeds", self.seeds, minimum=0)
        check_range("ps_learning_rate", self.ps_learning_rate, 0.0, 10.0, low_open=True)
        check_range("staleness_target", self.staleness_target, 0.0, 1.0, low_open=True)
        check_range("masked_keep", self.masked_keep, 0.0, 1.0, low_open=True)
        if self.masked_steps % 4:
            raise ValueError(f"masked_steps: must be a multiple of 4 (steps per scheduled function); "
                             f"got {self.masked_steps}")
        if self.staleness_steps % self.staleness_eval_every:
            raise ValueError(f"staleness_eval_every: must divide staleness_steps={self.staleness_steps}; "
                             f"got {self.staleness_eval_every}")
        check_choices("staleness_optimizers", self.staleness_optimizers, STALENESS_OPTIMIZERS)
        for name in self.staleness_optimizers:
            rates = self.staleness_learning_rates.get(name) if isinstance(self.staleness_learning_rates, dict) else None
            if not rates:
                raise ValueError(f"staleness_learning_rates: no rates for {name!r}; give a list per optimizer")
            for lr in rates:
                check_range(f"staleness_learning_rates[{name}]", lr, 0.0, 10.0, low_open=True)
        for n in (self.ps_n, *self.n_push_sweep):
            if self.ps_steps_per_function % n:
                raise ValueError(f"ps_steps_per_function: must be a multiple of ps_n and of every n_push_sweep value; "
                                 f"{self.ps_steps_per_function} is not a multiple of {n}")

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any]) -> GradientStudyConfig:
        """The config from notebook parameters: every field name in ``values`` that is not None; defaults otherwise."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    @classmethod
    def parameter_names(cls) -> list[str]:
        """Every field, in order (the names the parameters cell may set)."""
        return [f.name for f in fields(cls)]

    def plain(self) -> dict[str, Any]:
        """The resolved parameters as plain data (for metrics.json)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}
