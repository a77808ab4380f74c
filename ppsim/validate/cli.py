"""``ppsim validate`` command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CALIBRATE_TIMEOUT_S = 1800


def add_validate_parser(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_live_engine_flags, add_scenario_flags

    p = sub.add_parser("validate", help="run the live engine and the simulator on one workload and compare")
    add_scenario_flags(p)
    add_live_engine_flags(p)  # --threads-per-stage, --device, --backend, ...: the scenario's live_engine
    p.add_argument("--repeats", type=int, default=3, help="engine runs, to measure run-to-run spread (default 3)")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="with no --profile, calibrate this machine on the full grid (minutes) instead of the quick one",
    )
    p.add_argument(
        "--host-guard",
        choices=["flag", "refuse", "off"],
        default="flag",
        help="read the host around each engine run: flag a busy or drifting host (default), "
        "refuse to validate on one, or off",
    )
    p.add_argument(
        "--host-max-drift",
        type=float,
        default=0.20,
        help="largest difference of the CPU probe from the profile's calibration-time probe "
        "(or, for a profile without one, between readings), as a fraction (default 0.20)",
    )
    p.add_argument(
        "--host-min-core-share",
        type=float,
        default=0.85,
        help="smallest share of a core the CPU probe may get (default 0.85)",
    )
    p.add_argument("--output-dir", default="ppsim-validation")
    p.set_defaults(handler=cmd_validate)


def calibrate_here(args: argparse.Namespace, device: str) -> str | None:
    """Calibrate this host into OUTPUT/profile (quick grid unless --calibrate); the artifact path."""
    prof = Path(args.output_dir) / "profile"
    model = args.model or "tiny"
    grid = "full" if args.calibrate else "quick"
    print(
        f"validate: no --profile; calibrating {model} on this {device} ({grid} grid) into {prof}",
        file=sys.stderr,
        flush=True,
    )
    cmd = [
        sys.executable,
        "-m",
        "ppsim.cli",
        "calibrate",
        "--model",
        model,
        "--device",
        device,
        "--output-dir",
        str(prof),
        *(() if args.calibrate else ("--quick",)),
        *(("--moe-router-zipf", str(args.moe_router_zipf)) if getattr(args, "moe_router_zipf", None) else ()),
    ]
    if subprocess.run(cmd, timeout=CALIBRATE_TIMEOUT_S).returncode != 0:
        return None
    return str(prof)


def cmd_validate(args: argparse.Namespace) -> int:
    from ppsim.cli import scenario_from_args
    from ppsim.errors import PPSimError
    from ppsim.outputs import check_output_dir
    from ppsim.validate.host import HostGuard
    from ppsim.validate.run import format_report, validate

    if args.calibrate and args.profile:
        raise PPSimError("--calibrate: makes a new profile, --profile uses an existing one; give one of them")
    if args.repeats < 1:
        raise PPSimError("--repeats: must be >= 1")
    host = HostGuard(args.host_guard, args.host_max_drift, args.host_min_core_share)
    check_output_dir(args.output_dir)
    s = scenario_from_args(args)  # bad input fails here, before a calibration of minutes
    if not args.profile:
        args.profile = calibrate_here(args, s.live_engine.device)
        if args.profile is None:
            print("error: calibration failed; see its output above, or pass --profile DIR", file=sys.stderr)
            return 1
    s = scenario_from_args(args)  # the engine runs with its live_engine section
    from engine.launcher import StageFault

    try:
        payload = validate(s, args.output_dir, args.repeats, host=host)
    except StageFault as err:  # a stage failed: not bad input; nothing is written
        print(f"error: {str(err).splitlines()[0]}; nothing written to {args.output_dir}", file=sys.stderr)
        return 1
    print(format_report(payload))
    print(
        f"results written to {args.output_dir}/ (validation.json, step_costs.csv, latency_cdf.png, "
        "trace_combined.json, engine-*/, sim/; each run with its dashboard.png)"
    )
    return 0
