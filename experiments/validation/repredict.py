"""Finished ``ppsim validate`` runs predicted again with other profiles, side by side.

Each run dir's scenario is simulated with each ``--profile`` in turn (the run's own engine KV pool,
``replay_adjusted.prepared``) and compared with the engine runs' summaries it holds; per scenario the
mean TPOT and median E2EL errors, then per profile the median |error| over the scenarios of every
target metric (bubble in fraction points). What a change to calibration does to the same engine
runs; a profile calibrated after the runs is not a prediction made before them (say so).

Run: python experiments/validation/repredict.py --profile A [--profile B ...] RUN_DIR [...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from experiments.validation.replay_adjusted import prepared
from experiments.validation.runfiles import reading_run
from experiments.validation.tables import SHOWN as METRICS
from ppsim.cli import Parser, run_main
from ppsim.cost.profiled import read_profile
from ppsim.errors import PPSimError
from ppsim.validate.run import replay_with


def errors(d: Path, profile: str) -> dict[str, float]:
    v, prep = prepared(d, profile)
    return {r["metric"]: r["error"] for r in replay_with(prep, prep.cost, v["engine_summaries"])["rows"]}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/repredict.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="append", required=True, help="profile dir (repeat to compare)")
    ap.add_argument("dirs", nargs="+", help="finished validate output dirs")
    args = ap.parse_args(argv)
    return run_main(lambda: repredict(args))


def check_inputs(args: argparse.Namespace) -> None:
    """Every profile readable and every dir a finished validation, before the first replay."""
    for p in args.profile:
        read_profile(p)
    for d in args.dirs:
        if not (Path(d) / "validation.json").is_file():
            raise PPSimError(f"dirs: {d}: no validation.json; give finished `ppsim validate` output dirs")


def repredict(args: argparse.Namespace) -> int:
    check_inputs(args)
    table = {p: {m: [] for m in METRICS} for p in args.profile}
    for d in args.dirs:
        cells = []
        for p in args.profile:
            with reading_run(d):
                e = errors(Path(d), p)
            for m in METRICS:
                table[p][m].append(e[m])
            cells.append(f"TPOT {e['mean_tpot_ms']:+7.1%}  E2EL {e['median_e2el_ms']:+7.1%}")
        print(f"{Path(d).name[:40]:<40} " + " | ".join(cells), flush=True)
    print("\nmedian |error| over the scenarios (bubble in points)")
    print(f"{'profile':<40} " + " ".join(f"{m[:13]:>13}" for m in METRICS))
    for p in args.profile:
        med = {m: statistics.median(abs(x) for x in table[p][m]) for m in METRICS}
        cells = [f"{med[m]:>13.3f}" if m == "pipeline_bubble_fraction" else f"{med[m]:>13.1%}" for m in METRICS]
        print(f"{p[-40:]:<40} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
