"""What the benchmark scripts share: Vidur's scenario and the `ppsim simulate` child command line."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Vidur's own scenario: Llama-2-70B, TP=2, A100, PP=4, Poisson 2 req/s of 512 in / 128 out.
VIDUR = [
    "--model",
    "llama-2-70b",
    "--hardware",
    "a100-80gb",
    "-tp",
    "2",
    "-pp",
    "4",
    "--request-rate",
    "2",
    "--random-input-len",
    "512",
    "--random-output-len",
    "128",
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "4096",
]


def simulate_argv(args: list[str], out: Path) -> list[str]:
    """`ppsim simulate ARGS` with its default outputs into ``out`` (no PNG, no progress), in this Python."""
    return [sys.executable, "-m", "ppsim.cli", "simulate", *args, "--quiet", "--no-dashboard", "--output-dir", str(out)]
