"""``ppsim engine``: the simulator's scenario flags, run on real stage processes.

Importing this module does not import torch; the handler does, so the simulator's commands work
without torch installed.
"""

from __future__ import annotations

import argparse
import signal
import sys


def add_engine_parser(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_live_engine_flags, add_scenario_flags

    p = sub.add_parser("engine", help="run a scenario on the real pipeline-parallel engine (torch.distributed)")
    add_scenario_flags(p)
    add_live_engine_flags(p)  # the scenario's live_engine section (ppsim/flags.py, LIVE_ENGINE_FLAGS)
    a = p.add_argument
    a("--output-dir", default="ppsim-engine-results", help="where results go (default ppsim-engine-results)")
    a("--no-dashboard", action="store_true", help="skip dashboard.png (`ppsim plot` draws it later)")
    p.set_defaults(handler=cmd_engine)


def cmd_engine(args: argparse.Namespace) -> int:
    from engine.launcher import StageFault
    from engine.run import EngineFault, Terminated, run_engine
    from ppsim.cli import report_rejections, scenario_from_args, scenario_inputs
    from ppsim.metrics.summary import format_summary
    from ppsim.outputs import check_output_dir
    from ppsim.rejections import rejections_of

    s = scenario_from_args(args)  # its live_engine section: the engine's own flags over the config file's
    out_dir = check_output_dir(args.output_dir, inputs=scenario_inputs(args, s, live=True))
    try:  # SIGTERM raises Terminated, a KeyboardInterrupt (ppsim.cli.main)
        run = run_engine(s, out_dir, log=lambda m: print(m, flush=True), dashboard=not args.no_dashboard)
    except EngineFault as err:
        print(f"error: {err}", file=sys.stderr)
        print(f"partial results written to {out_dir}/", file=sys.stderr)
        return 1
    except StageFault as err:  # before any request ran (start-up): nothing is written
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        if getattr(err, "partial_results", None):
            print(f"partial results written to {err.partial_results}/", file=sys.stderr)
        if isinstance(err, Terminated):
            print("terminated (SIGTERM)", file=sys.stderr)
            return 128 + signal.SIGTERM
        raise
    print(format_summary(run.summary, "Engine Benchmark Result"))
    print(
        f"results written to {out_dir}/ (summary.json, requests.csv, tokens.csv, stage_ops.csv, "
        "trace.json, actions.csv, config.json, engine.json, tokens.json, stage_loop.csv, timeseries.csv, timeline.csv"
        f"{'' if args.no_dashboard else ', dashboard.png'})"
    )
    return report_rejections(*rejections_of(run.prep, run.requests, run.summary))
