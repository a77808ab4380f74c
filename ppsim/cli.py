"""``ppsim``: command-line entry point. Flags map onto the scenario; the config file sits below them."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ppsim.errors import PPSimError, Terminated
from ppsim.fileio import permission_fix, short_repr
from ppsim.metrics.trace import TRACE_WINDOW_S

# characters that would break an error line (newlines, NUL, other controls, Unicode line separators)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# a negative number or a list of numbers, as float() reads them ("-1e-6,0,0", "-inf", "-Infinity", "-nan")
_NUMBER_WORD = "infinity|inf|nan"
_NEGATIVE_NUMBER = re.compile(rf"^-(\d|\.\d|{_NUMBER_WORD})([\d.e+\-,:]|{_NUMBER_WORD})*$", re.IGNORECASE)


def one_line(text: str) -> str:
    """``text`` with control characters escaped as in ``repr`` (a path holding a newline stays one line)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and negative numbers as values (``--coefficients -1,0,0``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "-1", "-1.5", "-1e-6,0,0", "-inf", "-nan,0,0": values, not flags (no ppsim flag starts with a digit,
        # -inf or -nan); their validation says what is wrong with them
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {one_line(message)} (see `{self.prog} --help`)\n")


def _window_s(text: str) -> float:
    """``--trace-window-s``: positive seconds, or inf (argparse puts the flag's name before the message)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not v > 0:
        raise argparse.ArgumentTypeError(
            f"{short_repr(text)} is not a positive number of seconds; "
            f"give one such as {TRACE_WINDOW_S:g}, or inf for the whole run"
        )
    return v


def add_scenario_flags(p: argparse.ArgumentParser) -> None:
    """The flags shared by ``simulate``, ``engine``, ``validate`` and the chunk commands: one per scenario
    field, generated from the config and the table of the engines' flag names (:mod:`ppsim.flags`)."""
    from ppsim.flags import flag_specs

    p.add_argument("--config", help="TOML/YAML/JSON scenario file; flags override it")
    for f in flag_specs():
        p.add_argument(*f.flags, dest=f.dest, **f.kwargs)


def add_live_engine_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the scenario's ``live_engine`` section (``ppsim engine``, ``ppsim validate``)."""
    from ppsim.flags import live_engine_flag_specs

    for f in live_engine_flag_specs():
        p.add_argument(*f.flags, dest=f.dest, **f.kwargs)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from ppsim.flags import flag_paths, live_engine_flag_specs

    out: dict[str, Any] = {}
    paths = {**flag_paths(), **{f.dest: f.path for f in live_engine_flag_specs()}}  # absent dests: None
    for dest, path in paths.items():
        v = getattr(args, dest, None)
        if v is None:
            continue
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    if getattr(args, "profile", None):
        out.setdefault("cost", {})["kind"] = "profile"
    return out


def scenario_from_args(args: argparse.Namespace):  # noqa: ANN201
    """The scenario of the config file and the flags; an error in a live-engine value given as a flag
    names the flag (``--threads-per-stage: ...``), one from the file names the field."""
    from ppsim.config import build_scenario
    from ppsim.flags import live_engine_flag_specs

    try:
        return build_scenario(args.config, overrides_from_args(args))
    except PPSimError as err:
        msg = str(err)
        for f in live_engine_flag_specs():
            field = ".".join(f.path)
            if msg.startswith(field + ":") and getattr(args, f.dest, None) is not None:
                raise PPSimError(f.flags[0] + msg[len(field) :]) from None
        raise


def scenario_inputs(args: argparse.Namespace, s: Any, live: bool = False) -> dict[str, str]:
    """The paths a scenario command reads as it runs, by the flag that gave them (the field when the config
    file did): a model's config.json, the trace, the profile and, for the engine (``live``), the
    checkpoint (``--config`` is read whole before any work: ``engine --config RUN/config.json
    --output-dir RUN`` re-runs a run in place). :func:`ppsim.outputs.check_output_dir` keeps the
    results apart from them."""
    from ppsim.models.shape import list_presets

    checkpoint = s.live_engine.checkpoint if live else None
    paths = [  # flag, its dest, the field, the path (--config: read whole before any work, so no matter)
        ("--model", "model", "model", None if s.model in list_presets() else s.model),
        ("--trace", "trace", "workload.trace", s.workload.trace),
        ("--profile", "profile", "cost.profile_dir", s.cost.profile_dir),
        ("--checkpoint", "live_engine_checkpoint", "live_engine.checkpoint", checkpoint),
    ]
    read_as_file = ("--trace",)  # one that is not a file: its reader says so, more to the point
    return {
        flag if getattr(args, dest, None) else field: v
        for flag, dest, field, v in paths
        if v and (flag not in read_as_file or os.path.isfile(v))
    }


def cmd_simulate(args: argparse.Namespace) -> int:
    from ppsim.metrics.io import DASHBOARD_FILES, DEFAULT_FILES, DETAILED_FILES
    from ppsim.metrics.summary import format_summary
    from ppsim.outputs import check_output_dir
    from ppsim.run import run_scenario

    if args.trace_window_s is not None and not args.save_detailed:
        raise PPSimError(
            "--trace-window-s: it sets the span of trace.json, which only --save-detailed writes; "
            "add --save-detailed or drop --trace-window-s"
        )
    s = scenario_from_args(args)
    window = TRACE_WINDOW_S if args.trace_window_s is None else args.trace_window_s
    window = None if math.isinf(window) else window  # inf: the whole run
    out_dir = check_output_dir(args.output_dir, inputs=scenario_inputs(args, s))
    out = run_scenario(
        s,
        out_dir,
        save_detailed=args.save_detailed,
        lean=True,
        trace_window_s=window,
        progress=not args.quiet,
        dashboard=not args.no_dashboard,
    )
    print(format_summary(out.summary))
    files = DEFAULT_FILES + (DETAILED_FILES if args.save_detailed else ()) + DASHBOARD_FILES
    if args.no_dashboard:
        files = files[:-1]
    print(f"results written to {out_dir}/ ({', '.join(files)})")
    return report_rejections(out.rejections, out.all_rejected)


def report_rejections(message: str | None, all_rejected: bool) -> int:
    """Print the line about rejected requests; exit status 1 if no request could be served."""
    if message is None:
        return 0
    print(f"{'error' if all_rejected else 'warning'}: {message}", file=sys.stderr)
    return 1 if all_rejected else 0


def cmd_models(args: argparse.Namespace) -> int:
    from ppsim.models.shape import list_presets, load_model

    print(
        f"{'name':<16}{'layers':>7}{'hidden':>8}{'heads':>7}{'kv':>5}{'vocab':>8}{'params(B)':>11}"
        f"{'active(B)':>11}{'attn':>6}{'experts':>9}{'weights':>10}"
    )
    for n in list_presets():
        m = load_model(n)
        experts = f"{m.num_experts_per_tok}/{m.n_routed_experts}" if m.is_moe else "-"
        print(
            f"{n:<16}{m.num_layers:>7}{m.hidden_size:>8}{m.num_heads:>7}{m.num_kv_heads:>5}{m.vocab_size:>8}"
            f"{m.total_params() / 1e9:>11.2f}{m.active_params() / 1e9:>11.2f}{m.attention:>6}{experts:>9}"
            f"{m.weight_dtype:>10}"
        )
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from ppsim.hardware.presets import DEVICES, LINKS

    print(f"{'device':<14}{'bf16 TFLOP/s':>14}{'fp8':>7}{'fp4':>7}{'HBM GB/s':>10}{'mem GiB':>9}")
    for d in DEVICES.values():
        fp8 = f"{d.peak_tflops_fp8:.0f}" if d.peak_tflops_fp8 else "-"
        fp4 = f"{d.peak_tflops_fp4:.0f}" if d.peak_tflops_fp4 else "-"
        print(f"{d.name:<14}{d.peak_tflops:>14.0f}{fp8:>7}{fp4:>7}{d.hbm_bandwidth_gbps:>10.0f}{d.memory_gib:>9.1f}")
    print(f"\n{'link':<12}{'latency us':>11}{'GB/s':>8}")
    for ln in LINKS.values():
        print(f"{ln.name:<12}{ln.latency_us:>11.1f}{ln.bandwidth_gbps:>8.1f}")
    return 0


def cmd_bubble(args: argparse.Namespace) -> int:
    from ppsim.bubble import bubble_rows

    rows = bubble_rows()
    bad = [r for r in rows if abs(r["analytic"] - r["simulated"]) > 1e-6]
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'P':>3}{'M':>5}{'(P-1)/(M+P-1)':>16}{'simulated':>12}")
        for r in rows:
            print(f"{r['pp']:>3}{r['microbatches']:>5}{r['analytic']:>16.6f}{r['simulated']:>12.6f}")
    if bad:
        print(f"error: {len(bad)} rows differ from the closed form by more than 1e-6", file=sys.stderr)
        return 1
    return 0


DESCRIPTION = (
    "ppsim: simulate pipeline-parallel LLM serving (vLLM and SGLang flag names), run the same "
    "policies on a real torch.distributed engine, calibrate, validate and sweep."
)

COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "simulate": (cmd_simulate, "simulate a serving scenario (default: Llama-3-70B, PP=4 H100, 8 req/s)"),
    "models": (cmd_models, "list model presets"),
    "hardware": (cmd_hardware, "list device and link presets"),
    "bubble": (cmd_bubble, "closed-form pipeline bubble vs the simulator"),
}


