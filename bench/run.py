"""Run every benchmark (``make bench``); each prints ratios measured side by side in one run.

Results also go to build/bench/<name>.json. Benchmarks report; they never fail on a time. A benchmark
that crashes is reported (its JSON holds the error), the others still run, and the exit status is 1.

Sizes (the argument lists below) keep the MaskedOptimizer benchmarks at about 6 minutes on a 2-core
machine (measured: 335 s on 2026-11-26), longer when shared with other jobs (a CNN step takes ~0.06-0.3 s on CPU). The
MirroredStrategy benchmark runs in its own process (two logical CPU devices must be set up before
TensorFlow starts). The parameter-server benchmarks run at their own defaults (the sparse one: 3 repeats of 24 timed
functions, its steps are short).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_cnn_loop  # noqa: E402
import bench_masked_fit  # noqa: E402
import bench_masked_step  # noqa: E402
import bench_ps  # noqa: E402
import bench_sparse_embedding  # noqa: E402

from study.report import cache  # noqa: E402
from study.report.load import Load, describe  # noqa: E402
from study.report.prose import ceil, floor  # noqa: E402


def _mirrored() -> dict:
    """bench_masked_mirrored in a child process (its logical devices must precede TensorFlow's start)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mirrored.json"
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_masked_mirrored.py")),
                        "--rounds", "11", "--json", str(out)], check=True, timeout=1800)
        return json.loads(out.read_text())


BENCHMARKS = {  # the library's rows take about 3 of the bench's 7 minutes: 15 rounds each, XLA 11, keep medians steady
    "masked_fit": lambda: bench_masked_fit.main(["--rounds", "15", "--epochs", "2", "--steps", "6"]),
    "masked_fit_xla": lambda: bench_masked_fit.main(["--jit", "--rounds", "11", "--epochs", "1", "--steps", "6",
                                                     "--variants", "hold,hold_one,mask_fn,hold_adamw"]),
    "masked_step": lambda: bench_masked_step.main(["--rounds", "15", "--steps", "10"]),
    "masked_step_xla": lambda: bench_masked_step.main(["--jit", "--rounds", "11", "--steps", "6"]),
    "masked_mirrored": _mirrored,
    "cnn_loop": lambda: bench_cnn_loop.main(["--rounds", "5", "--steps", "20"]),
    "sparse_embedding": lambda: bench_sparse_embedding.main(["--rounds", "7", "--steps", "20"]),
    "parameter_server": lambda: bench_ps.main([]),
    "parameter_server_sparse": lambda: bench_ps.main(["--sparse", "--repeats", "3", "--functions-per-worker", "24"]),
}


Row = dict  # {"label", "wall": (median, min, max), "cpu": (median, min, max) or None, "target": float or None,
#             "at_least": True where the target is a floor (scaling: >= 1.6), else it is a ceiling (<=)}


