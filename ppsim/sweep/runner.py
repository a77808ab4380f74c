"""``ppsim sweep``: expand the space, skip what the results folder already holds, evaluate the rest.

Each finished configuration is saved at once (atomically) under ``OUT/results/``, so a sweep
that is interrupted (Ctrl-C: exit status 130) loses only the configurations in flight, and a
configuration that raises is recorded as status ``error`` instead of ending the sweep. At the end
``OUT/sweep.csv`` (the ranked table), ``OUT/pareto.png`` and ``OUT/space.json`` (the space as
resolved) are written.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError, Terminated
from ppsim.fileio import cut_text
from ppsim.metrics.io import dumps
from ppsim.outputs import check_apart, check_output_dir, write_result_set
from ppsim.sweep.evaluate import Task, config_key
from ppsim.sweep.executors import check_executor_flags, run_tasks
from ppsim.sweep.progress import Progress
from ppsim.sweep.results import format_table, load_done, plot_pareto, save_result, to_csv
from ppsim.sweep.space import SweepSpace, load_space


@dataclass
class SweepReport:
    space: SweepSpace
    results: list[dict[str, Any]]
    reused: int  # configurations found in the results folder
    evaluated: int
    simulated_runs: int  # runs made by this invocation
    wall_s: float
    csv_path: Path
    plot_path: Path | None


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``terminated``) during a sweep; the configurations finished so far are saved
    under ``OUT/results/``."""

    def __init__(self, out_dir: Path, finished: int, reused: int, total: int, terminated: bool = False) -> None:
        super().__init__(f"{finished} evaluated, {reused} reused of {total}")
        self.out_dir, self.finished, self.reused, self.total = out_dir, finished, reused, total
        self.terminated = terminated


def make_tasks(space: SweepSpace) -> list[Task]:
    tol, steps = space.search.rel_tolerance, space.search.max_steps
    tasks = []
    for c in space.configs:
        key = config_key(c.scenario, space.slo, tol, steps)
        tasks.append(Task(key, c.labels, c.scenario, space.slo, tol, steps))
    # the same configuration listed twice (e.g. two aliases to one value) is evaluated once
    return list({t.key: t for t in tasks}.values())


def _damaged_line(out: Path, damaged: list[str]) -> str:
    """One line for the damaged files of ``OUT/results/``, which are evaluated again."""
    shown = "; ".join(damaged[:3]) + (f"; ... ({len(damaged) - 3} more)" if len(damaged) > 3 else "")
    return f"warning: {out}/results/: {len(damaged)} damaged result file(s) evaluated again: {cut_text(shown)}"


SWEEP_FILES = ("sweep.csv", "space.json", "pareto.png")  # results/ holds one file per configuration


def space_inputs(space: SweepSpace) -> list[tuple[str, str]]:
    """The paths the sweep's runs read (a model's config.json, a profile), by field, each path once: the
    output folder may not be one of them or lie inside one (``--space`` is read whole before any work)."""
    from ppsim.models.shape import list_presets

    presets = set(list_presets())
    seen: dict[str, str] = {}
    for c in space.configs:
        s = c.scenario
        for field, path in (
            ("model", None if s.model in presets else s.model),
            ("cost.profile_dir", s.cost.profile_dir),
        ):
            if path and path not in seen:
                seen[path] = f"{field} of --space"
    return [(name, path) for path, name in seen.items()]


def run_sweep(
    space: SweepSpace,
    out_dir: str | Path,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
) -> SweepReport:
    check_executor_flags(executor, workers, ray_address)
    out = check_output_dir(out_dir, names=SWEEP_FILES, replace=False)
    for name, path in space_inputs(space):  # one at a time: a field may give several paths
        check_apart(out, "--output-dir", {name: path}, replace=False, names=(*SWEEP_FILES, "results"))
    t0 = time.perf_counter()
    tasks = make_tasks(space)
    done, damaged = load_done(out, [t.key for t in tasks])
    if damaged:
        print(_damaged_line(out, damaged), file=sys.stderr)
    todo = [t for t in tasks if t.key not in done]
    bar = Progress(len(todo), enabled=progress)
    runs = 0
    fresh: dict[str, dict[str, Any]] = {}
    if todo:
        results_iter = run_tasks(todo, executor, workers, ray_address)
        try:
            for r in results_iter:
                save_result(out, r)
                fresh[r["key"]] = r
                runs += r.get("runs", 0)
                bar.update()
        except KeyboardInterrupt as err:
            raise SweepInterrupted(out, len(fresh), len(done), len(tasks), isinstance(err, Terminated)) from None
        finally:
            results_iter.close()  # shuts the pool down (queued configurations cancelled) if interrupted
    by_key = {**done, **fresh}
    results = [by_key[t.key] for t in tasks]
    axes = list(space.axes)
    csv_path = out / "sweep.csv"
    space_json = dumps(
        {
            "name": space.name,
            "base": space.base,
            "axes": space.axes,
            "num_gpus": space.num_gpus,
            "slo": space.slo,
            "search": vars(space.search),
            "filtered_by_num_gpus": space.filtered,
        }
    )
    # the folder holds results/ it resumes from: these files join it, nothing there is removed
    write_result_set(out, {"sweep.csv": to_csv(results, axes), "space.json": space_json}, replace=False)
    png = out / "pareto.png"
    plotted = plot_pareto(results, png, f"{space.name}: SLO {', '.join(f'{k}<={v:g}' for k, v in space.slo.items())}")
    return SweepReport(
        space, results, len(done), len(fresh), runs, time.perf_counter() - t0, csv_path, png if plotted else None
    )


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="capacity search: highest SLO-meeting rate per configuration of a space")
    p.add_argument("--space", required=True, help="TOML/YAML search space (see experiments/spaces/)")
    p.add_argument("--output-dir", default="ppsim-sweep", help="results folder; a rerun resumes from it")
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes (local) or CPUs (local Ray); default: all; not with --ray-address",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to connect to (--executor ray only; default: start a local one)",
    )
    p.add_argument("--top", type=int, default=20, help="rows of the ranked table to print")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    check_executor_flags(args.executor, args.workers, args.ray_address)
    if args.top < 1:
        raise PPSimError(f"--top: {args.top} rows; give a positive number of rows to print")
    space = load_space(args.space)
    try:
        rep = run_sweep(space, args.output_dir, args.executor, args.workers, args.ray_address, not args.no_progress)
    except SweepInterrupted as intr:
        how = "terminated (SIGTERM)" if intr.terminated else "interrupted"
        print(
            f"\n{how}: {intr.finished} configurations evaluated in this run ({intr.reused} reused, "
            f"{intr.total} in all) are kept in {intr.out_dir}/results/; rerun the same command to resume",
            file=sys.stderr,
        )
        return 143 if intr.terminated else 130
    print(format_table(rep.results, list(space.axes), args.top))
    print(
        f"{rep.evaluated} evaluated ({rep.simulated_runs} simulated runs), {rep.reused} reused from "
        f"{args.output_dir}/results/, {space.filtered} filtered by num_gpus; {rep.wall_s:.1f} s"
    )
    plot = f"  plot: {rep.plot_path}" if rep.plot_path else "  (no plot: nothing met the SLOs)"
    print(f"table: {rep.csv_path}{plot}")
    return 0
