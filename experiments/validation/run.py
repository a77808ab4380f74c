"""Validation: the live CPU engine vs the simulator, on the development matrix and a held-out set.

Development: the 9 fixed scenarios the model was developed against (in-sample). Held-out: scenarios
drawn at run time by a seeded sampler over every engine policy, PP 1-2, load from light to saturated,
length distributions, chunked-prefill budget and aborts (``scenarios.py``); no modelling choice was
made looking at them. Each scenario runs ``ppsim validate`` (engine ``--repeats`` times, host guard,
step-level cost error). Writes ``results.md``, ``results.csv`` and ``errors.png`` here (with
``-<model>`` in the name for another model than tiny) and every scenario's validation under ``runs/``
(not committed).

Run (quiet host; the calibration first, then both sets):
  .venv/bin/python experiments/validation/run.py                      # tiny, shipped profile
  .venv/bin/python experiments/validation/run.py --calibrate          # tiny, calibrated now
  .venv/bin/python experiments/validation/run.py --model dense-1024 --calibrate   # compute-bound model
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.validation.scenarios import (  # noqa: E402
    DEVELOPMENT,
    ENGINE_POLICIES,
    development,
    held_out,
    scenario,
)
from experiments.validation.tables import RELATIVE, SHOWN, result_row, results_md, to_csv  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.deployment import prepare  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.metrics.io import atomic_write, save_figure  # noqa: E402
from ppsim.outputs import check_output_dir  # noqa: E402
from ppsim.validate.host import HostGuard  # noqa: E402
from ppsim.validate.run import validate  # noqa: E402

HERE = Path(__file__).parent
SHIPPED_PROFILE = str(HERE.parents[1] / "profiles" / "tiny-cpu")
MODELS = {"tiny": "tiny", "dense-1024": str(HERE / "models" / "dense-1024")}
MAX_SCALE = 1000.0  # x the largest scenario's 40 prompts: hours of engine runs per scenario
# a held-out scenario's name (``scenarios.held_out``): draw k, policy, PP size, load
HELD_OUT_NAME = re.compile(rf"h(\d+)-({'|'.join(map(re.escape, ENGINE_POLICIES))})-pp[12]-(offline|load\d+\.\d\d)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = Parser(prog="experiments/validation/run.py", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="engine runs per scenario (default 3)")
    ap.add_argument("--set", choices=["development", "held-out", "both"], default="both")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="scenario names to run (of the chosen sets)")
    ap.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="tiny",
        help="tiny (overhead-bound) or dense-1024 (hidden 1024, 4 layers: compute dominates a step)",
    )
    ap.add_argument("--profile", help="calibration artifact (default for tiny: the shipped profiles/tiny-cpu)")
    ap.add_argument(
        "--calibrate", action="store_true", help="calibrate this host (full grid) into RUNS/profile-MODEL first"
    )
    ap.add_argument("--heldout-seed", type=int, default=14, help="seed of the held-out sampler (default 14)")
    ap.add_argument("--heldout-per-policy", type=int, default=2, help="held-out draws per policy (default 2)")
    ap.add_argument(
        "--num-prompts-scale",
        type=float,
        default=1.0,
        help="scale every scenario's prompt count (a smoke test uses 0.25; reported figures use 1)",
    )
    ap.add_argument("--host-guard", choices=["flag", "refuse", "off"], default="flag")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="run repeat k of every scenario before repeat k+1 of any, so that a scenario's repeats are "
        "minutes apart and its reference averages the host's states (default: back to back)",
    )
    ap.add_argument("--runs", default=str(HERE / "runs"), help="where each scenario's validation goes (default: runs/)")
    ap.add_argument("--out", default=str(HERE), help="where results.md/csv and errors.png go (default: here)")
    args = ap.parse_args(argv)
    problem = bad_args(args)
    if problem:
        ap.error(problem)
    return args


def bad_args(args: argparse.Namespace) -> str | None:
    """The first flag whose value means nothing (one line), None if all are fine."""
    checks = [
        (args.repeats < 1, f"--repeats: {args.repeats}; give 1 or more engine runs per scenario"),
        (args.heldout_seed < 0, f"--heldout-seed: {args.heldout_seed}; numpy's seeds are non-negative"),
        (args.heldout_per_policy < 0, f"--heldout-per-policy: {args.heldout_per_policy}; give 0 or more"),
        (
            not 0 < args.num_prompts_scale <= MAX_SCALE,
            f"--num-prompts-scale: {args.num_prompts_scale} is not within (0, {MAX_SCALE:g}]; "
            "give 0.25 for a smoke test, 1 for the reported figures",
        ),
        (args.profile is not None and not args.profile.strip(), "--profile: empty path; give a calibration artifact"),
        (
            args.calibrate and args.profile is not None,
            "--calibrate: calibrates this host, --profile uses an existing artifact; give one of them",
        ),
        (
            args.model != "tiny" and not (args.profile or args.calibrate),
            f"--model {args.model}: no shipped profile; pass --profile DIR or --calibrate",
        ),
    ]
    return next((why for bad, why in checks if bad), None)


def check_only(args: argparse.Namespace) -> None:
    """Refuse, before any work, a ``--only`` name that no scenario of the chosen sets can have (held-out
    names are drawn at run time: their form here, the names themselves in :func:`check_drawn`)."""
    dev, held = args.set in ("development", "both"), args.set in ("held-out", "both")
    for name in args.only or ():
        m = HELD_OUT_NAME.fullmatch(name)
        if not ((dev and name in DEVELOPMENT) or (held and m and int(m[1]) < args.heldout_per_policy)):
            known = [f"the development set has {', '.join(DEVELOPMENT)}"] if dev else []
            if held:
                known.append("held-out names are h<k>-<policy>-pp<P>-<load>, drawn at run time")
            raise PPSimError(f"--only: no scenario {name!r} in --set {args.set}; {'; '.join(known)}")


def check_drawn(args: argparse.Namespace, todo: list) -> None:
    """Every ``--only`` name is among the scenarios planned (the held-out ones now drawn)."""
    names = [t[1] for t in todo]
    missing = [n for n in args.only or () if n not in names]
    if missing:
        raise PPSimError(f"--only: no scenario {missing[0]!r} in --set {args.set}; there are {', '.join(names)}")


def profile_for(args: argparse.Namespace) -> str:
    if args.profile:
        return args.profile
    if not args.calibrate:
        return SHIPPED_PROFILE
    from calibration.calibrate import calibrate

    prof = str(Path(args.runs) / f"profile-{args.model}")
    print(f"== calibrating {args.model} on this CPU (full grid)", flush=True)
    calibrate(MODELS[args.model], "cpu", prof, log=lambda m: None)
    return prof


def scaled(s, k: float):  # noqa: ANN001, ANN201
    if k == 1.0:
        return s
    n = max(2, round(s.workload.num_prompts * k))
    return s.model_copy(update={"workload": s.workload.model_copy(update={"num_prompts": n})})


def plan_scenarios(args: argparse.Namespace, profile: str) -> list[tuple[str, str, dict, object]]:
    model = MODELS[args.model]
    todo = []
    if args.set in ("development", "both"):
        for name, s in development(model, profile).items():
            knobs = {"policy": s.engine.policy.kind, "pp": s.cluster.pipeline_parallel_size}
            todo.append(("development", name, knobs, s))
    if args.set in ("held-out", "both"):
        for name, (knobs, s) in held_out(args.heldout_seed, args.heldout_per_policy, model, profile).items():
            todo.append(("held-out", name, knobs, s))
    check_drawn(args, todo)
    return [t for t in todo if not args.only or t[1] in args.only]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(lambda: run(args))  # Ctrl-C / SIGTERM: the engine's stages stopped, one line, exit 130 / 143


def run(args: argparse.Namespace) -> int:
    """Check the names and paths, calibrate (``--calibrate``), check the profile, run every scenario, write."""
    t0 = time.perf_counter()
    check_only(args)
    check_output_dir(args.runs, "--runs", replace=False)
    check_output_dir(args.out, "--out", names=result_names(args), replace=False)
    profile = profile_for(args)
    prepare(scenario(MODELS[args.model], profile, {}, 1, {}))  # a missing or damaged profile: one line, now
    todo = plan_scenarios(args, profile)
    if not todo:
        raise PPSimError(f"--set {args.set}: no scenario to run (--heldout-per-policy {args.heldout_per_policy})")
    payloads = (interleaved if args.interleave else back_to_back)(args, todo)
    rows = [result_row(set_name, name, knobs, p) for (set_name, name, knobs, _), p in zip(todo, payloads, strict=True)]
    write_results(args, profile, rows, time.perf_counter() - t0)
    return 0


def result_names(args: argparse.Namespace) -> list[str]:
    suffix = "" if args.model == "tiny" else f"-{args.model}"
    return [f"results{suffix}.csv", f"results{suffix}.md", f"errors{suffix}.png"]


def _show(name: str, knobs: dict, payload: dict) -> None:
    r = result_row("", name, knobs, payload)
    print(
        {m: f"{r[f'{m}_error']:+.3f}" for m in SHOWN},
        f"step {r['step_median_error']:+.3f}",
        "host ok" if r["host_ok"] is not False else f"HOST FLAGGED: {r['host_problem']}",
        flush=True,
    )


@contextmanager
def named(name: str) -> Iterator[None]:
    """A scenario's PPSimError, its name first."""
    try:
        yield
    except PPSimError as err:
        raise PPSimError(f"{name}: {err}") from None