def _spread(values: list | None) -> tuple | None:
    """``(median, min, max)`` of a benchmark's per-repeat values; None when it has none."""
    import statistics

    values = [v for v in values or [] if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def _ps_rows(results: dict, row: Any) -> list[str]:
    """The parameter server's ratios (bench_ps.py: each a list over interleaved repeats) as rows, and its byte
    ratios (not times) as notes."""
    r = results.get("parameter_server", {})
    row("parameter server: 2 workers / 1 worker, steps per second", _spread(r.get("scaling_2_over_1")),
        _spread(r.get("cpu_time_scaling_2_over_1")), 1.6, at_least=True)
    row("parameter server: ps step / local one-core step, time per step", _spread(r.get("overhead_ps_over_local")),
        _spread(r.get("cpu_overhead_ps_over_local")), 1.3)
    row("parameter server: 4 workers / 1 worker (oversubscribed), steps per second",
        _spread(r.get("scaling_4_over_1")), None, None)
    s = results.get("parameter_server_sparse", {})
    notes = []
    for optimizer, name in (("adagrad", "Downpour's Adagrad"), ("adam", "Adam")):
        row(f"parameter server, Embedding: sparse / dense pushes, steps per second ({name})",
            _spread(s.get(f"{optimizer}_steps_per_s_sparse_over_dense")), None, None)
        for key, what in (("bytes", "bytes pushed per update, sparse / dense pushes"),
                          ("fetched_bytes", "bytes fetched per update, sparse / whole fetches")):
            spread = _spread(s.get(f"{optimizer}_{key}_sparse_over_dense"))
            if spread is not None:
                notes.append(f"parameter server, Embedding ({name}): {what}: {spread[0]:.3f} "
                             f"({floor(spread[1], 'fixed', 3)}–{ceil(spread[2], 'fixed', 3)})")
    return notes


def _rows(results: dict) -> tuple[list[Row], list[str]]:
    """The ratios with targets in one place (each benchmark also prints its own lines), and the memory notes."""
    rows: list[Row] = []

    def row(label: str, wall: tuple | None, cpu: tuple | None, target: float | None, at_least: bool = False) -> None:
        if wall is not None and wall[0] is not None:
            rows.append({"label": label, "wall": wall, "cpu": cpu, "target": target, "at_least": at_least})

    for key, suffix in (("masked_fit", ""), ("masked_fit_xla", " [XLA fit]")):
        for c in results.get(key, {}).get("comparisons", {}).values():
            row(f"fit: {c['variant']} / {c['reference']}{suffix}", (c["ratio_median"], c["ratio_min"], c["ratio_max"]),
                (c["cpu_ratio_median"], c["cpu_ratio_min"], c["cpu_ratio_max"]), c["target"])
    for key, label in (("masked_step", "custom loop"), ("masked_step_xla", "custom loop XLA")):
        r = results.get(key, {})
        for variant, target in (("hold", r.get("target")),):
            name = f"ratio_{variant}_over_plain"
            if name in r:
                row(f"{label}: {variant} / plain", (r[name], *r[f"{name}_rounds_min_max"]),
                    (r[f"cpu_{name}"], *r[f"cpu_{name}_rounds_min_max"]), target)
    r = results.get("masked_mirrored", {})
    if "ratio_hold_over_plain" in r:
        wall, cpu = r["ratio_rounds"], r["cpu_ratio_rounds"]
        row("MirroredStrategy fit: masked / plain", (r["ratio_hold_over_plain"], min(wall), max(wall)),
            (r["cpu_ratio_hold_over_plain"], min(cpu), max(cpu)), r["target"])
    r = results.get("sparse_embedding", {})
    if "ratio_sparse_over_densified" in r:
        row("sparse state, embedding: sparse gradient / densified",
            (r["ratio_sparse_over_densified"], *r["ratio_sparse_over_densified_rounds_min_max"]),
            (r["cpu_ratio_sparse_over_densified"], *r["cpu_ratio_sparse_over_densified_rounds_min_max"]), None)
    notes = _ps_rows(results, row)
    m = results.get("masked_fit", {}).get("memory") or {}
    if "hold_mask_bytes_per_masked_entry" in m:
        notes.append(f"memory, hold: {m['hold_mask_bytes_per_masked_entry']:.3f} B per masked entry + "
                     f"{m['hold_unmasked_bytes']} B of unmasked variables (target <= 1 B per masked entry); mask_fn "
                     f"only: {m.get('mask_fn_mask_bytes')} B in all; inner optimizer bytes equal: "
                     f"{m['inner_bytes_equal']}")
    if "sparse_over_dense_fc1_bytes" in m:
        v = m["sparse_over_dense_fc1_bytes"]
        notes.append(f"memory, sparse state / dense hold, optimizer bytes for fc1 (1% trainable): {v:.4f}  "
                     f"(target <= 0.03: {'met' if v <= 0.03 else 'NOT met'})")
    return rows, notes


def _met(row: Row) -> str:
    """Whether the target is met, by the wall-time median: "met" or "NOT met" where the whole range over rounds
    lies on that side of the target, "undecided" where the target lies inside it (one run cannot say), "met in CPU
    time only" where wall time misses and the CPU-time median meets it; empty without a target."""
    target = row["target"]
    if target is None:
        return ""
    median, low, high = row["wall"]
    if row.get("at_least"):  # a floor: mirror the ceiling's rules
        if low < target <= high:
            return ("undecided: inside the range over rounds "
                    f"(median {'at or over' if median >= target else 'under'} it)")
        if median >= target:
            return "met"
        return "met in CPU time only" if row["cpu"] and row["cpu"][0] >= target else "NOT met"
    if low <= target < high:
        return f"undecided: inside the range over rounds (median {'at or under' if median <= target else 'over'} it)"
    if median <= target:
        return "met"
    return "met in CPU time only" if row["cpu"] and row["cpu"][0] <= target else "NOT met"


def _bound(row: Row) -> str:
    """``"≥ 1.6"`` or ``"≤ 1.05"``: the row's target with its direction."""
    return f"{'≥' if row.get('at_least') else '≤'} {row['target']:g}"


def _summary(results: dict) -> list[str]:
    """The summary ``make bench`` prints: one line per ratio, wall and CPU, then the memory notes."""
    rows, notes = _rows(results)
    lines = []
    for r in rows:
        target = f"  target {_bound(r)}: {_met(r)}" if r["target"] is not None else ""
        cpu = f"; CPU {r['cpu'][0]:.3f} ({r['cpu'][1]:.3f}-{r['cpu'][2]:.3f})" if r["cpu"] else ""
        lines.append(f"  {r['label']:<52} wall {r['wall'][0]:.3f} ({r['wall'][1]:.3f}-{r['wall'][2]:.3f}){cpu}{target}")
    return lines + [f"  {n}" for n in notes]


def _markdown(results: dict, context: dict) -> str:
    """BENCH.md: what ran where, then every ratio with its range over rounds and its target."""
    rows, notes = _rows(results)
    load = context["load"]
    head = [
        "# Benchmarks: ratios measured side by side in one run",
        "",
        "Generated by `make bench` (`bench/run.py --publish results/bench`); do not edit. The JSON beside this file "
        "holds every number of each benchmark. Each ratio is the median over interleaved rounds of variant / "
        "reference, each its own compiled model with the same weights and data; the range is over rounds, rounded "
        "outward. "
        "Wall time counts waiting for a core; process CPU time does not. A target is met when the wall-time median "
        "and the whole range over rounds are at or under it, NOT met when the range lies above it, undecided when it "
        "lies inside the range (\"met in CPU time only\": wall time misses, the CPU-time median meets it); a target "
        "marked ≥ (the parameter server's scaling) is a floor, with the same rules mirrored. The parameter-server rows "
        "are over interleaved repeats of whole jobs (bench/bench_ps.py); their byte ratios, not times, follow the "
        "table.",
        "",
        f"- commit: `{context['commit']}`{' (with uncommitted changes)' if context['dirty'] else ''}; "
        f"finished {context['finished_at']}; {context['seconds']:.0f} s in all",
        f"- machine: {context['machine']['processor'] or context['machine']['machine']}, "
        f"{context['machine']['cpus']} cores; TensorFlow {context['versions']['tensorflow']}, "
        f"Keras {context['versions']['keras']}",
        f"- load while it ran: {describe(load)}",
        "",
        "| ratio | wall time, median (range) | CPU time, median (range) | target |",
        "|---|---|---|---|",
    ]
    def cell(median: float, low: float, high: float) -> str:  # the range rounded outward: it holds the rounds
        return f"{median:.3f} ({floor(low, 'fixed', 2)}–{ceil(high, 'fixed', 2)})"

    for r in rows:
        cpu = cell(*r["cpu"]) if r["cpu"] else ""
        target = f"{_bound(r)}: {_met(r)}" if r["target"] is not None else ""
        head.append(f"| {r['label']} | {cell(*r['wall'])} | {cpu} | {target} |")
    return "\n".join(head + [""] + [f"- {n}" for n in notes] + [""])


def _publish(results: dict, context: dict, directory: Path) -> None:
    """Write BENCH.md and one JSON per benchmark into ``directory``, replacing it whole (never half-written)."""
    staging = directory.with_name(directory.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, result in results.items():
        (staging / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (staging / "context.json").write_text(json.dumps(context, indent=2, default=str) + "\n")
    (staging / "BENCH.md").write_text(_markdown(results, context))
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks named (all when none): ``python bench/run.py masked_fit parameter_server``.

    ``--publish DIR`` (``make bench``; every benchmark must have run, none crashed) writes DIR/BENCH.md and the
    JSON, with the commit, the machine and its load; otherwise the JSON goes to build/bench/ only.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    publish = None
    if "--publish" in args:
        at = args.index("--publish")
        if at + 1 >= len(args):
            print("bench/run.py: --publish needs a directory, e.g. --publish results/bench", file=sys.stderr)
            return 2
        publish = Path(args[at + 1])
        del args[at:at + 2]
    names = args or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"bench/run.py: unknown benchmark(s) {unknown}; allowed: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    if publish is not None and set(names) != set(BENCHMARKS):
        print(f"bench/run.py: --publish writes the whole table, so it runs every benchmark; leave out the names "
              f"({', '.join(names)})", file=sys.stderr)
        return 2
    out = Path(__file__).resolve().parents[1] / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "processor": cache.machine()["cpu"], "cpus": os.cpu_count()}
    results, failed = {}, []
    start = time.perf_counter()
    with Load() as load:
        for name in names:
            run = BENCHMARKS[name]
            print(f"\n== {name} ==", flush=True)
            began = time.perf_counter()
            try:
                result = run()
            except Exception as e:  # a crash is reported, not hidden; the other benchmarks still run
                traceback.print_exc()
                failed.append(name)
                result = {"error": f"{type(e).__name__}: {e}"}
            result["seconds"] = time.perf_counter() - began
            results[name] = result
            (out / f"{name}.json").write_text(json.dumps({**result, **machine}, indent=2, default=str) + "\n")
    seconds = time.perf_counter() - start
    print(f"\n== summary ({seconds:.0f} s; {describe(load.result)}) ==")
    print("\n".join(_summary(results)))
    if failed:
        print(f"  FAILED (crashed, not a time): {', '.join(failed)}")
        if publish is not None:
            print(f"  {publish} left as it was (a crashed benchmark is not published)")
        return 1
    if publish is not None:
        import keras
        import tensorflow as tf
        context = {"commit": _git("rev-parse", "HEAD"),
                   "dirty": bool(_git("status", "--porcelain", "--", "lib", "bench")),
                   "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "seconds": round(seconds, 1), "machine": machine, "load": load.result,
                   "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}
        _publish(results, context, publish)
        print(f"  published: {publish / 'BENCH.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
