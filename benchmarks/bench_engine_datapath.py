"""What each policy's own data path changes in the engine: before (vLLM V1's path) and after (its own).

For each policy, the same offline workload on the tiny model at PP=2 (one torch thread per stage,
gloo on CPU) twice: with ``EngineOptions(data_path="vllm-v1")`` (every stage waits for its
previous send before computing; sampled tokens return through the engine core) and with the
policy's own path (SGLang / TensorRT-LLM: overlapped sends and the ring return to rank 0; vLLM
MRV2: the sampled-token broadcast). Prints output throughput, the measured pipeline bubble and the
mean send time per micro-batch (stage 0 -> 1), plus the simulator's bubble for the same scenario
(which models the policy's own path). Repeats alternate the two paths so host drift hits both.

Run: ``.venv/bin/python benchmarks/bench_engine_datapath.py [--repeats 3] [--policy P ...]``;
a small check: ``--num-prompts 8 --output-len 8 --repeats 1``.
"""

from __future__ import annotations

import argparse
import statistics

from engine.run import EngineOptions, run_engine
from ppsim.config import build_scenario, step_budget_fields
from ppsim.run import run_scenario


def scenario(policy: str, n: int, input_len: int, output_len: int, budget: int):
    engine = {"policy": policy, **step_budget_fields(policy, budget)}
    if policy == "trtllm-slots":
        engine["enable_chunked_prefill"] = True  # same chunks as the others (TensorRT-LLM's default is off)
    return build_scenario(
        None,
        {
            "model": "tiny",
            "seed": 0,
            "cluster": {"pipeline_parallel_size": 2},
            "engine": engine,
            "workload": {
                "num_prompts": n,
                "request_rate": float("inf"),
                "random_input_len": input_len,
                "random_output_len": output_len,
            },
        },
    )


def mean_send_ms(run) -> float:
    sends = [o.end_s - o.start_s for o in run.ops if o.kind == "send"]
    return 1e3 * statistics.fmean(sends) if sends else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", nargs="+", default=["sglang-ring", "trtllm-slots", "vllm-mrv2"])
    a = ap.parse_args()
    print(
        f"tiny model, PP=2, {a.num_prompts} prompts x ({a.input_len} in, {a.output_len} out), offline, "
        f"budget {a.max_num_batched_tokens} tokens, 1 thread per stage, gloo on CPU; median of {a.repeats}"
    )
    print(f"{'policy':<14}{'data path':<10}{'out tok/s':>10}{'bubble':>8}{'send ms':>9}{'sim bubble':>11}")
    for policy in a.policy:
        s = scenario(policy, a.num_prompts, a.input_len, a.output_len, a.max_num_batched_tokens)
        sim_bubble = run_scenario(s).summary["pipeline_bubble_fraction"]
        got: dict[str, list[tuple[float, float, float]]] = {"vllm-v1": [], "policy": []}
        for _ in range(a.repeats):
            for path in got:
                run = run_engine(s, options=EngineOptions(threads_per_stage=1, data_path=path), dashboard=False)
                m = run.summary
                got[path].append((m["output_throughput"], m["pipeline_bubble_fraction"], mean_send_ms(run)))
        for path, rows in got.items():
            tput, bubble, send = (statistics.median(col) for col in zip(*rows, strict=True))
            print(f"{policy:<14}{path:<10}{tput:>10.1f}{bubble:>8.3f}{send:>9.3f}{sim_bubble:>11.3f}")


if __name__ == "__main__":
    main()
