"""Per-stage memory of MoE models: every stage holds all experts of its layers; refusal when it does not fit."""

from __future__ import annotations

import pytest

from ppsim.config import build_scenario
from ppsim.cost.memory import stage_memory, stage_weight_bytes
from ppsim.deployment import build_topology, prepare
from ppsim.errors import PPSimError
from ppsim.models.shape import load_model
from ppsim.units import GIB


def test_deepseek_r1_fp4_pp8_stage_weights() -> None:
    r1 = load_model("deepseek-r1").with_dtypes(weight_dtype="fp4")
    topo = build_topology(r1, 8, 1, "vllm")
    weights = [stage_weight_bytes(r1, st) for st in topo.stages]
    extras = r1.embedding_bytes() + r1.lm_head_bytes()
    # All stages together hold the whole model once: weights / 8 per stage on average, plus the end extras.
    assert sum(weights) / 8 == pytest.approx((r1.total_weight_bytes() - extras) / 8 + extras / 8, rel=1e-9)
    # Independent estimate from the published config: an MoE layer is 257 experts of 3 x 7168 x 2048
    # NVFP4 weights (0.5625 B) plus ~187M MLA + 1.8M bf16 router; a dense layer has a 3 x 7168 x 18432 MLP.
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    moe_layer = (257 * 3 * 7168 * 2048 + attn) * 0.5625 + 256 * 7168 * 2
    dense_layer = (3 * 7168 * 18432 + attn) * 0.5625
    for st, w in zip(topo.stages, weights, strict=True):
        n_moe = r1.num_moe_layers(st.start_layer, st.end_layer)
        expect = n_moe * moe_layer + (st.num_layers - n_moe) * dense_layer
        expect += r1.embedding_bytes() * st.is_first + r1.lm_head_bytes() * st.is_last
        assert w == pytest.approx(expect, rel=0.05)
    # The middle stages are each within 5% of weights/8 scaled by their share of MoE layers (7 or 8 of 58).
    layer_total = r1.total_weight_bytes() - extras
    for st, w in zip(topo.stages[1:-1], weights[1:-1], strict=True):
        share = r1.num_moe_layers(st.start_layer, st.end_layer) / 58 * 8
        assert w == pytest.approx(layer_total / 8 * share, rel=0.05)
    # It fits on RTX PRO 6000 (96 GB) at PP8, with KV room that follows the latent size.
    mem = stage_memory(r1, topo.stages[3], 95.6, 0.9, 2.0, 16)
    assert mem.kv_bytes_per_token == topo.stages[3].num_layers * 576 * 2


def test_mla_kv_is_replicated_across_tp() -> None:
    r1 = load_model("deepseek-r1")
    one, eight = build_topology(r1, 2, 1, "vllm").stages[1], build_topology(r1, 2, 8, "vllm").stages[1]
    assert stage_memory(r1, eight, 140.4, 0.9, 2.0, 16).kv_bytes_per_token == 30 * 576 * 2
    assert stage_weight_bytes(r1, eight) < stage_weight_bytes(r1, one) / 7  # experts split 8 ways, a_proj replicated


def test_moe_model_that_does_not_fit_is_refused() -> None:
    s = build_scenario(
        None,
        {
            "model": "deepseek-r1",
            "hardware": "h100-sxm",
            "cluster": {"pipeline_parallel_size": 2, "tensor_parallel_size": 4},
        },
    )
    with pytest.raises(PPSimError, match=r"memory: stage 0 needs [\d.]+ GiB .*short by [\d.]+ GiB") as err:
        prepare(s, requests=[])
    need = (
        stage_weight_bytes(load_model("deepseek-r1"), build_topology(load_model("deepseek-r1"), 2, 4, "vllm").stages[0])
        / GIB
    )
    assert f"needs {need:.1f} GiB" in str(err.value)


def test_fp8_deepseek_fits_pp2_tp8_h200() -> None:
    s = build_scenario(
        None,
        {
            "model": "deepseek-r1",
            "hardware": "h200",
            "cluster": {"pipeline_parallel_size": 2, "tensor_parallel_size": 8},
        },
    )
    p = prepare(s, requests=[])
    assert p.shape.weight_dtype == "fp8"
    assert all(36 * GIB < m.weight_bytes < 42 * GIB for m in p.memory)  # ~671 GB of fp8 over 16 GPUs
    bf16 = prepare(build_scenario(None, {**s.model_dump(), "weight_dtype": "bf16"}), requests=[])
    assert bf16.num_blocks < p.num_blocks  # twice the weights leave less KV room
