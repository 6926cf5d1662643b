"""What a task shows in its terminal: one line per event, TensorFlow's own output in a log file, and Ctrl-C.

A task started by ``python -m downpour`` writes its own messages (``downpour: ...``) and progress lines to the
terminal; everything else written to its standard error (TensorFlow's C++ log, gRPC's errors, Python warnings
and tracebacks) goes to a log file, ``<job>-<index>-<port>.log`` in ``--log-dir`` (default
``$TMPDIR/downpour-<uid>``), which every error message names. ``Console.open`` moves file descriptor 2 itself,
so output from C++ that never passes through Python lands there too.

Ctrl-C: ``Console.stop_on_sigint`` blocks SIGINT in the main thread before TensorFlow starts its own threads (so
they inherit the block) and waits for it in one thread of its own, which prints one line and ends the process
with exit code 130. It works whatever the main thread is doing, also when it is inside TensorFlow's C++ (a ps
task in its server's loop, the chief waiting on a remote call), where a Python ``KeyboardInterrupt`` would
never be raised.

``console = Console.open("/tmp/downpour", "ps", 0, 2222); console.say("ps:0 ready")``
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

EXIT_INTERRUPTED = 130
"""Exit code of a task stopped by Ctrl-C (SIGINT): 128 + 2, as a shell reports it."""


def default_log_dir() -> Path:
    """``$TMPDIR/downpour-<uid>``: one folder per user, private to them."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"downpour-{uid}"


def log_name(job: str, index: int, port: int | str) -> str:
    """The log file of one task: ``ps-0-2222.log``."""
    return f"{job}-{index}-{port}.log"


class Console:
    """A task's terminal (the original standard error) and its log file (where standard error now goes)."""

    def __init__(self, terminal: IO[str], log: Path | None):
        self.terminal, self.log = terminal, log

    @classmethod
    def open(cls, log_dir: str | Path | None, job: str, index: int, port: int | str) -> Console:
        """Send this process's standard error (fd 2) to ``log_dir/<job>-<index>-<port>.log``; keep the terminal.

        The folder is created private to the user (mode 700). Returns the console to write messages to.
        """
        folder = Path(log_dir) if log_dir is not None else default_log_dir()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / log_name(job, index, port)
        sys.stderr.flush()
        terminal = os.fdopen(os.dup(2), "w", buffering=1)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        print(f"==== {job}:{index} pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')} ====",
              file=sys.stderr, flush=True)
        return cls(terminal, path)

    def say(self, message: str) -> None:
        """One line ``downpour: message`` in the terminal (line breaks become spaces), and in the log."""
        line = "downpour: " + " ".join(part.strip() for part in str(message).splitlines() if part.strip())
        print(line, file=self.terminal, flush=True)
        if self.log is not None:
            print(line, file=sys.stderr, flush=True)

    def where(self) -> str:
        """`` (full log: PATH)``, for the end of an error message."""
        return f" (full log: {self.log})" if self.log is not None else ""

    def stop_on_sigint(self, task: str, detail: str = "") -> None:
        """End the process with exit code 130 and one line when it receives SIGINT (Ctrl-C), whatever it is doing,
        also when it was started with SIGINT ignored (a background job of a script).

        Call it in the main thread before TensorFlow starts threads. ``detail`` is added to the line.
        """
        if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX: Python's KeyboardInterrupt
            return
        # a process started as a background job of a script inherits SIGINT ignored, and an ignored signal is
        # dropped before sigwait could see it: take it back (blocked everywhere, so its default action never runs)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

        def wait() -> None:
            signal.sigwait({signal.SIGINT})
            self.say(f"{task}: stopped by Ctrl-C (SIGINT), exit code {EXIT_INTERRUPTED}{detail}")
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)

        threading.Thread(target=wait, name="downpour-sigint", daemon=True).start()
        print(f"==== Ctrl-C (SIGINT) ends {task} with exit code {EXIT_INTERRUPTED} ====", file=sys.stderr, flush=True)
