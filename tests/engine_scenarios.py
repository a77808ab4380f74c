"""The tiny-model scenario the live-engine tests run (torch-free: only builds the config)."""

from __future__ import annotations

from ppsim.config import build_scenario, step_budget_fields


def tiny_scenario(policy: str, pp: int, budget: int, seed: int, range_ratio: float, **engine):
    """Tiny model, 6 requests at t = 0 of about 40 prompt and 6 output tokens (``range_ratio`` spreads both),
    chunked at ``budget`` tokens; ``engine``: more engine fields."""
    if policy == "trtllm-slots":
        engine.setdefault("enable_chunked_prefill", True)  # TensorRT-LLM's default is off
    return build_scenario(
        None,
        {
            "model": "tiny",
            "hardware": "h100-sxm",
            "seed": seed,
            "cluster": {"pipeline_parallel_size": pp},
            "engine": {"policy": policy, **step_budget_fields(policy, budget), **engine},
            "workload": {
                "num_prompts": 6,
                "request_rate": float("inf"),
                "random_input_len": 40,
                "random_output_len": 6,
                "random_range_ratio": range_ratio,
            },
        },
    )
