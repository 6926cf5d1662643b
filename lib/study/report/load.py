"""How busy the machine was while a notebook ran: what its timings are worth.

``Load()`` is a context manager around a run. It samples the 1-minute load average every few seconds, and at the
start and end reads the CPU time of this process and of its children that have ended (the notebook's kernel and
what the kernel started and waited for) and the machine's busy CPU time from ``/proc/stat``. ``Load.result``:

* ``wall_s``, ``cpu_s`` (the run's own CPU time) and ``cores_used`` (``cpu_s / wall_s``);
* ``loadavg``: the 1-minute load average over the run, ``mean`` and ``max`` of the samples;
* ``others_share``: CPU time used by everything else on the machine while the run ran, as a share of what the
  machine's cores could give in that time (``None`` where ``/proc/stat`` is missing);
* ``idle``: whether the machine was otherwise idle: ``others_share`` at most ``IDLE_SHARE`` (without
  ``/proc/stat``: the mean load average at most ``cores_used`` + ``IDLE_SHARE`` × cores).

The pipeline records the result in the manifest entry (``load``), prints it in the report next to the timings
(``describe``) and says so when the machine was not idle. ``with Load() as load: ...; load.result["idle"]``
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

IDLE_SHARE = 0.10
"""Other processes may use up to this share of the machine's CPU capacity for a run to count as on an idle machine."""
SAMPLE_S = 5.0
"""Seconds between load-average samples."""


def busy_cpu_s(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds all processes of the machine have used since boot (``/proc/stat``'s first line, idle and iowait
    left out), or None where there is no ``/proc/stat``."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (user + system)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


class Load:
    """Measure the machine's load while the ``with`` block runs (see the module docstring)."""

    def __init__(self, sample_s: float = SAMPLE_S) -> None:
        self.sample_s = sample_s
        self.samples: list[float] = []
        self.result: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while True:
            value = _loadavg()
            if value is not None:
                self.samples.append(value)
            if self._stop.wait(self.sample_s):
                return

    def __enter__(self) -> Load:
        self._wall, self._cpu, self._busy = time.perf_counter(), own_cpu_s(), busy_cpu_s()
        self._thread = threading.Thread(target=self._sample, name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        final = _loadavg()
        if final is not None:
            self.samples.append(final)
        self.result = summarise(time.perf_counter() - self._wall, own_cpu_s() - self._cpu,
                                None if self._busy is None or busy_cpu_s() is None else busy_cpu_s() - self._busy,
                                self.samples, os.cpu_count() or 1)


def summarise(wall_s: float, cpu_s: float, busy_s: float | None, samples: list[float], cores: int) -> dict[str, Any]:
    """The record of a run's load from its measurements (``busy_s``: the whole machine's busy CPU seconds).

    >>> r = summarise(100.0, 90.0, 150.0, [1.5, 2.0], 2)
    >>> r["cores_used"], r["others_share"], r["idle"], r["loadavg"]
    (0.9, 0.3, False, {'mean': 1.75, 'max': 2.0, 'samples': 2})
    """
    wall_s = max(wall_s, 1e-9)
    others = None if busy_s is None else round(max(busy_s - cpu_s, 0.0) / (wall_s * cores), 3)
    loadavg = ({"mean": round(sum(samples) / len(samples), 2), "max": round(max(samples), 2), "samples": len(samples)}
               if samples else None)
    cores_used = round(cpu_s / wall_s, 2)
    if others is not None:
        idle = others <= IDLE_SHARE
    elif loadavg is not None:
        idle = loadavg["mean"] <= cores_used + IDLE_SHARE * cores
    else:
        idle = None
    return {"wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1), "cores": cores, "cores_used": cores_used,
            "loadavg": loadavg, "others_share": others, "idle": idle}


def describe(load: dict[str, Any] | None) -> str:
    """One line for a report: how busy the machine was and whether that makes its timings comparable.

    >>> describe(summarise(100.0, 90.0, 150.0, [1.5, 2.0], 2))
    "not idle: other processes used 30.0% of the 2 cores; load average 1.75 (max 2.00; it counts this run's own
    threads too); this run used 0.9 cores (90 s CPU in 100 s)"
    >>> describe(None)
    'not recorded'
    """
    if not load:
        return "not recorded"
    parts = []
    if load.get("others_share") is not None:
        parts.append(f"other processes used {100 * load['others_share']:.1f}% of the {load['cores']} cores")
    if load.get("loadavg"):
        parts.append(f"load average {load['loadavg']['mean']:.2f} (max {load['loadavg']['max']:.2f}; it counts this "
                     "run's own threads too)")
    parts.append(f"this run used {load['cores_used']:g} cores ({load['cpu_s']:.0f} s CPU in {load['wall_s']:.0f} s)")
    state = {True: "otherwise idle", False: "not idle", None: "idle or not: unknown"}[load.get("idle")]
    return f"{state}: " + "; ".join(parts)


def report_note(load: dict[str, Any] | None) -> str:
    """The Markdown note a report shows next to its timings."""
    line = describe(load)
    if load and load.get("idle") is False:
        return (f"**How this run was timed: the machine was not idle** ({line.removeprefix('not idle: ')}). "
                "Its timings, and any ratio of "
                "timings quoted below, were taken while other work shared the CPU: they say little about the "
                "code; rerun on an idle machine before relying on them. Results that are not timings are unaffected.")
    return f"*How this run was timed:* {line}. Timings are wall-clock times on this machine."
