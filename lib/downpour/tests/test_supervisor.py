"""``python -m downpour local``: a ps task killed mid-job is recovered with no human step.

The command runs 2 ps tasks, 2 workers and the chief; the test kills one ps task (SIGKILL) once the counter is past
a checkpoint, so that updates are lost and redone. Three interleavings, each forced rather than left to timing:

* ``ps:0``, which holds the update counter that the chief reads every 0.1 s: the chief sees it go at once, before
  the command has started it again;
* ``ps:1``: the chief sees it through a worker's failed push or fetch;
* ``ps:1, chief stopped``: the chief is frozen (SIGSTOP) while ps:1 is killed and started again, and resumed
  (SIGCONT) once the new, empty ps:1 listens: the chief meets a task that answers but lost its variables.

Each must end with exit 0, every update accounted for (the counter ends at exactly ``steps / n_push``, every
scheduled function returned once, the restored checkpoint and the updates redone recorded), and one line naming
the fault. Slow (a cluster, a minute or two each): ``make test-slow``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from downpour.cluster import reachable
from downpour.examples import tabular


@pytest.mark.parametrize("args, message", [
    (["--job", "/nowhere/job.json"], "downpour: --job: '/nowhere/job.json' is neither a JSON object nor a file"),
    (["--job", '{"steps": 8}', "--workers", "0"], "downpour: workers: expected an integer >= 1"),
    (["--job", '{"steps": 8}', "--max-restarts", "-1"],
     "downpour: --max-restarts and --ps-wait: expected numbers >= 0"),
])
def test_bad_arguments_end_the_command_with_one_line_and_exit_2_before_any_task_starts(args, message):
    run = subprocess.run([sys.executable, "-m", "downpour", "local", *args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stdout == "", run
    assert run.stderr.splitlines()[-1].startswith(message), run.stderr


def _job(tmp_path: Path) -> Path:
    from downpour.examples.tabular.data import write

    job = json.loads(tabular.JOB.read_text())
    job.update(data_kwargs={"folder": str(write(tmp_path / "tabular"))}, checkpoint_dir=str(tmp_path / "ckpt"),
               steps=960, checkpoint_every=40, eval_every=240)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


@pytest.mark.slow  # a cluster, a minute or two each: make test-slow
@pytest.mark.cluster
@pytest.mark.parametrize("victim, stop_chief", [("ps:0", False), ("ps:1", False), ("ps:1", True)],
                         ids=["ps0-seen-at-once", "ps1-seen-by-a-worker", "ps1-back-before-the-chief-looks"])
def test_a_killed_ps_task_is_recovered_by_the_chief_with_no_human_step(tmp_path, victim, stop_chief):
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "downpour", "local", "--job", str(_job(tmp_path)), "--workers", "2", "--ps", "2",
               "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    os.set_blocking(process.stdout.fileno(), False)
    lines: list[str] = []
    pids: dict[str, int] = {}
    addresses: dict[str, str] = {}
    killed = None
    deadline = time.monotonic() + 900
    try:
        while process.poll() is None:
            assert time.monotonic() < deadline, "\n".join(lines)
            for line in iter(process.stdout.readline, ""):
                lines.append(line.rstrip("\n"))
                found = re.match(r"local: (\w+:\d+|chief) at (\S+), pid (\d+)", line)
                if found:
                    pids[found.group(1)], addresses[found.group(1)] = int(found.group(3)), found.group(2)
            if killed is None:
                try:
                    state = json.loads(Path(f"{out}.progress.json").read_text())
                except (OSError, ValueError):
                    state = {}
                if state.get("version", 0) >= 100 and state["version"] > (state.get("checkpoint_version") or 0):
                    if stop_chief:
                        os.kill(pids["chief"], signal.SIGSTOP)
                    os.kill(pids[victim], signal.SIGKILL)
                    killed = state
                    if stop_chief:  # resume the chief once the command has started a new, empty ps task
                        while not (any(f"local: {victim} exited" in x for x in lines) and reachable(
                                addresses[victim])):
                            assert time.monotonic() < deadline
                            lines += [x.rstrip("\n") for x in iter(process.stdout.readline, "")]
                            time.sleep(0.1)
                        time.sleep(1.0)
                        os.kill(pids["chief"], signal.SIGCONT)
            time.sleep(0.05)
        lines += process.stdout.read().splitlines()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = "\n".join(lines)
    assert process.returncode == 0, text
    assert killed is not None, text
    # one line names the fault, and no other task said anything
    said = [line for line in lines if line.startswith("downpour:")]
    assert len(said) == 1 and said[0].startswith(f"downpour: {victim} lost (") and (
        "waiting up to 300 s (--ps-wait) for it to come back, then continuing from the checkpoint of update") in \
        said[0], text
    assert f"local: {victim} exited with code -9; starting it again (restart 1 of 3)" in text
    # every update accounted for
    r = json.loads(out.read_text())
    assert r["applied_updates"] == 960 // 2 == r["returned_updates"], text
    assert r["returned_functions"] == r["scheduled_functions"] == 960 // 8
    first, again = r["attempts"]
    assert not first["resumed"] and again["resumed"] and again["restored_version"] % 40 == 0
    [recovery] = r["recoveries"]
    [failure] = json.loads(Path(f"{out}.faults.json").read_text())
    assert recovery["task"] == victim and failure["lost"] == [victim] and recovery["failure"] == failure
    assert recovery["restored_version"] == again["restored_version"] == failure["checkpoint_version"]
    seen = failure["version_at_failure"] if failure["version_at_failure"] is not None else failure[
        "last_polled_version"]
    assert recovery["updates_redone"] == seen - again["restored_version"] >= killed["version"] - again[
        "restored_version"] > 0
    assert recovery["next_update_s"] > 0
    told = re.search(r"\((?:at least )?(\d+) updates? applied since then to redo\)", said[0])
    assert told and int(told.group(1)) == recovery["updates_redone"], said[0]  # the line says what was lost
    assert r["frozen"]["frozen_changed_bits"] == 0  # the restored masks held through the fault
