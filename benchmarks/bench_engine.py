"""Engine benchmark: the tiny model offline (all requests at t = 0) at PP=1 and PP=2 on CPU.

One torch thread per stage. Prints output throughput, per-stage busy fraction and the measured
pipeline bubble (1 - total stage busy time / (stages x window), from the stages' own clocks).
Run: ``.venv/bin/python benchmarks/bench_engine.py [--num-prompts N] [--policy P ...]``.
"""

from __future__ import annotations

import argparse

from engine.run import EngineOptions, run_engine
from ppsim.config import build_scenario, step_budget_fields


def scenario(pp: int, policy: str, n: int, input_len: int, output_len: int, budget: int):
    return build_scenario(
        None,
        {
            "model": "tiny",
            "seed": 0,
            "cluster": {"pipeline_parallel_size": pp},
            "engine": {"policy": policy, **step_budget_fields(policy, budget)},
            "workload": {
                "num_prompts": n,
                "request_rate": float("inf"),
                "random_input_len": input_len,
                "random_output_len": output_len,
            },
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--policy", nargs="+", default=["vllm-sync", "vllm-batch-queue"])
    a = ap.parse_args()
    print(
        f"tiny model, {a.num_prompts} prompts x ({a.input_len} in, {a.output_len} out), offline, "
        f"budget {a.max_num_batched_tokens} tokens, 1 thread per stage, gloo on CPU"
    )
    print(f"{'pp':>3} {'policy':<18}{'out tok/s':>10}{'steps':>7}  {'stage busy':<16}{'bubble':>7}{'wall s':>8}")
    for pp in (1, 2):
        for policy in a.policy if pp > 1 else ["vllm-sync"]:
            s = scenario(pp, policy, a.num_prompts, a.input_len, a.output_len, a.max_num_batched_tokens)
            run = run_engine(s, options=EngineOptions(threads_per_stage=1))
            m = run.summary
            busy = " ".join(f"{f:.2f}" for f in m["stage_busy_fraction"])
            print(
                f"{pp:>3} {policy:<18}{m['output_throughput']:>10.1f}{run.info['num_steps_launched']:>7}  "
                f"{busy:<16}{m['pipeline_bubble_fraction']:>7.3f}{run.info['wall_s']:>8.2f}"
            )


if __name__ == "__main__":
    main()
