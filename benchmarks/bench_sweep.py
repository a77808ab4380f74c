"""Benchmark: a Vidur-Search-sized capacity sweep on this machine with the local executor.

Space: ``experiments/spaces/llama2-70b-vidur.toml`` (Llama-2-70B on H100: TP 1/2/4/8 x PP 1/2/4 x
max_num_seqs 32/64/128 x {vllm-sync, vllm-batch-queue} x chunk 512/1024/2048 = 216
configurations; 128 requests of 512 + 128 tokens per run; bisection to 5% in at most 6 steps
after the saturation run). Target: under 10 minutes on 2 cores. Starts from an empty results
folder (no resume) and reports the wall time, the number of simulated runs and the load average.

    .venv/bin/python benchmarks/bench_sweep.py [--workers N] [--space FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ppsim.sweep.executors import default_workers
from ppsim.sweep.results import format_table
from ppsim.sweep.runner import run_sweep
from ppsim.sweep.space import load_space

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 600.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--space", default=str(ROOT / "experiments" / "spaces" / "llama2-70b-vidur.toml"))
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--output-dir", default=None, help="keep the results here (default: a temporary folder)")
    args = p.parse_args(argv)
    space = load_space(args.space)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rep = run_sweep(space, args.output_dir or tmp, "local", args.workers, progress=True)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    print(format_table(rep.results, list(space.axes), top=10))
    status = Counter(r["status"] for r in rep.results)
    print(f"\nconfigurations: {len(rep.results)} ({dict(status)})")
    print(f"simulated runs: {rep.simulated_runs}")
    print(
        f"wall time: {wall:.1f} s with {args.workers} local workers on {os.cpu_count()} CPUs "
        f"(target < {TARGET_S:.0f} s: {'met' if wall < TARGET_S else 'MISSED'})"
    )
    print(f"load average (1 min) before {load0[0]:.2f}, after {load1[0]:.2f}")
    return 0 if wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
