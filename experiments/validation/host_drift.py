"""How far this host's speed moves between engine runs: the noise floor under a validation's errors.

``--cycles`` cycles, each: one paired co-run reading (:func:`calibration.corun.profile_corun`: middle
stage steps with a second stage process computing on the other core and without, which also times the
steps alone), then ``ppsim validate`` of one scenario once at each ``--pp`` depth against one profile.
Per cycle: the co-run reading, the host's speed (the steps alone over the profile's prediction of the
same plans) and each depth's step level (the engine's stage computes against the profile's prediction
for the same plans, idle and co-run charges included: sum predicted / sum measured - 1, the
``step_costs.csv`` of ``validate``). At the end: each level's range over the cycles, and the
correlation of the readings with the levels, i.e. whether a reading taken just before a run could
correct its prediction. With ``--sampler``, also the host's speed *during* each run and for six
seconds before the cycle's runs (:mod:`host_sampler`: one small matmul timed every 0.25 s beside the
engine), its correlation with the levels, and each level's spread once scaled one for one by its run's
sampler reading. Writes ``cycles.csv`` and ``host_drift.md`` to ``--out`` (each cycle's validation
under ``--out/runs/``). Meaningful only with nothing else running.

Run: python experiments/validation/host_drift.py --config SCENARIO --profile DIR --out DIR [--cycles 7] [--pp 1 2]
     [--sampler]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.metrics.io import atomic_write  # noqa: E402

PLANS = ("D1x128", "D8x128", "P64@0")  # calibration.corun's plans
MAX_CYCLES = 100  # each a co-run reading and a validation per depth: hours
IDLE_SAMPLE_S = 6.0  # the sampler's reading with the engine idle, before each cycle's runs


def step_level(step_costs_csv: str) -> float:
    """Sum of predicted over sum of measured stage computes, minus one (negative: the engine was slower)."""
    rows = list(csv.DictReader(io.StringIO(step_costs_csv)))
    measured = sum(float(r["measured_s"]) for r in rows)
    return sum(float(r["predicted_s"]) for r in rows) / measured - 1.0 if measured > 0 else math.nan


def correlation(xs: list[float], ys: list[float]) -> float:
    """Pearson's r; nan when either side does not vary or there are fewer than three pairs."""
    try:
        return statistics.correlation(xs, ys) if len(xs) >= 3 else math.nan
    except statistics.StatisticsError:
        return math.nan


def summary_md(rows: list[dict[str, Any]], depths: list[int], command: str) -> str:
    """The cycles table, each level's range, and the readings' correlations with the levels."""
    lines = [
        "# Host drift: one scenario validated cycle after cycle",
        "",
        f"Command: `{command}`. Level = sum of predicted / sum of measured stage computes - 1 (negative: the",
        "engine slower than the profile). Speed = the steps alone over the profile's prediction.",
        "",
        "| cycle | s since start | co-run | speed | " + " | ".join(f"level PP={p}" for p in depths) + " |",
        "|---|---|---|---|" + "---|" * len(depths),
    ]
    for r in rows:
        levels = " | ".join(f"{r[f'level_pp{p}']:+.3f}" for p in depths)
        lines.append(f"| {r['cycle']} | {r['t_s']:.0f} | {r['corun']:.3f} | {r['speed']:.3f} | {levels} |")
    lines += ["", "| level | min | median | max | r with co-run | r with speed |", "|---|---|---|---|---|---|"]
    series = {f"PP={p}": [r[f"level_pp{p}"] for r in rows] for p in depths}
    if len(depths) > 1:
        lo, hi = depths[0], depths[-1]
        series[f"PP={hi} - PP={lo}"] = [r[f"level_pp{hi}"] - r[f"level_pp{lo}"] for r in rows]
    co, speed = [r["corun"] for r in rows], [r["speed"] for r in rows]
    for name, ys in series.items():
        lines.append(
            f"| {name} | {min(ys):+.3f} | {statistics.median(ys):+.3f} | {max(ys):+.3f} | "
            f"{correlation(co, ys):+.2f} | {correlation(speed, ys):+.2f} |"
        )
    if "sampler_idle_ms" in rows[0]:
        lines += sampler_md(rows, depths)
    return "\n".join(lines) + "\n"


def sampler_md(rows: list[dict[str, Any]], depths: list[int]) -> list[str]:
    """The in-run sampler against each depth's level: correlations, and the level's spread (population
    standard deviation over the cycles) before and after scaling it one for one by the sampler:
    ``(1 + level) * sampler / median(sampler) - 1``, i.e. as if every run had the median host."""
    idle = [r["sampler_idle_ms"] for r in rows]
    lines = [
        "",
        "In-run sampler (ms per sample; `before`: six seconds with the engine idle, just before the cycle's runs):",
        "",
        "| level | sampler during the run: min / median / max | r with it | r with the one before | "
        "level sd | sd scaled by it |",
        "|---|---|---|---|---|---|",
    ]
    for p in depths:
        xs, ys = [r[f"sampler_pp{p}_ms"] for r in rows], [r[f"level_pp{p}"] for r in rows]
        mid = statistics.median(xs)
        scaled = [(1 + y) * x / mid - 1 for x, y in zip(xs, ys, strict=True)]
        lines.append(
            f"| PP={p} | {min(xs):.2f} / {mid:.2f} / {max(xs):.2f} | {correlation(xs, ys):+.2f} | "
            f"{correlation(idle, ys):+.2f} | {statistics.pstdev(ys):.3f} | {statistics.pstdev(scaled):.3f} |"
        )
    return lines