def back_to_back(args: argparse.Namespace, todo: list) -> list[dict]:
    """Each scenario's ``--repeats`` engine runs one after another, then the next scenario."""
    payloads = []
    for set_name, name, knobs, s in todo:
        print(f"== [{set_name}] {name}", flush=True)
        out = Path(args.runs) / args.model / name
        with named(name):
            payloads.append(
                validate(
                    scaled(s, args.num_prompts_scale),
                    out,
                    args.repeats,
                    log=lambda m: None,
                    host=HostGuard(args.host_guard),
                )
            )
        _show(name, knobs, payloads[-1])
    return payloads


def interleaved(args: argparse.Namespace, todo: list) -> list[dict]:
    """Repeat k of every scenario, in order, before repeat k + 1 of any (``--interleave``): a scenario's
    repeats then lie a whole round apart, so its engine reference samples the host at different times,
    as the calibration's rounds do, where back-to-back repeats share one state of a host whose speed moves
    within minutes (``host_drift.py``). Every check is made before the first run; nothing is written
    until a scenario's last repeat."""
    from ppsim.validate.run import engine_repeats, finish_validation, prepare_validation

    ready = []
    for _set_name, name, _knobs, s in todo:
        with named(name):
            ready.append(
                prepare_validation(
                    scaled(s, args.num_prompts_scale),
                    Path(args.runs) / args.model / name,
                    args.repeats,
                    host=HostGuard(args.host_guard),
                )
            )
    done: list[tuple[list, list]] = [([], []) for _ in todo]
    for k in range(args.repeats):
        for (set_name, name, _knobs, _s), (s, _out, host), (runs, usage) in zip(todo, ready, done, strict=True):
            print(f"== [{set_name}] {name}: repeat {k + 1}/{args.repeats}", flush=True)
            with named(name):
                more, cpu = engine_repeats(s, host, [k], log=lambda m: None, total=args.repeats)
            runs += more
            usage += cpu
    payloads = []
    for (_set_name, name, knobs, _s), (s, out, host), (runs, usage) in zip(todo, ready, done, strict=True):
        with named(name):
            payloads.append(finish_validation(s, out, runs, usage, host, log=lambda m: None))
        _show(name, knobs, payloads[-1])
    return payloads


