"""What took a stage's core while it computed: a scheduler trace of an engine run, read against its computes.

On a CPU host the engine's processes share the cores: at PP = 2 on 2 vCPUs the engine core has no core of its
own, and a stage's compute is wall time on a core that other threads may take (a step's wall over its thread
CPU time, ``step_costs.csv``). This reads a ``perf`` record of every context switch during the run and, per
stage, every time the stage's main thread was switched out while still runnable (preempted) inside one of its
computes: which thread took the core, how often, for how long (until the stage's thread ran again, cut at the
compute's end). docs/engine.md, "What takes a stage's core", reads it.

Record and print (root, or ``perf_event_paranoid`` <= 1)::

    perf record -e sched:sched_switch -a -o run.perf -- ppsim validate --config C --repeats 1 --output-dir R
    perf script -i run.perf -F comm,pid,tid,cpu,time,event,trace > run.txt
    python experiments/validation/steals.py run.txt R/engine-0

The trace's clock and the engine's differ by an offset, found by search: the one that puts the stage's thread
on its core for the largest share of its computes' time (printed; near 1 when the offset is right, as a
compute is its thread running). The stages' threads are ``engine.json`` ``stage_pids`` (a process's main
thread has its pid); the engine core's process is ``core_pid`` (runs since 2026-12-07; named in the table).
Writes nothing.
"""

from __future__ import annotations

import bisect
import csv
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402

SWITCH = re.compile(
    r"\[(?P<cpu>\d+)\]\s+(?P<t>\d+\.\d+):\s+sched:sched_switch:\s+prev_comm=(?P<pc>.+?)\s+prev_pid=(?P<pp>\d+)"
    r"\s+prev_prio=\d+\s+prev_state=(?P<st>\S+)\s+==>\s+next_comm=(?P<nc>.+?)\s+next_pid=(?P<np>\d+)"
)
COARSE_S, FINE_S, EXACT_S = 1e-3, 2e-5, 1e-6  # the offset search's steps
VOTERS, BINS = 40, 10  # computes that vote for an offset; offsets searched around
SHOWN = 8  # threads listed per stage


@dataclass
class Thread:
    """One stage thread's record in the trace: its on-core spells and its preemptions."""

    on: list[tuple[float, float]] = field(default_factory=list)  # (switched in, switched out), trace clock
    taken: list[tuple[float, float, str]] = field(default_factory=list)  # (switched out runnable, back in, by)


def read_trace(path: Path, tids: set[int]) -> dict[int, Thread]:
    """``tids``' spells on their cores and their preemptions from a ``perf script`` of sched_switch events."""
    out = {t: Thread() for t in tids}
    since: dict[int, float] = {}  # tid -> switched in at
    pending: dict[int, tuple[float, str]] = {}  # tid -> (switched out runnable at, by whom)
    seen = 0
    with path.open(errors="replace") as fh:
        for line in fh:
            m = SWITCH.search(line)
            if m is None:
                continue
            seen += 1
            t, prev, nxt = float(m["t"]), int(m["pp"]), int(m["np"])
            if nxt in out:
                since[nxt] = t
                if nxt in pending:
                    t_out, by = pending.pop(nxt)
                    out[nxt].taken.append((t_out, t, by))
            if prev in out:
                if prev in since:
                    out[prev].on.append((since.pop(prev), t))
                if m["st"].startswith("R"):  # still runnable: preempted (or yielded)
                    pending[prev] = (t, f"{m['nc']} ({m['np']})")
                else:
                    pending.pop(prev, None)
    if not seen:
        raise PPSimError(
            f"{path}: no sched:sched_switch events; record with `perf record -e sched:sched_switch -a` and print "
            "with `perf script -F comm,pid,tid,cpu,time,event,trace`"
        )
    return out


def read_run(run: Path) -> tuple[list[int], int | None, dict[int, list[tuple[float, float]]]]:
    """An engine run dir's stage pids, the engine core's pid (None: not recorded) and each stage's computes."""
    info_f, ops_f = run / "engine.json", run / "stage_ops.csv"
    if not info_f.is_file() or not ops_f.is_file():
        raise PPSimError(f"{run}: no engine.json and stage_ops.csv; give an engine run dir (R/engine-0)")
    try:
        info = json.loads(info_f.read_text())
    except ValueError as e:
        raise PPSimError(f"{info_f}: not JSON ({e}); give an engine run dir") from None
    pids = info.get("stage_pids") if isinstance(info, dict) else None
    if not isinstance(pids, list) or not pids:
        raise PPSimError(f"{info_f}: no stage_pids; rerun the engine (every run records them)")
    comps: dict[int, list[tuple[float, float]]] = defaultdict(list)
    try:
        with ops_f.open() as fh:
            for r in csv.DictReader(fh):
                if r.get("kind") == "compute" and str(r.get("track", "")).startswith("stage"):
                    comps[int(r["track"][5:])].append((float(r["start_s"]), float(r["end_s"])))
    except (KeyError, TypeError, ValueError) as e:
        raise PPSimError(f"{ops_f}: not a stage_ops.csv ({type(e).__name__}: {e}); rerun the engine") from None
    return [int(p) for p in pids], info.get("core_pid"), {k: sorted(v) for k, v in comps.items()}


