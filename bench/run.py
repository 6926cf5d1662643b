"""Run every benchmark (``make bench``); each prints ratios measured side by side in one run.

Results also go to build/bench/<name>.json. Benchmarks report; they never fail on a time. A benchmark
that crashes is reported (its JSON holds the error), the others still run, and the exit status is 1.

Sizes (the argument lists below) keep the MaskedOptimizer benchmarks at about 6 minutes on a 2-core
machine (measured: 335 s on 2026-11-26), longer when shared with other jobs (a CNN step takes ~0.06-0.3 s on CPU). The
MirroredStrategy benchmark runs in its own process (two logical CPU devices must be set up before
TensorFlow starts). The parameter-server benchmarks run at their own defaults (the sparse one: 3 repeats of 24 timed functions, its steps are short).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_cnn_loop  # noqa: E402
import bench_masked_fit  # noqa: E402
import bench_masked_step  # noqa: E402
import bench_ps  # noqa: E402
import bench_sparse_embedding  # noqa: E402

def _mirrored() -> dict:
    """bench_masked_mirrored in a child process (its logical devices must precede TensorFlow's start)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mirrored.json"
        subprocess.run([sys.executable, str(Path(__file__).with_name("bench_masked_mirrored.py")),
                        "--rounds", "7", "--json", str(out)], check=True, timeout=1800)
        return json.loads(out.read_text())


BENCHMARKS = {
    "masked_fit": lambda: bench_masked_fit.main(["--rounds", "7", "--epochs", "2", "--steps", "6"]),
    "masked_fit_xla": lambda: bench_masked_fit.main(["--jit", "--rounds", "5", "--epochs", "1", "--steps", "6",
                                                     "--variants", "hold,hold_one,mask_fn,hold_adamw,hold_restore,hold_adamw_restore"]),
    "masked_step": lambda: bench_masked_step.main(["--rounds", "7", "--steps", "10"]),
    "masked_step_xla": lambda: bench_masked_step.main(["--jit", "--rounds", "5", "--steps", "6"]),
    "masked_mirrored": _mirrored,
    "cnn_loop": lambda: bench_cnn_loop.main(["--rounds", "5", "--steps", "20"]),
    "sparse_embedding": lambda: bench_sparse_embedding.main(["--rounds", "7", "--steps", "20"]),
    "parameter_server": lambda: bench_ps.main([]),
    "parameter_server_sparse": lambda: bench_ps.main(["--sparse", "--repeats", "3", "--functions-per-worker", "24"]),
}


def _summary(results: dict) -> list[str]:
    """The MaskedOptimizer targets in one place (each benchmark also prints its own lines)."""
    lines = []

    def ratio(label: str, value: float | None, spread: tuple | None, target: float | None) -> None:
        if value is None:
            return
        met = "" if target is None else f"  target <= {target}: {'met' if value <= target else 'NOT met'}"
        extra = f" (rounds {spread[0]:.3f}-{spread[1]:.3f})" if spread else ""
        lines.append(f"  {label:<52} {value:.3f}{extra}{met}")

    for key, suffix in (("masked_fit", ""), ("masked_fit_xla", " [XLA fit]")):
        for c in results.get(key, {}).get("comparisons", {}).values():
            label = f"fit: {c['variant']} / {c['reference']}{suffix}"
            ratio(label + " (wall)", c["ratio_median"], (c["ratio_min"], c["ratio_max"]), c["target"])
            ratio(label + " (CPU)", c["cpu_ratio_median"], (c["cpu_ratio_min"], c["cpu_ratio_max"]), c["target"])
    for key, label in (("masked_step", "custom loop: hold / plain"), ("masked_step_xla", "custom loop XLA: hold / plain")):
        r = results.get(key, {})
        if "ratio_hold_over_plain" in r:
            ratio(label + " (wall)", r["ratio_hold_over_plain"], tuple(r["ratio_hold_over_plain_rounds_min_max"]),
                  r["target"])
            ratio(label + " (CPU)", r["cpu_ratio_hold_over_plain"],
                  tuple(r["cpu_ratio_hold_over_plain_rounds_min_max"]), r["target"])
    for key, label in (("masked_step", "custom loop: hold_restore / plain"),
                       ("masked_step_xla", "custom loop XLA: hold_restore / plain")):
        r = results.get(key, {})
        if "ratio_hold_restore_over_plain" in r:
            ratio(label + " (wall)", r["ratio_hold_restore_over_plain"],
                  tuple(r["ratio_hold_restore_over_plain_rounds_min_max"]), None)
            ratio(label + " (CPU)", r["cpu_ratio_hold_restore_over_plain"],
                  tuple(r["cpu_ratio_hold_restore_over_plain_rounds_min_max"]), None)
    r = results.get("masked_mirrored", {})
    if "ratio_hold_over_plain" in r:
        for key, what in (("ratio_hold_over_plain", "wall"), ("cpu_ratio_hold_over_plain", "CPU")):
            rounds = r[key.replace("hold_over_plain", "rounds")]
            ratio(f"MirroredStrategy fit: masked / plain ({what})", r[key], (min(rounds), max(rounds)), r["target"])
    r = results.get("sparse_embedding", {})
    if "ratio_sparse_over_densified" in r:
        for key, what in (("", "wall"), ("cpu_", "CPU")):
            ratio(f"sparse state, embedding: sparse gradient / densified ({what})", r[f"{key}ratio_sparse_over_densified"],
                  tuple(r[f"{key}ratio_sparse_over_densified_rounds_min_max"]), None)
    m = results.get("masked_fit", {}).get("memory") or {}
    if "hold_mask_bytes_per_masked_entry" in m:
        lines.append(f"  memory, hold: {m['hold_mask_bytes_per_masked_entry']:.3f} B per masked entry + "
                     f"{m['hold_unmasked_bytes']} B of unmasked variables (target <= 1 B per masked entry); mask_fn only: "
                     f"{m.get('mask_fn_mask_bytes')} B in all; inner optimizer bytes equal: {m['inner_bytes_equal']}")
    if "sparse_over_dense_fc1_bytes" in m:
        v = m["sparse_over_dense_fc1_bytes"]
        lines.append(f"  memory, sparse state / dense hold, optimizer bytes for fc1 (1% trainable): {v:.4f}  "
                     f"target <= 0.03: {'met' if v <= 0.03 else 'NOT met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks named in ``argv`` (all when none): ``python bench/run.py masked_fit parameter_server``."""
    names = list(sys.argv[1:] if argv is None else argv) or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"bench/run.py: unknown benchmark(s) {unknown}; allowed: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    out = Path(__file__).resolve().parents[1] / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count()}
    results, failed = {}, []
    start = time.perf_counter()
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
    print(f"\n== summary ({time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores) ==")
    print("\n".join(_summary(results)))
    if failed:
        print(f"  FAILED (crashed, not a time): {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