def write_results(args: argparse.Namespace, profile: str, rows: list[dict], wall_s: float) -> None:
    out = Path(args.out)
    csv_name, md_name, png_name = result_names(args)
    cmd = "python experiments/validation/run.py " + " ".join(sys.argv[1:])
    header = [
        f"# Validation: CPU engine vs simulator ({args.model} model)",
        "",
        f"Command: `{cmd.strip()}` ({wall_s / 60:.0f} min). Profile: "
        f"{'calibrated just before the runs' if args.calibrate else profile}. Engine repeats per scenario: "
        f"{args.repeats}. Held-out: seed {args.heldout_seed}, {args.heldout_per_policy} draws per policy, "
        "drawn at run time; no modelling choice was made on them. Prompt count scale: "
        f"{args.num_prompts_scale}. Host guard: {args.host_guard}. Repeats: "
        f"{'interleaved (repeat k of every scenario before k + 1)' if args.interleave else 'back to back'}.",
    ]
    atomic_write(out / csv_name, to_csv(rows))
    md = results_md(rows, header)
    atomic_write(out / md_name, md)
    print(md)
    plot(rows, out / png_name)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(11, 0.45 * len(rows)), 4.5))
    x = np.arange(len(rows))
    for i, m in enumerate(RELATIVE):
        ax.bar(x + (i - len(RELATIVE) / 2) * 0.13, [r[f"{m}_error"] * 100 for r in rows], 0.13, label=m)
    for lim in (10, -10):
        ax.axhline(lim, color="k", ls=":", lw=0.8)
    dev = sum(r["set"] == "development" for r in rows)
    if 0 < dev < len(rows):
        ax.axvline(dev - 0.5, color="grey", lw=1.2)
    ax.set_xticks(x, [r["scenario"] for r in rows], rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("simulator error vs engine (%)")
    ax.set_title("development (left) | held-out (right)" if 0 < dev < len(rows) else "")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
