"""Down-sampled series of a run, recorded as it runs in memory that does not grow with its length.

* Per-stage busy time and KV blocks in use, in ``max_bins`` fixed-width time bins from t = 0. When a
  time past the last bin arrives, neighbouring bins are merged pairwise and the width doubles, so at
  most ``max_bins`` bins exist and at least half of them hold the run. Times are integer nanoseconds,
  so a merge never changes a total: the busy nanoseconds of a stage are exactly the sum of its ops'.
* KV blocks in use are a step function of time (``sample_kv`` at every change): each bin keeps its
  integral (block-nanoseconds, for the time average) and its maximum.
* The operations of one short window of the timeline (for the dashboard's timeline panel): those
  overlapping ``[window_start_s, t_b)``, where ``t_b`` is the start of the first stage's
  ``window_steps + 1``-th compute at or after ``window_start_s``. At most ``max_window_ops`` are kept.

Executors call ``add_op(track, kind, start_s, end_s)`` for every stage compute, link send and
engine-core step, and ``sample_kv(t_s, blocks_used)``; ``close(end_s)`` ends the run. ``series_csv``
and ``timeline_csv`` are the files ``timeseries.csv`` and ``timeline.csv`` that ``ppsim plot`` reads.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

NS_PER_S = 1_000_000_000
DEFAULT_BINS = 512  # at least 256 bins hold the run once it is longer than 512 x the first width
FIRST_WIDTH_NS = 1_000  # 1 us: the narrowest bin; a 1 s run ends with ~4 ms bins
WINDOW_AFTER = 0.1  # the timeline window opens at this fraction of the last arrival time


def _ns(t_s: float) -> int:
    """Seconds -> integer nanoseconds (nearest; times before 0 count as 0)."""
    t = int(t_s * 1e9 + 0.5)
    return t if t > 0 else 0


class SeriesRecorder:
    def __init__(
        self,
        num_stages: int,
        max_bins: int = DEFAULT_BINS,
        first_width_ns: int = FIRST_WIDTH_NS,
        window_start_s: float = 0.0,
        window_steps: int = 16,
        max_window_ops: int = 20_000,
    ) -> None:
        if num_stages < 1:
            raise ValueError("num_stages must be >= 1")
        if max_bins < 2 or max_bins % 2:
            raise ValueError("max_bins must be an even number >= 2")
        if first_width_ns < 1:
            raise ValueError("first_width_ns must be >= 1")
        self.num_stages = num_stages
        self.max_bins = max_bins
        self.width_ns = first_width_ns
        self.busy_ns = [[0] * max_bins for _ in range(num_stages)]  # compute ns of each stage per bin
        self.kv_area = [0] * max_bins  # block-ns per bin
        self.kv_max = [0] * max_bins  # most blocks in use at any time in the bin
        self.end_ns = 0  # latest time seen
        self._limit_ns = max_bins * first_width_ns  # the bins cover [0, limit)
        self.kv_t_ns = 0  # time of the last KV change
        self.kv_used = 0  # blocks in use since then
        self._stage = {f"stage{i}": i for i in range(num_stages)}
        self.window_start_ns = _ns(window_start_s)
        self._wa_s, self._wb_s = window_start_s, float("inf")  # the window's bounds, for fast tests
        self.window_end_ns: int | None = None  # fixed once the window holds window_steps first-stage steps
        self.window_steps = window_steps
        self.max_window_ops = max_window_ops
        self.window_ops: list[tuple[str, str, float, float]] = []
        self._window_firsts = 0

    @classmethod
    def for_run(cls, num_stages: int, arrivals_s: Iterable[float]) -> SeriesRecorder:
        """A recorder whose timeline window opens after the first 10% of the arrivals' span."""
        last = max(arrivals_s, default=0.0)
        return cls(num_stages, window_start_s=WINDOW_AFTER * last, window_steps=max(8, 4 * num_stages))

    # --- recording ------------------------------------------------------------------------------
    def _cover(self, t_ns: int) -> None:
        """Merge bins pairwise (doubling their width) until ``t_ns`` falls inside the last bin."""
        if t_ns > self.end_ns:
            self.end_ns = t_ns
        while t_ns > self._limit_ns:
            half = self.max_bins // 2
            pad = [0] * half
            for b in self.busy_ns:
                b[:] = [b[2 * i] + b[2 * i + 1] for i in range(half)] + pad
            a, m = self.kv_area, self.kv_max
            a[:] = [a[2 * i] + a[2 * i + 1] for i in range(half)] + pad
            m[:] = [max(m[2 * i], m[2 * i + 1]) for i in range(half)] + pad
            self.width_ns *= 2
            self._limit_ns *= 2

    def _spread(self, bins: list[int], a: int, b: int, weight: int = 1) -> None:
        """Add ``weight`` x the overlap of [a, b) ns with each bin."""
        w = self.width_ns
        i, j = a // w, (b - 1) // w
        if i == j:
            bins[i] += (b - a) * weight
            return
        bins[i] += ((i + 1) * w - a) * weight
        full = w * weight
        for k in range(i + 1, j):
            bins[k] += full
        bins[j] += (b - j * w) * weight

    def add_busy(self, stage: int, start_s: float, end_s: float) -> None:
        a, b = int(start_s * 1e9 + 0.5), int(end_s * 1e9 + 0.5)  # _ns, inlined: called for every compute
        if a < 0:
            a = 0
        if b <= a:
            return
        if b > self.end_ns:
            self._cover(b)
        w = self.width_ns
        if a // w == (b - 1) // w:  # the common case: inside one bin
            self.busy_ns[stage][a // w] += b - a
        else:
            self._spread(self.busy_ns[stage], a, b)

    def add_op(self, track: str, kind: str, start_s: float, end_s: float) -> None:
        """One operation: a stage's compute counts as busy time; every kind may enter the window.
        Called once per operation of the run, so it is kept to a few comparisons."""
        if kind == "compute" and track in self._stage:
            self.add_busy(self._stage[track], start_s, end_s)
        elif end_s * 1e9 > self.end_ns:
            self._cover(_ns(end_s))
        if end_s > self._wa_s and start_s < self._wb_s:
            self._window(track, kind, start_s, end_s)

    def add_compute(self, track: str, start_s: float, end_s: float) -> None:
        """``add_op(track, "compute", ...)`` with ``add_busy`` inlined (once per stage per micro-batch).
        :meth:`ppsim.metrics.oplog.OpLog.add_compute` inlines this in turn: change both
        (``tests/test_dashboard.py`` checks they agree)."""
        stage = self._stage.get(track)
        if stage is None:
            self.add_op(track, "compute", start_s, end_s)
            return
        a, b = int(start_s * 1e9 + 0.5), int(end_s * 1e9 + 0.5)
        if a < 0:
            a = 0
        if b > a:
            if b > self.end_ns:  # _cover, inlined where no bin merges
                if b > self._limit_ns:
                    self._cover(b)
                else:
                    self.end_ns = b
            w = self.width_ns
            if a // w == (b - 1) // w:
                self.busy_ns[stage][a // w] += b - a
            else:
                self._spread(self.busy_ns[stage], a, b)
        if end_s > self._wa_s and start_s < self._wb_s:
            self._window(track, "compute", start_s, end_s)

    def add_other(self, track: str, kind: str, start_s: float, end_s: float) -> None:
        """``add_op`` for a kind other than compute (a send, an engine-core step), ``_cover`` and ``_ns``
        inlined where no bin merges (once per send and per core step). :meth:`ppsim.metrics.oplog.OpLog.add_other`
        inlines this in turn: change both (``tests/test_dashboard.py`` checks they agree)."""
        if end_s * 1e9 > self.end_ns:
            t = int(end_s * 1e9 + 0.5)  # _ns (not negative: above end_ns >= 0)
            if t > self._limit_ns:
                self._cover(t)
            elif t > self.end_ns:
                self.end_ns = t
        if end_s > self._wa_s and start_s < self._wb_s:
            self._window(track, kind, start_s, end_s)

    def add_ops(self, ops: Iterable[Any]) -> None:
        """Every record with ``track, kind, start_s, end_s`` fields (e.g. ``OpRecord``), in start order."""
        for o in ops:
            self.add_op(o.track, o.kind, o.start_s, o.end_s)

    def _window(self, track: str, kind: str, start_s: float, end_s: float) -> None:
        if end_s <= self._wa_s or start_s >= self._wb_s:
            return
        if len(self.window_ops) < self.max_window_ops:
            self.window_ops.append((track, kind, start_s, end_s))
        if self.window_end_ns is None and kind == "compute" and track == "stage0" and start_s >= self._wa_s:
            self._window_firsts += 1
            if self._window_firsts > self.window_steps:
                self.window_end_ns, self._wb_s = _ns(start_s), start_s
                self.window_ops = [op for op in self.window_ops if op[2] < start_s]

    def sample_kv(self, t_s: float, used: int) -> None:
        """Blocks in use from ``t_s`` on (call at every change; repeated values cost one comparison)."""
        if used == self.kv_used:
            return
        t = _ns(t_s)
        self._carry_kv(t)
        self.kv_used = used
        i = min(t // self.width_ns, self.max_bins - 1)
        if used > self.kv_max[i]:
            self.kv_max[i] = used

    def _carry_kv(self, t: int) -> None:
        """Account the blocks in use from the last change up to ``t`` ns."""
        if t > self.kv_t_ns:
            self._cover(t)
            if self.kv_used:
                self._spread(self.kv_area, self.kv_t_ns, t, self.kv_used)
                w = self.width_ns
                m = self.kv_max
                for k in range(self.kv_t_ns // w, (t - 1) // w + 1):
                    if m[k] < self.kv_used:
                        m[k] = self.kv_used
            self.kv_t_ns = t

    def close(self, end_s: float) -> None:
        """The run ended at ``end_s``: carry the last KV value to it."""
        self._carry_kv(_ns(end_s))
        self._cover(_ns(end_s))

    # --- reading --------------------------------------------------------------------------------
    def num_bins(self) -> int:
        """Bins up to the last time seen."""
        return max(1, -(-self.end_ns // self.width_ns))

    def busy_total_s(self, stage: int) -> float:
        return sum(self.busy_ns[stage]) / NS_PER_S

    def timeline(self) -> tuple[float, float, list[tuple[str, str, float, float]]]:
        """The window ``(start_s, end_s, ops)``; the end is the last op's end if the run ended first."""
        ops = sorted(self.window_ops, key=lambda o: (o[2], o[0]))
        wa = self.window_start_ns / NS_PER_S
        if self.window_end_ns is not None:
            return wa, self.window_end_ns / NS_PER_S, ops
        return wa, max((o[3] for o in ops), default=wa), ops

    @staticmethod
    def combine(parts: Sequence[SeriesRecorder]) -> SeriesRecorder:
        """Data-parallel replicas (one stage each) as one recorder: replica r's stage is stage r, KV
        areas add up, and the maximum is the sum of the replicas' maxima (an upper bound)."""
        out = SeriesRecorder(
            len(parts),
            parts[0].max_bins,
            parts[0].width_ns,
            parts[0].window_start_ns / NS_PER_S,
            parts[0].window_steps,
            parts[0].max_window_ops,
        )
        end = max(p.end_ns for p in parts)
        for p in parts:
            p._cover(end)
        out._cover(end)
        for r, p in enumerate(parts):  # the same doubling rule gives every part the same width
            out.busy_ns[r] = list(p.busy_ns[0])
            out.kv_area = [x + y for x, y in zip(out.kv_area, p.kv_area, strict=True)]
            out.kv_max = [x + y for x, y in zip(out.kv_max, p.kv_max, strict=True)]
            for track, kind, a, b in p.window_ops:
                name = f"stage{r}" if track == "stage0" else f"r{r}.{track}"
                out.window_ops.append((name, kind, a, b))
        out.end_ns = end
        ends = [p.window_end_ns for p in parts if p.window_end_ns is not None]
        out.window_end_ns = min(ends) if ends else None
        if out.window_end_ns is not None:
            out._wb_s = out.window_end_ns / NS_PER_S
            out.window_ops = [o for o in out.window_ops if o[2] < out._wb_s]
        return out


SERIES_FIELDS_HEAD = ["t_start_s", "t_end_s"]
TIMELINE_FIELDS = ["track", "kind", "start_s", "end_s"]


def series_csv(rec: SeriesRecorder) -> str:
    """One row per bin up to the run's end: busy fraction of each stage over the bin, mean and maximum
    KV blocks in use. The last bin ends at the run's end, so fraction x (t_end - t_start) is exact."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    stages = [f"stage{i}_busy" for i in range(rec.num_stages)]
    w.writerow([*SERIES_FIELDS_HEAD, *stages, "kv_blocks_mean", "kv_blocks_max"])
    width = rec.width_ns
    for k in range(rec.num_bins()):
        a, b = k * width, min((k + 1) * width, max(rec.end_ns, 1))
        span = b - a
        w.writerow(
            [
                f"{a / NS_PER_S:.9f}",
                f"{b / NS_PER_S:.9f}",
                *(f"{rec.busy_ns[s][k] / span:.9g}" for s in range(rec.num_stages)),
                f"{rec.kv_area[k] / span:.6g}",
                rec.kv_max[k],
            ]
        )
    return buf.getvalue()


def timeline_csv(rec: SeriesRecorder) -> str:
    """The window's operations; the first row (track ``window``) holds the window's bounds."""
    start, end, ops = rec.timeline()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TIMELINE_FIELDS)
    w.writerow(["window", "window", repr(start), repr(end)])
    w.writerows((t, k, repr(a), repr(b)) for t, k, a, b in ops)
    return buf.getvalue()
