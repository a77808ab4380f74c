"""Engine core and control path per step, engine vs simulator, from a ``ppsim validate`` output dir.

For every step of every run (``engine-N/stage_ops.csv`` and ``sim/stage_ops.csv``) it takes the
engine core's ``schedule`` and ``update`` spans, the *launch gap* (schedule end -> the first stage's
compute start: building and pickling the step messages, the queue, the stage waking up) and the
*return gap* (the last stage's compute end -> the core's update start: tokens back over the queue),
and prints medians, engine beside simulator. The step-level cost error of ``validate`` covers the
stage computes; this covers the rest of a step, which at PP=1 decode of a few requests is a large
share of it.

Run: python experiments/validation/control_path.py VALIDATION_DIR [VALIDATION_DIR ...]
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def spans(timeline: Path) -> dict[str, list[float]]:
    """Per kind of gap, the list of seconds over the run's steps (in step order)."""
    rows = [r for r in csv.DictReader(timeline.open()) if r["track"] != "window"]
    rows.sort(key=lambda r: float(r["start_s"]))
    stages = sorted({r["track"] for r in rows if r["track"].startswith("stage")})
    first, last = stages[0], stages[-1]
    out: dict[str, list[float]] = defaultdict(list)
    sched_end = None
    for r in rows:
        a, b = float(r["start_s"]), float(r["end_s"])
        if r["track"] == "core":
            out[r["kind"]].append(b - a)
            if r["kind"] == "schedule":
                sched_end = b
            elif r["kind"] == "update" and out.get("_last_end"):
                out["return gap"].append(a - out.pop("_last_end")[0])
        elif r["track"] == first and r["kind"] == "compute" and sched_end is not None:
            out["launch gap"].append(a - sched_end)
            sched_end = None
        if r["track"] == last and r["kind"] == "compute":
            out["_last_end"] = [b]
    out.pop("_last_end", None)
    return out


def report(d: Path) -> str:
    runs = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("engine-"))
    eng: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for k, v in spans(r / "stage_ops.csv").items():
            eng[k] += v
    sim = spans(d / "sim" / "stage_ops.csv")
    lines = [f"{d.name}: median ms per step, engine ({len(runs)} runs) vs simulator"]
    for k in ("schedule", "launch gap", "return gap", "update"):
        e, s = eng.get(k), sim.get(k)
        if e and s:
            me, ms = statistics.median(e) * 1e3, statistics.median(s) * 1e3
            lines.append(f"  {k:<11} engine {me:7.3f}  sim {ms:7.3f}  (n {len(e)}, {len(s)})")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(report(Path(arg)))
