"""One script for a machine with a single H200 (or any one CUDA GPU): calibrate, run, compare.

Steps, all outputs under ``--out`` (default ``experiments/validation/gpu``):
1. ``ppsim calibrate`` on CUDA for ``tiny`` and a mid-size model (``llama-3-8b``, bf16), quick grid.
2. ``ppsim validate`` (engine vs simulator, profiled cost) at PP=1 for both models.
3. The tiny model at PP=2 on the shared GPU, stages host-staged over gloo (NCCL refuses two ranks
   on one GPU): a functional check of the pipeline on CUDA, not a timing reference.
4. ``tiny-moe`` (8 routed experts, top-2): calibrate and validate at PP=1 on a decode-heavy load.
5. The error table of every validation, printed last.

``--device cpu --mid-model tiny --mid-dtype float32`` is a dry run of every step on this host.

A global budget (``--budget-s``, default 420 s < the 8-minute limit) stops starting new steps once
spent; every subprocess has its own timeout. Run: ``python experiments/validation/gpu_h200.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from ppsim.metrics.io import atomic_write

HERE = Path(__file__).parent
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


def run(cmd: list[str], log: Path, timeout_s: float) -> int:
    print("$", " ".join(cmd), flush=True)
    t = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"  -> exit {rc} in {time.perf_counter() - t:.0f} s (log {log})", flush=True)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "gpu"))
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--mid-model", default="llama-3-8b")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the steps here")
    ap.add_argument("--mid-dtype", default="bfloat16")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ppsim = [sys.executable, "-m", "ppsim.cli"]
    left = lambda: args.budget_s - (time.perf_counter() - t0)  # noqa: E731
    steps = [
        (
            "calibrate-tiny",
            ppsim
            + [
                "calibrate",
                "--model",
                "tiny",
                "--device",
                args.device,
                "--quick",
                "--output",
                str(out / "profile-tiny"),
            ],
            90,
        ),
        (
            "calibrate-mid",
            ppsim
            + [
                "calibrate",
                "--model",
                args.mid_model,
                "--device",
                args.device,
                "--quick",
                "--dtype",
                args.mid_dtype,
                "--output",
                str(out / "profile-mid"),
            ],
            120,
        ),
        (
            "validate-tiny-pp1",
            ppsim
            + [
                "validate",
                "--model",
                "tiny",
                "-pp",
                "1",
                "--profile",
                str(out / "profile-tiny"),
                "--device",
                args.device,
                *WL,
                "--output-dir",
                str(out / "validate-tiny-pp1"),
            ],
            90,
        ),
        (
            "validate-mid-pp1",
            ppsim
            + [
                "validate",
                "--model",
                args.mid_model,
                "-pp",
                "1",
                "--profile",
                str(out / "profile-mid"),
                "--device",
                args.device,
                *WL,
                "--output-dir",
                str(out / "validate-mid-pp1"),
            ],
            120,
        ),
        (
            "engine-tiny-pp2-shared-gpu",
            ppsim
            + [
                "engine",
                "--model",
                "tiny",
                "-pp",
                "2",
                "--device",
                args.device,
                "--backend",
                "gloo",
                "--num-prompts",
                "16",
                "--request-rate",
                "inf",
                "--output-dir",
                str(out / "engine-tiny-pp2"),
            ],
            60,
        ),
        (
            "calibrate-moe",
            ppsim
            + [
                "calibrate",
                "--model",
                "tiny-moe",
                "--device",
                args.device,
                "--quick",
                "--output",
                str(out / "profile-moe"),
            ],
            90,
        ),
        (
            "validate-moe-pp1",
            ppsim
            + [
                "validate",
                "--model",
                "tiny-moe",
                "-pp",
                "1",
                "--profile",
                str(out / "profile-moe"),
                "--device",
                args.device,
                *MOE_WL,
                "--output-dir",
                str(out / "validate-moe-pp1"),
            ],
            90,
        ),
    ]
    status = {}
    for name, cmd, limit in steps:
        if left() < 20:
            status[name] = "skipped (budget)"
            continue
        rc = run(cmd, out / f"{name}.log", min(limit, left()))
        status[name] = "ok" if rc == 0 else f"exit {rc}"
    atomic_write(out / "status.json", json.dumps(status, indent=2) + "\n")
    print(f"\n==== done in {time.perf_counter() - t0:.0f} s: {status}")
    for name in ("validate-tiny-pp1", "validate-mid-pp1", "validate-moe-pp1"):
        log = out / f"{name}.log"
        if log.exists():
            print(f"\n#### {name}\n" + log.read_text()[-4000:])
    return 0 if all(v == "ok" for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
