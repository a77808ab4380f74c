"""``ppsim plot`` (redraw a run's dashboard) and ``ppsim compare`` (runs side by side)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppsim.errors import PPSimError
from ppsim.outputs import check_output_dir, check_output_file

COMPARE_DIR = "ppsim-compare"  # where compare.png goes without --output or --output-dir


def add_plot_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="redraw a run's dashboard.png from the files of its directory")
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="directory written by simulate, engine or validate (every run of a validate directory)",
    )
    p.add_argument("--output", default=None, help="PNG path (default RUN_DIR/dashboard.png; one RUN_DIR only)")
    p.set_defaults(handler=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from ppsim.metrics.io import save_figure
    from ppsim.report.compare import expand
    from ppsim.report.dashboard import draw_dashboard
    from ppsim.report.runfiles import load_run

    runs = expand(args.run_dirs)
    if args.output is not None:
        _check_png(args.output, "dashboard.png")
    if args.output is not None and len(runs) > 1:
        raise PPSimError(f"--output: {len(runs)} runs given; drop --output to write RUN_DIR/dashboard.png each")
    paths = [Path(args.output) if args.output is not None else run / "dashboard.png" for run in runs]
    for path in paths:  # every PNG path and every run's files, before any is drawn
        check_output_file(path, "--output")
    loaded = [load_run(run) for run in runs]
    for run, path in zip(loaded, paths, strict=True):
        save_figure(draw_dashboard(run), path, dpi=100)
        print(f"dashboard written to {path}")
    return 0


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="vllm bench serve metrics of runs side by side, latency CDFs and throughput in one PNG"
    )
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (simulate, engine, validate); ratios are to the first",
    )
    p.add_argument("--output", default=None, help="PNG path (default OUTPUT_DIR/compare.png)")
    p.add_argument("--output-dir", default=None, help=f"where compare.png goes (default {COMPARE_DIR})")
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from ppsim.report.compare import compare_runs, format_comparison, write_comparison

    if args.output is not None and args.output_dir is not None:
        raise PPSimError("--output-dir: --output names the PNG itself, so no directory is used; drop one of them")
    if args.output is None:
        out_dir = COMPARE_DIR if args.output_dir is None else args.output_dir
        # compare.png is written beside the runs, never into one of them (that would change a run's set)
        many = len(args.run_dirs) > 1
        runs = {f"RUN_DIR #{i + 1}" if many else "RUN_DIR": r for i, r in enumerate(args.run_dirs)}
        check_output_dir(out_dir, "--output-dir", names=("compare.png",), replace=False, inputs=runs)
        path = Path(out_dir) / "compare.png"
    else:
        _check_png(args.output, "compare.png")
        path = Path(args.output)
    check_output_file(path, "--output" if args.output is not None else "--output-dir")
    names, runs = compare_runs(args.run_dirs)
    print(format_comparison(names, runs))
    print(f"plot written to {write_comparison(names, runs, path)}")
    return 0


def _check_png(path: str, example: str) -> None:
    """Refuse an --output that is empty (not the default path) or not a PNG file."""
    if not path.strip():
        raise PPSimError(f"--output: empty path; name the PNG file, e.g. {example}, or drop --output for the default")
    if Path(path).suffix.lower() != ".png":
        raise PPSimError(f"--output: {path} is not a .png path; name the file FILE.png")
