"""How long a lost ps task costs: ``python -m downpour local`` on the tabular example, one ps task killed mid-job.

``python bench/bench_ps_recovery.py [--task ps:1] [--at 300] [--steps 3200]`` runs the example job (2 ps tasks,
2 workers, a checkpoint every 200 updates) under ``python -m downpour local``, kills ``--task`` (SIGKILL) once the
counter is past ``--at`` and past a checkpoint, and prints what the command measured: the seconds from the task's
restart to the next update applied, and the updates redone (applied after the restored checkpoint, before the
fault). It checks that the job still ended with exit 0 and every update accounted for. Not part of ``make bench``
(one run, a duration, not a ratio); the load of the machine is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="ps:1", help="the ps task to kill (default ps:1)")
    parser.add_argument("--at", type=int, default=300, help="kill once the counter is past this (default 300)")
    parser.add_argument("--steps", type=int, default=3200, help="the job's steps (default 3200: 1600 updates)")
    args = parser.parse_args(argv)
    from downpour.examples import tabular
    from downpour.examples.tabular.data import write

    with tempfile.TemporaryDirectory(prefix="bench-ps-recovery-") as tmp:
        job = json.loads(tabular.JOB.read_text())
        job.update(data_kwargs={"folder": str(write(Path(tmp) / "data"))}, checkpoint_dir=f"{tmp}/ckpt",
                   steps=args.steps, eval_every=400, checkpoint_every=200)
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "downpour", "local", "--job", f"{tmp}/job.json", "--workers", "2",
                   "--ps", "2", "--out", str(out)]
        load_before = os.getloadavg()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        os.set_blocking(process.stdout.fileno(), False)
        pids, killed = {}, None
        while process.poll() is None:
            for line in iter(process.stdout.readline, ""):
                print(line, end="", flush=True)
                found = re.match(r"local: (\w+:\d+) at \S+, pid (\d+)", line)
                if found:
                    pids[found.group(1)] = int(found.group(2))
            if killed is None:
                try:
                    state = json.loads(Path(f"{out}.progress.json").read_text())
                except (OSError, ValueError):
                    state = {}
                if state.get("version", 0) >= args.at and state["version"] > (state.get("checkpoint_version") or 0):
                    os.kill(pids[args.task], signal.SIGKILL)
                    killed = state["version"]
                    print(f"bench: killed {args.task} at update {killed} (checkpoint {state['checkpoint_version']})",
                          flush=True)
            time.sleep(0.05)
        print(process.stdout.read(), end="")
        result = json.loads(out.read_text()) if out.is_file() else {}
    load_after = os.getloadavg()
    ok = process.returncode == 0 and result.get("applied_updates") == args.steps // 2 and len(
        result.get("recoveries", [])) == 1
    for r in result.get("recoveries", []):
        print(f"bench: {r['task']} killed: next update {r['next_update_s']:.1f} s after its restart; updates redone "
              f"{r['updates_redone']} (restored the checkpoint of update {r['restored_version']})")
    print(f"bench: exit {process.returncode}, updates {result.get('applied_updates')} of {args.steps // 2}; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, {os.cpu_count()} cores")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
