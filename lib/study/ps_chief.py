"""Downpour SGD, the chief: a ``ClusterCoordinator`` schedules the worker loop, records the measurements and
survives worker and ps faults (``run_chief``; started by ``python -m study.ps_roles``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from study.ps_config import DownpourConfig
from study.ps_variables import (
    PsVariables, _short_device, build_model, load_data, make_dataset, with_values, worker_function,
)


def _is_ps_failure(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return "/job:ps" in text or "PSUnavailableError" in text


def _write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def run_chief(config: DownpourConfig, cluster: dict[str, list[str]], out: str | None = None,
              resume: bool = False) -> int:
    """The coordinator's whole job (``python -m study.ps_roles`` as chief); returns the exit code."""
    from study import ps_roles
    from study.cluster import check_parameter_server_cluster, wait_for_tasks

    try:
        check_parameter_server_cluster(cluster)
    except ValueError as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return ps_roles.EXIT_BAD_INPUT
    config = dataclasses.replace(config, workers=len(cluster["worker"]), ps=len(cluster["ps"]))
    if config.checkpoint_every and not config.checkpoint_dir:
        print("study.ps_roles: checkpoint_every needs checkpoint_dir (a folder the chief can write)", file=sys.stderr)
        return ps_roles.EXIT_BAD_INPUT
    try:
        wait_for_tasks(cluster, timeout=config.start_timeout)
    except TimeoutError as e:
        print(f"study.ps_roles: {e}", file=sys.stderr)
        return ps_roles.EXIT_UNREACHABLE
    progress = f"{out}.progress.json" if out else None
    trainer = _Chief(config, cluster, progress)
    try:
        result = trainer.train(resume)
    except Exception as e:  # noqa: BLE001 - a lost ps is an expected fault; anything else is re-raised
        if not _is_ps_failure(e):
            raise
        failure = trainer.record_failure(e)
        print(f"study.ps_roles: a ps task was lost ({failure['error'][:200]}); restart it, then the chief with "
              f"--resume to continue from the checkpoint of update {failure['checkpoint_version']}", file=sys.stderr)
        return ps_roles.EXIT_PS_LOST
    if out:
        _write_json(out, result)
    print(f"chief: done, {result['applied_updates']} updates in {result['seconds']:.1f} s", flush=True)
    return 0


