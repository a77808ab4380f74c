"""The stage glue fitted two ways, on finished ``ppsim validate`` runs: least squares in seconds and
in relative error (``glue_fits.fit_stage_glue``'s default since 2026-12-01, when the operators were
first timed cold; the seconds form was the default before, docs/calibration.md "The glue's fit").

The profile the runs were predicted with is refitted from its own ``samples.csv`` both ways (copies
under ``--work``; the engine runs take no part in either fit). Per way, it prints:

- the step-level error: every engine stage compute of the runs (``step_costs.csv``) against the
  prediction with that way's glue. The glue depends only on the stage and the step's token and
  request counts, so the recorded prediction is moved by each way's glue minus the glue of the
  profile as it was (``--profile``'s own ``fits.json``, what the runs were predicted with; the
  operators refitted by the current code must be the profile's own, so for a profile calibrated before
  the operators' fitting last changed, 2026-12-01, trust the replay below, not this); runs recorded
  while the simulator charged the profile's ``live_stage`` factor (2026-11-30, until commit 421d23a:
  held-out seeds 21-24, dense-1024 seed 21, the MoE runs of that day) need ``--recorded-with-live``
  to take it off first (the stage time for that is taken on a plan rebuilt from the row's counts);
- the replay: each scenario simulated with that way's profile, against the engine's summaries
  (``ppsim.validate.run.replay_with``), median |error| over the scenarios per metric.

Run: python experiments/validation/glue_fit.py --profile DIR [--recorded-with-live] RUN_DIR [...]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from calibration import calibrate as cal
from experiments.validation.replay_adjusted import prepared
from experiments.validation.runfiles import reading_run
from experiments.validation.tables import RELATIVE as METRICS  # the latency metrics, bubble apart
from ppsim.cli import Parser, run_main
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import ProfiledCost, read_profile
from ppsim.errors import PPSimError
from ppsim.models.shape import load_model
from ppsim.outputs import check_apart, check_output_dir
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.validate.run import replay_with

WAYS = ("seconds", "relative")
GLUES = ("layer_glue", "first_glue", "last_glue")


def refit_copy(profile: Path, dst: Path, way: str) -> Path:
    """``profile`` copied to ``dst`` and refitted with the glue fitted ``way``."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(profile, dst)
    cal.refit(str(dst), relative_glue=way == "relative")
    return dst


