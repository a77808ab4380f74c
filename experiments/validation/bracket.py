"""A finished validation's runs predicted with a profile calibrated before them, one calibrated right
after them, and the two pooled (``calibration/merge.py``): how much of a draw's error is the host's
speed moving between one calibration and the runs.

On this 2-vCPU VM the host's speed moves 10-20 points within minutes; a validation of 30 minutes after a
calibration of 6 carries the state of the calibration's minutes into every prediction. Calibrating again
once the runs end and pooling the two brackets the runs in time. Only calibration's own timings go into
either profile, no engine figure; but "after" and "pooled" were measured after the runs, so they are not
predictions made before them, and the table says so.

Run (right after `run.py ... --calibrate --runs RUNS`, nothing between, quiet host):
  PYTHONPATH=. python experiments/validation/bracket.py --model dense-1024 --runs RUNS --out DIR
      [--before RUNS/profile-dense-1024] [--after DIR]
writes DIR/profile-after (unless --after), DIR/profile-pooled and DIR/bracket.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from experiments.validation.repredict import errors
from experiments.validation.run import HELD_OUT_NAME, MODELS
from experiments.validation.tables import SHOWN as METRICS
from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError

BUBBLE = "pipeline_bubble_fraction"
TARGETS = {"output_throughput": 0.05, "mean_tpot_ms": 0.05, BUBBLE: 0.05}  # the rest: 10%


def run_dirs(runs: Path) -> dict[str, list[Path]]:
    """The finished validations under ``runs`` (``validation.json``), development and held-out apart
    (held-out names start ``h<k>-``, experiments/validation/scenarios.py)."""
    sets: dict[str, list[Path]] = {"development": [], "held-out": []}
    for d in sorted(p.parent for p in runs.glob("*/validation.json")):
        sets["held-out" if HELD_OUT_NAME.fullmatch(d.name) else "development"].append(d)
    return {k: v for k, v in sets.items() if v}


def table(sets: dict[str, list[Path]], profiles: dict[str, str]) -> list[str]:
    lines = []
    for name, dirs in sets.items():
        errs = {label: [errors(d, p) for d in dirs] for label, p in profiles.items()}
        lines += [
            f"### {name} ({len(dirs)} scenarios): median |error|, bubble in fraction points",
            "",
            "| profile | " + " | ".join(METRICS) + " |",
            "|---|" + "---|" * len(METRICS),
        ]
        for label, es in errs.items():
            med = {m: statistics.median(abs(e[m]) for e in es) for m in METRICS}
            cells = [f"{med[m]:.3f}" if m == BUBBLE else f"{100 * med[m]:.1f}%" for m in METRICS]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        goal = {m: TARGETS.get(m, 0.10) for m in METRICS}
        target = [f"{goal[m]:.2f}" if m == BUBBLE else f"{100 * goal[m]:.0f}%" for m in METRICS]
        lines += ["| target | " + " | ".join(target) + " |", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/bracket.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--runs", required=True, help="run.py's --runs of the finished validation")
    ap.add_argument("--before", help="the profile calibrated before the runs (default: RUNS/profile-MODEL, run.py's)")
    ap.add_argument("--after", help="a profile calibrated right after them (default: calibrate now)")
    ap.add_argument("--out", required=True, help="directory for profile-after, profile-pooled, bracket.md")
    args = ap.parse_args(argv)
    # exit 2 for every PPSimError (a calibration's OutputError too); Ctrl-C / SIGTERM stop the calibration, one line
    return run_main(lambda: bracket(args), exit_code=2)


def bracket(args: argparse.Namespace) -> None:
    """The two profiles after ``before`` (calibrating "after" unless given), the table, ``bracket.md``."""
    before = args.before or str(Path(args.runs) / f"profile-{args.model}")  # where run.py --calibrate wrote it
    out = Path(args.out)
    sets = run_dirs(Path(args.runs))
    if not sets:
        raise PPSimError(f"--runs: no finished validation (validation.json) under {args.runs}")
    from calibration.artifact import check_output_dir
    from calibration.merge import merge

    if not (Path(before) / "samples.csv").is_file():  # checked before a calibration of minutes
        raise PPSimError(f"--before: {before} is no calibration (no samples.csv); give run.py's profile")
    after = args.after or str(out / "profile-after")
    pooled = str(out / "profile-pooled")
    for d in (pooled,) if args.after else (after, pooled):
        check_output_dir(d, "--out")
    t0 = time.perf_counter()
    if not args.after:
        from calibration.calibrate import calibrate

        print(f"== calibrating {args.model} again (full grid), right after the runs", flush=True)
        calibrate(MODELS[args.model], "cpu", after, log=lambda m: None)
    merge([before, after], pooled, ("--before", "--after"), "--out")
    profiles = {"before the runs (the prediction)": before, "after the runs": after, "pooled": pooled}
    rows = table(sets, profiles)
    lines = [
        f"# The host's drift bracketed ({args.model})",
        "",
        f"Runs: `{args.runs}`. Profiles: before `{before}`, after `{after}`"
        + (f" (calibrated in {time.perf_counter() - t0:.0f} s right after the runs)" if not args.after else "")
        + f", pooled `{pooled}`. Only the first is a prediction made before the runs: the others were"
        " measured after them (calibration's own timings, no engine figure).",
        "",
        *rows,
    ]
    (out / "bracket.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
