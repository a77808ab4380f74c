"""One script for a machine with a single H200 (or any one CUDA GPU): calibrate, run, compare.

Steps, all outputs under ``--out`` (default ``experiments/validation/gpu-nocudnn``):
1. ``ppsim calibrate`` on CUDA for ``tiny`` and a mid-size model (``llama-3-8b``, bf16), quick grid.
2. ``ppsim validate`` (engine vs simulator, profiled cost) at PP=1 for both models.
3. The tiny model at PP=2 on the shared GPU, stages host-staged over gloo (NCCL refuses two ranks
   on one GPU): a functional check of the pipeline on CUDA, not a timing reference.
4. The first-wave question (docs/validation.md, "On one H200"): the engine and calibration now keep
   SDPA off cuDNN's attention, which plans a graph per new shape (``engine/kvcache.py::
   set_attention_backends``); the mid-size validation runs again with torch's default
   (``PPSIM_SDPA_CUDNN=1``) and with the caching allocator's expandable segments
   (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``). ``gpu_table.py`` splits each into waves:
   the 2x slower first wave should be gone in the default run and back in the cuDNN one.
5. ``tiny-moe`` (8 routed experts, top-2): calibrate and validate at PP=1 on a decode-heavy load.
6. The error table of every validation, printed last.

``--device cpu --mid-model tiny --mid-dtype float32`` is a dry run of every step on this host.

A global budget (``--budget-s``, default 480 s: give the device call a 540 s limit) stops starting
new steps once spent, the later ones first; every subprocess has its own timeout.
Run: ``python experiments/validation/gpu_h200.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError
from ppsim.metrics.io import atomic_write
from ppsim.models.shape import load_model
from ppsim.outputs import check_output_dir

HERE = Path(__file__).parent
MIN_BUDGET_S, MAX_BUDGET_S = 20.0, 86400.0  # no step starts with less than 20 s left; a day
WL = [
    "--num-prompts",
    "32",
    "--random-input-len",
    "256",
    "--random-output-len",
    "32",
    "--request-rate",
    "inf",
    "--max-num-batched-tokens",
    "1024",
    "--max-num-seqs",
    "16",
    "--repeats",
    "2",
]

CUDNN = {"PPSIM_SDPA_CUDNN": "1"}  # torch's default attention backends, cuDNN's first on an H200
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # segments grow in place
MOE_WL = [  # decode-heavy: up to 32 requests per step, each touching top-2 of 8 routed experts
    "--num-prompts",
    "32",
    "--random-input-len",
    "64",
    "--random-output-len",
    "64",
    "--request-rate",
    "inf",
    "--max-num-seqs",
    "32",
    "--repeats",
    "2",
]


def run(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> int:
    print("$", " ".join(f"{k}={v}" for k, v in (env or {}).items()), " ".join(cmd), flush=True)
    t = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env={**os.environ, **(env or {})}
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"  -> exit {rc} in {time.perf_counter() - t:.0f} s (log {log})", flush=True)
    return rc


def steps_of(args: argparse.Namespace, out: Path) -> list[tuple[str, list[str], float, dict[str, str]]]:
    """(name, command, time limit s, extra environment) of every step, in priority order."""
    ppsim = [sys.executable, "-m", "ppsim.cli"]
    dev = ["--device", args.device]

    def calibrate(model: str, name: str, *extra: str) -> list[str]:
        return ppsim + ["calibrate", "--model", model, *dev, "--quick", *extra, "--output", str(out / name)]

    def validate(model: str, profile: str, wl: list[str], name: str) -> list[str]:
        flags = ["--model", model, "-pp", "1", "--profile", str(out / profile), *dev, *wl]
        return ppsim + ["validate", *flags, "--output-dir", str(out / name)]

    mid = args.mid_model
    return [
        ("calibrate-tiny", calibrate("tiny", "profile-tiny"), 90, {}),
        ("calibrate-mid", calibrate(mid, "profile-mid", "--dtype", args.mid_dtype), 120, {}),
        ("validate-tiny-pp1", validate("tiny", "profile-tiny", WL, "validate-tiny-pp1"), 90, {}),
        ("validate-mid-pp1", validate(mid, "profile-mid", WL, "validate-mid-pp1"), 120, {}),
        ("validate-mid-cudnn", validate(mid, "profile-mid", WL, "validate-mid-cudnn"), 90, CUDNN),
        ("validate-mid-expandable", validate(mid, "profile-mid", WL, "validate-mid-expandable"), 90, EXPANDABLE),
        (
            "engine-tiny-pp2-shared-gpu",
            ppsim
            + ["engine", "--model", "tiny", "-pp", "2", *dev, "--backend", "gloo", "--num-prompts", "16"]
            + ["--request-rate", "inf", "--output-dir", str(out / "engine-tiny-pp2")],
            60,
            {},
        ),
        ("calibrate-moe", calibrate("tiny-moe", "profile-moe"), 90, {}),
        ("validate-moe-pp1", validate("tiny-moe", "profile-moe", MOE_WL, "validate-moe-pp1"), 90, {}),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/gpu_h200.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(HERE / "gpu-nocudnn"))
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--mid-model", default="llama-3-8b")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the steps here")
    ap.add_argument("--mid-dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args(argv)
    if not MIN_BUDGET_S < args.budget_s <= MAX_BUDGET_S:  # nan too
        ap.error(
            f"--budget-s: {args.budget_s:g} is not within ({MIN_BUDGET_S:g}, {MAX_BUDGET_S:g}]; "
            "no step starts with less than 20 s left (default 480)"
        )
    return run_main(lambda: run_steps(args))


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (no context is created: the steps run as their own processes)."""
    import torch

    return torch.cuda.is_available()


def run_steps(args: argparse.Namespace) -> int:
    """Every step within the budget, ``status.json``, the validations' tables; the inputs checked first."""
    try:  # a typo: one line now, not a failed step after the tiny model's
        load_model(args.mid_model)
    except PPSimError as err:
        raise PPSimError(f"--mid-model: {str(err).removeprefix('model: ')}") from None
    if args.device == "cuda" and not cuda_available():  # every step would fail the same way
        raise PPSimError(
            "--device: cuda, but torch sees no CUDA device here; "
            "run it where a GPU is lent, or --device cpu for a dry run"
        )
    out = Path(args.out)
    names = ["status.json", *(f"{name}.log" for name, *_ in steps_of(args, out))]
    check_output_dir(out, "--out", names=names, replace=False)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - t0)  # noqa: E731
    status = {}
    for name, cmd, limit, env in steps_of(args, out):
        if left() < 20:
            status[name] = "skipped (budget)"
            continue
        rc = run(cmd, out / f"{name}.log", min(limit, left()), env)
        status[name] = "ok" if rc == 0 else f"exit {rc}"
    atomic_write(out / "status.json", json.dumps(status, indent=2) + "\n")
    print(f"\n==== done in {time.perf_counter() - t0:.0f} s: {status}")
    for name in status:
        log = out / f"{name}.log"
        if name.startswith("validate") and log.exists():
            print(f"\n#### {name}\n" + log.read_text()[-4000:])
    return 0 if all(v == "ok" for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