def approx_plan(T: int, R: int, P: int, ctx: int) -> Any:
    """A plan with the row's counts: its decodes share the context evenly, its prefill starts at 0."""
    nd = R - (1 if P else 0)
    items = [PlanItem(i, max(ctx // max(nd, 1) - 1, 0), 1, False, True) for i in range(nd)]
    if P:
        items.append(PlanItem(nd, 0, P, True, True))
    return make_plan(0, items)


def step_errors(
    run: Path, base: ProfiledCost, costs: dict[str, ProfiledCost], with_live: bool
) -> dict[str, list[float]]:
    """Per way, every stage compute's (predicted - measured) / measured (``base``: the profile the
    runs were predicted with)."""
    v = json.loads((run / "validation.json").read_text())
    pp = int(v["scenario"]["cluster"]["pipeline_parallel_size"])
    per_stage = base.shape.num_layers // pp
    live = base.f["live_stage"].at(float(min(pp, 2))) if with_live and "live_stage" in base.f else 1.0
    out: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in csv.DictReader((run / "step_costs.csv").open()):
        T, R, P, st = int(r["num_tokens"]), int(r["num_reqs"]), int(r["num_prefill_tokens"]), int(r["stage"])
        spec = StageSpec(st, st * per_stage, (st + 1) * per_stage, st == 0, st == pp - 1)
        measured, recorded = float(r["measured_s"]), float(r["predicted_s"])
        if live != 1.0:
            recorded -= (live - 1.0) * base.stage_time(spec, approx_plan(T, R, P, int(r["decode_ctx_tokens"])))
        for way, cost in costs.items():
            shift = spec.num_layers * (cost.f["layer_glue"].tok_req(T, R) - base.f["layer_glue"].tok_req(T, R))
            if spec.is_first:
                shift += cost.f["first_glue"].tok_req(T, R) - base.f["first_glue"].tok_req(T, R)
            if spec.is_last:
                shift += cost.f["last_glue"].tok_req(T, R) - base.f["last_glue"].tok_req(T, R)
            out[way].append((recorded + shift - measured) / measured)
    return out


def replay_errors(run: Path, profiles: dict[str, Path]) -> dict[str, dict[str, float]]:
    out = {}
    for way, prof in profiles.items():
        v, prep = prepared(run, str(prof))
        rows = replay_with(prep, prep.cost, v["engine_summaries"])["rows"]
        out[way] = {r["metric"]: r["error"] for r in rows if r["metric"] in (*METRICS, "pipeline_bubble_fraction")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/glue_fit.py", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="ppsim validate output dirs predicted with --profile")
    ap.add_argument("--profile", required=True, help="the calibration the runs were predicted with")
    ap.add_argument("--work", default="/tmp/ppsim-glue-fit", help="where the two refitted copies go")
    ap.add_argument("--recorded-with-live", action="store_true", help="the runs' predictions charged live_stage")
    args = ap.parse_args(argv)
    return run_main(lambda: glue_fit(args))


def check_inputs(args: argparse.Namespace) -> None:
    """The profile (readable, with its samples), the run dirs and ``--work`` (the two copies replaced
    there may not be or hold an input), before any refit."""
    check_refit_inputs(
        args, WAYS, ("validation.json", "step_costs.csv"), "the calibration the runs were predicted with"
    )


def check_refit_inputs(
    args: argparse.Namespace, ways: tuple[str, ...], run_files: tuple[str, ...], profile_what: str
) -> dict[str, str]:
    """``--profile`` (readable, with its samples), the run dirs (each with ``run_files``) and ``--work``
    (``work/WAY`` for each of ``ways`` is replaced whole, so it may not be or hold an input), each refused in
    one line naming its flag (``profile_what`` says what to give); returns the inputs by flag."""
    dirs = [("--profile", args.profile, ("samples.csv", "meta.json"))]
    dirs += [("runs", d, run_files) for d in args.runs]
    for flag, d, need in dirs:
        missing = [f for f in need if not (Path(d) / f).is_file()]
        if missing:
            what = profile_what if flag == "--profile" else "ppsim validate output dirs"
            raise PPSimError(f"{flag}: {d}: no {' or '.join(missing)}; give {what}")
    read_profile(args.profile)
    inputs = {"--profile": args.profile, **{f"runs {d}": d for d in args.runs}}
    work = check_output_dir(args.work, "--work", replace=False, inputs=inputs)
    for w in ways:
        check_apart(work / w, "--work", inputs)  # refit_copy replaces work/WAY whole
        if (work / w).exists() and not (work / w).is_dir():
            raise PPSimError(f"--work: {work / w} exists and is not a directory; remove it or pick another --work")
    return inputs


def glue_fit(args: argparse.Namespace) -> None:
    check_inputs(args)
    meta = json.loads((Path(args.profile) / "meta.json").read_text())
    model = json.loads((Path(args.runs[0]) / "validation.json").read_text())["scenario"]["model"]
    shape = load_model(model)
    profiles = {w: refit_copy(Path(args.profile), Path(args.work) / w, w) for w in WAYS}
    tp = int(meta.get("tp", 1))
    base = ProfiledCost(read_profile(args.profile), shape, None, tp)
    costs = {w: ProfiledCost(read_profile(p), shape, None, tp) for w, p in profiles.items()}
    steps: dict[str, list[float]] = {w: [] for w in WAYS}
    replays: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    for run in map(Path, args.runs):
        with reading_run(run, "runs"):
            for w, errs in step_errors(run, base, costs, args.recorded_with_live).items():
                steps[w] += errs
            for w, errs in replay_errors(run, profiles).items():
                replays[w].append(errs)
    print(f"{len(args.runs)} runs, {len(steps[WAYS[0]])} engine stage computes; glue fitted in seconds -> relative")
    for w in WAYS:
        c = {k: v * 1e6 for k, v in costs[w].f["layer_glue"].coef.items()}
        print(f"  layer_glue {w:8s}: c0 {c['c0']:7.1f} us, tok {c['tok']:6.2f} us, req {c['req']:6.2f} us")
    med = {w: (statistics.median(map(abs, steps[w])), statistics.median(steps[w])) for w in WAYS}
    print("  step-level median |error| (signed): " + " -> ".join(f"{a:.1%} ({s:+.1%})" for a, s in med.values()))
    for m in (*METRICS, "pipeline_bubble_fraction"):
        vals = [statistics.median(abs(x[m]) for x in replays[w]) for w in WAYS]
        unit = "{:.3f} pts" if m == "pipeline_bubble_fraction" else "{:.1%}"
        print(f"  {m:26s} " + " -> ".join(unit.format(v) for v in vals))


if __name__ == "__main__":
    sys.exit(main())
