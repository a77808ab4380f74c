"""Stage restarts on an input already sent, engine against simulator, by margin and by requests.

A stage past the first restarts on its next input where the stage before finished that step before it
freed (``ppsim.validate.path.restart_margins``). Per ``ppsim validate`` run dir, per engine repeat and for
the simulator: the median restart per bin of that margin (how early the input came) and per request count
of the step. What docs/validation.md part 21 reads: the engine's restart is flat in the margin and grows
with the requests; the profile's ``turnaround`` (``--profile``) is what the simulator charges.

Run: python experiments/validation/restarts.py [--profile DIR] RUN_DIR [...]
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

from experiments.validation.control_path import read_ops  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.cost.profiled import read_profile  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.validate.path import restart_margins  # noqa: E402

MARGIN_BINS_MS = (0.0, 0.2, 0.4, 0.6, 1.0, 2.0)  # lower edges; the last bin is open
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


def cells(groups: dict) -> str:
    return "  ".join(f"{k}: {statistics.median(v):.2f} ({len(v)})" for k, v in groups.items()) or "none"


def report(run: Path) -> list[str]:
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
        lines.append(f"  {p.name:9s} by margin (ms): {cells(by_margin(rows))}")
        lines.append(f"  {'':9s} by requests:    {cells(by_requests(rows))}")
    return lines


def show(args: argparse.Namespace) -> None:
    if args.profile is not None:
        t = read_profile(args.profile).fits.get("turnaround")
        coef = t.coef if t is not None else {"c0": 0.0, "c1": 0.0}
        per = f" + {coef['c1'] * 1e3:.4f} ms a request" if t is not None and t.x == "reqs" else ""
        print(f"profile turnaround: {coef['c0'] * 1e3:.3f} ms{per}")
    for run in map(Path, args.runs):
        if not run.is_dir():
            raise PPSimError(f"{run}: not a directory; give ppsim validate output dirs")
        print("\n".join(report(run)))


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/restarts.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="a calibration: print the turnaround it charges")
    ap.add_argument("runs", nargs="+", help="ppsim validate output dirs (engine-*/ and sim/ inside)")
    args = ap.parse_args(argv)
    return run_main(lambda: show(args))


if __name__ == "__main__":
    raise SystemExit(main())
