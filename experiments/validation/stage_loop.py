"""What a stage does between two computes, from the engine's own record of its loop (``stage_loop.csv``).

Per engine run (an ``ppsim engine`` output dir, or each ``engine-N/`` of a ``ppsim validate`` dir) and per
request count of the step: the restarts of a stage (``--stage``, default the last), as the simulator's
``turnaround`` counts them (:func:`ppsim.validate.path.restart_margins`: the stage before had finished the step's
compute before this stage freed; on the first stage every compute after another), split into the hand-on of the
previous step's outputs (the last stage's put of the sampled tokens, another stage's send), reading the control
messages, waiting for the input to arrive (the receive) and the rest; then how often the stage thread was
switched out during the hand-on, the restart with and without that, and how many of those hand-ons overlap a
record of the engine core (``update`` / ``schedule`` in ``stage_ops.csv``): the core's work landing on the
stage's core (docs/validation.md, What is left out: the stage turnaround).

Run: python experiments/validation/stage_loop.py [--stage K] RUN_DIR [...]
"""

from __future__ import annotations

import bisect
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.metrics.records import LOOP_FIELDS  # noqa: E402

PARTS = ("out", "ctrl", "wait", "rest")


def read_loop(path: Path) -> list[dict[str, float]]:
    """``stage_loop.csv``'s rows, every column a number; one-line errors for a missing or foreign file."""
    if not path.is_file():
        raise PPSimError(f"{path}: missing; engine runs write it since 2026-12-06 (rerun the engine)")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if rows and (missing := [c for c in LOOP_FIELDS if c not in rows[0]]):
        raise PPSimError(f"{path}: not a stage_loop.csv (no {', '.join(missing)}); rerun the engine")
    try:
        return [{k: float(r[k]) for k in LOOP_FIELDS} for r in rows]
    except ValueError as e:
        raise PPSimError(f"{path}: not a stage_loop.csv ({e}); rerun the engine") from None


def core_spans(path: Path) -> list[tuple[float, float]]:
    """The engine core's ``update`` and ``schedule`` records of ``stage_ops.csv``, by start."""
    if not path.is_file():
        return []
    with path.open() as f:
        spans = [(float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f) if r["track"] == "core"]
    return sorted(spans)


def overlaps(spans: list[tuple[float, float]], a: float, b: float) -> bool:
    """Whether a span of ``spans`` (sorted by start, none overlapping another: one thread's records) meets
    [a, b]: the last one starting before ``b`` does if any does."""
    i = bisect.bisect_left(spans, (b, float("-inf")))
    return i > 0 and spans[i - 1][1] > a


def restarts(rows: list[dict[str, float]], stage: int, core: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Each restart of ``stage``: its seconds, parts (``PARTS``), the step's requests, whether the previous
    hand-on was switched out and whether it overlapped a core record. A restart: the stage's compute after
    another whose step the stage before had finished computing by the time this stage freed (any compute
    after another on the first stage)."""
    mine = sorted((r for r in rows if int(r["stage"]) == stage), key=lambda r: r["start_s"])
    upstream = {int(r["step_id"]): r["end_s"] for r in rows if int(r["stage"]) == stage - 1}
    out = []
    for prev, r in zip(mine, mine[1:], strict=False):
        if min(prev["end_s"], r["ready_s"], prev["out_s"], r["ctrl_s"]) < 0:
            continue  # a record without the loop's readings
        if stage > 0 and upstream.get(int(r["step_id"]), float("inf")) > prev["end_s"]:
            continue  # its input was computed after the stage freed: a hand-over, not a restart
        wait = r["recv_done_s"] - r["ready_s"] if r["recv_done_s"] >= 0 else 0.0
        total = r["start_s"] - prev["end_s"]
        handed = prev["end_s"] + prev["out_s"]
        parts = {"out": prev["out_s"], "ctrl": r["ctrl_s"], "wait": max(wait, 0.0)}
        parts["rest"] = total - sum(parts.values())
        out.append(
            {
                "reqs": r["num_reqs"],
                "restart": total,
                **parts,
                "switched": prev["out_switched"] > 0,
                "core": overlaps(core, prev["end_s"], handed),
            }
        )
    return out


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.3f}" if xs else "-"


def lines_of(rs: list[dict[str, float]]) -> list[str]:
    """One line per request count: medians (ms) of the restart and its parts, the switched hand-ons."""
    by: dict[int, list[dict[str, float]]] = defaultdict(list)
    for r in rs:
        by[int(r["reqs"])].append(r)
    out = []
    for n, sel in sorted(by.items()):
        sw = [r for r in sel if r["switched"]]
        calm = [r for r in sel if not r["switched"]]
        parts = "  ".join(f"{p} {ms([r[p] for r in sel])}" for p in PARTS)
        out.append(
            f"    {n:4d} reqs: {len(sel):4d} restarts, median {ms([r['restart'] for r in sel])} ms ({parts});"
            f" switched in the hand-on {len(sw)} (restart {ms([r['restart'] for r in sw])}, over a core record"
            f" {sum(r['core'] for r in sw)}), not {len(calm)} (restart {ms([r['restart'] for r in calm])},"
            f" over a core record {sum(r['core'] for r in calm)})"
        )
    return out or ["    no restart"]


def run_dirs(d: Path) -> list[Path]:
    """An engine output dir itself, or the ``engine-N/`` dirs of a ``ppsim validate`` dir."""
    if not d.is_dir():
        raise PPSimError(f"{d}: not a directory; give ppsim engine or ppsim validate output dirs")
    if (d / "stage_loop.csv").is_file():
        return [d]
    runs = sorted(p for p in d.glob("engine-*") if p.is_dir())
    if not runs:
        raise PPSimError(f"{d}: no stage_loop.csv and no engine-N/ inside; give ppsim engine or validate output dirs")
    return runs


def report(d: Path, stage: int | None) -> list[str]:
    out = [f"== {d}"]
    for run in run_dirs(d):
        rows = read_loop(run / "stage_loop.csv")
        k = int(max((r["stage"] for r in rows), default=0)) if stage is None else stage
        out.append(f"  {run.name}: stage {k}, restarts by the step's requests (ms; parts: medians)")
        out += lines_of(restarts(rows, k, core_spans(run / "stage_ops.csv")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/stage_loop.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", type=int, default=None, help="the stage whose restarts to split (default: the last)")
    ap.add_argument("runs", nargs="+", help="ppsim engine output dirs or ppsim validate output dirs")
    args = ap.parse_args(argv)
    if args.stage is not None and args.stage < 0:
        ap.error(f"--stage: {args.stage} is negative; give a stage index, 0 for the first")
    return run_main(lambda: print("\n".join(line for d in args.runs for line in report(Path(d), args.stage))))


if __name__ == "__main__":
    raise SystemExit(main())
