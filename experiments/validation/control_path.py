"""Engine core and control path per step, engine vs simulator, from a ``ppsim validate`` output dir.

For every step of every run (``engine-N/stage_ops.csv`` and ``sim/stage_ops.csv``) it takes the
engine core's ``schedule`` and ``update`` spans, the *launch* gap (schedule end -> the first stage's
compute start: building and pickling the step messages, the queue, the stage waking up) and the
*return* gap (the last stage's compute end -> the core's update start: tokens back over the queue),
as calibration reads them (:func:`calibration.core_path.step_paths`), and prints medians, engine
beside simulator. The step-level cost error of ``validate`` covers the stage computes; this covers
the rest of a step, which at PP=1 decode of a few requests is a large share of it. Launches and
returns count only where the far side was waiting (see ``step_paths``; a launch runs from the step's own schedule,
docs/validation.md part 35). For the policies that schedule ahead (``vllm-async``, ``vllm-mrv2``) a step's compute
also waits for its placeholders' sampled tokens, so their launch is more than the control path (the replay's path
factor leaves them out: ``replay_adjusted.SCHEDULES_AHEAD``). At PP > 1 it adds the
*handoff* (a stage's compute end -> the next stage's compute start, where that stage was waiting:
:func:`calibration.core_path.handoffs`).

It also splits ``validate``'s step-level error against CPU time (``step_costs.csv``, run 0) by how
much of each stage step overlapped other stages' computes in the engine: where the PP=2 steps that
the cost model misses are.

Run: python experiments/validation/control_path.py VALIDATION_DIR [VALIDATION_DIR ...]
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from calibration.core_path import handoffs, step_paths
from ppsim.metrics.records import OpRecord

KINDS = ("schedule", "launch", "return", "update", "handoff")


def read_ops(path: Path) -> list[OpRecord]:
    out = []
    for r in csv.DictReader(path.open()):
        out.append(
            OpRecord(
                r["track"],
                r["kind"],
                int(r["step_id"]),
                float(r["start_s"]),
                float(r["end_s"]),
                int(r["num_tokens"]),
                int(r["num_reqs"]),
                num_prefill_tokens=int(r.get("num_prefill_tokens") or 0),
                num_decode_tokens=int(r.get("num_decode_tokens") or 0),
                nbytes=float(r.get("nbytes") or 0.0),
            )
        )
    return out


def paths(ops: list[OpRecord]) -> dict[str, list[tuple[int, float]]]:
    """The core path per step (calibration's ``step_paths``) and the stage hand-overs (``handoffs``)."""
    return {**step_paths(ops), "handoff": handoffs(ops)}


def report(d: Path) -> str:
    runs = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("engine-"))
    eng: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in runs:
        for k, v in paths(read_ops(r / "stage_ops.csv")).items():
            eng[k] += [t for _, t in v]
    sim = {k: [t for _, t in v] for k, v in paths(read_ops(d / "sim" / "stage_ops.csv")).items()}
    lines = [f"{d.name}: median ms per step, engine ({len(runs)} runs) vs simulator"]
    for k in KINDS:
        e, s = eng.get(k), sim.get(k)
        if e and s:
            me, ms = statistics.median(e) * 1e3, statistics.median(s) * 1e3
            lines.append(f"  {k:<9} engine {me:7.3f}  sim {ms:7.3f}  (n {len(e)}, {len(s)})")
    return "\n".join(lines)


OVERLAP_BINS = ((0.0, 0.2), (0.2, 0.6), (0.6, 0.9), (0.9, 1.01))


def overlap_report(d: Path) -> str:
    """Median step error vs CPU by the fraction of the step other stages were computing (run 0)."""
    ops = [o for o in read_ops(d / "engine-0" / "stage_ops.csv") if o.kind == "compute"]
    if len({o.track for o in ops}) < 2:
        return ""
    err = {
        (int(r["stage"]), int(r["step_id"])): float(r["cpu_error"])
        for r in csv.DictReader((d / "step_costs.csv").open())
        if r["run"] == "0" and r["cpu_error"] not in ("", "None")
    }
    rows = []
    for o in ops:
        e = err.get((int(o.track[5:]), o.step_id))
        dur = o.end_s - o.start_s
        if e is None or dur <= 0:
            continue
        busy = sum(max(0.0, min(o.end_s, p.end_s) - max(o.start_s, p.start_s)) for p in ops if p.track != o.track)
        rows.append((busy / dur, e))
    lines = [f"{d.name}: step error vs CPU by overlap with other stages' computes (engine run 0)"]
    for lo, hi in OVERLAP_BINS:
        sel = [e for f, e in rows if lo <= f < hi]
        if sel:
            lines.append(
                f"  overlap {lo:.1f}-{min(hi, 1.0):.1f}: {len(sel):4d} steps, median {statistics.median(sel):+.1%}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(report(Path(arg)))
        print(overlap_report(Path(arg)))
