"""Probe: do closures over a Keras model's variables run the workers one at a time?

The first version of the parameter server trained a plain-TF MLP because "closures over a Keras model's
variables ran one worker at a time". This probe isolates that claim. On one cluster (2 workers, 1 ps) it runs
the same 2-worker job twice, each scheduled function doing ``--steps`` SGD steps of the Deep MNIST CNN:

* ``keras``: the model built under ``strategy.scope()``, so its variables are Keras variables on the ps; the
  closure calls ``model(x)`` and ``assign_sub`` on ``model.trainable_variables`` (what the first version tried);
* ``stateless``: what ``downpour`` does -- plain ``tf.Variable`` s on the ps, the model run with
  ``model.stateless_call`` on a local copy fetched once per function, one push at the end.

Each function records ``tf.timestamp()`` on its worker before its first read and after its last write, so the
overlap of the two workers' functions is measured directly: ``busy workers`` = summed function time / span
(2.0 = both workers always busy, 1.0 = one at a time). It also counts traces (a retrace per call would
serialise the workers on the coordinator's tracing lock) and each worker's CPU seconds.
Run ``--threads 0`` for workers without the one-core limit (TensorFlow's defaults, as in the first version).
``python bench/probe_keras_closures.py``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))


def chief(mode: str, steps: int, functions: int) -> dict:
    """Runs in the chief process (``TF_CONFIG`` says chief)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from study.models import deep_mnist_cnn

    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if mode == "keras":
        with strategy.scope():
            model = deep_mnist_cnn()
        params = model.trainable_variables
    else:
        model = deep_mnist_cnn()
        with strategy.scope():
            params = [tf.Variable(v.numpy()) for v in model.trainable_variables]
    seed_state = [tf.constant(v.numpy()) for v in model.non_trainable_variables]
    rng = np.random.default_rng(0)
    x_all = rng.random((512, 28, 28, 1)).astype(np.float32)
    y_all = rng.integers(0, 10, 512).astype(np.int32)
    dataset = coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((x_all, y_all)).repeat().batch(32))
    iterator = iter(dataset)
    traces = []

    @tf.function
    def run(it):
        traces.append(1)  # Python side effect: runs once per trace
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            if mode == "keras":
                writes = []
                for _ in range(steps):
                    x, y = next(it)
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, model(x, training=True))
                    for v, g in zip(params, tape.gradient(loss, params)):
                        writes.append(v.assign_sub(0.01 * g))
            else:
                local = [p.read_value() for p in params]
                state = list(seed_state)  # dropout's seed generator state, a local value
                for _ in range(steps):
                    x, y = next(it)
                    with tf.GradientTape() as tape:
                        tape.watch(local)
                        logits, state = model.stateless_call(local, state, x, training=True)
                        loss = loss_fn(y, logits)
                    local = [w - 0.01 * g for w, g in zip(local, tape.gradient(loss, local))]
                writes = [p.assign(w) for p, w in zip(params, local)]
        with tf.control_dependencies(writes + [loss]):
            ended = tf.timestamp()
        return started, ended, tf.distribute.coordinator.experimental_get_current_worker_index()

    for _ in range(4):  # warm up: trace, ship the function to both workers
        coordinator.schedule(run, args=(iterator,))
    coordinator.join()
    begin = time.perf_counter()
    values = [coordinator.schedule(run, args=(iterator,)) for _ in range(functions)]
    coordinator.join()
    wall = time.perf_counter() - begin
    spans = [tuple(float(t) for t in v.fetch()[:2]) + (int(v.fetch()[2]),) for v in values]
    span = max(b for _, b, _ in spans) - min(a for a, _, _ in spans)
    return {"mode": mode, "steps_per_s": functions * steps / wall,
            "busy_workers": sum(b - a for a, b, _ in spans) / span,
            "traces": len(traces), "functions_per_worker": {w: sum(s[2] == w for s in spans) for w in (0, 1)}}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="SGD steps per scheduled function")
    parser.add_argument("--functions", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="worker intra-op threads; 0 = TensorFlow's default")
    parser.add_argument("--chief", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.chief:
        print(json.dumps(chief(args.chief, args.steps, args.functions)))
        sys.stdout.flush()
        os._exit(0)
    from downpour.launcher import cpu_seconds
    from downpour.local import LocalCluster

    results = []
    limited = args.threads > 0
    with LocalCluster(workers=2, ps=1, worker_threads=max(1, args.threads), pin_workers=limited) as cluster:
        if not limited:  # TensorFlow's defaults: restart the workers without the thread limit
            for i in (0, 1):
                cluster.kill("worker", i)
                cluster.processes[("worker", i)] = subprocess.Popen(
                    [sys.executable, "-c", "from downpour.cluster import *; import tensorflow as tf, json, os; "
                     "c = parse_tf_config(); tf.distribute.Server(tf.train.ClusterSpec(c['cluster']), "
                     "job_name='worker', task_index=c['task']['index'], "
                     "config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)).join()"],
                    env=dict(os.environ, TF_CONFIG=cluster.tf_config("worker", i)), start_new_session=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cluster.wait_until_listening([("worker", 0), ("worker", 1)])
        for mode in ("keras", "stateless"):
            cpu = {i: cpu_seconds(cluster.processes[("worker", i)].pid) for i in (0, 1)}
            run = subprocess.run([sys.executable, __file__, "--chief", mode, "--steps", str(args.steps),
                                  "--functions", str(args.functions)], capture_output=True, text=True, timeout=900,
                                 env=dict(os.environ, TF_CONFIG=cluster.tf_config("chief", 0)))
            if run.returncode != 0:
                raise RuntimeError(run.stderr[-2000:])
            result = json.loads(run.stdout.strip().splitlines()[-1])
            result["worker_cpu_s"] = {i: round(cpu_seconds(cluster.processes[("worker", i)].pid) - cpu[i], 2)
                                      for i in (0, 1)}
            results.append(result)
            print(json.dumps(result), flush=True)
    print(f"\nworkers: {'1 intra-op thread, pinned to one core each' if limited else 'TensorFlow defaults'}; "
          f"{os.cpu_count()} cores; load average {Path('/proc/loadavg').read_text().split()[0]}")
    for r in results:
        print(f"  {r['mode']:<10} busy workers {r['busy_workers']:.2f} (2 = fully parallel), {r['steps_per_s']:.2f} "
              f"steps/s, {r['traces']} trace(s), functions per worker {r['functions_per_worker']}, "
              f"worker CPU s {r['worker_cpu_s']}")
    return results


if __name__ == "__main__":
    main()
