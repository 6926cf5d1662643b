"""Running a notebook so that it can be interrupted safely: signals, the kernel's process tree, papermill.

* ``SIGNALS``: SIGINT/SIGTERM become ``Interrupted`` in the main thread, except inside ``SIGNALS.hold()``, where the
  block finishes first (moving a finished notebook into place and recording it is never cut in half);
* ``Started``: the processes the pipeline starts from a point on; ``stop()`` stops them and what they started (in
  any session), and nothing this process had started before;
* ``execute``: papermill in a worker thread, so that signals reach the main thread; on an interruption the
  kernel's tree is stopped before ``Interrupted`` is re-raised.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the pipeline; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class _Signals:
    """SIGINT/SIGTERM -> ``Interrupted`` in the main thread, except inside ``hold()``, where it waits.

    Only the first signal counts: a second one while the pipeline cleans up is ignored, so the cleanup finishes.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._holding = 0

    def handler(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            return
        self.received = signum
        if not self._holding:
            raise Interrupted(signum)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Run the block to its end even if a signal arrives; raise ``Interrupted`` after it."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and self.received is not None:
            raise Interrupted(self.received)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Install the handlers for SIGINT and SIGTERM (main thread only), restoring the previous ones after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.received = None
        previous = {sig: signal.signal(sig, self.handler) for sig in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(sig) is not signal.SIG_IGN}  # like Python: an ignored signal stays ignored
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            self.received = None


SIGNALS = _Signals()
"""The one handler of the pipeline's process (``SIGNALS.installed()``, ``SIGNALS.hold()``)."""




class Started:
    """The processes this pipeline starts from now on: the children of this process that appear after it is made.

    ``stop()`` stops them and everything below them (the kernel, and whatever the kernel started, in any
    session), and nothing else: a child this process had before, or that something else in it started earlier,
    is left alone.

    >>> started = Started()
    >>> started.stop()  # nothing started since
    []
    """

    def __init__(self) -> None:
        self._before = {p.pid for p in _children()}

    def roots(self) -> list[Any]:
        """The direct children started since this object was made, still alive."""
        return [p for p in _children() if p.pid not in self._before]

    def stop(self, grace_s: float = 5.0) -> list[int]:
        """Stop the started processes' trees: freeze them (no new forks), SIGTERM, then SIGKILL after ``grace_s``.

        Returns the pids it signalled. The kernel runs in its own session and so does anything started with
        ``start_new_session``; walking parent links finds them all as long as their parents are alive, which the
        SIGSTOP pass guarantees until the whole tree is known.
        """
        import psutil

        found: dict[int, Any] = {}
        while True:  # freeze, until a pass finds no new process
            tree = []
            for root in self.roots() if not found else [p for p in found.values()]:
                tree.append(root)
                try:
                    tree.extend(root.children(recursive=True))
                except psutil.Error:
                    pass
            new = [p for p in tree if p.pid not in found]
            if not new:
                break
            for p in new:
                found[p.pid] = p
                try:
                    p.suspend()
                except psutil.Error:
                    pass
        procs = list(found.values())
        for p in procs:
            try:
                p.terminate()
                p.resume()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        return sorted(found)


def _children() -> list[Any]:
    """The live direct children of this process."""
    import psutil

    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def execute(notebook: Path, executed: Path, parameters: dict[str, Any], timeout_s: int) -> None:
    """papermill in a worker thread, so that signals reach the main thread (nbclient, when it runs in the main
    thread, replaces the SIGINT/SIGTERM handlers with its own, and restores SIG_DFL for SIGTERM afterwards).

    On any exception in the main thread (``Interrupted``), the kernel's process tree is stopped before it is
    re-raised, so nothing is left running and nothing writes into staging any more.
    """
    import papermill

    box: dict[str, BaseException] = {}

    def work() -> None:
        try:
            papermill.execute_notebook(
                str(notebook), str(executed), parameters=parameters,
                kernel_name="python3", cwd=str(notebook.parent), execution_timeout=timeout_s,
                progress_bar=sys.stderr.isatty(), log_output=True,
            )
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    started = Started()
    worker = threading.Thread(target=work, name=f"papermill:{notebook.stem}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        started.stop()
        worker.join(30)  # papermill notices the dead kernel and returns
        raise
    if "error" in box:
        raise box["error"]
