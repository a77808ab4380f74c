"""Records -> a Chrome/Perfetto trace (open in ui.perfetto.dev): one track per stage and link."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ppsim.metrics.records import OpRecord

TRACE_WINDOW_S = 60.0  # default span of simulated time in trace.json (a long run's full trace is too large)


def _track_order(track: str) -> tuple[int, int, str]:
    if track.startswith("stage"):
        return (0, int(track[5:]), track)
    if track.startswith("link"):
        return (1, int(track[4:].split("->")[0]), track)
    return (2, 0, track)


def trace_events(ops: list[OpRecord], pid: int = 0, process_name: str = "ppsim") -> list[dict[str, Any]]:
    tracks = sorted({o.track for o in ops}, key=_track_order)
    tid = {t: i for i, t in enumerate(tracks)}
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process_name}}]
    for t, i in tid.items():
        ev.append({"ph": "M", "pid": pid, "tid": i, "name": "thread_name", "args": {"name": t}})
        ev.append({"ph": "M", "pid": pid, "tid": i, "name": "thread_sort_index", "args": {"sort_index": i}})
    for o in ops:
        ev.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": tid[o.track],
                "name": f"{o.kind} mb{o.step_id}" if o.step_id >= 0 else o.kind,
                "ts": o.start_s * 1e6,
                "dur": (o.end_s - o.start_s) * 1e6,
                "args": {
                    "tokens": o.num_tokens,
                    "reqs": o.num_reqs,
                    "prefill": o.num_prefill_tokens,
                    "decode": o.num_decode_tokens,
                    "bytes": o.nbytes,
                },
            }
        )
    return ev


def trace_window(ops: Iterable[OpRecord], window_s: float | None) -> list[OpRecord]:
    """The operations starting within ``window_s`` of simulated time from the first one (all if None)."""
    ops = list(ops)
    if window_s is None or not ops:
        return ops
    end = min(o.start_s for o in ops) + window_s
    return [o for o in ops if o.start_s < end]


def chrome_trace(ops: Iterable[OpRecord], process_name: str = "ppsim", window_s: float | None = None) -> dict[str, Any]:
    """The trace of ``ops``; with ``window_s``, only the first ``window_s`` seconds of simulated time
    (a long run's full trace is too large for Perfetto to open)."""
    return {"traceEvents": trace_events(trace_window(ops, window_s), 0, process_name), "displayTimeUnit": "ms"}
