"""Where an executor's stage, link and core operations go: running totals always, records on request.

The summary needs only each stage's busy time and the window from the first compute to the last;
those are kept as running totals, and the dashboard's down-sampled series (bounded) is fed here.
The operations themselves (``stage_ops.csv``, the Perfetto trace, validation, tests) are kept only
with ``keep=True``, so a long run holds nothing per event.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from ppsim.metrics.records import OpRecord
from ppsim.metrics.series import SeriesRecorder


class OpLog:
    """Iterable over the kept :class:`OpRecord` s; ``busy``/``t0``/``t1`` over every compute."""

    __slots__ = ("keep", "records", "busy", "t0", "t1", "series")

    def __init__(self, keep: bool = True, series: SeriesRecorder | None = None) -> None:
        self.keep = keep
        self.series = series  # the dashboard's down-sampled series, fed every operation
        self.records: list[OpRecord] = []
        self.busy: dict[str, float] = {}  # compute track -> seconds busy
        self.t0 = math.inf  # first compute start
        self.t1 = -math.inf  # last compute end

    def add(
        self,
        track: str,
        kind: str,
        step_id: int,
        start_s: float,
        end_s: float,
        num_tokens: int,
        num_reqs: int,
        num_prefill_tokens: int = 0,
        num_decode_tokens: int = 0,
        nbytes: float = 0.0,
    ) -> None:
        if kind == "compute":
            self.busy[track] = self.busy.get(track, 0.0) + (end_s - start_s)
            if start_s < self.t0:
                self.t0 = start_s
            if end_s > self.t1:
                self.t1 = end_s
        if self.series is not None:
            self.series.add_op(track, kind, start_s, end_s)
        if self.keep:
            self.records.append(
                OpRecord(
                    track,
                    kind,
                    step_id,
                    start_s,
                    end_s,
                    num_tokens,
                    num_reqs,
                    num_prefill_tokens,
                    num_decode_tokens,
                    nbytes,
                )
            )

    def add_compute(
        self,
        track: str,
        step_id: int,
        start_s: float,
        end_s: float,
        num_tokens: int,
        num_reqs: int,
        num_prefill_tokens: int,
        num_decode_tokens: int,
    ) -> None:
        """``add(track, "compute", ...)``: the same, without the dispatch on ``kind`` (the fast pipeline's
        hot path)."""
        busy = self.busy
        busy[track] = busy.get(track, 0.0) + (end_s - start_s)
        if start_s < self.t0:
            self.t0 = start_s
        if end_s > self.t1:
            self.t1 = end_s
        sr = self.series
        if sr is not None:
            stage = sr._stage.get(track)
            if stage is None:
                sr.add_op(track, "compute", start_s, end_s)
            else:  # SeriesRecorder.add_compute, inlined (once per stage per micro-batch)
                a, b = int(start_s * 1e9 + 0.5), int(end_s * 1e9 + 0.5)
                if a < 0:
                    a = 0
                if b > a:
                    if b > sr.end_ns:
                        if b > sr._limit_ns:
                            sr._cover(b)
                        else:
                            sr.end_ns = b
                    w = sr.width_ns
                    if a // w == (b - 1) // w:
                        sr.busy_ns[stage][a // w] += b - a
                    else:
                        sr._spread(sr.busy_ns[stage], a, b)
                if end_s > sr._wa_s and start_s < sr._wb_s:
                    sr._window(track, "compute", start_s, end_s)
        if self.keep:
            self.records.append(
                OpRecord(
                    track,
                    "compute",
                    step_id,
                    start_s,
                    end_s,
                    num_tokens,
                    num_reqs,
                    num_prefill_tokens,
                    num_decode_tokens,
                    0.0,
                )
            )

    def add_other(
        self,
        track: str,
        kind: str,
        step_id: int,
        start_s: float,
        end_s: float,
        num_tokens: int,
        num_reqs: int,
        nbytes: float = 0.0,
    ) -> None:
        """``add`` for a ``kind`` other than compute (a send, a core step): the same, without the dispatch."""
        sr = self.series
        if sr is not None:  # SeriesRecorder.add_other, inlined (every send and engine-core step)
            if end_s * 1e9 > sr.end_ns:
                t = int(end_s * 1e9 + 0.5)  # _ns (not negative: above end_ns >= 0)
                if t > sr._limit_ns:
                    sr._cover(t)
                elif t > sr.end_ns:
                    sr.end_ns = t
            if end_s > sr._wa_s and start_s < sr._wb_s:
                sr._window(track, kind, start_s, end_s)
        if self.keep:
            self.records.append(OpRecord(track, kind, step_id, start_s, end_s, num_tokens, num_reqs, 0, 0, nbytes))

    def append(self, o: OpRecord) -> None:
        self.add(*o.row())

    def merge(self, other: OpLog, rename: dict[str, str], prefix: str) -> None:
        """Fold ``other`` in: tracks in ``rename`` take the new name, others get ``prefix``."""
        for track, busy in other.busy.items():
            name = rename.get(track, prefix + track)
            self.busy[name] = self.busy.get(name, 0.0) + busy
        self.t0, self.t1 = min(self.t0, other.t0), max(self.t1, other.t1)
        if self.keep:
            for o in other.records:
                t = rename.get(o.track, prefix + o.track)
                self.records.append(OpRecord(t, *o.row()[1:]))

    def __iter__(self) -> Iterator[OpRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)
