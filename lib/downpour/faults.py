"""Exit codes of every task, and which errors mean a lost ps task (TensorFlow's typed errors, then a probe).

A push, a fetch or the chief's own read fails with a typed ``tf.errors.OpError`` when a ps task is gone:
``UnavailableError`` (the connection failed; the coordinator's own ``PSUnavailableError`` is one), ``AbortedError``
or ``CancelledError`` (the remote call was cut off). A shape error (``InvalidArgumentError``), an
out-of-memory error (``ResourceExhaustedError``) or a missing file (``NotFoundError``) never counts as a lost
ps, whatever its text says. A typed connection error counts only when a ps task is also found down: its port
refuses connections (``lost_ps_tasks``), so a flaky connection to a healthy ps is an ordinary failure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
"""The chief failed for another reason; it says which, and ends every remote call it started."""
EXIT_BAD_INPUT = 2
"""Bad ``TF_CONFIG``, job, flag or data file; the message names it and what is allowed."""
EXIT_UNREACHABLE = 3
EXIT_RESUME_REFUSED = 4
"""``--resume`` found a checkpoint and sidecar that disagree; nothing was trained."""
EXIT_PORT_IN_USE = 5
"""A ps or worker task cannot listen: its port is in use by another process (stop it, or give the task another
port in ``TF_CONFIG``)."""
EXIT_PS_LOST = 75
"""A ps task was lost and did not come back within ``--ps-wait``: restart it, then the chief with ``--resume``
(``EX_TEMPFAIL``). Within ``--ps-wait`` the chief waits for it and continues from the last checkpoint itself."""

PS_WAIT_S = 300.0
"""The chief's default ``--ps-wait``: how long it waits for a lost ps task to come back before it gives up (exit 75).
Long enough for a supervisor (``python -m downpour local``, systemd, Kubernetes) to start the task again, TensorFlow's
start-up included, on a busy machine or a replacement one; short enough that a ps task gone for good ends the job
with a line saying what to do, rather than a chief waiting without end."""
CALL_DEADLINE_S = 60.0
"""The longest the chief waits for one call to a task (a counter read, a function's result, a snapshot)."""
SAVE_DEADLINE_S = 300.0
"""The longest the chief waits for a checkpoint to be written or restored (it reads every variable)."""


class CallTimeout(TimeoutError):
    """A call from the chief to a task did not return within its deadline (a dead or hung peer)."""


def with_deadline(call: Callable[[], Any], seconds: float, what: str) -> Any:
    """``call()``, or a ``CallTimeout`` naming ``what`` when it has not returned within ``seconds``.

    The call runs in a daemon thread: a remote call to a dead peer that never returns (gRPC can wait "forever")
    is left behind, and the chief goes on to classify the fault and exit or start again.

    >>> with_deadline(lambda: 2 + 2, 1.0, "a sum")
    4
    """
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run, name=f"deadline: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallTimeout(f"{what}: no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def error_chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps: the coordinator's ``original_exception``, ``__cause__`` and ``__context__``."""
    chain: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or any(e is seen for seen in chain):
            continue
        chain.append(e)
        todo += [getattr(e, "original_exception", None), e.__cause__, e.__context__]
    return chain


def connection_errors() -> tuple[type, ...]:
    """TensorFlow's typed errors for a remote task that went away."""
    import tensorflow as tf

    # the coordinator's own PSUnavailableError subclasses UnavailableError: caught here without naming it
    return (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError, CallTimeout)


def lost_ps_tasks(error: BaseException, ps_addresses: list[str], probe: Callable[[str], bool] | None = None,
                  tries: int = 3) -> list[str]:
    """The ps tasks (``"ps:i"``) that are down when ``error`` is a typed connection error; ``[]`` otherwise.

    ``probe(address) -> bool`` (default: a TCP connect) tells whether a task answers; it is asked ``tries``
    times, half a second apart, so a task that is merely slow is not declared lost.
    ``lost_ps_tasks(e, ["localhost:2221", "localhost:2222"])``
    """
    from downpour.cluster import reachable

    if not any(isinstance(e, connection_errors()) for e in error_chain(error)):
        return []
    probe = probe or reachable
    for attempt in range(tries):
        down = [f"ps:{i}" for i, address in enumerate(ps_addresses) if not probe(address)]
        if down or attempt == tries - 1:
            return down
        time.sleep(0.5)
    return []


def first_line(error: BaseException, limit: int = 300) -> str:
    """``"Type: the message's first line"``, at most ``limit`` characters, without TensorFlow's
    ``{{function_node ...}}`` prefix and ``[Op:...]`` suffix; for a ``Graph execution error:`` the line that says
    what went wrong, after the "Detected at node ..." trace; for a remote task's error, the message inside gRPC's
    wrapper; for autograph's ``in user code:``, its last line."""
    text = str(getattr(error, "message", None) or error)
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S).strip()
    grpc = re.search(r'grpc_message:"\s*(.*?)(\\n|\n|")', text)  # a remote task's error, inside gRPC's wrapper
    if grpc:
        text = grpc.group(1)
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("Graph execution error") and len(lines) > 1:
        told = [line for line in lines[1:] if not line.startswith((" ", "\t", "Detected at node", "[["))]
        lines = told[-1:] or lines
    elif lines and lines[0].strip() == "in user code:" and len(lines) > 1:  # autograph: the error is the last line
        lines = lines[-1:]
    line = lines[0].strip() if lines else ""
    named = re.match(r"^\w+(Error|Exception): ", line)  # the line names its own type already
    text = line if named else f"{type(error).__name__}: {line}" if line else type(error).__name__
    return text[:limit]


def data_error(error: BaseException) -> Any:
    """The ``tf.errors.NotFoundError`` in ``error``'s chain (a data file a worker or the chief cannot read), or None."""
    import tensorflow as tf

    return next((e for e in error_chain(error) if isinstance(e, tf.errors.NotFoundError)), None)
