"""The engine's own whole-model stage on decode steps of B requests, timed here, against profiles.

One process times ``engine/step.py::forward_step`` on the engine's ``nn.Module`` stage (first and
last: PP = 1; one torch thread; thread CPU time, the calibration's clock) for decode steps of B = 1-12
and 16 requests at contexts 120-180, in three interleaved rounds, and prints each profile's error on
the same measurements (so profiles calibrated at different times are compared on one reading of the
host). Not a validation (no live engine, no scheduling): the step-level check of the cost model on
the steps light load runs most, and whether a profile follows the CPU GEMM's block-of-4 saw-tooth
(3 requests dearer than 4 on ``dense-1024``). Meaningful on a quiet host.

Run: python experiments/validation/stage_check.py --model MODEL PROFILE [PROFILE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/stage_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="preset name or HF config.json path")
    ap.add_argument("profiles", nargs="+")
    args = ap.parse_args(argv)
    return run_main(lambda: stage_check(args))


def stage_check(args: argparse.Namespace) -> int:
    from ppsim.cost.profiled import ProfiledCost, check_shape, read_profile
    from ppsim.models.shape import load_model

    try:  # the model and every profile (readable, measured for this model) before any timing
        s = load_model(args.model)
    except PPSimError as err:
        raise PPSimError(f"--model: {str(err).removeprefix('model: ')}") from None
    profiles = []
    for p in args.profiles:
        try:
            profiles.append(read_profile(p))
            check_shape(profiles[-1], s, p)
        except PPSimError as err:
            raise PPSimError(f"profiles: {str(err).removeprefix('--profile: ')}") from None
    costs = [ProfiledCost(prof, s, None, 1) for prof in profiles]
    import numpy as np
    import torch

    from calibration.layer import Seq
    from calibration.samples import plan_of_seqs
    from calibration.stage_step import EngineStages
    from calibration.timer import Timer
    from engine.model import torch_dtype
    from ppsim.cost.base import StageSpec

    torch.set_num_threads(1)
    stages = EngineStages(s, torch_dtype(s.dtype), torch.device("cpu"), s.num_layers)
    timer = Timer(clock="thread", repeats=3, min_repeat_s=0.03)
    rng = np.random.default_rng(0)
    batches = [*range(1, 13), 16]
    plans = {b: [Seq(int(L), 1) for L in rng.integers(120, 180, size=b)] for b in batches}
    fns = {b: stages.step_fn("stage_full", plans[b]) for b in batches}
    meas: dict[int, list[float]] = {b: [] for b in batches}
    with torch.inference_mode():
        for _ in range(3):
            for b in batches:
                meas[b] += timer.samples(fns[b])[0]
    stage = StageSpec(0, 0, s.num_layers, True, True)
    errs: list[list[float]] = [[] for _ in costs]
    print(f"{'B':>3} {'measured ms':>12} {'spread':>7}  " + "  ".join(f"{p[-24:]:>24}" for p in args.profiles))
    for b in batches:
        m = statistics.mean(meas[b])
        plan = plan_of_seqs(plans[b])
        row = []
        for i, c in enumerate(costs):
            e = (c.stage_time(stage, plan) - m) / m
            errs[i].append(e)
            row.append(f"{e:>+24.3f}")
        print(f"{b:>3} {m * 1e3:>12.2f} {(max(meas[b]) - min(meas[b])) / m:>7.2f}  " + "  ".join(row))
    print(f"{'median error':>24}  " + "  ".join(f"{statistics.median(e):>+24.3f}" for e in errs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
