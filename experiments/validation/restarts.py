"""Stage restarts on an input already sent, engine against simulator, by margin and by requests.

A stage past the first restarts on its next input where the stage before finished that step before it
freed (``ppsim.validate.path.restart_margins``). Per ``ppsim validate`` run dir, per engine repeat and for
the simulator: the median restart per bin of that margin (how early the input came) and per request count
of the step. What docs/validation.md part 21 reads: the engine's restart is flat in the margin and grows
with the requests; the profile's ``turnaround`` (``--profile``) is what the simulator charges.

``--calibration PROFILE`` reads the calibration run's restarts one by one (``turnaround_each`` rows of
``samples.csv``, calibrations since 2026-12-05 evening): that sample is bimodal (a fast mode at 0.14-0.30 ms
beside the runs' 0.5-0.8 ms, docs/validation.md part 21; part 24 found it right after a hand-over), and each
restart's fast or slow side (under or over
``FAST_MS``) is set against what might set it: the step's requests and prefill tokens, how early its input came,
the stage's compute before (seconds, prefill or not), when the core's schedule of the step ended, and when in
the run it fell; then the restarts by requests, back-to-back (the stage's previous compute a restart too:
``path_fits.back_to_back``, what part 24's line is fitted on) apart from those right after a hand-over, where the
fast mode sits. Calibrations since 2026-12-06 also carry each restart's parts from the engine's stage-loop
record (the hand-on of the previous outputs, switched out or not; the control messages; the receive), printed by
requests (``experiments/validation/stage_loop.py`` gives the same split for an engine or validate run).

Per run it also splits the restarts by what the restarted step is (a prefill step, a decode right after the
stage's prefill compute, a decode after a decode); ``--pool`` pools those over the runs of one name (every
round's ``b8``, say), engine repeats apart from the simulator: what docs/validation.md part 41's follow-up reads.

Run: python experiments/validation/restarts.py [--profile DIR] [--calibration DIR] [--pool] [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calibration.artifact import read_samples  # noqa: E402
from calibration.path_fits import back_to_back  # noqa: E402
from experiments.validation.control_path import read_ops  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.cost.profiled import read_profile  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.metrics.records import OpRecord  # noqa: E402
from ppsim.validate.path import restart_margins, restart_records  # noqa: E402

MARGIN_BINS_MS = (0.0, 0.2, 0.4, 0.6, 1.0, 2.0)  # lower edges; the last bin is open
FAST_MS = 0.4  # between the calibration sample's two modes (p10 0.14-0.30 ms; the runs' 0.5-0.8 ms)
EACH = ("reqs", "chunk", "gap_s", "median_s", "prev_s", "prev_prefill", "at_s")  # turnaround_each columns read
NEEDED = ("track", "kind", "step_id", "start_s", "end_s", "num_tokens", "num_reqs")  # stage_ops.csv's columns read


def by_margin(rows: list[tuple[int, int, float, float]]) -> dict[float, list[float]]:
    """Lower edge of the margin bin (ms) -> restarts (ms) in it."""
    out: dict[float, list[float]] = defaultdict(list)
    for _, _, margin, t in rows:
        edge = max(e for e in MARGIN_BINS_MS if margin * 1e3 >= e)
        out[edge].append(t * 1e3)
    return dict(sorted(out.items()))


def by_requests(rows: list[tuple[int, int, float, float]]) -> dict[int, list[float]]:
    """Requests of the step -> restarts (ms)."""
    out: dict[int, list[float]] = defaultdict(list)
    for _, reqs, _, t in rows:
        out[reqs].append(t * 1e3)
    return dict(sorted(out.items()))


KINDS = ("prefill", "decode after a prefill", "decode")  # what the restarted step is, and the compute before it


def by_kind(ops: list[OpRecord]) -> dict[str, list[float]]:
    """What the restarted step is -> restarts (ms): a prefill step (any prefill tokens), a decode right after
    the stage's prefill compute, or a decode after a decode (docs/validation.md part 41's follow-up)."""
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in restart_records(ops):
        kind = KINDS[0] if r["prefill_tokens"] > 0 else KINDS[1] if r["prev_prefill_tokens"] > 0 else KINDS[2]
        out[kind].append(r["restart_s"] * 1e3)
    return {k: v for k, v in out.items() if v}


def cells(groups: dict) -> str:
    return "  ".join(f"{k}: {statistics.median(v):.2f} ({len(v)})" for k, v in groups.items()) or "none"


def report(run: Path, pooled: dict[str, dict[str, list[float]]] | None = None) -> list[str]:
    """Per engine repeat and the simulator of a validate run: the restarts by margin, requests and step kind;
    with ``pooled``, each part's by-kind restarts are added under ``engine`` or ``sim`` of the run's name."""
    parts = sorted(p for p in run.iterdir() if p.is_dir() and (p.name.startswith("engine-") or p.name == "sim"))
    if not parts:
        raise PPSimError(f"{run}: no engine-*/ or sim/ run inside; give ppsim validate output dirs")
    lines = [f"== {run}"]
    for p in parts:
        f = p / "stage_ops.csv"
        if not f.is_file():
            raise PPSimError(f"{f}: missing; validate writes it (rerun ppsim validate)")
        try:
            with f.open() as fh:
                head = fh.readline().strip().split(",")
            if missing := [c for c in NEEDED if c not in head]:
                raise KeyError(", ".join(missing))
            ops = read_ops(f)
        except (KeyError, ValueError) as e:
            raise PPSimError(f"{f}: not a stage_ops.csv ({type(e).__name__}: {e}); rerun ppsim validate") from None
        rows = restart_margins(ops)
        kinds = by_kind(ops)
        lines.append(f"  {p.name:9s} by margin (ms): {cells(by_margin(rows))}")
        lines.append(f"  {'':9s} by requests:    {cells(by_requests(rows))}")
        lines.append(f"  {'':9s} by step kind:   {cells(kinds)}")
        if pooled is not None:
            side = pooled.setdefault(f"{run.name} {'sim' if p.name == 'sim' else 'engine'}", {})
            for k, v in kinds.items():
                side.setdefault(k, []).extend(v)
    return lines


def pooled_lines(pooled: dict[str, dict[str, list[float]]]) -> list[str]:
    """The by-kind restarts pooled over the runs of one name (e.g. every round's ``b8``), engine and simulator."""
    lines = ["== pooled by run name (median ms (restarts), p25-p75)"]
    for name, kinds in sorted(pooled.items()):
        text = "  ".join(f"{k}: {statistics.median(v):.2f} ({len(v)}) {_iqr(v)}" for k in KINDS if (v := kinds.get(k)))
        lines.append(f"  {name:14s} {text or 'none'}")
    return lines


def _iqr(xs: list[float]) -> str:
    if len(xs) < 2:
        return ""
    q = statistics.quantiles(xs, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


def restart_rows(profile: str) -> tuple[list[dict], list[dict]]:
    """The ``turnaround_each`` rows of a calibration's ``samples.csv``, and its wide run's (``turnaround_wide``,
    calibrations since docs/validation.md part 26; none before)."""
    d = Path(profile)
    if not (d / "samples.csv").is_file():
        raise PPSimError(f"--calibration {profile}: no samples.csv there; give a ppsim calibrate output dir")
    samples = read_samples(d)
    rows = [r for r in samples if r["op"] == "turnaround_each"]
    if not rows:
        raise PPSimError(
            f"--calibration {profile}: no turnaround_each rows (calibrations record them since 2026-12-05); "
            "recalibrate to read the restarts one by one"
        )
    if missing := [c for c in EACH if any(c not in r for r in rows)]:
        raise PPSimError(f"--calibration {profile}: turnaround_each rows without {', '.join(missing)}; recalibrate")
    return rows, [r for r in samples if r["op"] == "turnaround_wide"]


def side_lines(rows: list[dict]) -> list[str]:
    """Per side (fast / slow) the medians of what might set a restart, then the fast share by requests."""

    lines = [f"restarts {len(rows)}; fast (< {FAST_MS} ms) {sum(r['median_s'] * 1e3 < FAST_MS for r in rows)}"]
    for name, sel in (("fast", True), ("slow", False)):
        rs = [r for r in rows if (r["median_s"] * 1e3 < FAST_MS) == sel]
        if not rs:
            lines.append(f"  {name}: none")
            continue
        lags = [r["core_lag_s"] * 1e3 for r in rs if "core_lag_s" in r]
        ms = {k: _med([r[k] * 1e3 for r in rs]) for k in ("median_s", "gap_s", "prev_s")}
        lines.append(
            f"  {name}: {len(rs)}  restart {ms['median_s']} ms  reqs {_med([r['reqs'] for r in rs])}"
            f"  input early by {ms['gap_s']} ms  compute before {ms['prev_s']} ms"
            f"  after a prefill {sum(r['prev_prefill'] > 0 for r in rs) / len(rs):.2f}"
            f"  prefill step {sum(r['chunk'] > 0 for r in rs) / len(rs):.2f}"
            f"  core schedule end after free {_med(lags)} ms  at {_med([r['at_s'] for r in rs])} s"
        )
    share = "  ".join(
        f"{k}: {sum(t < FAST_MS for t in v) / len(v):.2f} ({len(v)})" for k, v in each_by_requests(rows).items()
    )
    lines.append(f"  fast share by requests: {share}")
    lines += part_lines(rows)
    b2b = back_to_back(rows)
    ids = {id(r) for r in b2b}
    for name, sel in (("back-to-back", b2b), ("after a hand-over", [r for r in rows if id(r) not in ids])):
        fast = sum(r["median_s"] * 1e3 < FAST_MS for r in sel)
        lines.append(f"  {name} ({len(sel)}, fast {fast}) by requests: {cells(each_by_requests(sel))}")
    return lines


def part_lines(rows: list[dict]) -> list[str]:
    """The restarts' parts from the engine's stage-loop record (calibrations since 2026-12-06: ``out_s``,
    ``out_switched``, ``ctrl_s``, ``recv_wait_s``), by requests: medians (ms), and the restarts whose hand-on
    was switched out; none for rows without them."""
    parts = [r for r in rows if "out_s" in r]
    out = []
    for n, sel in sorted(_by_reqs(parts).items()):
        sw = [r["median_s"] * 1e3 for r in sel if r["out_switched"] > 0]
        calm = [r["median_s"] * 1e3 for r in sel if r["out_switched"] <= 0]
        med = {k: statistics.median(r[k] * 1e3 for r in sel) for k in ("median_s", "out_s", "ctrl_s", "recv_wait_s")}
        out.append(
            f"  parts at {n} requests ({len(sel)}): restart {med['median_s']:.3f} ms = hand-on {med['out_s']:.3f}"
            f" + control messages {med['ctrl_s']:.3f} + receive {med['recv_wait_s']:.3f} + rest (medians);"
            f" hand-on switched out in {len(sw)} (restart {_med(sw)}), not in {len(calm)} (restart {_med(calm)})"
        )
    return out


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f}" if xs else "-"


def _by_reqs(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        out[int(r["reqs"])].append(r)
    return out


def each_by_requests(rows: list[dict]) -> dict[int, list[float]]:
    """Requests of the step -> restarts (ms) of ``turnaround_each`` rows, by request count."""
    return {n: [r["median_s"] * 1e3 for r in sel] for n, sel in sorted(_by_reqs(rows).items())}


def show(args: argparse.Namespace) -> None:
    if args.calibration is not None:
        rows, wide = restart_rows(args.calibration)
        print(f"== calibration {args.calibration}")
        print("\n".join(side_lines(rows)))
        if wide:  # the wide run's restarts, micro-batches of 1-32 requests
            print(f"  wide run ({len(wide)}) by requests: {cells(each_by_requests(wide))}")
    if args.profile is not None:
        t = read_profile(args.profile).fits.get("turnaround")
        coef = t.coef if t is not None else {"c0": 0.0, "c1": 0.0}
        per = f" + {coef['c1'] * 1e3:.4f} ms a request" if t is not None and t.x == "reqs" else ""
        print(f"profile turnaround: {coef['c0'] * 1e3:.3f} ms{per}")
    pooled: dict[str, dict[str, list[float]]] | None = {} if args.pool else None
    for run in map(Path, args.runs):
        if not run.is_dir():
            raise PPSimError(f"{run}: not a directory; give ppsim validate output dirs")
        print("\n".join(report(run, pooled)))
    if pooled:
        print("\n".join(pooled_lines(pooled)))


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/restarts.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="a calibration: print the turnaround it charges")
    ap.add_argument("--calibration", help="a calibration: its run's restarts one by one, fast against slow")
    ap.add_argument(
        "--pool", action="store_true", help="also pool the restarts by step kind over the runs of one name (b1, ...)"
    )
    ap.add_argument("runs", nargs="*", help="ppsim validate output dirs (engine-*/ and sim/ inside)")
    args = ap.parse_args(argv)
    if not args.runs and args.calibration is None:
        ap.error("give ppsim validate output dirs, --calibration DIR, or both")
    return run_main(lambda: show(args))


if __name__ == "__main__":
    raise SystemExit(main())
