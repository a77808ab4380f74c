"""The cost model's step-level error by plan class: prefill, mixed and decode steps apart.

``runs DIR [DIR ...]``: for each finished ``ppsim validate`` output (``step_costs.csv``; a parent of
several is searched one level down) the median step-level error (thread CPU time, as calibration
times) of its pure-prefill, mixed and decode computes, and prefill + mixed minus decode: within one
scenario the host's speed level cancels in that difference, so what is left is how the profile prices
the two classes against each other. On this 2-vCPU VM the held-out draws' prefills ran 4-6 points
further below the profile than their decodes (docs/validation.md, part 13), and light-load TTFT, made
of prefills, missed by more than TPOT.

``check --model MODEL PROFILE``: the engine's own whole-model stage (``engine/step.py::forward_step``,
PP = 1, one torch thread, thread CPU time) on prefill plans of 16-200 tokens and decode plans of 1-8
requests, timed in interleaved rounds in one process, against ``PROFILE``'s ``stage_time`` of the same
plans: whether the host's current speed state scales the two classes alike (it does not on this VM:
decodes, bound by per-kernel overhead, gain more in a fast state than the GEMM-bound prefills).

``items --model MODEL PROFILE``: the engine's first stage of a two-stage pipeline (its half of the layers,
with the embedding) on prefills of 1, 2, 4, 8, 16 and 32 items of 16 tokens (and 1 and 4 of 128, 2 of 256,
1 of 512, and 32 decodes), the same way, against ``PROFILE``'s ``stage_time`` and its operators alone (no
``layer_glue``): whether the profile prices a step's many prefill items as the engine runs them. The grid's
stage plans hold one prefill item at most; MoE's B = 32 prefill steps hold 32 (docs/validation.md, "What is left
out").

``gaps DIR [DIR ...]``: the step-level error (wall clock, as the simulator charges) by the idle gap before
each compute (``ppsim.validate.steps.idle_gaps`` on the engine's ``stage_ops.csv``, as the simulator reads it),
per pipeline depth and class, with and without the run's own ``stage_idle`` charge: how much of the idle
table calibration measured (a sleeping thread's next step against the one before it) the engine's
stages bore. On this VM the share moved from draw to draw with the host (docs/validation.md, part 14).

``first DIR [DIR ...] [--profile P]``: whether a stage's first compute of a run pays for the idle before it. The
simulator reads that compute's gap from the run's start (as if the stage were warm at 0); the engine's stages idled
since their warm-up, seconds before. Per repeat and stage whose first two computes have one shape (tokens, prefill
tokens): the first's measured over predicted time (wall clock, as charged) over the second's (the host's speed
cancels), as recorded and with the first charged the idle table's longest gap instead (``stage_idle`` held, as a stage
idle since before the run would be). ``--profile``: the run's calibration, where its recorded path has moved.

``depth DIR [DIR ...]``: what the live engine's stages cost over the stage model at each pipeline depth, the
figure the live level and depth ratio stand for: per engine compute, its time net of the run's idle charge over
the prediction net of it and of the run's live factors (``level_factor`` x ``depth_factor`` of its
``validation.json``); at PP > 1 only the computes charged no co-run (one micro-batch in flight,
``ppsim.validate.steps.corun_steps``). Medians per run and per depth, and PP=2 over PP=1.

``live --model MODEL PROFILE``: the same per depth on calibration's live runs (``samples.csv``), over the same
steps timed alone (``live_stage`` as charged, ``live_fits.fit_live``) and over the stage model: where the two
differ, the model's own error on the live steps' stages, which the charged ratio leaves out but multiplies; and
the live decode steps timed alone over the stage model by their number of requests (:func:`live_by_batch`).
On `dense-1024` the serving runs' PP=2 / PP=1 came out 0.98-1.03 where calibration's charged depth ratio was
1.10-1.18 and its ratio over the model 1.02-1.05 (docs/validation.md, part 16).

Run: python experiments/validation/plan_class.py runs RUN_DIR [RUN_DIR ...]
     python experiments/validation/plan_class.py gaps RUN_DIR [RUN_DIR ...]
     python experiments/validation/plan_class.py first RUN_DIR [RUN_DIR ...] [--profile DIR]
     python experiments/validation/plan_class.py depth RUN_DIR [RUN_DIR ...]
     python experiments/validation/plan_class.py live --model MODEL PROFILE
     python experiments/validation/plan_class.py check --model tiny PROFILE
     python experiments/validation/plan_class.py items --model tiny-moe PROFILE
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.validation.control_path import read_ops  # noqa: E402
from experiments.validation.runfiles import reading_run  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.validate.steps import (  # noqa: E402
    STEP_CLASSES,
    corun_steps,
    idle_gaps,
    prefill_minus_decode,
    step_class,
)

PREFILL_PLANS = {f"P{n}@0": [(0, n)] for n in (16, 32, 64, 96, 128, 200)} | {"P56@64": [(64, 56)]}
DECODE_PLANS = {"D1@64": [(64, 1)], "D1@250": [(250, 1)]} | {f"D{b}@150": [(150, 1)] * b for b in (2, 4, 8)}
ITEM_PLANS = {f"{k}xP16@0": [(0, 16)] * k for k in (1, 2, 4, 8, 16, 32)}
ITEM_PLANS |= {"1xP128@0": [(0, 128)], "4xP128@0": [(0, 128)] * 4, "1xP512@0": [(0, 512)], "2xP256@0": [(0, 256)] * 2}
ITEM_PLANS |= {"32xD1@40": [(40, 1)] * 32}


def plan_class(row: dict[str, str]) -> str:
    """``prefill`` (every token a prompt's), ``mixed`` or ``decode`` for one ``step_costs.csv`` row."""
    return step_class(int(row["num_tokens"]), int(row["num_prefill_tokens"]))


def class_errors(rows: list[dict[str, str]]) -> dict[str, list[float]]:
    """Step-level errors (thread CPU clock) of each class."""
    out: dict[str, list[float]] = {c: [] for c in STEP_CLASSES}
    for r in rows:
        out[plan_class(r)].append(float(r["cpu_error"]))
    return out


def run_dirs(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "step_costs.csv").is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(d for d in p.iterdir() if (d / "step_costs.csv").is_file())
        if not p.exists():
            raise PPSimError(f"runs: {p} does not exist; give ppsim validate output directories")
    if not found:
        raise PPSimError(
            "runs: no step_costs.csv under " + ", ".join(paths) + "; give ppsim validate output directories"
        )
    return found


def report_runs(paths: list[str]) -> None:
    diffs, dirs = [], run_dirs(paths)
    print(f"{'scenario':40s} " + " ".join(f"{c:>16s}" for c in STEP_CLASSES) + f" {'prefill - decode':>17s}")
    for d in dirs:
        with reading_run(d), open(d / "step_costs.csv", newline="") as f:
            errs = class_errors(list(csv.DictReader(f)))
        cells = [f"{statistics.median(v):+.3f} (n={len(v):4d})" if v else f"{'-':>16s}" for v in errs.values()]
        diff = prefill_minus_decode(errs)
        if diff is not None:
            diffs.append(diff)
        print(
            f"{d.name[:40]:40s} "
            + " ".join(f"{c:>16s}" for c in cells)
            + (f" {diff:+17.3f}" if diff is not None else "")
        )
    if diffs:
        below = sum(x < 0 for x in diffs)
        print(
            f"median prefill - decode: {statistics.median(diffs):+.3f} over {len(diffs)} scenarios, {below} below zero"
        )


GAP_BINS_MS = (0.0, 1.5, 6.0)  # the idle gap before a compute: [0, 1.5), [1.5, 6), [6, inf) ms


def gap_bin(gap_s: float) -> float:
    """The lower edge (ms) of the bin of ``gap_s``."""
    return max(lo for lo in GAP_BINS_MS if gap_s * 1e3 >= lo) if gap_s > 0 else 0.0


def run_idle(d: Path, profile: str | None = None) -> tuple[Callable[[int, float], float], int]:
    """Run ``d``'s own idle charge, (stage index, gap seconds) -> seconds (its profile's ``stage_idle`` as the
    simulator charges it; none without one), and its pipeline depth; ``profile`` in place of the run's own."""
    from experiments.validation.replay_adjusted import prepared

    with reading_run(d):
        _v, prep = prepared(d, profile)
    stages, cost = prep.topology.stages, prep.cost
    if not getattr(cost, "has_idle", False):
        return (lambda _i, _gap: 0.0), len(stages)
    return (lambda i, gap: cost.idle_time(stages[i], gap)), len(stages)


def gap_rows(
    d: Path, idle: Callable[[int, float], float], depth: int
) -> list[tuple[int, str, float, float, float, float]]:
    """(depth, class, gap bin, error with the idle charge, error without it, the charge over the measured
    time) per engine compute of run ``d`` (``step_costs.csv``, each repeat's ``engine-N/stage_ops.csv``)."""
    with reading_run(d):
        with open(d / "step_costs.csv", newline="") as f:
            steps = list(csv.DictReader(f))
        gaps: dict[int, dict[tuple[int, int], float]] = {}
        for rep in sorted({int(r["run"]) for r in steps}):
            ops = d / f"engine-{rep}" / "stage_ops.csv"
            if ops.is_file():
                gaps[rep] = idle_gaps(read_ops(ops))
        out = []
        for r in steps:
            i, meas = int(r["stage"]), float(r["measured_s"])
            gap = gaps.get(int(r["run"]), {}).get((i, int(r["step_id"])))
            if gap is None or meas <= 0.0:
                continue
            pred, charge = float(r["predicted_s"]), idle(i, gap)
            err, bare = (pred - meas) / meas, (pred - charge - meas) / meas
            out.append((depth, plan_class(r), gap_bin(gap), err, bare, charge / meas))
    return out


def report_gaps(paths: list[str]) -> None:
    by: dict[tuple[int, str, float], list[tuple[float, float, float]]] = {}
    for d in run_dirs(paths):
        for depth, cls, lo, err, bare, share in gap_rows(d, *run_idle(d)):
            by.setdefault((depth, cls, lo), []).append((err, bare, share))
    heads = (("PP", 2), ("class", -8), ("gap (ms)", 9), ("computes", 8), ("error", 7), ("no idle", 8), ("charge", 7))
    print(" ".join(f"{h:<{-w}s}" if w < 0 else f"{h:>{w}s}" for h, w in heads) + f" {'borne':>6s}")
    for (depth, cls, lo), v in sorted(by.items()):
        err, bare, share = (statistics.median(x[k] for x in v) for k in range(3))
        # the share of the charge the engine's computes bore: 1 all of it, 0 none (medians, of the measured time)
        borne = f"{-bare / share + 0.0:6.2f}" if share > 0 else f"{'-':>6s}"
        gap = ">=" + format(lo, "g")
        print(f"{depth:2d} {cls:8s} {gap:>9s} {len(v):8d} {err:+7.1%} {bare:+8.1%} {share:7.1%} {borne}")


def first_rows(d: Path, idle: Callable[[int, float], float]) -> list[tuple[int, float, float]]:
    """(stage, ratio as recorded, ratio with the first compute charged the held idle) per repeat and stage of run
    ``d`` whose first two computes have one shape; the ratio is the first's measured / predicted over the second's."""
    with reading_run(d):
        with open(d / "step_costs.csv", newline="") as f:
            steps = {(int(r["run"]), int(r["stage"]), int(r["step_id"])): r for r in csv.DictReader(f)}
        out = []
        for rep in sorted({k[0] for k in steps}):
            ops_file = d / f"engine-{rep}" / "stage_ops.csv"
            if not ops_file.is_file():
                continue
            firsts: dict[int, list[tuple[dict[str, str] | None, float]]] = {}
            for (i, k), gap in idle_gaps(read_ops(ops_file)).items():  # in the order the computes started
                firsts.setdefault(i, []).append((steps.get((rep, i, k)), gap))
            for i, computes in sorted(firsts.items()):
                (a, gap), (b, _) = (computes + [(None, 0.0)] * 2)[:2]
                if a is None or b is None:
                    continue
                if (a["num_tokens"], a["num_prefill_tokens"]) != (b["num_tokens"], b["num_prefill_tokens"]):
                    continue
                if min(float(a["predicted_s"]), float(b["predicted_s"]), float(b["measured_s"])) <= 0.0:
                    continue
                second = float(b["measured_s"]) / float(b["predicted_s"])
                p1 = float(a["predicted_s"])
                held = p1 - idle(i, gap) + idle(i, math.inf)
                out.append((i, float(a["measured_s"]) / p1 / second, float(a["measured_s"]) / held / second))
    return out


def report_first(paths: list[str], profile: str | None) -> None:
    got: list[tuple[float, float]] = []
    print(f"{'scenario':40s} {'pairs':>5s} {'recorded':>8s} {'held':>6s}")
    for d in run_dirs(paths):
        rows = first_rows(d, run_idle(d, profile)[0])
        if rows:
            got += [(r, h) for _, r, h in rows]
            rec, held = statistics.median(r for _, r, _ in rows), statistics.median(h for _, _, h in rows)
            print(f"{d.name[:40]:40s} {len(rows):5d} {rec:8.3f} {held:6.3f}")
    if not got:
        raise PPSimError("runs: no repeat whose stages' first two computes have one shape; nothing to compare")
    nearer = sum(abs(h - 1) < abs(r - 1) for r, h in got)
    med = [statistics.median(x) for x in ([r for r, _ in got], [h for _, h in got])]
    off = [statistics.median(abs(x[k] - 1) for x in got) for k in (0, 1)]
    print(
        f"first over second, median over {len(got)}: recorded {med[0]:.3f} (|r - 1| {off[0]:.3f}),"
        f" held {med[1]:.3f} (|r - 1| {off[1]:.3f}); held nearer 1 in {nearer}"
    )


def depth_rows(d: Path, idle: Callable[[int, float], float], depth: int) -> list[float]:
    """Per engine compute of run ``d`` (at PP > 1 those charged no co-run): its measured time net of the
    run's idle charge over the prediction net of the charge and of the run's live factors."""
    with reading_run(d):
        v = json.loads((d / "validation.json").read_text())
        factor = float(v.get("level_factor", 1.0)) * float(v.get("depth_factor", 1.0))
        with open(d / "step_costs.csv", newline="") as f:
            steps = list(csv.DictReader(f))
        gaps: dict[int, dict[tuple[int, int], float]] = {}
        coruns: dict[int, set[int]] = {}
        for rep in sorted({int(r["run"]) for r in steps}):
            ops_file = d / f"engine-{rep}" / "stage_ops.csv"
            if ops_file.is_file():
                ops = read_ops(ops_file)
                gaps[rep], coruns[rep] = idle_gaps(ops), corun_steps(ops, depth)
        out = []
        for r in steps:
            rep, i, k = int(r["run"]), int(r["stage"]), int(r["step_id"])
            gap = gaps.get(rep, {}).get((i, k))
            if gap is None or k in coruns[rep]:
                continue
            charge = idle(i, gap)
            net, model = float(r["measured_s"]) - charge, (float(r["predicted_s"]) - charge) / factor
            if net > 0.0 and model > 0.0:
                out.append(net / model)
    return out


def report_depth(paths: list[str]) -> None:
    by: dict[int, list[float]] = {}
    print(f"{'scenario':40s} {'PP':>2s} {'computes':>8s} {'engine / model':>14s}")
    for d in run_dirs(paths):
        idle, depth = run_idle(d)
        ratios = depth_rows(d, idle, depth)
        if ratios:
            by.setdefault(depth, []).extend(ratios)
            print(f"{d.name[:40]:40s} {depth:2d} {len(ratios):8d} {statistics.median(ratios):14.3f}")
    med = {k: statistics.median(v) for k, v in sorted(by.items())}
    for k, m in med.items():
        print(f"PP={k}: {m:.3f} over {len(by[k])} computes" + (" (charged no co-run)" if k > 1 else ""))
    if 1 in med and 2 in med:
        print(f"PP=2 / PP=1: {med[2] / med[1]:.3f}")


def report_live(model: str, profile: str) -> None:
    from calibration.artifact import read_samples
    from calibration.live_fits import live_ratios
    from ppsim.cost.profiled import ProfiledCost, corun_ratio, read_profile
    from ppsim.models.shape import load_model

    p = read_profile(profile)
    cost = ProfiledCost(p, load_model(model), None, 1)
    corun = corun_ratio(p.fits["stage_corun"]) if "stage_corun" in p.fits else 1.0
    ratios = live_ratios(cost, read_samples(profile), corun)
    if not ratios:
        raise PPSimError(f"profile: {profile} has no live runs timed alone; calibrate with the live engine runs")
    for n, (alone, over_model) in ratios.items():
        stages = f"{n} stage{'s' if n > 1 else ''}"
        print(f"{stages}: over the steps alone {alone:.3f}, over the stage model {over_model:.3f}")
    if 1 in ratios and 2 in ratios:
        a, m = (ratios[2][k] / ratios[1][k] for k in (0, 1))
        print(f"two over one: over the steps alone {a:.3f}, over the stage model {m:.3f}")
    by_batch = live_by_batch(cost, read_samples(profile))
    cells = ", ".join(f"B {a}{f'-{b}' if b > a else ''}: {m:.3f} ({n})" for (a, b), (m, n) in by_batch.items())
    print(f"decode steps timed alone over the stage model, by requests (steps): {cells or 'none'}")


def live_by_batch(cost: Any, rows: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[float, int]]:
    """Calibration's live decode-only steps timed alone over the stage model, median per bin of requests
    (``live_fits.decode_ratios``; empty bins left out): the stage model's shape in the batch on the engine's own plans,
    the host's level common to the bins of one profile. With the glue fitted on the grid alone, on this VM
    `tiny-moe`'s decode of 1 came out 0.81-0.88 and of 13-20 0.91-1.01 (four calibrations); `dense-1024`'s of 4-7
    1.02-1.16 and of 13-20 0.90-1.03 (twelve) (docs/validation.md, "What is left out"). Since 2026-12-05 the glue
    is fitted on these steps too (``glue_fits.fit_layer_glue_live``), so for a profile fitted since, this is
    in-sample; since part 45 a profile charges these ratios (``decode_batch``), so for one fitted since, the bins
    read near 1 by construction."""
    from calibration.live_fits import decode_ratios

    return {k: (statistics.median(q for _, q in v), len(v)) for k, v in decode_ratios(cost, rows).items()}


def timed_plans(
    model: str, profile: str, rounds: int, plans: dict[str, list[tuple[int, int]]], first_stage_of: int = 1
) -> dict[str, tuple[float, float]]:
    """Plan -> (measured, profile) seconds: the engine's own stage step (``forward_step``, one torch thread,
    thread CPU time, interleaved rounds) of the first stage of a ``first_stage_of``-stage pipeline."""
    import torch

    from calibration.layer import Seq
    from calibration.samples import plan_of_seqs
    from calibration.stage_step import EngineStages
    from engine.model import torch_dtype
    from ppsim.cost.base import StageSpec
    from ppsim.cost.profiled import ProfiledCost, read_profile
    from ppsim.models.shape import load_model

    torch.set_num_threads(1)
    s = load_model(model)
    cost = ProfiledCost(read_profile(profile), s, None, 1, pp=first_stage_of)
    stages = EngineStages(s, torch_dtype(s.dtype), torch.device("cpu"), s.num_layers)
    end = s.num_layers // first_stage_of
    last = first_stage_of == 1
    seqs = {k: [Seq(a, n) for a, n in v] for k, v in plans.items()}
    fns = {k: stages.layout_step_fn(0, end, True, last, v) for k, v in seqs.items()}
    meas: dict[str, list[float]] = {k: [] for k in plans}
    with torch.inference_mode():
        for _ in range(rounds):  # interleaved: a drift of the host between rounds hits every plan alike
            for k, fn in fns.items():
                fn()
                t0 = time.thread_time()
                fn(), fn(), fn()
                meas[k].append((time.thread_time() - t0) / 3)
    stage = StageSpec(0, 0, end, True, last)
    return {k: (statistics.median(meas[k]), cost.stage_time(stage, plan_of_seqs(seqs[k]))) for k in plans}


def check(model: str, profile: str, rounds: int) -> None:
    errs: dict[str, list[float]] = {"prefill": [], "decode": []}
    for k, (m, p) in timed_plans(model, profile, rounds, PREFILL_PLANS | DECODE_PLANS).items():
        errs["prefill" if k in PREFILL_PLANS else "decode"].append((p - m) / m)
        print(f"{k:8s} measured {m * 1e3:8.2f} ms  profile {p * 1e3:8.2f} ms  error {(p - m) / m:+.3f}")
    pre, dec = statistics.median(errs["prefill"]), statistics.median(errs["decode"])
    print(f"median error: prefill {pre:+.3f}, decode {dec:+.3f}, prefill - decode {pre - dec:+.3f}")


def without_glue(profile: str, model: str, pp: int) -> Any:
    """``profile``'s cost model with ``layer_glue`` zero: a stage's operators alone."""
    import dataclasses

    from ppsim.cost.profiled import OpFit, ProfiledCost, read_profile
    from ppsim.models.shape import load_model

    p = read_profile(profile)
    g = p.fits["layer_glue"]
    zero = OpFit("layer_glue", g.form, g.x, {k: 0.0 for k in g.coef})
    return ProfiledCost(dataclasses.replace(p, fits={**p.fits, "layer_glue": zero}), load_model(model), None, 1, pp=pp)


def items(model: str, profile: str, rounds: int) -> None:
    from calibration.layer import Seq
    from calibration.samples import plan_of_seqs
    from ppsim.cost.base import StageSpec
    from ppsim.models.shape import load_model

    times = timed_plans(model, profile, rounds, ITEM_PLANS, first_stage_of=2)
    base = times["1xP16@0"][1] / times["1xP16@0"][0]
    bare, half = without_glue(profile, model, 2), load_model(model).num_layers // 2
    for k, (m, p) in times.items():
        shape = p / m / base  # profile over measured, over the one-item prefill's: the host's level cancels
        ops = bare.stage_time(StageSpec(0, 0, half, True, False), plan_of_seqs([Seq(a, n) for a, n in ITEM_PLANS[k]]))
        print(
            f"{k:9s} measured {m * 1e3:8.2f} ms  profile {p * 1e3:8.2f} ms  error {(p - m) / m:+.3f}  shape {shape:.3f}"
            f"  glue charged {(p - ops) / half * 1e3:.2f} ms a layer,"
            f" measured beyond the operators {(m - ops) / half * 1e3:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/plan_class.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("runs", help="step-level error by plan class of finished validations")
    r.add_argument("dirs", nargs="+")
    g = sub.add_parser("gaps", help="step-level error by the idle gap before each compute, with and without stage_idle")
    g.add_argument("dirs", nargs="+")
    fs = sub.add_parser("first", help="a stage's first compute of a run, as recorded and charged the held idle")
    fs.add_argument("dirs", nargs="+")
    fs.add_argument("--profile", help="the runs' calibration, where their recorded path has moved")
    dp = sub.add_parser("depth", help="the engine's stage computes over the stage model, per pipeline depth")
    dp.add_argument("dirs", nargs="+")
    lv = sub.add_parser("live", help="calibration's live runs over the steps alone and over the stage model")
    lv.add_argument("--model", default="tiny")
    lv.add_argument("profile")
    c = sub.add_parser("check", help="the engine's stage in-process on both classes against a profile")
    it = sub.add_parser("items", help="a first stage in-process on prefills of 1-32 items against a profile")
    for q in (c, it):
        q.add_argument("--model", default="tiny")
        q.add_argument("--rounds", type=int, default=8)
        q.add_argument("profile")
    args = ap.parse_args(argv)
    if args.cmd in ("check", "items") and not 1 <= args.rounds <= 1000:
        ap.error(f"--rounds: {args.rounds} must be in [1, 1000]")
    if args.cmd == "runs":
        return run_main(lambda: report_runs(args.dirs))
    if args.cmd == "gaps":
        return run_main(lambda: report_gaps(args.dirs))
    if args.cmd == "first":
        return run_main(lambda: report_first(args.dirs, args.profile))
    if args.cmd == "depth":
        return run_main(lambda: report_depth(args.dirs))
    if args.cmd == "live":
        return run_main(lambda: report_live(args.model, args.profile))
    if args.cmd == "items":
        return run_main(lambda: items(args.model, args.profile, args.rounds))
    return run_main(lambda: check(args.model, args.profile, args.rounds))


if __name__ == "__main__":
    sys.exit(main())
