"""Records -> a Chrome/Perfetto trace (open in ui.perfetto.dev): one track per stage and link."""

from __future__ import annotations

from typing import Any

from ppsim.metrics.records import OpRecord


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
        ev.append({
            "ph": "X",
            "pid": pid,
            "tid": tid[o.track],
            "name": f"{o.kind} mb{o.step_id}" if o.step_id >= 0 else o.kind,
            "ts": o.start_s * 1e6,
            "dur": (o.end_s - o.start_s) * 1e6,
            "args": {"tokens": o.num_tokens, "reqs": o.num_reqs, "prefill": o.num_prefill_tokens,
                     "decode": o.num_decode_tokens, "bytes": o.nbytes},
        })
    return ev


def chrome_trace(ops: list[OpRecord], process_name: str = "ppsim") -> dict[str, Any]:
    return {"traceEvents": trace_events(ops, 0, process_name), "displayTimeUnit": "ms"}
