"""A progress bar on stderr for long simulations: requests ended, simulated time, ETA (tqdm).

Shown only on a terminal, and only once a run has lasted ``DELAY_S`` of wall time; silent with
``--quiet`` or when stderr is a pipe or a file. It never changes a result.
"""

from __future__ import annotations

import sys
from typing import Any

DELAY_S = 2.0  # runs shorter than this never draw a bar


class RunProgress:
    def __init__(self, total: int, enabled: bool = True, stream: Any = None, delay_s: float = DELAY_S) -> None:
        stream = stream or sys.stderr
        self.bar = None
        self.step = max(1, total // 1000)  # redraw at most ~1000 times over the run
        self.pending = 0
        if enabled and total > 0 and stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, unit="req", desc="simulate", file=stream, delay=delay_s, dynamic_ncols=True, leave=False
            )

    def ended(self, now_s: float) -> None:
        """One request ended (finished, aborted or rejected) at simulated time ``now_s``."""
        if self.bar is None:
            return
        self.pending += 1
        if self.pending >= self.step:
            self.bar.set_postfix_str(f"simulated {now_s:,.1f} s", refresh=False)
            self.bar.update(self.pending)
            self.pending = 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.pending)
            self.bar.close()
            self.bar = None
