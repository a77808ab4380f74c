"""The ``ppsim calibrate`` and ``ppsim import-vidur`` subcommands (parsers and handlers)."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from ppsim.errors import PPSimError

MAX_ROUTER_ZIPF = 8.0  # the scenario field moe_router_zipf's bound (ppsim/config.py): a profile must match it
VIDUR_ROOT_ENV = "PPSIM_VIDUR_ROOT"
VIDUR_SOURCE = "the data/profiling directory of a Vidur checkout (git clone https://github.com/microsoft/vidur)"


def add_output_dir_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--output-dir`` as every ppsim command names it; ``--output`` kept as an alias."""
    p.add_argument("--output-dir", "--output", dest="output", required=True, metavar="DIR", help=what)


def resolve_vidur_root(root: str | None) -> str:
    """``--root``, else ``$PPSIM_VIDUR_ROOT``; refuse with where the data comes from when neither is set."""
    if root == "":
        raise PPSimError(f"--root: empty; pass {VIDUR_SOURCE}, or drop --root to use ${VIDUR_ROOT_ENV}")
    root = root or os.environ.get(VIDUR_ROOT_ENV) or None
    if root is None:
        raise PPSimError(f"--root: not given; pass --root DIR or set {VIDUR_ROOT_ENV}=DIR, DIR being {VIDUR_SOURCE}")
    return root


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="profile operators, link and CPU overheads with torch; write a profile")
    p.add_argument("--model", default="tiny", help="preset name or HF config.json path (default tiny)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", help="float32 | float16 | bfloat16 (default: the model's torch_dtype)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: one per stage worker)")
    p.add_argument("--quick", action="store_true", help="small grid (seconds), for tests")
    p.add_argument(
        "--clock",
        default="auto",
        choices=["auto", "wall", "thread"],
        help="CPU timing clock; auto = thread CPU time with one torch thread (robust on a shared host)",
    )
    p.add_argument(
        "--moe-router-zipf",
        type=float,
        default=0.0,
        help="MoE: the engine router's popularity skew s to measure expert load under, 0 to 8 (default 0)",
    )
    p.add_argument("--no-link", action="store_true", help="skip the two-process link profiler")
    add_output_dir_flag(p, "profile directory to write (alias --output)")
    p.set_defaults(handler=cmd_calibrate)


def add_import_vidur_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-vidur", help="convert Vidur GPU operator profiles (CSV) into a ppsim profile")
    p.add_argument("--root", help=f"Vidur's profiling data: {VIDUR_SOURCE}; default ${VIDUR_ROOT_ENV}")
    p.add_argument("--device", default="h100", help="a100 | h100 | a40 (a folder under ROOT/compute)")
    p.add_argument(
        "--model",
        required=True,
        help="ppsim preset: llama-2-7b, llama-2-70b, llama-3-8b, llama-3-70b, codellama-34b, internlm-20b, qwen-72b",
    )
    p.add_argument("--vidur-model", help="model folder under compute/DEVICE, e.g. meta-llama/Llama-2-7b-hf")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, dest="tp")
    p.add_argument("--network", default="pairwise_nvlink", help="pairwise_nvlink | dgx (network/DEVICE_NETWORK)")
    add_output_dir_flag(p, "profile directory to write (alias --output)")
    p.set_defaults(handler=cmd_import_vidur)


def check_router_zipf(zipf: float) -> None:
    """Refuse a router skew no scenario can use (``moe_router_zipf`` is 0..8), before any profiling."""
    if not (math.isfinite(zipf) and 0.0 <= zipf <= MAX_ROUTER_ZIPF):
        raise PPSimError(
            f"--moe-router-zipf: {zipf:g} is not a router skew a scenario can use; "
            f"give a finite value in [0, {MAX_ROUTER_ZIPF:g}] (0 = the router alone)"
        )


def cmd_calibrate(args: argparse.Namespace) -> int:
    check_router_zipf(args.moe_router_zipf)
    from calibration.calibrate import calibrate
    from calibration.report import format_report

    t0 = time.perf_counter()
    meta = calibrate(
        args.model,
        args.device,
        args.output,
        quick=args.quick,
        threads=args.threads,
        dtype=args.dtype,
        link=not args.no_link,
        clock=args.clock,
        router_zipf=args.moe_router_zipf,
    )
    print(format_report(meta, json.loads((Path(args.output) / "fits.json").read_text())))
    print(f"profile written to {args.output}/ (meta.json, fits.json, samples.csv) in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_import_vidur(args: argparse.Namespace) -> int:
    from calibration.artifact import check_output_dir
    from calibration.vidur_import import import_vidur

    # before the data root: a bad output path is the first thing to fix; nor may it be, hold or lie in the data
    given = args.root if args.root is not None else os.environ.get(VIDUR_ROOT_ENV)
    check_output_dir(
        args.output, inputs={"--root" if args.root is not None else VIDUR_ROOT_ENV: given} if given else {}
    )
    root = resolve_vidur_root(args.root)
    try:
        meta, fits = import_vidur(
            root, args.device, args.model, args.output, tp=args.tp, vidur_model=args.vidur_model, network=args.network
        )
    except PPSimError as err:  # a bad root from the environment is named as such, not as the flag not given
        msg = str(err)
        if args.root is None and msg.startswith("--root:"):
            raise PPSimError(VIDUR_ROOT_ENV + msg[len("--root") :]) from None
        raise
    for op, f in sorted(fits.items()):
        src = f.get("source", "")
        cv = f.get("cv_median_abs_rel_err")
        print(f"{op:<26}{f['form']:<14}{src}" + ("" if cv is None else f"  (cv median |err| {100 * cv:.1f}%)"))
    for m in meta["missing"]:
        print(f"missing: {m}")
    print(f"profile written to {args.output}/")
    return 0
