"""lib/downpour/README.md, run as written: the walk-through ("A second model, by hand") and the section "A model
with an Embedding and two inputs", block by block, from the repository root, with five free ports in place of
23220-23224. A ``bash`` block of ``TF_CONFIG=... "ps"/"worker"`` lines starts one task per line (as a terminal
would, each in its own process group); ``export`` blocks apply to every later block; any other ``bash`` block runs
to its end and must exit 0; a ``text`` block after it is what it must print (``...`` stands for anything, in
order, other lines allowed in between). At the end every task gets Ctrl-C (SIGINT to its group) and must end with
exit code 130 and the line the doc quotes.

Slow (about five minutes on a busy 2-core machine): ``pytest -m slow lib/downpour/tests/test_readme.py``.
"""

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from downpour.local import free_ports

REPO = Path(__file__).resolve().parents[3]  # the README's commands run from the repository root
DOC = REPO / "lib" / "downpour" / "README.md"
pytestmark = [pytest.mark.slow, pytest.mark.cluster,
              pytest.mark.skipif(not DOC.is_file(), reason="runs the README's commands in the repository")]
DOC_PORTS = [23220, 23221, 23222, 23223, 23224]
SECTIONS = ("## A second model, by hand", "### Several machines")


def blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block between the two headings of ``SECTIONS``."""
    start, end = text.index(SECTIONS[0]), text.index(SECTIONS[1])
    return re.findall(r"^```(\w*)\n(.*?)^```", text[start:end], flags=re.S | re.M)


def printed_as_shown(output: str, shown: str) -> bool:
    """Whether every line of ``shown`` (``...`` = anything) matches a line of ``output``, in order."""
    lines = iter(output.splitlines())
    for want in shown.strip().splitlines():
        pattern = re.escape(want.strip()).replace(re.escape("..."), ".*")
        if not any(re.fullmatch(pattern, line.strip()) for line in lines):
            return False
    return True


def _wait_for(process: subprocess.Popen, text: str, timeout: float = 180) -> str:
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and text not in seen:
        if not select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen += line
    assert text in seen, f"waited for {text!r}; the task printed {seen!r}"
    return seen


def test_the_walk_through_and_the_embedding_section_run_as_written():
    text = DOC.read_text()
    ports = free_ports(len(DOC_PORTS))
    for doc_port, port in zip(DOC_PORTS, ports):
        text = text.replace(str(doc_port), str(port))
    prelude, tasks = "", {}
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CLUSTER", "TF_CPP_MIN_LOG_LEVEL")}
    found = blocks(text)
    assert [lang for lang, _ in found].count("bash") >= 8, found
    try:
        for i, (lang, body) in enumerate(found):
            if lang != "bash":
                continue
            lines = [line for line in body.splitlines() if line.strip()]
            if all(line.startswith("export ") for line in lines):
                prelude += body
                continue
            if all(line.startswith("TF_CONFIG=") and re.search(r'"type": "(ps|worker)"', line) for line in lines):
                started = {}
                for line in lines:
                    job, index = re.search(r'"type": "(\w+)", "index": (\d)', line).groups()
                    started[f"{job}:{index}"] = subprocess.Popen(
                        ["bash", "-c", prelude + line], cwd=REPO, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
                tasks.update(started)
                for name, process in started.items():
                    job, index = name.split(":")
                    port = ports[1 + int(index)] if job == "ps" else ports[3 + int(index)]
                    said = _wait_for(process, f"serving {name} at grpc://localhost:{port}; listening on 127.0.0.1; "
                                              "intra-op threads 1")
                    assert "downpour:" not in said, said
                continue
            run = subprocess.run(["bash", "-c", prelude + body], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=900)  # one terminal: both, in order
            assert run.returncode == 0, f"{body}\n{run.stdout[-3000:]}"
            following = found[i + 1] if i + 1 < len(found) else ("", "")
            if following[0] == "text":
                assert printed_as_shown(run.stdout, following[1]), (
                    f"{body}\nprinted:\n{run.stdout}\nthe doc shows:\n{following[1]}")
        assert set(tasks) == {"ps:0", "ps:1", "worker:0", "worker:1"}
        for name, process in tasks.items():  # Ctrl-C in each terminal
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(timeout=10) == 130, name
            rest = process.stdout.read()
            assert f"downpour: {name}: stopped by Ctrl-C (SIGINT), exit code 130" in rest, rest
    finally:
        for process in tasks.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_the_shown_output_check_is_not_vacuous():
    assert printed_as_shown("a 1\nnoise\nb 2 3\n", "a ...\nb ... 3")
    assert not printed_as_shown("b 2\na 1\n", "a ...\nb ...")
    assert len(blocks(DOC.read_text())) > 10