def _reading(stages: Any, shape: Any, cost: Any, stack: int) -> tuple[float, float]:
    """(co-run: median over plans of with / alone, speed: median over plans of alone / the profile's prediction)."""
    import numpy as np

    from calibration.corun import profile_corun
    from calibration.profile_ops import parse_plan
    from calibration.samples import plan_of_seqs
    from ppsim.cost.base import StageSpec

    rows = {r["plan"]: r for r in profile_corun(stages, shape, shape.dtype, rounds=3)}
    spec = StageSpec(0, stages.start, stages.start + stack, False, False)
    speeds = []
    for p in PLANS:
        seqs = parse_plan(p, np.random.default_rng(0))
        predicted = cost.stage_time(spec, plan_of_seqs(seqs))
        speeds.append(rows[p]["alone_s"] / predicted)
    return statistics.median(r["median_s"] / r["alone_s"] for r in rows.values()), statistics.median(speeds)


def _sampler(shape: Any, folder: Path) -> Any:
    """name -> a HostSampler of this model's MLP shape writing to ``folder/name.txt``."""
    from engine.host_sampler import HostSampler

    folder.mkdir(parents=True, exist_ok=True)
    return lambda name: HostSampler(shape.hidden_size, shape.intermediate_size, folder / f"{name}.txt")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = Parser(prog="experiments/validation/host_drift.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="scenario file (TOML/YAML/JSON), e.g. a run's engine-0/config.json")
    ap.add_argument("--profile", required=True, help="calibration artifact of this host")
    ap.add_argument("--out", required=True, help="directory for cycles.csv, host_drift.md and runs/")
    ap.add_argument("--cycles", type=int, default=7, help="readings + validations (default 7)")
    ap.add_argument("--pp", type=int, nargs="+", default=[1, 2], help="pipeline depths validated each cycle")
    ap.add_argument("--sampler", action="store_true", help="time the host during each run (host_sampler.py)")
    args = ap.parse_args(argv)
    if not 1 <= args.cycles <= MAX_CYCLES:
        ap.error(f"--cycles: {args.cycles} is not within [1, {MAX_CYCLES}]; each cycle is a reading and a validation")
    if min(args.pp) < 1 or len(set(args.pp)) < len(args.pp):
        ap.error(f"--pp: {' '.join(map(str, args.pp))}; give distinct pipeline depths of 1 or more, such as 1 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(lambda: cycles(args, argv))


def cycles(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The inputs checked (``--out``, the scenario, the profile, each depth), then the cycles and the summary."""
    from ppsim.config import build_scenario
    from ppsim.cost.profiled import ProfiledCost, check_shape, read_profile
    from ppsim.deployment import prepare
    from ppsim.models.shape import load_model
    from ppsim.outputs import check_output_dir

    inputs = {"--config": args.config, "--profile": args.profile}
    out = check_output_dir(args.out, "--out", names=("cycles.csv", "host_drift.md"), replace=False, inputs=inputs)
    base = build_scenario(args.config, {"cost": {"kind": "profile", "profile_dir": args.profile}})
    shape = load_model(base.model)
    profile = read_profile(args.profile)
    check_shape(profile, shape, args.profile)
    cost = ProfiledCost(profile, shape, None, 1)
    for p in args.pp:  # each depth as validated below: one that the model or the policy cannot take, now
        try:
            prepare(base.model_copy(update={"cluster": base.cluster.model_copy(update={"pipeline_parallel_size": p})}))
        except PPSimError as err:
            raise PPSimError(f"--pp {p}: {err}") from None
    import torch

    from calibration.layer import TORCH_DTYPES
    from calibration.stage_step import EngineStages
    from ppsim.validate.host import HostGuard
    from ppsim.validate.run import validate

    torch.set_num_threads(1)
    stack = max(1, shape.num_layers // max(args.pp))
    stages = EngineStages(shape, TORCH_DTYPES[shape.dtype], torch.device("cpu"), stack)
    sampled = _sampler(shape, out / "sampler") if args.sampler else None
    t0, rows = time.monotonic(), []
    for i in range(args.cycles):
        corun, speed = _reading(stages, shape, cost, stack)
        row: dict[str, Any] = {"cycle": i, "t_s": time.monotonic() - t0, "corun": corun, "speed": speed}
        if sampled:
            with sampled(f"cycle{i}-idle") as sm:
                time.sleep(IDLE_SAMPLE_S)
            row["sampler_idle_ms"] = sm.stats()["mean_s"] * 1e3
        for p in args.pp:
            s = base.model_copy(update={"cluster": base.cluster.model_copy(update={"pipeline_parallel_size": p})})
            d = out / "runs" / f"cycle{i}-pp{p}"
            with sampled(f"cycle{i}-pp{p}") if sampled else contextlib.nullcontext() as sm:
                validate(s, d, 1, log=lambda m: None, host=HostGuard("off"))
            row[f"level_pp{p}"] = step_level((d / "step_costs.csv").read_text())
            if sampled:
                row[f"sampler_pp{p}_ms"] = sm.stats()["mean_s"] * 1e3
        rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write(out / "cycles.csv", buf.getvalue())
    command = "python experiments/validation/host_drift.py " + " ".join(sys.argv[1:] if argv is None else argv)
    md = summary_md(rows, args.pp, command)
    atomic_write(out / "host_drift.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
