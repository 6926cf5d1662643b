"""Benchmark: asynchronous Downpour on the Deep MNIST CNN with Adam on the ps -- scaling with workers, and the
cost of the ps.

In one run, on one ``LocalCluster`` (4 workers, 2 ps tasks; each worker limited to one core:
``intra_op_parallelism_threads=1`` and ``os.sched_setaffinity``), repeated ``--repeats`` times, interleaved:

* the same worker loop in a local process limited the same way (no ps, no network; Adam applied locally);
* Downpour with 1 worker and with 2 workers, ``n_fetch = n_push = 4``, Adam on the ps (``--optimizer``);
* then 4 workers, oversubscribed: 4 one-core workers on this machine's cores.

Every run reads the study's MNIST from IDX files (``downpour.data:idx``), the workers each their own shard.

Ratios: scaling = steps/s of 2 workers / 1 worker (target >= 1.6); overhead = the PS step time / the local
step time, with 1 worker (target <= 1.3), and the same in CPU seconds per step (worker + ps) / the local loop's.
Steps/s are measured after warm-up (tracing, shipping the function and the data to each worker). The CPU seconds
each task used in that window, and the load average, are reported too: on a shared machine a worker that does not
get its core shows up there, not in the ratio. Prints; asserts nothing about time.
``python bench/bench_ps.py --repeats 3``

``--sparse``: an Embedding-heavy model instead (``lib/downpour/examples/tokens`` with a 50,000 x 32 table, 1 worker,
2 ps tasks), each job run pushing only the rows a push touched and fetching only the rows the next batches look up
(``sparse_push`` and ``sparse_fetch`` true) and pushing and fetching dense tensors (both false), interleaved,
with Downpour's Adagrad (a scatter on the ps) and with Adam (Keras' Adam
updates every row of a sparse gradient's variable): bytes pushed and fetched per update and steps per second,
sparse / dense.
``python bench/bench_ps.py --sparse --repeats 3 --functions-per-worker 24``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))

from downpour import DownpourConfig, run_downpour  # noqa: E402
from downpour.local import LocalCluster  # noqa: E402

BASE = DownpourConfig(model="study.models:deep_mnist_cnn", n_fetch=4, n_push=4, steps_per_function=8, batch=50,
                      learning_rate=0.001, optimizer="adam", ps=2, data="downpour.data:idx")


def _load() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def local_child(config: DownpourConfig, functions: int, repeats: int) -> dict:
    """The local loop in a fresh process (its thread pools and affinity are set before TensorFlow starts)."""
    run = subprocess.run([sys.executable, __file__, "--local-child", json.dumps(dataclasses.asdict(config)),
                          str(functions), str(repeats)], capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"bench_ps: the local loop failed: {run.stderr[-1500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def ps_run(cluster: LocalCluster, base: DownpourConfig, workers: int, functions_per_worker: int) -> dict:
    warmup = workers  # one function per worker: tracing, and shipping the function and the data to it
    config = dataclasses.replace(base, workers=workers, warmup_functions=warmup,
                                 steps=(warmup + functions_per_worker * workers) * base.steps_per_function)
    load = _load()
    r = run_downpour(config, cluster, timeout_s=900)
    window = r.steady_seconds
    cpu = r["steady_task_cpu_s"]
    worker_cpu = sum(v for k, v in cpu.items() if k.startswith("worker") and v is not None)
    return {"workers": workers, "steps_per_s": r["steps_per_s"], "updates_per_s": r["updates_per_s"],
            "steady_seconds": window, "steady_steps": r["steady_steps"],
            "busy_workers_mean": r.get("busy_workers_mean"),
            "worker_cpu_share": {k: (v / window if v is not None else None) for k, v in cpu.items()},
            "worker_cpu_s_per_step": worker_cpu / r["steady_steps"] if r["steady_steps"] else None,
            "ps_cpu_s_per_step": sum(v for k, v in cpu.items() if k.startswith("ps") and v is not None)
            / r["steady_steps"] if r["steady_steps"] else None,
            "worker_steps_per_cpu_s": r["steady_steps"] / worker_cpu if worker_cpu else None,
            "staleness_mean": statistics.fmean(r["staleness"]) if r["staleness"] else 0.0,
            "pushed_bytes_per_update": r.pushed_bytes / max(1, r.returned_updates),
            "dense_bytes_per_update": r.dense_push_bytes / max(1, r.returned_updates),
            "fetched_bytes_per_update": r.fetched_bytes / max(1, r.returned_updates),
            "dense_fetch_bytes_per_update": r.dense_fetch_bytes / max(1, r.returned_updates),
            "load_before": load, "load_after": _load()}


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return (f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f} "
            f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)})")


SPARSE = DownpourConfig(model="downpour.examples.tokens.model:build", model_kwargs={"width": 32, "vocab": 50_000},
                        data="downpour.examples.tokens.data:dataset",
                        loss={"class_name": "BinaryCrossentropy", "config": {"from_logits": True}},
                        n_fetch=4, n_push=4, steps_per_function=8, batch=32, learning_rate=0.01, ps=2)
"""The Embedding-heavy job of ``--sparse``: 50,000 x 32 float32 = 6.4 MB of embedding table, split over both ps."""


def sparse_main(repeats: int, functions_per_worker: int) -> dict:
    """``--sparse``: sparse and dense pushes of one Embedding-heavy job, interleaved, per optimizer on the ps."""
    from downpour.examples.tokens.data import write

    started = time.monotonic()
    runs: dict[str, list] = {}
    data = tempfile.TemporaryDirectory(prefix="bench-ps-sparse-")
    folder = str(write(data.name, workers=1, per_worker=4000, test=200, vocab=SPARSE.model_kwargs["vocab"]))
    with data, LocalCluster(workers=1, ps=2, start_timeout=300) as cluster:
        for _ in range(repeats):
            for optimizer in ("adagrad", "adam"):
                for sparse_push in (True, False):
                    job = dataclasses.replace(SPARSE, optimizer=optimizer, sparse_push=sparse_push,
                                              sparse_fetch=sparse_push, data_kwargs={"folder": folder},
                                              eval_samples=200)
                    run = ps_run(cluster, job, 1, functions_per_worker)
                    runs.setdefault(f"{optimizer}/{'sparse' if sparse_push else 'dense'}", []).append(run)
                    print(f"  {optimizer}, {'sparse' if sparse_push else 'dense'} pushes and fetches: "
                          f"{run['steps_per_s']:.2f} steps/s, {run['pushed_bytes_per_update'] / 1e6:.3f} MB pushed "
                          f"and {run['fetched_bytes_per_update'] / 1e6:.3f} MB fetched per update", flush=True)
    out: dict = {"runs": runs, "config": dataclasses.asdict(SPARSE), "cpus": os.cpu_count()}
    print(f"\nAn Embedding-heavy model (lib/downpour/examples/tokens, 50,000 x 32 table = 6.4 MB, over 2 ps tasks), "
          f"1 worker, "
          f"batch {SPARSE.batch} x 20 tokens, n_fetch = n_push = {SPARSE.n_push}; {repeats} interleaved repeats; load "
          f"average {min(r['load_before'] for v in runs.values() for r in v):.1f}-"
          f"{max(r['load_after'] for v in runs.values() for r in v):.1f}.")
    for optimizer in ("adagrad", "adam"):
        sparse, dense = runs[f"{optimizer}/sparse"], runs[f"{optimizer}/dense"]
        bytes_ratio = [a["pushed_bytes_per_update"] / b["pushed_bytes_per_update"] for a, b in zip(sparse, dense)]
        speed = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(sparse, dense)]
        fetch_ratio = [a["fetched_bytes_per_update"] / b["fetched_bytes_per_update"] for a, b in zip(sparse, dense)]
        out[f"{optimizer}_bytes_sparse_over_dense"] = bytes_ratio
        out[f"{optimizer}_fetched_bytes_sparse_over_dense"] = fetch_ratio
        out[f"{optimizer}_steps_per_s_sparse_over_dense"] = speed
        print(f"  {optimizer} on the ps: bytes pushed per update, sparse / dense = {_spread(bytes_ratio)} "
              f"({statistics.fmean(r['pushed_bytes_per_update'] for r in sparse) / 1e6:.3f} MB / "
              f"{statistics.fmean(r['pushed_bytes_per_update'] for r in dense) / 1e6:.3f} MB)")
        print(f"  {optimizer} on the ps: bytes fetched per update, sparse / dense = {_spread(fetch_ratio)} "
              f"({statistics.fmean(r['fetched_bytes_per_update'] for r in sparse) / 1e6:.3f} MB / "
              f"{statistics.fmean(r['fetched_bytes_per_update'] for r in dense) / 1e6:.3f} MB)")
        print(f"  {optimizer} on the ps: steps/s, sparse / dense = {_spread(speed)} "
              f"({_spread([r['steps_per_s'] for r in sparse])} / {_spread([r['steps_per_s'] for r in dense])})")
    out["seconds"] = time.monotonic() - started
    print(f"  ({out['seconds']:.0f} s in all)")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sparse", action="store_true", help="the Embedding-heavy model: sparse vs dense pushes")
    parser.add_argument("--functions-per-worker", type=int, default=4, help="timed functions per worker per run")
    parser.add_argument("--four-workers", type=int, default=2, help="repeats of the 4-worker run (0: skip)")
    parser.add_argument("--optimizer", default=BASE.optimizer, help="on the ps: adam (default), sgd, adagrad, ...")
    parser.add_argument("--local-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.local_child:
        from downpour.worker import local_steps_per_s

        config = DownpourConfig(**json.loads(args.local_child[0]))
        print(json.dumps(local_steps_per_s(config, functions=int(args.local_child[1]),
                                           repeats=int(args.local_child[2]))))
        return {}
    if args.sparse:
        return sparse_main(args.repeats, args.functions_per_worker)

    started = time.monotonic()
    runs: dict[str, list] = {"local": [], "1": [], "2": [], "4": []}
    from study.gradients.ps_data import write_study_mnist

    data = tempfile.TemporaryDirectory(prefix="bench-ps-")
    base = dataclasses.replace(BASE, optimizer=args.optimizer,
                               learning_rate=0.05 if args.optimizer in ("sgd", "adagrad") else BASE.learning_rate,
                               data_kwargs={"folder": str(write_study_mnist(data.name))})
    with data, LocalCluster(workers=4, ps=2, start_timeout=300) as cluster:
        for _ in range(args.repeats):
            local = local_child(base, functions=args.functions_per_worker, repeats=1)
            runs["local"].append({"steps_per_s": local["steps_per_s"][0], "cpu_s_per_step": local["cpu_s_per_step"][0],
                                  "cpu_share": local["steps_per_s"][0] * local["cpu_s_per_step"][0],
                                  "limits": local["limits"]})
            print(f"  local loop: {runs['local'][-1]['steps_per_s']:.2f} steps/s", flush=True)
            for workers in (1, 2):
                runs[str(workers)].append(ps_run(cluster, base, workers, args.functions_per_worker))
                print(f"  {workers} worker(s): {runs[str(workers)][-1]['steps_per_s']:.2f} steps/s", flush=True)
        for _ in range(args.four_workers):
            runs["4"].append(ps_run(cluster, base, 4, max(1, args.functions_per_worker // 2)))
            print(f"  4 workers: {runs['4'][-1]['steps_per_s']:.2f} steps/s", flush=True)
    rate = {k: [r["steps_per_s"] for r in v] for k, v in runs.items()}
    scaling = [b / a for a, b in zip(rate["1"], rate["2"])]
    overhead = [loc / ps for loc, ps in zip(rate["local"], rate["1"])]
    cpu_overhead = [(r["worker_cpu_s_per_step"] + r["ps_cpu_s_per_step"]) / loc["cpu_s_per_step"]
                    for r, loc in zip(runs["1"], runs["local"])]
    shares = [min(v for k, v in r["worker_cpu_share"].items() if k.startswith("worker") and v is not None)
              for r in runs["2"]]
    # what 2 workers would give if each had a core to itself: twice the ratio of steps per worker CPU second
    cpu_scaling = [2 * b["worker_steps_per_cpu_s"] / a["worker_steps_per_cpu_s"] for a, b in zip(runs["1"], runs["2"])]
    out = {"runs": runs, "scaling_2_over_1": scaling, "cpu_time_scaling_2_over_1": cpu_scaling,
           "overhead_ps_over_local": overhead,
           "cpu_overhead_ps_over_local": cpu_overhead,
           "scaling_4_over_1": [r / statistics.fmean(rate["1"]) for r in rate["4"]],
           "limits": f"each worker and the local loop: {runs['local'][0]['limits'].replace(', pinned to core 0', '')}, "
                     "one core each (os.sched_setaffinity)",
           "config": dataclasses.asdict(base), "cpus": os.cpu_count(), "seconds": time.monotonic() - started,
           "command": "python bench/bench_ps.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(f"\nAsynchronous Downpour, Deep MNIST CNN (3,274,634 parameters), {base.optimizer} on the ps, batch "
          f"{base.batch}, n_fetch = n_push = {base.n_fetch}, {base.steps_per_function} steps per scheduled function, "
          f"2 ps tasks (fc1/kernel split over both), {os.cpu_count()} cores.")
    print(f"Limits: {out['limits']}; ps and chief unlimited. Steps/s after warm-up, {args.repeats} repeats, "
          f"interleaved; load average {min(r['load_before'] for r in runs['1']):.1f}-"
          f"{max(r['load_after'] for r in runs['2']):.1f} during the runs.")
    for key, name in (("local", "local one-core loop"), ("1", "PS, 1 worker"), ("2", "PS, 2 workers"),
                      ("4", "PS, 4 workers")):
        if rate[key]:
            print(f"  {name:<22} {_spread(rate[key])} steps/s")
    print(f"  scaling 2 workers / 1 worker       = {_spread(scaling)}   (target >= 1.6)")
    print(f"  overhead PS step / local step      = {_spread(overhead)}   (target <= 1.3)")
    print(f"  ... in CPU seconds per step (worker + ps) / local = {_spread(cpu_overhead)}")
    one_share = [r["worker_cpu_share"]["worker:0"] for r in runs["1"]]
    print(f"  share of a core the local loop got: {_spread([r['cpu_share'] for r in runs['local']])}; "
          f"the worker of the 1-worker runs: {_spread(one_share)}")
    print(f"  smallest CPU share a worker got in the 2-worker runs: {_spread(shares)} of a core")
    print(f"  scaling from CPU time (2 x steps per worker-CPU-second, 2 workers / 1) = {_spread(cpu_scaling)}"
          f"  (what the ratio would be if each worker had its core to itself)")
    if rate["4"]:
        print(f"  4 workers / 1 worker               = {_spread(out['scaling_4_over_1'])}  (4 one-core workers on "
              f"{os.cpu_count()} cores: at most {os.cpu_count()}x, less the ps and the chief)")
    print(f"  ({out['seconds']:.0f} s in all)")
    return out


if __name__ == "__main__":
    main()
