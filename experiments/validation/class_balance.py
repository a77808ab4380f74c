"""How a calibration's stage model prices the computes holding a prefill item against the decode computes, on
finished ``ppsim validate`` runs of it, two ways of fitting it compared (``glue_live.py``'s ways, ``--compare``).

Per run and way: (summed measured over summed predicted seconds of the stage computes holding a prefill item) over
(the same of the decode computes). 1 is both classes priced alike; under 1 the prefill computes are priced dear
against the decodes. The host's speed, common to both classes within a run, cancels, so the figure says how the
model prices one class against the other whatever the host did between calibration and the runs: what a glue form
that changes the prefill steps' price is meant to move (docs/validation.md part 31, read after its verdict (c)).

Each compute's prediction under a way is the run's recorded one (``step_costs.csv``: the run's own profile, its idle
and co-run charges included) plus that way's ``stage_time`` of the plan minus the run profile's; the plans are the
engine's (``engine-N/actions.csv``, every stage computing the plan that entered stage 0; an item of one token after
a prefix is read as a decode).

``--grid`` prints, instead of runs, each way's error on the calibration's own middle-stage plans ((measured -
predicted) / measured; ``*``: a plan of many prefill items, which the glue's fit leaves out): where part 31 found the
(1, tokens, requests) glue pricing ``P16@0x32`` over on every MoE calibration, without any validation run.

Run: python experiments/validation/class_balance.py --profile DIR [--compare before31:prestep] [--work DIR] RUN_DIR...
     python experiments/validation/class_balance.py --profile DIR --grid [--compare ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calibration.artifact import read_samples  # noqa: E402
from calibration.samples import multi_item, plan_of, stage_spec, value  # noqa: E402
from experiments.validation.glue_fit import check_refit_inputs  # noqa: E402
from experiments.validation.glue_live import COMPARES, refit_copy  # noqa: E402
from experiments.validation.replay_adjusted import prepared  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.cost.profiled import ProfiledCost, read_profile  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.models.shape import ModelShape  # noqa: E402
from ppsim.policy.plan import PlanItem, StepPlan, make_plan  # noqa: E402


def launched_plans(path: Path) -> dict[int, StepPlan]:
    """An engine run's ``actions.csv`` as step id -> the plan launched into stage 0."""
    plans = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            if int(r["stage"]) != 0:
                continue
            items = []
            for part in r["requests"].split():
                req, start, n = (int(x) for x in part.split(":"))
                prefill = r["kind"] == "prefill" or (r["kind"] == "mixed" and (n > 1 or start == 0))
                items.append(PlanItem(req, start, n, is_prefill=prefill, samples=True))
            plans[int(r["step"])] = make_plan(int(r["step"]), items)
    return plans


def balance(
    steps: list[dict[str, str]], plans: dict[int, dict[int, StepPlan]], stages: Any, costs: dict[str, Any], base: Any
) -> dict[str, float | None]:
    """Way -> (measured / predicted over the prefill-holding computes) / (the same over the decodes), each way's
    prediction the recorded one moved by its ``stage_time`` minus ``base``'s; None without both classes. ``steps``:
    ``step_costs.csv`` rows; ``plans``: run -> step id -> plan."""
    sums = {w: {True: [0.0, 0.0], False: [0.0, 0.0]} for w in costs}
    for r in steps:
        plan = plans.get(int(r["run"]), {}).get(int(r["step_id"]))
        if plan is None:
            continue
        stage = stages[int(r["stage"])]
        recorded, at_base = float(r["predicted_s"]), base.stage_time(stage, plan)
        prefill = int(r["num_prefill_tokens"]) > 0
        for w, cost in costs.items():
            s = sums[w][prefill]
            s[0] += float(r["measured_s"])
            s[1] += recorded + cost.stage_time(stage, plan) - at_base
    out: dict[str, float | None] = {}
    for w, s in sums.items():
        (mp, pp), (md, pd) = s[True], s[False]
        out[w] = (mp / pp) / (md / pd) if min(mp, pp, md, pd) > 0 else None
    return out