class OnCore:
    """How long a thread was on its core up to a time: the running sum over its spells."""

    def __init__(self, spells: list[tuple[float, float]]) -> None:
        self.starts = [a for a, _ in spells]
        self.ends = [b for _, b in spells]
        self.before = [0.0]
        for a, b in spells:
            self.before.append(self.before[-1] + b - a)

    def upto(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return 0.0
        return self.before[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]


def coverage(on: OnCore, comps: list[tuple[float, float]], offset: float) -> float:
    """The share of the computes' time (shifted by ``offset`` onto the trace's clock) the thread was on its core."""
    total = sum(b - a for a, b in comps)
    return sum(on.upto(b + offset) - on.upto(a + offset) for a, b in comps) / total if total > 0 else 0.0


def align(on: OnCore, comps: list[tuple[float, float]]) -> tuple[float, float]:
    """The offset (trace clock - engine clock) that maximises :func:`coverage`, and that coverage.

    Candidates are voted: a compute's start or end against a spell's start or end (over the first
    ``VOTERS`` computes, the trace's spells of at least half the compute), in ``COARSE_S`` bins; the
    ``BINS`` most voted are searched around at ``COARSE_S / 4``, the best then at ``FINE_S`` and ``EXACT_S``."""
    if not on.starts or not comps:
        raise PPSimError("the trace has no spell of the stage's thread, or the run no compute: not the same run?")
    votes: Counter[int] = Counter()
    for a, b in comps[:VOTERS]:
        for s, e in zip(on.starts, on.ends, strict=True):
            if e - s >= (b - a) / 2:
                votes[round((s - a) / COARSE_S)] += 1
                votes[round((e - b) / COARSE_S)] += 1
    grid = [(k + i / 4) * COARSE_S for k, _ in votes.most_common(BINS) for i in range(-8, 9)]
    share = lambda o: coverage(on, comps, o)  # noqa: E731
    best = max(grid, key=share)
    for step in (FINE_S, EXACT_S):
        best = max((best + i * step for i in range(-60, 61)), key=share)
    return best, share(best)


def stolen(th: Thread, comps: list[tuple[float, float]], offset: float) -> dict[str, list[float]]:
    """Who took the stage's core inside its computes -> the seconds each time (to the stage's return, cut at
    the compute's end)."""
    starts = [a + offset for a, _ in comps]
    out: dict[str, list[float]] = defaultdict(list)
    for t_out, t_back, by in th.taken:
        i = bisect.bisect_right(starts, t_out) - 1
        if i >= 0 and t_out < comps[i][1] + offset:
            out[by].append(min(t_back, comps[i][1] + offset) - t_out)
    return dict(out)


def report(trace: Path, run: Path) -> list[str]:
    pids, core, comps = read_run(run)
    threads = read_trace(trace, set(pids))
    lines = [f"== {run} against {trace}"]
    for k, pid in enumerate(pids):
        cs = comps.get(k, [])
        on = OnCore(threads[pid].on)
        offset, share = align(on, cs)
        took = stolen(threads[pid], cs, offset)
        total = sum(b - a for a, b in cs)
        lost = sum(sum(v) for v in took.values())
        lines.append(
            f"stage {k} (pid {pid}): {len(cs)} computes, {total * 1e3:.1f} ms; on its core {share:.1%} of it"
            f" (trace clock = engine clock + {offset:.6f} s); preempted inside them {sum(map(len, took.values()))}"
            f" times, {lost * 1e3:.1f} ms ({lost / total if total else 0:.1%})"
        )
        for by, ts in sorted(took.items(), key=lambda kv: -sum(kv[1]))[:SHOWN]:
            who = " (the engine core)" if core is not None and by.endswith(f"({core})") else ""
            median = sorted(ts)[len(ts) // 2]
            lines.append(f"  {by + who:40s} {len(ts):5d} times {sum(ts) * 1e3:8.1f} ms  median {median * 1e3:.3f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/steals.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="perf script output of the run's sched:sched_switch events")
    ap.add_argument("run", help="the engine run dir (engine.json, stage_ops.csv): R/engine-0 of ppsim validate")
    args = ap.parse_args(argv)

    def show() -> None:
        trace = Path(args.trace)
        if not trace.is_file():
            raise PPSimError(f"trace: {trace} is not a file; give perf script's output")
        print("\n".join(report(trace, Path(args.run))))

    return run_main(show)


if __name__ == "__main__":
    raise SystemExit(main())
