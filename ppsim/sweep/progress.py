"""A plain-text progress bar with an ETA on stderr (no dependency).

On a terminal the bar redraws in place; otherwise (CI logs, pipes) it prints a line at most
every ``min_interval_s`` and at the end. The ETA is the mean wall time per finished
configuration times the configurations left, divided over the configurations still to run.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def fmt_duration(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    def __init__(
        self,
        total: int,
        label: str = "configs",
        stream: TextIO | None = None,
        width: int = 30,
        min_interval_s: float = 5.0,
        enabled: bool = True,
    ) -> None:
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.min_interval_s = min_interval_s
        self.enabled = enabled and total > 0
        self.done = 0
        self.t0 = time.monotonic()
        self._last = float("-inf")

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.t0
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta_s = fmt_duration(eta) if self.done else "?"
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {self.label} "
            f"{frac * 100:5.1f}%  elapsed {fmt_duration(elapsed)}  ETA {eta_s}"
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        last = self.done >= self.total
        if self.tty:
            self.stream.write("\r" + self.line(now) + ("\n" if last else ""))
            self.stream.flush()
        elif last or now - self._last >= self.min_interval_s:
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()
            self._last = now
