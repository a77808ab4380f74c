"""``ppsim validate`` command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def add_validate_parser(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_scenario_flags

    p = sub.add_parser("validate", help="run the live engine and the simulator on one workload and compare")
    add_scenario_flags(p)
    p.add_argument("--repeats", type=int, default=3, help="engine runs, to measure run-to-run spread (default 3)")
    p.add_argument("--calibrate", action="store_true", help="calibrate this machine first (into OUTPUT/profile)")
    p.add_argument("--threads-per-stage", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the engine's stages compute")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="engine torch.distributed backend")
    p.add_argument("--output-dir", default="ppsim-validation")
    p.set_defaults(handler=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    from engine.run import EngineOptions
    from ppsim.cli import scenario_from_args
    from ppsim.errors import PPSimError
    from ppsim.outputs import check_output_dir
    from ppsim.validate.run import format_report, validate

    if args.calibrate and args.profile:
        raise PPSimError("--calibrate: makes a new profile, --profile uses an existing one; give one of them")
    if args.repeats < 1:
        raise PPSimError("--repeats: must be >= 1")
    check_output_dir(args.output_dir)
    if args.calibrate:
        prof = Path(args.output_dir) / "profile"
        model = args.model or "tiny"
        cmd = [sys.executable, "-m", "ppsim.cli", "calibrate", "--model", model, "--device", args.device,
               "--output", str(prof)]
        if subprocess.run(cmd, timeout=900).returncode != 0:
            print("error: calibration failed; see its output above", file=sys.stderr)
            return 2
        args.profile = str(prof)
    s = scenario_from_args(args)
    opts = EngineOptions(threads_per_stage=args.threads_per_stage, device=args.device, backend=args.backend)
    from engine.launcher import StageFault

    try:
        payload = validate(s, args.output_dir, args.repeats, opts)
    except StageFault as err:  # a stage failed: not bad input; nothing is written
        print(f"error: {str(err).splitlines()[0]}; nothing written to {args.output_dir}", file=sys.stderr)
        return 1
    print(format_report(payload))
    print(f"results written to {args.output_dir}/ (validation.json, latency_cdf.png, trace_combined.json, "
          "engine-*/, sim/; each run with its dashboard.png)")
    return 0