class _Chief:
    """Build, schedule, poll, checkpoint, evaluate: the chief's side of one job (runs in the chief process)."""

    def __init__(self, config: DownpourConfig, cluster: dict[str, list[str]], progress: str | None):
        self.config, self.cluster, self.progress_path = config, cluster, progress
        self.state: dict[str, Any] = {"functions_done": 0, "records": [], "curve": [], "elapsed": 0.0,
                                      "attempts": [], "checkpoints": [], "samples": {}}
        self.last_version = 0
        self.checkpoint_version = None
        self.ps: PsVariables | None = None

    def write_progress(self, **extra: Any) -> None:
        if self.progress_path:
            _write_json(self.progress_path, {
                "version": self.last_version, "functions_done": self.state["functions_done"],
                "checkpoint_version": self.checkpoint_version,
                "version_task": _short_device(self.ps.version.device) if self.ps else None, **extra})

    def record_failure(self, error: BaseException) -> dict[str, Any]:
        at_failure = None
        try:  # exact when the counter lives on a ps task that is still alive
            at_failure = int(self.ps.version.numpy())
        except Exception:  # noqa: BLE001
            pass
        failure = {"error": f"{type(error).__name__}: {error}".splitlines()[0], "version_at_failure": at_failure,
                   "last_polled_version": self.last_version, "checkpoint_version": self.checkpoint_version}
        self.write_progress(failure=failure)
        return failure

    def train(self, resume: bool) -> dict[str, Any]:
        born = time.perf_counter()
        import tensorflow as tf

        def log(what: str) -> None:
            print(f"chief: {what} ({time.perf_counter() - born:.1f} s)", flush=True)

        config, cluster = self.config, self.cluster
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=config.shard_min_bytes, max_shards=config.ps)
        strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        log("connected")
        model = build_model(config)
        self.ps = ps = PsVariables(model, config, strategy)
        log("variables on the ps")
        checkpoint = ps.checkpoint()
        manager = (tf.train.CheckpointManager(checkpoint, config.checkpoint_dir, max_to_keep=2)
                   if config.checkpoint_every else None)
        # the chief reads and writes every checkpoint file itself (by default each ps task would write its own
        # shard on its own disk), so checkpoint_dir has to exist only where the chief runs
        io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
        restored = None
        if resume and manager is not None and manager.latest_checkpoint:
            checkpoint.restore(manager.latest_checkpoint, options=io).assert_existing_objects_matched()
            self.state = json.loads(Path(f"{manager.latest_checkpoint}.state.json").read_text())
            restored = int(ps.version.numpy())
        self.checkpoint_version = restored if restored is not None else 0
        self.last_version = int(ps.version.numpy())
        self.state["attempts"].append({
            "resumed": restored is not None, "restored_version": restored,
            "restored_functions": self.state["functions_done"] if restored is not None else 0})
        self.write_progress()

        x_train, y_train, x_test, y_test = load_data(config)
        x_test, y_test = x_test[:config.eval_samples], y_test[:config.eval_samples]
        workers = config.workers
        iterator = iter(coordinator.create_per_worker_dataset(
            lambda: make_dataset(x_train, y_train, config, workers,
                                 tf.distribute.coordinator.experimental_get_current_worker_index())))
        fn = worker_function(model, ps, config, tf.distribute.coordinator.experimental_get_current_worker_index)
        log("data on the workers")

        snapshots = []
        if not self.state["curve"] and config.eval_every:
            snapshots.append((0.0, *ps.snapshot()))
        functions = config.functions
        per_checkpoint = (max(1, -(-config.checkpoint_every // config.pushes_per_function))
                          if config.checkpoint_every else functions)
        warmup = config.warmup_functions if config.warmup_functions is not None else min(functions, 2 * workers)
        clock = time.perf_counter() - self.state["elapsed"]
        steady_from = None
        next_eval = (self.last_version // config.eval_every + 1) * config.eval_every if config.eval_every else None
        done = self.state["functions_done"]
        while done < functions:
            end = min(functions, (done // per_checkpoint + 1) * per_checkpoint)
            if done < warmup and steady_from is None and not restored:
                end = min(end, warmup)
            scheduled = [coordinator.schedule(fn, args=(iterator,)) for _ in range(done, end)]
            while not coordinator.done():
                time.sleep(0.1)
                self.last_version = int(ps.version.numpy())
                self.write_progress(in_flight=end - done, steady=steady_from is not None)
                if next_eval is not None and self.last_version >= next_eval:
                    snapshots.append((time.perf_counter() - clock, *ps.snapshot()))
                    next_eval = (self.last_version // config.eval_every + 1) * config.eval_every
            coordinator.join()
            log(f"{end} functions done")
            for value in scheduled:
                self._record(value.fetch(), time.perf_counter() - clock)
            done = self.state["functions_done"] = end
            self.last_version = int(ps.version.numpy())
            if steady_from is None and (done >= warmup or restored):
                steady_from = (time.perf_counter(), done, self.last_version)
                self.write_progress(steady=True)
            if manager is not None and (done % per_checkpoint == 0 or done == functions):
                self.state["elapsed"] = time.perf_counter() - clock
                self._evaluate_into_curve(snapshots, model, x_test, y_test)
                snapshots = []
                path = manager.save(checkpoint_number=self.last_version, options=io)
                self.checkpoint_version = self.last_version
                self.state["checkpoints"].append({"version": self.last_version, "functions": done,
                                                  "seconds": self.state["elapsed"]})
                _write_json(f"{path}.state.json", self.state)
            self.write_progress(steady=steady_from is not None)
        elapsed = time.perf_counter() - clock
        self.write_progress(steady=steady_from is not None, finished=True)
        final = ps.snapshot()
        snapshots.append((elapsed, *final))
        self._evaluate_into_curve(snapshots, model, x_test, y_test)
        return self._result(elapsed, steady_from, final[0], ps)

    def _record(self, value: dict[str, Any], seconds: float) -> None:
        import numpy as np

        worker = int(value["worker"])
        samples = self.state["samples"].setdefault(str(worker), [])
        samples.extend(np.unique(np.asarray(value["samples"])).tolist())
        self.state["samples"][str(worker)] = sorted(set(samples))
        self.state["records"].append({
            "worker": worker, "versions": np.asarray(value["versions"]).tolist(),
            "staleness": np.asarray(value["staleness"]).tolist(), "loss": np.asarray(value["loss"]).tolist(),
            "started": float(value["started"]), "ended": float(value["ended"]), "returned_s": seconds})

    def _evaluate_into_curve(self, snapshots: list[tuple], model: Any, x: Any, y: Any) -> None:
        from study.training import accuracy

        seeds = [s for s in self.ps.initial_seed_state]
        for seconds, version, trainable, state in snapshots:
            if self.state["curve"] and self.state["curve"][-1]["applied_updates"] == version:
                continue
            self.state["curve"].append({"applied_updates": version, "seconds": seconds,
                                        "accuracy": accuracy(with_values(model, trainable, state, seeds, self.ps), x, y)})

    def _result(self, elapsed: float, steady_from: tuple | None, final_version: int, ps: PsVariables) -> dict[str, Any]:
        import numpy as np

        config, records = self.config, self.state["records"]
        steady: dict[str, Any] = {}
        if steady_from is not None:
            t0, f0, v0 = steady_from
            window = time.perf_counter() - t0
            steps = (len(records) - f0) * config.steps_per_function
            steady = {"steady_seconds": window, "steady_steps": steps, "steady_updates": final_version - v0,
                      "steps_per_s": steps / window if window > 0 else float("nan"),
                      "updates_per_s": (final_version - v0) / window if window > 0 else float("nan")}
            intervals = [(r["started"], r["ended"]) for r in records[f0:]]
            if intervals:
                span = max(b for _, b in intervals) - min(a for a, _ in intervals)
                steady["busy_workers_mean"] = sum(b - a for a, b in intervals) / span if span > 0 else float("nan")
        samples = {w: set(v) for w, v in self.state["samples"].items()}
        overlap = sum(len(samples[a] & samples[b]) for a in samples for b in samples if a < b)
        layout = ps.placement()
        per_task: dict[str, int] = {}
        for row in layout:
            for shard in row["shards"]:
                per_task[shard["task"]] = per_task.get(shard["task"], 0) + shard["bytes"]
        staleness = [s for r in records for s in r["staleness"]]
        returned_pushes = sum(len(r["versions"]) for r in records)
        return {
            "config": asdict(config),
            "scheduled_functions": config.functions, "returned_functions": len(records),
            "scheduled_steps": config.functions * config.steps_per_function,
            "returned_steps": len(records) * config.steps_per_function,
            "returned_updates": returned_pushes, "applied_updates": final_version,
            "seconds": elapsed, **steady,
            "staleness": staleness, "curve": self.state["curve"],
            "steady_from_function": steady_from[1] if steady_from is not None else None,
            "function_times": [[r["worker"], r["started"], r["ended"]] for r in records],
            "final_accuracy": self.state["curve"][-1]["accuracy"] if self.state["curve"] else None,
            "loss_first": float(np.mean(records[0]["loss"])) if records else None,
            "loss_last": float(np.mean(records[-1]["loss"])) if records else None,
            "functions_per_worker": {str(w): sum(r["worker"] == w for r in records)
                                     for w in sorted({r["worker"] for r in records})},
            "samples_per_worker": {w: len(v) for w, v in samples.items()}, "samples_shared_between_workers": overlap,
            "placement": layout, "bytes_per_task": per_task,
            "attempts": self.state["attempts"], "checkpoints": self.state["checkpoints"],
            "parameters": int(sum(math.prod(r["shape"]) for r in layout[:len(ps.paths)])),
        }
