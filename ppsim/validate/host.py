"""Host guard: is this machine the same before and after every engine repeat, and is it ours?

The simulator knows nothing of other processes on the host: an engine run that shares its cores
with someone else's job is slower for a reason no cost model has, and a validation against it
measures the neighbour. So ``validate`` reads the host before and after each engine repeat (never
during one: the engine's own stages would be the load):

* ``load1``: ``os.getloadavg()[0]``, recorded for the reader; it is a one-minute moving average that
  still holds the previous repeat's own stages, so it is not judged.
* a fixed CPU probe run in one process per core at once: each times a fixed pure-Python loop by wall
  clock and by its own CPU time. ``core_share`` = the smallest CPU / wall ratio over the probes: 1.0
  on an idle host, about 2/3 when a third busy process shares two cores. ``probe_s`` = the slowest
  probe's wall time; its drift over the run (max / min - 1) shows a host whose speed changed
  (frequency, thermal, a neighbour coming and going).

A run is flagged when ``core_share`` fell below ``min_core_share`` at any reading or ``probe_s``
drifted by more than ``max_drift``. ``--host-guard refuse`` stops the validation at the first bad
reading instead (exit 2, one line); ``off`` skips the probe. Readings come from a function passed
in, so tests inject them and never depend on how fast the host is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ppsim.errors import PPSimError

PROBE_LOOP = 400_000  # iterations of the probe loop (about 30 ms of one core of a 2020s x86 server)
PROBE_CODE = (
    "import time\n"
    "t0 = time.perf_counter(); c0 = time.process_time(); x = 0\n"
    f"for i in range({PROBE_LOOP}):\n    x += i * i\n"
    "print(time.perf_counter() - t0, time.process_time() - c0)\n"
)
PROBE_TIMEOUT_S = 60.0
GuardMode = Literal["flag", "refuse", "off"]


@dataclass(frozen=True)
class HostReading:
    when: str  # "before 0", "after 0", ...
    load1: float
    probe_s: float  # slowest probe's wall seconds
    core_share: float  # smallest CPU / wall over the probes (1.0: each probe had a core to itself)


def cpu_probe(processes: int | None = None) -> tuple[float, float]:
    """Run the probe loop in ``processes`` (default: one per core) processes at once.

    Returns (slowest wall seconds, smallest CPU/wall share)."""
    n = processes or os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", PROBE_CODE], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    walls, shares = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=PROBE_TIMEOUT_S)
            wall, cpu = (float(v) for v in out.split())
            walls.append(wall)
            shares.append(min(1.0, cpu / wall) if wall > 0 else 1.0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
    return max(walls), min(shares)


def read_host(
    when: str,
    probe: Callable[[], tuple[float, float]] = cpu_probe,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
) -> HostReading:
    wall, share = probe()
    return HostReading(when, float(loadavg()[0]), float(wall), float(share))


@dataclass
class HostGuard:
    """Readings around each engine repeat and the judgement over them."""

    mode: GuardMode = "flag"
    max_drift: float = 0.15
    min_core_share: float = 0.85
    probe: Callable[[], tuple[float, float]] = cpu_probe
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg
    readings: list[HostReading] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in ("flag", "refuse", "off"):
            raise PPSimError(f"--host-guard: {self.mode!r} is not one of flag, refuse, off")
        if not self.max_drift > 0:
            raise PPSimError(f"--host-max-drift: {self.max_drift} must be > 0 (a fraction, e.g. 0.15)")
        if not 0 < self.min_core_share <= 1:
            raise PPSimError(f"--host-min-core-share: {self.min_core_share} must be in (0, 1]")

    def read(self, when: str) -> None:
        """Take one reading; in ``refuse`` mode raise at once if the host is already off."""
        if self.mode == "off":
            return
        self.readings.append(read_host(when, self.probe, self.loadavg))
        problem = self.problem()
        if problem and self.mode == "refuse":
            raise PPSimError(
                f"host guard: {problem}; validation refused (--host-guard refuse); "
                "rerun on a quiet host or pass --host-guard flag"
            )

    def drift(self) -> float:
        walls = [r.probe_s for r in self.readings]
        return max(walls) / min(walls) - 1.0 if walls and min(walls) > 0 else 0.0

    def problem(self) -> str | None:
        """What is wrong with the host, in a phrase; None when the readings are within bounds."""
        if not self.readings:
            return None
        worst = min(self.readings, key=lambda r: r.core_share)
        if worst.core_share < self.min_core_share:
            return (
                f"the CPU probe got {worst.core_share:.0%} of a core at '{worst.when}' (load {worst.load1:.1f}; "
                f"limit {self.min_core_share:.0%}): another process shares the cores"
            )
        if self.drift() > self.max_drift:
            return f"the CPU probe's time drifted {self.drift():.0%} over the run (limit {self.max_drift:.0%})"
        return None

    def to_dict(self) -> dict[str, Any]:
        problem = self.problem()
        return {
            "mode": self.mode,
            "ok": problem is None,
            "problem": problem,
            "max_drift": self.max_drift,
            "min_core_share": self.min_core_share,
            "probe_drift": self.drift(),
            "cpu_count": os.cpu_count(),
            "readings": [asdict(r) for r in self.readings],
        }


def host_line(h: dict[str, Any]) -> str:
    """One line for the report."""
    if h.get("mode") == "off" or not h.get("readings"):
        return "host guard: off (host not measured)"
    loads = [r["load1"] for r in h["readings"]]
    share = min(r["core_share"] for r in h["readings"])
    if h["ok"]:
        return (
            f"host guard: ok (CPU probe drift {h['probe_drift']:.0%}, core share >= {share:.0%}, "
            f"load {min(loads):.1f}-{max(loads):.1f})"
        )
    return f"host guard: FLAGGED, {h['problem']}: engine figures include contention the simulator does not model"