def version() -> str:
    """The installed distribution's version; the package's own when it is run from a source tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("ppsim")
    except PackageNotFoundError:
        from ppsim import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ppsim",
        description=DESCRIPTION,
        epilog="`ppsim COMMAND --help` lists a command's flags; flags alone (or nothing) run `ppsim simulate`.",
    )
    p.add_argument("--version", action="version", version=f"ppsim {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sim = sub.add_parser("simulate", help=COMMANDS["simulate"][1])
    add_scenario_flags(sim)
    sim.add_argument(
        "--output-dir", default="ppsim-results", metavar="DIR", help="where results go (default ppsim-results)"
    )
    sim.add_argument("--no-dashboard", action="store_true", help="skip dashboard.png (`ppsim plot` draws it later)")
    sim.add_argument(
        "--save-detailed",
        action="store_true",
        help="also write tokens.csv, stage_ops.csv and trace.json (every token and operation)",
    )
    sim.add_argument(
        "--trace-window-s",
        type=_window_s,
        default=None,  # unset: TRACE_WINDOW_S; given without --save-detailed: refused (no trace.json)
        help=f"simulated seconds in trace.json, with --save-detailed (default {TRACE_WINDOW_S:g}; inf: the whole run)",
    )
    sim.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    sub.add_parser("models", help=COMMANDS["models"][1])
    sub.add_parser("hardware", help=COMMANDS["hardware"][1])
    b = sub.add_parser("bubble", help=COMMANDS["bubble"][1])
    b.add_argument("--json", action="store_true")
    # Commands living in their own packages; none imports torch until its handler runs.
    from calibration.cli import add_calibrate_parser, add_import_vidur_parser
    from engine.cli import add_engine_parser
    from ppsim.chunks import add_chunk_parsers
    from ppsim.report.cli import add_compare_parser, add_plot_parser
    from ppsim.sweep.runner import add_sweep_parser
    from ppsim.validate.cli import add_validate_parser

    for add in (
        add_sweep_parser,
        add_calibrate_parser,
        add_import_vidur_parser,
        add_chunk_parsers,
        add_engine_parser,
        add_validate_parser,
        add_plot_parser,
        add_compare_parser,
    ):
        add(sub)
    return p


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`~ppsim.errors.Terminated` (a KeyboardInterrupt), so that ``timeout``, Slurm
    and Kubernetes get Ctrl-C's clean-up: no temporary result directory left, the engine's partial
    results written. Main thread only."""

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


