"""``ppsim engine``: the simulator's scenario flags, run on real stage processes.

Importing this module does not import torch; the handler does, so the simulator's commands work
without torch installed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator


def add_engine_parser(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_scenario_flags

    p = sub.add_parser("engine", help="run a scenario on the real pipeline-parallel engine (torch.distributed)")
    add_scenario_flags(p)
    for field, (flag, kwargs) in OPTION_FLAGS.items():
        p.add_argument(flag, dest=field, **kwargs)
    a = p.add_argument
    a("--output-dir", default="ppsim-engine-results", help="where results go (default ppsim-engine-results)")
    a("--no-dashboard", action="store_true", help="skip dashboard.png (`ppsim plot` draws it later)")
    p.set_defaults(handler=cmd_engine)


def cmd_engine(args: argparse.Namespace) -> int:
    from engine.launcher import StageFault
    from engine.run import EngineFault, Terminated, run_engine
    from ppsim.cli import report_rejections, scenario_from_args
    from ppsim.metrics.summary import format_summary
    from ppsim.outputs import check_output_dir
    from ppsim.rejections import rejections_of

    s = scenario_from_args(args)
    opts = engine_options(args)
    out_dir = check_output_dir(args.output_dir)
    try:
        with sigterm_as_interrupt():
            run = run_engine(s, out_dir, opts, log=lambda m: print(m, flush=True), dashboard=not args.no_dashboard)
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
        "trace.json, actions.csv, config.json, engine.json, tokens.json, timeseries.csv, timeline.csv"
        f"{'' if args.no_dashboard else ', dashboard.png'})"
    )
    return report_rejections(*rejections_of(run.prep, run.requests, run.summary))


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`engine.run.Terminated` (a KeyboardInterrupt) while the engine runs, so
    ``timeout``, Slurm and Kubernetes get the partial results Ctrl-C gets. Main thread only."""
    from engine.run import Terminated

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# EngineOptions field -> (its flag, argparse settings): the one table of the engine's own flags (the
# parser and the one-line error messages both read it)
OPTION_FLAGS: dict[str, tuple[str, dict]] = {
    "backend": (
        "--backend",
        {"choices": ["gloo", "nccl"], "default": "gloo", "help": "torch.distributed backend (default gloo)"},
    ),
    "device": (
        "--device",
        {"choices": ["cpu", "cuda"], "default": "cpu", "help": "where stages compute (default cpu)"},
    ),
    "threads_per_stage": (
        "--threads-per-stage",
        {"type": int, "default": 1, "help": "torch threads per stage process (default 1)"},
    ),
    "stage_timeout_s": (
        "--stage-timeout-s",
        {
            "type": float,
            "default": None,
            "help": "declare a stage dead after this long without progress (default 5 s + 4 x a full step)",
        },
    ),
    "startup_timeout_s": (
        "--startup-timeout-s",
        {
            "type": float,
            "default": 60.0,
            "help": "give up if a stage is "
            "not ready (spawned, joined, weights loaded, warmed up) within this (default 60)",
        },
    ),
    "kv_num_blocks": (
        "--kv-blocks",
        {"type": int, "default": None, "help": "KV pool size (default: what the workload can hold at once)"},
    ),
    "max_kv_gib": (
        "--max-kv-gib",
        {"type": float, "default": 4.0, "help": "refuse a larger KV cache per stage (default 4)"},
    ),
    "checkpoint": (
        "--checkpoint",
        {"default": None, "help": "HF-layout safetensors directory (default: random weights from --seed)"},
    ),
    "inject_fault": (
        "--inject-fault",
        {"default": None, "help": "test the fault path: kill:STAGE:STEP or stall:STAGE:STEP"},
    ),
}
FLAGS = {field: flag for field, (flag, _) in OPTION_FLAGS.items()}


def engine_options(args: argparse.Namespace):  # noqa: ANN201 - EngineOptions; engine.run imports torch
    """EngineOptions from the flags; a value out of range is a PPSimError naming the flag."""
    from pydantic import ValidationError

    from engine.run import EngineOptions
    from ppsim.config import format_validation_error
    from ppsim.errors import PPSimError

    try:
        return EngineOptions(**{field: getattr(args, field) for field in OPTION_FLAGS})
    except ValidationError as err:
        msg = format_validation_error(err)
        field = msg.split(":", 1)[0]
        if field in FLAGS:
            msg = FLAGS[field] + msg[len(field) :]
        raise PPSimError(msg) from None
