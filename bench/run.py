"""Run every benchmark (``make bench``); each prints ratios measured side by side in one run.

Results also go to build/bench/<name>.json. Benchmarks report; they never fail on a time.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_cnn_loop  # noqa: E402
import bench_masked_step  # noqa: E402
import bench_ps  # noqa: E402

BENCHMARKS = {
    "masked_step": lambda: bench_masked_step.main([]),
    "masked_step_xla": lambda: bench_masked_step.main(["--jit"]),
    "cnn_loop": lambda: bench_cnn_loop.main([]),
    "parameter_server": lambda: bench_ps.main([]),
}


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "processor": platform.processor(), "cpus": __import__("os").cpu_count()}
    for name, run in BENCHMARKS.items():
        print(f"\n== {name} ==", flush=True)
        result = run()
        (out / f"{name}.json").write_text(json.dumps({**result, **machine}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