def run_main(
    work: Callable[[], int | None],
    *,
    prefix: str = "",
    exit_code: int | None = None,
    signals: bool = True,
    os_errors: bool = True,
) -> int:
    """Run an entry point's ``work`` and return its exit status (``None``: 0), every failure one line on stderr.

    Bad input (:class:`~ppsim.errors.PPSimError`) is ``error: {prefix}{message}``, exit status the error's
    own (2; :class:`~ppsim.outputs.OutputError` 1) or ``exit_code`` when given. With ``signals``, SIGTERM
    raises :class:`~ppsim.errors.Terminated` while ``work`` runs (:func:`sigterm_as_interrupt`): exit 143
    after ``terminated (SIGTERM)``, Ctrl-C 130 after ``interrupted``. With ``os_errors``, a broken pipe
    (``| head``) is a quiet 0 and any other ``OSError`` one line naming the file, exit 2 where the fix is
    a permission (bad input), else 1. Without them, these propagate as they would without this function.
    """
    try:
        with sigterm_as_interrupt() if signals else contextlib.nullcontext():
            return work() or 0
    except PPSimError as err:
        print(f"error: {one_line(prefix + str(err))}", file=sys.stderr)
        return getattr(err, "exit_code", 2) if exit_code is None else exit_code
    except KeyboardInterrupt as err:
        if not signals:
            raise
        if isinstance(err, Terminated):  # SIGTERM: the clean-up on the way here has run, as for Ctrl-C
            print("terminated (SIGTERM)", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        if not os_errors:
            raise
        if isinstance(err, BrokenPipeError):  # `ppsim models | head`
            sys.stderr.close()
            return 0
        # a file that vanished or a disk that filled outside the result writers
        where, fix = f"{err.filename}: " if err.filename else "", permission_fix(err)
        print(f"error: {one_line(f'{prefix}{where}{err.strerror or err}{fix}')}", file=sys.stderr)
        return 2 if fix else 1  # a path the user may not read is bad input


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["simulate", *argv]  # flags alone (or nothing) run `ppsim simulate`
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None) or COMMANDS[args.command][0]
    return run_main(lambda: handler(args))


if __name__ == "__main__":
    sys.exit(main())
