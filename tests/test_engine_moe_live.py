"""The MoE model in the live engine (real stage processes, PP=2): every engine policy produces the
reference forward's greedy tokens, conserves requests and frees its KV, with a skewed router too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.model import build_stage, reference_generate  # noqa: E402
from engine.run import make_prompts, run_engine  # noqa: E402
from ppsim.config import build_scenario, step_budget_fields  # noqa: E402
from ppsim.deployment import prepare  # noqa: E402


def scenario(policy: str, zipf: float = 0.0):
    """tiny-moe; prompts 20..60 tokens over a 32-token budget (chunked), outputs 1..11; PP=2 (vllm-async:
    PP=1, the only PP vLLM's V1 runner runs async scheduling at)."""
    engine = {"policy": policy, **step_budget_fields(policy, 32)}
    if policy == "trtllm-slots":
        engine["enable_chunked_prefill"] = True  # TensorRT-LLM's default is off
    return build_scenario(
        None,
        {
            "model": "tiny-moe",
            "hardware": "h100-sxm",
            "seed": 5,
            "moe_router_zipf": zipf,
            "cluster": {"pipeline_parallel_size": 1 if policy == "vllm-async" else 2},
            "engine": engine,
            "workload": {
                "num_prompts": 5,
                "request_rate": float("inf"),
                "random_input_len": 40,
                "random_output_len": 6,
                "random_range_ratio": 0.9,
            },
        },
    )


_REF: dict[float, dict[int, list[int]]] = {}


def reference(s) -> dict[int, list[int]]:
    if s.moe_router_zipf not in _REF:
        torch.set_num_threads(1)
        p = prepare(s)
        full = build_stage(
            p.shape, 0, p.shape.num_layers, True, True, s.seed, torch.float32, router_zipf=s.moe_router_zipf
        )
        prompts = make_prompts(p.requests, p.shape.vocab_size, s.seed)
        _REF[s.moe_router_zipf] = {
            r.req_id: reference_generate(full, prompts[r.req_id], r.output_len) for r in p.requests
        }
    return _REF[s.moe_router_zipf]


def check(s) -> None:
    run = run_engine(s)
    assert run.summary["completed"] == len(prepare(s).requests) and run.summary["failed"] == 0
    assert run.info["kv_blocks_used_at_end"] == 0
    assert run.result.tokens == reference(s)


@pytest.mark.parametrize("policy, zipf", [("vllm-batch-queue", 0.0), ("sglang-ring", 1.0)])
def test_moe_runs_in_the_engine(policy, zipf):
    check(scenario(policy, zipf))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["vllm-sync", "vllm-async", "vllm-mrv2", "trtllm-slots", "llamacpp"])
def test_moe_runs_on_every_engine_policy(policy):
    check(scenario(policy))


def test_moe_checkpoint_in_the_engine(tmp_path):
    """Stage processes load a MoE safetensors checkpoint the test writes (weights of another seed)."""
    from engine.checkpoint import save_checkpoint
    from engine.run import EngineOptions
    from ppsim.models.shape import load_hf_config

    s = scenario("vllm-batch-queue")
    p = prepare(s)
    full = build_stage(p.shape, 0, p.shape.num_layers, True, True, 11, torch.float32)
    cfg, _ = load_hf_config("tiny-moe")
    save_checkpoint(full, tmp_path / "ckpt", cfg)
    run = run_engine(s, options=EngineOptions(checkpoint=str(tmp_path / "ckpt")))
    prompts = make_prompts(p.requests, p.shape.vocab_size, s.seed)
    want = {r.req_id: reference_generate(full, prompts[r.req_id], r.output_len) for r in p.requests}
    assert run.result.tokens == want and want != reference(s)
