"""Policy defaults and knobs true to the engines (issue 12): foreign knobs refused, SGLang's chunk fit on
every preset, the refined chunk form inside a simulation."""

from __future__ import annotations

import pytest

from ppsim.config import POLICY_KNOBS, EngineConfig, build_scenario
from ppsim.cost.chunk_fit import fit_from_cost, fit_refined_from_cost, sglang_knobs
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.models.shape import list_presets
from ppsim.policies import POLICIES
from ppsim.policy.chunking import chunk_plan
from ppsim.run import run_scenario


@pytest.mark.parametrize(
    "argv, owner",
    [
        (["--policy", "vllm-sync", "--pp-async-batch-depth", "3"], "sglang-ring"),
        (["--policy", "sglang-ring", "--pp-throttle"], "vllm-batch-queue and vllm-mrv2"),
        (["--policy", "vllm-batch-queue", "--max-batch-size", "8"], "trtllm-slots"),
        (["--policy", "trtllm-slots", "--chunked-prefill-size", "4096"], "sglang-ring"),
        (["--policy", "sglang-ring", "--max-num-batched-tokens", "4096"], "--max-prefill-tokens"),
    ],
)
def test_a_knob_of_another_policy_is_refused_in_one_line(argv, owner, capsys):
    from ppsim.cli import main

    assert main(["simulate", "--model", "tiny", "--num-prompts", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert owner in err and err.count("\n") == 1


def test_every_policy_knob_is_a_field_of_its_policies_only_and_their_defaults_validate():
    for knob, owners in POLICY_KNOBS.items():
        for kind, typ in POLICIES.items():
            assert (knob in typ.model_fields) == (kind in owners), (knob, kind)
    for policy in POLICIES:
        e = EngineConfig(policy=policy)
        assert e.policy.kind == policy and e.policy == policy and str(e.policy) == policy


@pytest.mark.parametrize("model", list_presets())
@pytest.mark.parametrize("chunk", [128, 8192])
def test_chunk_fit_works_for_every_preset(model, chunk):
    """SGLang's start-up fit (and the refined one) on stage 0 of every preset gives a usable chunk plan at
    the default chunk; at a tiny chunk a cost that is linear (dense models: the a -> 0 limit) still works,
    and one that is concave (MoE: more tokens touch more experts) is refused in one line, as SGLang's
    ChunkSizePredictor.fit refuses it."""
    tp = 4 if model == "qwen2.5-7b" else 8  # 28 heads: a divisor of them; enough GPUs for the largest
    s = build_scenario(
        None,
        {
            "model": model,
            "cluster": {"pipeline_parallel_size": 4, "tensor_parallel_size": tp},
            "engine": {"policy": "sglang-ring", "chunked_prefill_size": chunk},
        },
    )
    prep = prepare(s, requests=[])
    stage0 = prep.topology.stages[0]
    for fit in (
        lambda: fit_from_cost(prep.cost, stage0, chunk),
        lambda: fit_refined_from_cost(prep.cost, stage0, chunk, 4 * chunk),
    ):
        try:
            m = fit()
        except PPSimError as e:
            assert chunk < 8192 and prep.shape.is_moe, e
            assert "not positive" in str(e) and "\n" not in str(e)
            continue
        sizes = chunk_plan(4 * chunk, chunk, m)
        assert sum(sizes) == 4 * chunk and sizes[0] == chunk and all(0 < n <= chunk for n in sizes)


def test_refined_chunk_form_drives_a_simulation():
    over = {
        "model": "llama-3-8b",
        "cluster": {"pipeline_parallel_size": 2},
        "engine": {"policy": "sglang-ring", "enable_dynamic_chunking": True, "chunked_prefill_size": 2048},
        "workload": {"num_prompts": 2, "random_input_len": 7000, "random_output_len": 2},
    }
    budgets = {}
    for form in ("quadratic", "refined"):
        over["engine"]["dynamic_chunking_form"] = form
        s = build_scenario(None, over)
        prep = prepare(s)
        knobs = sglang_knobs(s.engine.policy, prep.cost, prep.topology.stages[0], 7000)
        budgets[form] = [knobs.chunk_budget(p) for p in (0, 2048, 4096, 6000)]
        assert run_scenario(s).summary["completed"] == 2
    assert budgets["refined"][0] == budgets["quadratic"][0] == 2048
    assert budgets["refined"] != budgets["quadratic"]


def test_dynamic_chunking_form_is_refused_for_a_vllm_policy():
    with pytest.raises(PPSimError, match="--dynamic-chunking-form is not a knob of vllm-sync"):
        build_scenario(None, {"engine": {"policy": "vllm-sync", "dynamic_chunking_form": "refined"}})


@pytest.mark.parametrize("hardware, chunk", [("l40s", 4096), ("h100-sxm", 8192), ("h200", 8192), ("b200", 16384)])
def test_sglang_chunk_default_follows_the_gpu_memory(hardware, chunk):
    """server_args.py::_handle_gpu_memory_settings: 4096 below 60 GB, 8192 below 160 GB, 16384 above."""
    s = build_scenario(None, {"hardware": hardware, "engine": {"policy": "sglang-ring"}})
    assert s.engine.policy.chunked_prefill_size == chunk
    assert s.engine.policy.max_prefill_tokens == 16384 and s.engine.policy.pp_async_batch_depth == 0
    eng = {"policy": "sglang-ring", "chunked_prefill_size": 12288}
    given = build_scenario(None, {"hardware": hardware, "engine": eng})
    assert given.engine.policy.chunked_prefill_size == 12288


def test_chunked_prefill_default_is_the_engines():
    """vLLM V1 always chunks; TensorRT-LLM's TorchLlmArgs.enable_chunked_prefill defaults to False."""

    def eng(policy, **kw):
        return build_scenario(None, {"engine": {"policy": policy, **kw}}).engine.policy

    assert eng("vllm-batch-queue").enable_chunked_prefill is True
    assert eng("trtllm-slots").enable_chunked_prefill is False
    assert eng("trtllm-slots", enable_chunked_prefill=True).enable_chunked_prefill is True
    with pytest.raises(PPSimError, match="--enable-chunked-prefill is not a knob of sglang-ring"):
        eng("sglang-ring", enable_chunked_prefill=False)
