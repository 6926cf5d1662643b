"""The chief: a ``ClusterCoordinator`` schedules the worker loop, records the measurements, checkpoints, and
exits with a code that says what happened (``run_chief``; started by ``python -m downpour``).

Only the chief imports the job's code (model, dataset function, loss, transform, masks): it traces them into
the functions it sends, and the ps and worker tasks run those graphs. Before anything is trained it checks the
data against the model: the specs of both splits, the test split it reads itself, and one batch that each worker
reads from its own disk. It reads the test split to evaluate snapshots; training data stays on the workers.
While training it says, once each, when a worker stops answering and when it is back.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from downpour import faults
from downpour.checkpoints import CheckpointStore, ResumeRefused
from downpour.config import DownpourConfig, optimizer_label
from downpour.jsonio import write_json_atomic
from downpour.result import DownpourResult, frozen_report
from downpour.variables import PsVariables, ps_devices, short_device

PROG = "downpour"
RUN_CONTROL = ("warmup_functions", "start_timeout", "checkpoint_dir", "eval_every", "eval_samples",
               "keep_checkpoints")
"""Job fields that may differ between a run and its ``--resume`` (everything else must match the checkpoint)."""
WORKER_POLL_S = 1.0
"""How often the chief checks that every worker still answers (a TCP connect each)."""


def _stderr(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def run_chief(config: DownpourConfig, cluster: dict[str, list[str]], out: str | None = None, resume: bool = False,
              say: Callable[[str], None] = _stderr, where: str = "", ps_wait: float = 0.0,
              after_lost_ps: bool = False, failure: dict[str, Any] | None = None) -> int:
    """The coordinator's whole job (``python -m downpour`` as chief); returns the exit code (``downpour.faults``).

    Every error ends here with one message (``say``; ``where`` is appended to failures: the log file's name) and a
    code: 2 bad input (cluster, job, masks, data that does not fit the model or cannot be read), 3 tasks
    unreachable, 4 ``--resume`` refused, 75 a ps task lost, 1 anything else (its traceback on standard error,
    which ``python -m downpour`` sends to the log file). ``ps_wait`` > 0: the caller starts the chief again with
    ``--resume`` after a lost ps (``python -m downpour`` does); the line says so. ``after_lost_ps``: this is that
    chief; it waits up to ``ps_wait`` for the ps tasks (75 if one is not back), restores the last checkpoint and
    skips reading every worker's whole data again. Each lost ps is also appended to ``<out>.faults.json`` (what was
    lost, the updates to redo), across those restarts; ``failure`` (a dict) is filled with what the chief knew.
    """
    from downpour.cluster import check_parameter_server_cluster, wait_for_tasks
    from downpour.data import dataset_function

    try:
        check_parameter_server_cluster(cluster)
        config = dataclasses.replace(config, workers=len(cluster["worker"]), ps=len(cluster["ps"]))
        if config.checkpoint_every and not config.checkpoint_dir:
            raise ValueError("checkpoint_every: needs checkpoint_dir (a folder the chief can write)")
        dataset_function(config)
    except ValueError as e:
        say(str(e))
        return faults.EXIT_BAD_INPUT
    try:
        wait_for_tasks(cluster, timeout=max(config.start_timeout, ps_wait) if after_lost_ps else config.start_timeout)
    except TimeoutError as e:
        if after_lost_ps:
            say(f"{e}: a ps task lost is not back within --ps-wait {ps_wait:g} s; restart it, then the chief with "
                f"--resume to continue from the last checkpoint")
            return faults.EXIT_PS_LOST
        say(str(e))
        return faults.EXIT_UNREACHABLE
    trainer = _Chief(config, cluster, f"{out}.progress.json" if out else None, say)
    trainer.ps_wait, trainer.data_checked = ps_wait, after_lost_ps
    try:
        trainer.set_up(resume)
    except ResumeRefused as e:
        say(str(e))
        return faults.EXIT_RESUME_REFUSED
    except ValueError as e:
        if "\n" in str(e):  # not one of this package's one-line refusals: TensorFlow's, from tracing the job's code
            return _failed(trainer, e, cluster, say, where, failure)
        say(str(e))
        return faults.EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - every error ends with a message and an exit code
        return _failed(trainer, e, cluster, say, where, failure)
    try:
        result = trainer.train()
        if out:
            write_json_atomic(out, result.to_json())
    except Exception as e:  # noqa: BLE001
        return _failed(trainer, e, cluster, say, where, failure)
    trainer.tell_tasks_finished()
    print(f"chief: done, {result.applied_updates} updates in {result.seconds:.1f} s", flush=True)
    return faults.EXIT_OK


def _failed(trainer: _Chief, error: BaseException, cluster: dict[str, list[str]], say: Callable[[str], None],
            where: str, known: dict[str, Any] | None = None) -> int:
    """Classify an error of set-up or training, report it in one line, and return the exit code."""
    traceback.print_exception(error, file=sys.stderr)  # the whole text, for the log file
    lost = faults.lost_ps_tasks(error, cluster["ps"]) or trainer.ps_tasks_restarted()
    failure = trainer.record_failure(error, lost)
    if known is not None:
        known.update(failure)
    if lost:
        then = (f"waiting up to {trainer.ps_wait:g} s (--ps-wait) for it to come back, then continuing"
                if trainer.ps_wait > 0 else "restart it, then the chief with --resume to continue")
        start = (f"from the checkpoint of update {failure['checkpoint_version']}" if failure["checkpoint_version"]
                 else "from update 0 (no checkpoint yet)")
        seen = failure["version_at_failure"] if failure["version_at_failure"] is not None else failure[
            "last_polled_version"]
        redo = seen - (failure["checkpoint_version"] or 0) if seen is not None else None
        lost_updates = "" if redo is None else f" ({'' if failure['version_at_failure'] is not None else 'at least '}" \
            f"{redo} update{'s' * (redo != 1)} applied since then to redo)"
        say(f"{', '.join(lost)} lost ({failure['error'][:160]}); {then} {start}{lost_updates}{where}")
        return faults.EXIT_PS_LOST
    missing = faults.data_error(error)
    if missing is not None:
        say(f"data: a data file cannot be read ({faults.first_line(missing)}); each worker reads the training "
            f"files that data_kwargs names from its own disk, and the chief reads the test split{where}")
        return faults.EXIT_BAD_INPUT
    say(f"the chief failed: {failure['error']}{where}")
    return faults.EXIT_FAILED


class _Chief:
    """Build, schedule, poll, checkpoint, evaluate: the chief's side of one job (runs in the chief process)."""

    def __init__(self, config: DownpourConfig, cluster: dict[str, list[str]], progress: str | None,
                 say: Callable[[str], None] = _stderr):
        self.config, self.cluster, self.progress_path, self.say = config, cluster, progress, say
        self.workers_down: set[str] = set()
        self.workers_lost: list[str] = []  # every worker this chief said lost, in order (in the progress file)
        self.workers_checked = 0.0
        self.state: dict[str, Any] = {"functions_done": 0, "records": [], "curve": [], "elapsed": 0.0,
                                      "attempts": [], "checkpoints": [], "samples": {}, "foreign_samples": 0}
        self.last_version = 0
        self.checkpoint_version: int | None = None
        self.ps: PsVariables | None = None
        self.ps_wait = 0.0
        self.data_checked = False  # True: a chief started again after a lost ps (the workers' data was read once)
        self.born = time.perf_counter()
        self.started_at = time.time()  # this chief process's start (a chief started again has a later one)

    def log(self, what: str) -> None:
        """One progress line on stdout, with the seconds since the chief started."""
        print(f"chief: {what} ({time.perf_counter() - self.born:.1f} s)", flush=True)

    def write_progress(self, **extra: Any) -> None:
        """The progress file the launcher polls (atomically): counter, functions done, last checkpoint, the workers
        this chief said lost (how the launcher knows a fault was seen before it injects the next), ``extra``."""
        if self.progress_path:
            write_json_atomic(self.progress_path, {
                "version": self.last_version, "functions_done": self.state["functions_done"],
                "checkpoint_version": self.checkpoint_version, "attempt": len(self.state["attempts"]),
                "chief_started": self.started_at,
                "restored_version": self.state["attempts"][-1]["restored_version"] if self.state["attempts"] else None,
                "version_task": short_device(self.ps.version.device) if self.ps else None,
                "workers_lost": self.workers_lost, **extra}, durable=False)

    def record_failure(self, error: BaseException, lost: list[str]) -> dict[str, Any]:
        """What the chief knew when ``error`` ended it, also written to the progress file."""
        at_failure = None
        if self.ps is not None and lost:
            try:  # exact when the counter lives on a ps task that is still alive (and kept its state)
                at_failure = self.counter(deadline=5.0)
            except Exception:  # noqa: BLE001 - the counter's task may be the lost one
                pass
        failure = {"error": faults.first_line(error), "lost": lost, "version_at_failure": at_failure,
                   "last_polled_version": self.last_version, "checkpoint_version": self.checkpoint_version,
                   "attempt": len(self.state["attempts"]), "time": time.time()}
        try:
            self.write_progress(failure=failure)
            if lost and self.progress_path:  # every lost ps of the job, across the chief's restarts
                from downpour.jsonio import read_json

                path = self.progress_path.removesuffix(".progress.json") + ".faults.json"
                write_json_atomic(path, [*read_json(path, []), failure])
        except OSError:
            pass
        return failure

    def counter(self, deadline: float = faults.CALL_DEADLINE_S) -> int:
        """The update counter, read from its ps task within ``deadline`` seconds (else ``faults.CallTimeout``)."""
        assert self.ps is not None
        return int(faults.with_deadline(self.ps.version.numpy, deadline, "reading the update counter"))

    def ps_tasks_restarted(self, deadline: float = 10.0) -> list[str]:
        """The ps tasks (``"ps:i"``) that answer but no longer hold this chief's variables: started again (by a
        supervisor) before the chief saw them go, so a failed call reached a new, empty task. Asked of one variable
        per task (``VarIsInitializedOp``, a few bytes), each within ``deadline``; ``[]`` before the variables exist."""
        if self.ps is None:
            return []
        import tensorflow as tf

        by_task: dict[str, Any] = {}
        for v in [*(s for row in self.ps.shards for s in row), *self.ps.shared_state, self.ps.version]:
            by_task.setdefault(short_device(v.device), v)
        gone = []
        for task, v in sorted(by_task.items()):
            def ask(v: Any = v) -> bool:
                with tf.device(v.device):
                    return bool(tf.raw_ops.VarIsInitializedOp(resource=v.handle).numpy())
            try:
                if not faults.with_deadline(ask, deadline, f"asking {task} for its variables"):
                    gone.append(task)
            except Exception:  # noqa: BLE001 - any error or no answer: the task is not the one we set up
                gone.append(task)
        return gone

    def tell_tasks_finished(self) -> None:
        """Write ``CHIEF_FINISHED`` into every ps and worker task's log (a ``tf.print`` run on each task), so that
        each says "the chief finished" when this process ends, not that it has gone; a task it cannot reach is
        skipped (it will say the chief has gone)."""
        import tensorflow as tf

        from downpour.cluster import CHIEF_FINISHED, reachable

        for job in ("ps", "worker"):
            for i, address in enumerate(self.cluster[job]):
                if not reachable(address, timeout=0.5):  # a call to a task that is gone could wait a long time
                    continue
                device = f"/job:{job}/replica:0/task:{i}/device:CPU:0"

                @tf.function
                def mark() -> Any:
                    with tf.device(device):
                        tf.print(CHIEF_FINISHED, output_stream=sys.stderr)  # the task's standard error: its log
                    return tf.constant(0)

                try:
                    # printed: returns
                    faults.with_deadline(lambda mark=mark: mark().numpy(), 10.0, f"telling {job}:{i}")
                except Exception:  # noqa: BLE001 - a task that is gone cannot be told
                    pass

    def set_up(self, resume: bool) -> None:
        """Connect, check the data against the model, put the variables on the ps, restore a checkpoint
        (``resume``), ship the data and the loop."""
        import tensorflow as tf

        from downpour.data import train_dataset
        from downpour.model import build_model, make_loss
        from downpour.worker import gradient_kinds, worker_function

        config, cluster = self.config, self.cluster
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self.log("connected")
        self.model = build_model(config)
        spec = self.check_data()
        self.initial = [v.numpy() for v in self.model.trainable_variables]
        # the variables and the optimizer on the ps tasks, created with no strategy in force (downpour.variables)
        self.ps = ps = PsVariables(self.model, config, ps_devices(config.ps))
        self.sparse = gradient_kinds(self.model, ps, config, spec)
        ps.prepare(self.sparse)
        self.log(f"variables on the ps; optimizer {optimizer_label(config.optimizer)}"
                 + (f", {len(ps.masks)} masked variables" if ps.masks else "")
                 + (f", sparse gradients for {sum(self.sparse)}" if any(self.sparse) else ""))
        self.checkpoint = ps.checkpoint()
        # the chief reads and writes every checkpoint file itself (by default each ps task would write its own
        # shard on its own disk), so checkpoint_dir has to exist only where the chief runs
        io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
        job = {k: v for k, v in asdict(config).items() if k not in RUN_CONTROL}
        self.store = (CheckpointStore(config.checkpoint_dir, config.keep_checkpoints, io, job)
                      if config.checkpoint_dir else None)
        self.restored = None
        if resume and self.store is not None:
            found = faults.with_deadline(lambda: self.store.restore(self.checkpoint, ps.version),
                                         faults.SAVE_DEADLINE_S, "restoring the checkpoint")
            if found is not None:
                self.restored, self.state = found
            else:
                self.log(f"--resume: no checkpoint in {config.checkpoint_dir} yet; starting from update 0")
        self.checkpoint_version = self.restored if self.restored is not None else 0
        self.last_version = self.counter()
        attempt = {"resumed": self.restored is not None, "restored_version": self.restored,
                   "restored_functions": self.state["functions_done"] if self.restored is not None else 0}
        # the job's history, kept beside the checkpoints: a restore rolls back the state, not the attempts
        self.state["attempts"] = self.store.start_attempt(attempt, resume) if self.store is not None else [attempt]
        self.write_progress()

        self.loss = make_loss(config)
        workers, make = config.workers, train_dataset(config)
        graph = tf.Graph()
        with graph.as_default():  # what the chief sends for the data: a graph of file readers, not the samples
            make(tf.constant(0, tf.int64), workers)
        self.dataset_graph_bytes = graph.as_graph_def().ByteSize()
        self.iterator = iter(self.coordinator.create_per_worker_dataset(
            lambda: make(tf.distribute.coordinator.experimental_get_current_worker_index(), workers)))
        self.fn = worker_function(self.model, ps, config,
                                  tf.distribute.coordinator.experimental_get_current_worker_index)
        self.log(f"dataset graph {self.dataset_graph_bytes} bytes; the loop is on the workers")

    def check_data(self) -> Any:
        """Check both splits' specs, the test split (read here) and one batch on every worker (read from its disk)
        against the model's inputs; a ``ValueError`` with one line naming the files, the expected and the found
        shape. Returns the training data's ``(x, y)`` spec."""
        from downpour.data import check_split, check_workers, eval_arrays, split_files

        config, model = self.config, self.model
        spec = check_split(model, config, "train")
        check_split(model, config, "test")
        try:
            self.x_test, self.y_test = eval_arrays(config)
        except Exception as e:  # noqa: BLE001 - a file the chief cannot read, or cannot parse
            raise ValueError(f"data: the chief cannot read the test split ({', '.join(split_files(config, 'test'))})"
                             f": {faults.first_line(e)}") from None
        if self.data_checked:
            self.log("data checked against the model's inputs on the chief (the workers' data was checked before)")
            return spec
        check_workers(model, config, len(self.cluster["worker"]))
        self.log(f"data checked against the model's inputs on the chief and on {len(self.cluster['worker'])} "
                 f"worker(s)")
        return spec

    def watch_workers(self) -> None:
        """Say once when a worker stops answering (its functions go to the others) and once when it is back."""
        from downpour.cluster import reachable

        now = time.monotonic()
        if now - self.workers_checked < WORKER_POLL_S:
            return
        self.workers_checked = now
        for i, address in enumerate(self.cluster["worker"]):
            name, up = f"worker:{i}", reachable(address, timeout=0.2)
            if not up and name not in self.workers_down:
                self.workers_down.add(name)
                self.workers_lost.append(name)
                self.say(f"{name} ({address}) lost; its functions go to the other workers, and the coordinator uses "
                         "it again when it is back: start it again with its command")
            elif up and name in self.workers_down:
                self.workers_down.discard(name)
                self.log(f"{name} ({address}) answers again")

    def train(self) -> DownpourResult:
        """Schedule every function, poll the counter, evaluate, checkpoint; return the measurements."""
        config, ps, coordinator = self.config, self.ps, self.coordinator
        assert ps is not None
        snapshots = []
        if not self.state["curve"] and config.eval_every:
            snapshots.append((0.0, *self.snapshot()))
        functions = config.functions
        per_checkpoint = (max(1, -(-config.checkpoint_every // config.pushes_per_function))
                          if config.checkpoint_every else functions)
        warmup = config.warmup_functions if config.warmup_functions is not None else min(functions, 2 * config.workers)
        clock = time.perf_counter() - self.state["elapsed"]
        steady_from = None
        next_eval = (self.last_version // config.eval_every + 1) * config.eval_every if config.eval_every else None
        done = self.state["functions_done"]
        while done < functions:
            end = min(functions, (done // per_checkpoint + 1) * per_checkpoint)
            if done < warmup and steady_from is None and not self.restored:
                end = min(end, warmup)
            scheduled = [coordinator.schedule(self.fn, args=(self.iterator,)) for _ in range(done, end)]
            while not coordinator.done():
                time.sleep(0.1)
                self.watch_workers()
                self.last_version = self.counter()
                self.write_progress(in_flight=end - done, steady=steady_from is not None)
                if next_eval is not None and self.last_version >= next_eval:
                    snapshots.append((time.perf_counter() - clock, *self.snapshot()))
                    next_eval = (self.last_version // config.eval_every + 1) * config.eval_every
            coordinator.join()
            self.log(f"{end} functions done")
            for value in scheduled:
                self._record(faults.with_deadline(value.fetch, faults.CALL_DEADLINE_S, "a function's result"),
                             time.perf_counter() - clock)
            done = self.state["functions_done"] = end
            self.last_version = self.counter()
            if steady_from is None and (done >= warmup or self.restored):
                steady_from = (time.perf_counter(), done, self.last_version)
                self.write_progress(steady=True)
            if self.store is not None and config.checkpoint_every and (done % per_checkpoint == 0 or done == functions):
                self.state["elapsed"] = time.perf_counter() - clock
                self._evaluate_into_curve(snapshots)
                snapshots = []
                self.state["checkpoints"].append({"version": self.last_version, "functions": done,
                                                  "seconds": self.state["elapsed"]})
                sidecar = {k: v for k, v in self.state.items() if k != "attempts"}  # attempts: CheckpointStore's
                faults.with_deadline(lambda: self.store.save(self.checkpoint, self.last_version, sidecar),
                                     faults.SAVE_DEADLINE_S, "writing a checkpoint")
                self.checkpoint_version = self.last_version
            self.write_progress(steady=steady_from is not None)
        elapsed = time.perf_counter() - clock
        self.write_progress(steady=steady_from is not None, finished=True)
        final = self.snapshot()
        snapshots.append((elapsed, *final))
        self._evaluate_into_curve(snapshots)
        return self._result(elapsed, steady_from, final)

    def snapshot(self) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
        """``PsVariables.snapshot`` (the counter and every value, read from the ps), within ``SAVE_DEADLINE_S``."""
        assert self.ps is not None
        return faults.with_deadline(self.ps.snapshot, faults.SAVE_DEADLINE_S, "reading the model from the ps")

    def _record(self, value: dict[str, Any], seconds: float) -> None:
        worker = int(value["worker"])
        self.state["samples"][str(worker)] = self.state["samples"].get(str(worker), 0) + int(value["samples"])
        foreign = int(value["foreign_samples"])
        if self.state["foreign_samples"] is not None:
            self.state["foreign_samples"] = None if foreign < 0 else self.state["foreign_samples"] + foreign
        self.state["records"].append({
            "worker": worker, "versions": np.asarray(value["versions"]).tolist(),
            "pushed_bytes": int(np.sum(value["pushed_bytes"])), "fetched_bytes": int(np.sum(value["fetched_bytes"])),
            "staleness": np.asarray(value["staleness"]).tolist(), "loss": np.asarray(value["loss"]).tolist(),
            "started": float(value["started"]), "ended": float(value["ended"]), "returned_s": seconds})

    def _fetched_whole(self) -> dict[str, str]:
        """The sparse variables the workers fetch whole, and why."""
        from downpour.model import row_inputs

        assert self.ps is not None
        if not self.config.sparse_fetch:
            return {p: "sparse_fetch is off" for p, sparse in zip(self.ps.paths, self.sparse) if sparse}
        return row_inputs(self.model, self.ps.paths, self.sparse)[1]

    def _evaluate_into_curve(self, snapshots: list[tuple]) -> None:
        from downpour.model import evaluate

        assert self.ps is not None
        seeds = list(self.ps.initial_seed_state)
        for seconds, version, trainable, state in snapshots:
            if self.state["curve"] and self.state["curve"][-1]["applied_updates"] == version:
                continue
            scores = evaluate(self.model, trainable, self.ps.full_state(seeds, state), self.x_test, self.y_test,
                              self.loss, self.config.from_logits)
            self.state["curve"].append({"applied_updates": version, "seconds": seconds, **scores})

    def _result(self, elapsed: float, steady_from: tuple | None, final: tuple) -> DownpourResult:
        config, records, ps = self.config, self.state["records"], self.ps
        assert ps is not None
        final_version = final[0]
        steady: dict[str, Any] = {}
        if steady_from is not None:
            t0, f0, v0 = steady_from
            window = time.perf_counter() - t0
            steps = (len(records) - f0) * config.steps_per_function
            steady = {"steady_from_function": f0, "steady_seconds": window, "steady_steps": steps,
                      "steady_updates": final_version - v0,
                      "steps_per_s": steps / window if window > 0 else float("nan"),
                      "updates_per_s": (final_version - v0) / window if window > 0 else float("nan")}
            intervals = [(r["started"], r["ended"]) for r in records[f0:]]
            if intervals:
                span = max(b for _, b in intervals) - min(a for a, _ in intervals)
                steady["busy_workers_mean"] = sum(b - a for a, b in intervals) / span if span > 0 else float("nan")
        layout = ps.placement()
        per_task: dict[str, int] = {}
        for row in layout:
            for shard in row["shards"]:
                per_task[shard["task"]] = per_task.get(shard["task"], 0) + shard["bytes"]
        returned_pushes = sum(len(r["versions"]) for r in records)
        versions = [v for r in records for v in r["versions"]]
        curve = self.state["curve"]
        trainable_bytes = sum(row["bytes"] for row in layout[:len(ps.paths)])
        return DownpourResult(
            config=asdict(config), scheduled_functions=config.functions, returned_functions=len(records),
            scheduled_steps=config.functions * config.steps_per_function,
            returned_steps=len(records) * config.steps_per_function,
            returned_updates=returned_pushes, applied_updates=final_version,
            distinct_versions=len(set(versions)) == len(versions), seconds=elapsed,
            staleness=[s for r in records for s in r["staleness"]], curve=curve,
            function_times=[[r["worker"], r["started"], r["ended"]] for r in records],
            final_accuracy=curve[-1]["accuracy"] if curve else None, final_loss=curve[-1]["loss"] if curve else None,
            loss_first=float(np.mean(records[0]["loss"])) if records else None,
            loss_last=float(np.mean(records[-1]["loss"])) if records else None,
            functions_per_worker={str(w): sum(r["worker"] == w for r in records)
                                  for w in sorted({r["worker"] for r in records})},
            samples_per_worker=dict(self.state["samples"]),
            samples_shared_between_workers=self.state["foreign_samples"],
            dataset_graph_bytes=self.dataset_graph_bytes,
            pushed_bytes=sum(r.get("pushed_bytes", 0) for r in records),
            dense_push_bytes=returned_pushes * trainable_bytes,
            fetched_bytes=sum(r.get("fetched_bytes", 0) for r in records),
            dense_fetch_bytes=len(records) * (config.steps_per_function // config.n_fetch) * trainable_bytes,
            fetched_whole=self._fetched_whole(),
            placement=layout, bytes_per_task=per_task, optimizer_bytes_per_task=ps.optimizer_placement(),
            optimizer=optimizer_label(config.optimizer),
            sparse_variables=[p for p, sparse in zip(ps.paths, self.sparse) if sparse],
            frozen=frozen_report(self.initial, final[1], ps.masks, ps.paths, layout, ps.optimizer.mask_placement,
                                 config.mask_policy),
            attempts=self.state["attempts"], checkpoints=self.state["checkpoints"],
            parameters=int(sum(math.prod(r["shape"]) for r in layout[:len(ps.paths)])), **steady)
