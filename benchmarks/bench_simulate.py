"""Simulator speed: 10,000 requests (512 in / 128 out), Llama-3-8B, PP=4, offline.

Prints wall time, simulated requests per second of wall time and SimPy events per second.
Target (issue 2): under 20 s on one core. Run: .venv/bin/python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import argparse
import time

from ppsim.config import build_scenario
from ppsim.deployment import prepare
from ppsim.metrics.summary import summarize
from ppsim.sim.executor import simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=10_000)
    ap.add_argument("--policy", default="vllm-batch-queue")
    args = ap.parse_args()
    s = build_scenario(
        overrides={
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 4},
            "engine": {"policy": args.policy},
            "workload": {
                "num_prompts": args.num_prompts,
                "request_rate": "inf",
                "random_input_len": 512,
                "random_output_len": 128,
            },
        }
    )
    t0 = time.perf_counter()
    prep = prepare(s)
    res = simulate(prep)
    t1 = time.perf_counter()
    summ = summarize(res.requests, res.ops, 4)
    t2 = time.perf_counter()
    wall = t1 - t0
    print(f"requests           {len(res.requests)}")
    print(f"simulated time (s) {res.end_s:.2f}")
    print(f"wall time (s)      {wall:.2f}  (+{t2 - t1:.2f} s summary)")
    print(f"sim requests/s     {len(res.requests) / wall:.0f}")
    print(f"events/s           {res.events / wall:.0f}  ({res.events} events)")
    print(f"output tok/s (sim) {summ['output_throughput']:.0f}")


if __name__ == "__main__":
    main()