def recorded(run: Path) -> list[dict[str, str]]:
    """A run's ``step_costs.csv`` rows, once each engine repeat they name has its ``actions.csv`` (refused in one
    line before any refit otherwise)."""
    with (run / "step_costs.csv").open(newline="") as f:
        steps = list(csv.DictReader(f))
    for rep in sorted({int(r["run"]) for r in steps}):
        if not (run / f"engine-{rep}" / "actions.csv").is_file():
            raise PPSimError(f"runs: {run}: no engine-{rep}/actions.csv; give ppsim validate output dirs")
    return steps


def run_balance(run: Path, steps: list[dict[str, str]], profile: Path, refits: dict[str, Path]) -> dict[str, Any]:
    """:func:`balance` of one run, its own profile ``profile`` the base."""
    reps = sorted({int(r["run"]) for r in steps})
    plans = {rep: launched_plans(run / f"engine-{rep}" / "actions.csv") for rep in reps}
    _, prep = prepared(run, str(profile))
    costs = {w: prepared(run, str(p))[1].cost for w, p in refits.items()}
    return balance(steps, plans, prep.topology.stages, costs, prep.cost)


def grid_errors(profile: Path, refits: dict[str, Path]) -> list[tuple[str, bool, dict[str, float]]]:
    """Per middle-stage plan of ``profile``'s grid: its name, whether it holds many prefill items, and way -> (measured
    - predicted) / measured under that way's refit."""
    meta = json.loads((profile / "meta.json").read_text())
    shape, stat = ModelShape(**meta["model"]), meta.get("statistic", "median")
    costs = {w: ProfiledCost(read_profile(p), shape, None, 1) for w, p in refits.items()}
    out = []
    for r in read_samples(profile):
        if r["op"] != "stage_mid" or r["split"] != "stage":
            continue
        spec, plan, measured = stage_spec(r), plan_of(r["items"]), value(r, stat)
        errs = {w: (measured - c.stage_time(spec, plan)) / measured for w, c in costs.items()}
        out.append((str(r["plan"]), multi_item(r), errs))
    return out


def class_balance(args: argparse.Namespace) -> None:
    ways = tuple(args.compare.split(":"))
    if not args.runs and not args.grid:
        raise PPSimError("runs: none given; give ppsim validate output dirs of the calibration, or --grid")
    check_refit_inputs(args, ways, ("validation.json", "step_costs.csv"), "a calibration with live runs")
    steps = {run: recorded(run) for run in map(Path, args.runs)}
    refits = {w: refit_copy(Path(args.profile), Path(args.work) / w, w) for w in ways}
    if args.grid:
        print(
            "the grid's middle-stage plans, (measured - predicted) / measured (*: many prefill items, out of the fit)"
        )
        for plan, many, errs in grid_errors(Path(args.profile), refits):
            shown = ", ".join(f"{w} {e:+.1%}" for w, e in errs.items())
            print(f"{plan}{' *' if many else ''}: {shown}")
    if steps:
        print("prefill computes' measured / predicted over the decodes' (1: priced alike)")
    for run, rows in steps.items():
        got = run_balance(run, rows, Path(args.profile), refits)
        shown = ", ".join(f"{w} {'-' if v is None else f'{v:.3f}'}" for w, v in got.items())
        print(f"{run}: {shown}")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/class_balance.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="ppsim validate output dirs of one calibration")
    ap.add_argument("--profile", required=True, help="that calibration")
    ap.add_argument("--compare", choices=COMPARES, default="before31:prestep", help="the two ways, base:new")
    ap.add_argument("--work", default="/tmp/ppsim-class-balance", help="where the two refitted copies go")
    ap.add_argument("--grid", action="store_true", help="also each way's error on the calibration's own stage plans")
    args = ap.parse_args(argv)
    return run_main(lambda: class_balance(args))


if __name__ == "__main__":
    sys.exit(main())
