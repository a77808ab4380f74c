"""The validation scenarios: the development matrix (fixed) and the held-out set (drawn at run time).

Development: 9 fixed scenarios (tiny model, PP <= 2, three policies) on which the layer-glue form,
the whole-layer stack and the control-path model were chosen; its errors are in-sample.

Held-out: scenarios drawn by a seeded sampler at run time, so no modelling choice was made looking
at them. Every policy the engine runs appears ``per_policy`` times; for each draw, independently:
PP 1 or 2; the load as a fraction of the simulated saturation throughput (light 0.15 to
saturated 1.2, log-uniform) or offline (all at t=0) one time in six; input and output lengths
(log-uniform 24..384 in, 6..64 out) with a length spread (``random_range_ratio`` 0..0.8); the
chunked-prefill budget (64..512 tokens) and ``max_num_seqs`` (4..32); and client aborts (a third of
the draws cancel 10-30% of their requests). A draw the scenario checks refuse (a prompt over a
policy's budget) is drawn again from the same generator, so the set depends on the seed only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ppsim.config import Scenario, build_scenario, step_budget_fields
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.policy.pipelines import BUILDERS, REPLICATED

# the policies the live engine runs (no-pp runs data-parallel replicas, which the engine does not)
ENGINE_POLICIES = tuple(p for p in BUILDERS if p not in REPLICATED)  # registry order: the draws depend on it
BASE_WL = {"num_prompts": 24, "random_input_len": 128, "random_output_len": 32, "random_range_ratio": 0.25}
DEVELOPMENT = {
    "pp1-sync-offline": ({"policy": "vllm-sync"}, 1, {"request_rate": "inf"}),
    "pp1-batchq-light": ({"policy": "vllm-batch-queue"}, 1, {"request_rate": 8.0}),
    "pp2-sync-offline": ({"policy": "vllm-sync"}, 2, {"request_rate": "inf"}),
    "pp2-batchq-throttle-offline": ({"policy": "vllm-batch-queue", "pp_throttle": True}, 2, {"request_rate": "inf"}),
    "pp2-batchq-nothrottle-offline": ({"policy": "vllm-batch-queue", "pp_throttle": False}, 2, {"request_rate": "inf"}),
    "pp2-batchq-light": ({"policy": "vllm-batch-queue"}, 2, {"request_rate": 8.0}),
    "pp2-batchq-near-saturation": ({"policy": "vllm-batch-queue"}, 2, {"request_rate": 25.0}),
    "pp2-sglang-ring-offline": ({"policy": "sglang-ring"}, 2, {"request_rate": "inf"}),
    "pp2-long-prompt-chunked": (
        {"policy": "vllm-batch-queue", "max_num_batched_tokens": 256},
        2,
        {
            "request_rate": "inf",
            "num_prompts": 2,
            "random_input_len": 2048,
            "random_output_len": 8,
            "random_range_ratio": 0.0,
        },
    ),
}
MAX_REDRAWS = 50


def scenario(model: str, profile: str, engine: dict[str, Any], pp: int, wl: dict[str, Any], seed: int = 0) -> Scenario:
    eng = {"max_num_seqs": 16, **step_budget_fields(engine.get("policy", ""), 512), **engine}
    return build_scenario(
        overrides={
            "model": model,
            "seed": seed,
            "cluster": {"pipeline_parallel_size": pp},
            "engine": eng,
            "workload": {**BASE_WL, **wl},
            "cost": {"kind": "profile", "profile_dir": profile},
        }
    )


def development(model: str, profile: str) -> dict[str, Scenario]:
    return {name: scenario(model, profile, eng, pp, wl) for name, (eng, pp, wl) in DEVELOPMENT.items()}


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def saturation_rate(s: Scenario) -> float:
    """Requests/s the simulator completes with every request sent at t=0 (the scenario's capacity)."""
    from ppsim.run import run_scenario

    off = s.model_copy(update={"workload": s.workload.model_copy(update={"request_rate": math.inf, "abort_rate": 0.0})})
    return float(run_scenario(off).summary["request_throughput"])


def draw(
    rng: np.random.Generator,
    policy: str,
    model: str,
    profile: str,
    capacity: Callable[[Scenario], float] = saturation_rate,
) -> tuple[dict[str, Any], Scenario]:
    """One held-out scenario of ``policy``: (the drawn knobs, the scenario)."""
    last = ""
    for _ in range(MAX_REDRAWS):
        pp = int(rng.integers(1, 3))
        if policy == "vllm-async":  # vLLM's V1 runner runs async scheduling at PP=1 only (the draw is kept)
            pp = 1
        offline = rng.uniform() < 1 / 6
        load = round(_log_uniform(rng, 0.15, 1.2), 3)
        wl = {
            "num_prompts": int(rng.integers(16, 41)),
            "random_input_len": int(round(_log_uniform(rng, 24, 384))),
            "random_output_len": int(round(_log_uniform(rng, 6, 64))),
            "random_range_ratio": round(float(rng.uniform(0.0, 0.8)), 2),
        }
        if rng.uniform() < 1 / 3:
            wl.update(
                abort_rate=round(float(rng.uniform(0.1, 0.3)), 2), abort_window_s=round(_log_uniform(rng, 0.2, 2.0), 2)
            )
        eng = {
            "policy": policy,
            **step_budget_fields(policy, int(rng.choice([64, 128, 256, 512]))),
            "max_num_seqs": int(rng.choice([4, 8, 16, 32])),
        }
        if policy == "trtllm-slots":  # its default is off; the drawn budget is a chunk, as for the others
            eng["enable_chunked_prefill"] = True
        seed = int(rng.integers(1, 1 << 30))
        try:
            s = scenario(model, profile, eng, pp, {**wl, "request_rate": "inf"}, seed)
            prepare(s)  # the scenario checks (prompt over a budget without chunking, KV) refuse bad draws
        except PPSimError as err:
            last = str(err)
            continue
        knobs = {"policy": policy, "pp": pp, **eng, **wl, "seed": seed, "load": "offline" if offline else load}
        if not offline:
            rate = round(load * capacity(s), 3)
            knobs["request_rate"] = rate
            s = s.model_copy(update={"workload": s.workload.model_copy(update={"request_rate": rate})})
        return knobs, s
    raise PPSimError(f"held-out sampler: no valid scenario for {policy} in {MAX_REDRAWS} draws (last: {last})")


def held_out(
    seed: int, per_policy: int, model: str, profile: str, capacity: Callable[[Scenario], float] = saturation_rate
) -> dict[str, tuple[dict[str, Any], Scenario]]:
    """``per_policy`` draws for every engine policy, in a fixed order from one generator."""
    prepare(scenario(model, profile, {}, 1, {}))  # a missing or mismatched profile fails here, not as redraws
    rng = np.random.default_rng(seed)
    out = {}
    for k in range(per_policy):
        for policy in ENGINE_POLICIES:
            knobs, s = draw(rng, policy, model, profile, capacity)
            load = knobs["load"] if knobs["load"] == "offline" else f"load{knobs['load']:.2f}"
            out[f"h{k}-{policy}-pp{knobs['pp']}-{load}"] = (knobs, s)
    return out
