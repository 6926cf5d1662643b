"""What a job measured: ``DownpourResult``, typed, written by the chief as JSON (``--out``) and read back.

``run_downpour`` returns one; ``python -m downpour`` (chief) writes ``to_json()`` to ``--out``. The fields are
typed attributes (``r.applied_updates``); for code that reads results as dicts (the study's notebook and tables)
a result is also a read-only mapping of its field names (``r["applied_updates"]``). ``FrozenReport`` says how many
frozen entries there were and how many of their bits changed, per variable and per ps task.

``DownpourResult.from_dict(json.load(open("result.json"))).frozen.frozen_changed_bits``
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class _Fields(Mapping):
    """A dataclass that can also be read as a mapping of its field names (read-only)."""

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True)
class FrozenReport(_Fields):
    """Frozen entries of the masked variables, and how many of their bits changed between the start and the end.

    ``per_variable[path]`` and ``per_task["ps:k"]`` hold ``frozen_entries``, ``frozen_changed`` (bits compared;
    -0.0 differs from 0.0), ``trainable_entries`` and ``trainable_changed``; a task's counts are those of the shards
    it holds, read back from it.
    """

    frozen_entries: int
    frozen_changed_bits: int
    masked_trainable_entries: int
    masked_trainable_changed: int
    per_variable: dict[str, dict[str, int]]
    per_task: dict[str, dict[str, int]]
    mask_placement: str | None
    policy: str


@dataclass(frozen=True)
class DownpourResult(_Fields):
    """One job's measurements (counts: a *step* is a minibatch on a worker, an *update* a push applied on the ps)."""

    config: dict[str, Any]
    scheduled_functions: int
    returned_functions: int
    scheduled_steps: int
    returned_steps: int
    returned_updates: int
    applied_updates: int
    distinct_versions: bool
    seconds: float
    staleness: list[int]
    curve: list[dict[str, Any]]
    function_times: list[list[float]]
    final_accuracy: float | None
    final_loss: float | None
    loss_first: float | None
    loss_last: float | None
    functions_per_worker: dict[str, int]
    samples_per_worker: dict[str, int]
    samples_shared_between_workers: int | None
    dataset_graph_bytes: int
    pushed_bytes: int
    """Bytes of gradient tensors every returned push sent (an ``IndexedSlices``: its rows and int64 indices)."""
    dense_push_bytes: int
    """What the same pushes would have sent as dense tensors."""
    fetched_bytes: int
    """Parameter bytes every returned function's fetches brought over (an ``Embedding`` fetched as rows: the rows
    the next ``n_fetch`` batches look up and their int64 ids)."""
    dense_fetch_bytes: int
    """What the same fetches would have brought as whole tensors."""
    fetched_whole: dict[str, str]
    """Sparse variables fetched whole anyway, and why (``sparse_fetch`` off, or rows not known from the inputs)."""
    placement: list[dict[str, Any]]
    bytes_per_task: dict[str, int]
    optimizer_bytes_per_task: dict[str, int]
    optimizer: str
    sparse_variables: list[str]
    frozen: FrozenReport | None
    attempts: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    parameters: int
    steady_from_function: int | None = None
    steady_seconds: float | None = None
    steady_steps: int | None = None
    steady_updates: int | None = None
    steps_per_s: float | None = None
    updates_per_s: float | None = None
    busy_workers_mean: float | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    """Filled in by ``run_downpour``: each injected fault and what followed."""
    task_cpu_s: dict[str, float | None] = field(default_factory=dict)
    steady_task_cpu_s: dict[str, float | None] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    worker_limits: str = ""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (what ``--out`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DownpourResult:
        """A result from ``to_json()`` output; a ``ValueError`` names missing or unknown fields."""
        names = set(cls._names())
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                         and f.name not in data)
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"result: missing fields {missing}, unknown fields {unknown}")
        values = dict(data)
        if values.get("frozen") is not None:
            values["frozen"] = FrozenReport(**values["frozen"])
        return cls(**values)


def frozen_report(initial: list[np.ndarray], final: list[np.ndarray], masks: dict[int, np.ndarray],
                  paths: list[str], placement: list[dict[str, Any]], mask_placement: str | None,
                  policy: str) -> FrozenReport | None:
    """Bits changed in frozen entries (and entries changed elsewhere) between ``initial`` and ``final``, per masked
    variable and per ps task (from ``placement``'s shards, split along axis 0). None without masks."""
    if not masks:
        return None
    per_variable: dict[str, dict[str, int]] = {}
    per_task: dict[str, dict[str, int]] = {}
    for i, keep in masks.items():
        start, end = initial[i], final[i]
        keep = np.broadcast_to(keep, start.shape)
        differs = start.view(f"u{start.dtype.itemsize}") != end.view(f"u{end.dtype.itemsize}")  # bit for bit
        per_variable[paths[i]] = _counts(keep, differs)
        offset = 0
        for shard in placement[i]["shards"]:
            rows = shard["shape"][0] if shard["shape"] else 1
            part = slice(offset, offset + rows) if start.ndim else slice(None)
            counts = _counts(keep[part], differs[part])
            task = per_task.setdefault(shard["task"], dict.fromkeys(counts, 0))
            for k, v in counts.items():
                task[k] += v
            offset += rows
    rows = per_variable.values()
    return FrozenReport(frozen_entries=sum(r["frozen_entries"] for r in rows),
                        frozen_changed_bits=sum(r["frozen_changed"] for r in rows),
                        masked_trainable_entries=sum(r["trainable_entries"] for r in rows),
                        masked_trainable_changed=sum(r["trainable_changed"] for r in rows),
                        per_variable=per_variable, per_task=per_task, mask_placement=mask_placement, policy=policy)


def _counts(keep: np.ndarray, differs: np.ndarray) -> dict[str, int]:
    return {"frozen_entries": int((~keep).sum()), "frozen_changed": int((differs & ~keep).sum()),
            "trainable_entries": int(keep.sum()), "trainable_changed": int((differs & keep).sum())}
