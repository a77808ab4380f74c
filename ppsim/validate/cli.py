"""``ppsim validate`` command line."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CALIBRATE_TIMEOUT_S = 1800


def add_validate_parser(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_live_engine_flags, add_scenario_flags
    from ppsim.validate.host import DEFAULT_MAX_DRIFT, DEFAULT_MIN_CORE_SHARE, MAX_DRIFT
    from ppsim.validate.preflight import MAX_REPEATS

    p = sub.add_parser("validate", help="run the live engine and the simulator on one workload and compare")
    add_scenario_flags(p)
    add_live_engine_flags(p)  # --threads-per-stage, --device, --backend, ...: the scenario's live_engine
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help=f"engine runs, to measure run-to-run spread (default 3, at most {MAX_REPEATS})",
    )
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
        default=DEFAULT_MAX_DRIFT,
        help="largest difference of the CPU probe from the profile's calibration-time probe "
        f"(or, for a profile without one, between readings), as a fraction (default {DEFAULT_MAX_DRIFT}, "
        f"at most {MAX_DRIFT:g})",
    )
    p.add_argument(
        "--host-min-core-share",
        type=float,
        default=DEFAULT_MIN_CORE_SHARE,
        help=f"smallest share of a core the CPU probe may get (default {DEFAULT_MIN_CORE_SHARE})",
    )
    p.add_argument("--output-dir", default="ppsim-validation")
    p.set_defaults(handler=cmd_validate)


class MadeProfile:
    """``OUTPUT/profile`` as ``validate`` calibrates it: a profile already there (a previous result set's)
    is moved aside first, and put back if the validation then fails, so a failed run leaves the output
    directory as it was (nothing half-written); :meth:`keep` drops the old one once the new result set
    is written."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = out, out / "profile"
        self.out_existed = out.exists()
        self.aside = None
        if self.path.exists():
            self.aside = Path(tempfile.mkdtemp(prefix=f".{out.name}-profile-before-", dir=out.parent))
            self.path.rename(self.aside / "profile")

    def keep(self) -> None:
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)

    def undo(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self.aside is not None:
            (self.aside / "profile").rename(self.path)
            shutil.rmtree(self.aside, ignore_errors=True)
        if not self.out_existed:
            with contextlib.suppress(OSError):
                self.out.rmdir()  # only if nothing else is in it


def calibrate_command(s: Any, prof: Path, full: bool) -> list[str]:
    """``ppsim calibrate`` for scenario ``s``'s model (from flags or ``--config`` alike) and router skew."""
    return [
        sys.executable,
        "-m",
        "ppsim.cli",
        "calibrate",
        "--model",
        s.model,
        "--device",
        s.live_engine.device,
        "--output-dir",
        str(prof),
        *(() if full else ("--quick",)),
        *(("--moe-router-zipf", repr(s.moe_router_zipf)) if s.moe_router_zipf else ()),
    ]


def calibrate_here(args: argparse.Namespace, s: Any) -> str | None:
    """Calibrate this host for the scenario into OUTPUT/profile, quick grid unless --calibrate; the
    artifact path, None if the calibration failed."""
    prof = Path(args.output_dir) / "profile"
    grid = "full" if args.calibrate else "quick"
    print(
        f"validate: no --profile; calibrating {s.model} on this {s.live_engine.device} ({grid} grid) into {prof}",
        file=sys.stderr,
        flush=True,
    )
    if subprocess.run(calibrate_command(s, prof, args.calibrate), timeout=CALIBRATE_TIMEOUT_S).returncode != 0:
        return None
    return str(prof)


def cmd_validate(args: argparse.Namespace) -> int:
    from ppsim.cli import scenario_from_args, scenario_inputs
    from ppsim.errors import PPSimError
    from ppsim.outputs import check_output_dir
    from ppsim.validate.host import HostGuard
    from ppsim.validate.preflight import check_engine_inputs, check_repeats
    from ppsim.validate.run import format_report, validate

    if args.calibrate and args.profile:
        raise PPSimError("--calibrate: makes a new profile, --profile uses an existing one; give one of them")
    check_repeats(args.repeats)
    host = HostGuard(args.host_guard, args.host_max_drift, args.host_min_core_share)
    s = scenario_from_args(args)  # bad input fails here or in the engine's checks, before a calibration of minutes
    inputs = scenario_inputs(args, s, live=True)
    carried = Path(args.output_dir, "profile").resolve()  # OUT/profile joins the new set (run.profile_files)
    check_output_dir(args.output_dir, inputs={k: v for k, v in inputs.items() if Path(v).resolve() != carried})
    check_engine_inputs(s)
    made = None
    if not args.profile and (args.calibrate or s.cost.kind != "profile"):  # a --config naming a profile_dir uses it
        made = MadeProfile(Path(args.output_dir))
        args.profile = calibrate_here(args, s)
        if args.profile is None:
            made.undo()
            print("error: calibration failed; see its output above, or pass --profile DIR", file=sys.stderr)
            return 1
    from engine.launcher import StageFault

    try:
        s = scenario_from_args(args)  # the engine runs with its live_engine section
        payload = validate(s, args.output_dir, args.repeats, host=host)
    except StageFault as err:  # a stage failed: not bad input; nothing is written
        if made is not None:
            made.undo()
        print(f"error: {str(err).splitlines()[0]}; nothing written to {args.output_dir}", file=sys.stderr)
        return 1
    except BaseException:
        if made is not None:
            made.undo()
        raise
    if made is not None:
        made.keep()
    print(format_report(payload))
    print(
        f"results written to {args.output_dir}/ (validation.json, step_costs.csv, latency_cdf.png, "
        "trace_combined.json, engine-*/, sim/; each run with its dashboard.png)"
    )
    return 0
