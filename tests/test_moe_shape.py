"""MoE / MLA model shapes read from the published HF config.json files, and storage dtypes."""

from __future__ import annotations

import pytest

from ppsim.config import build_scenario
from ppsim.errors import PPSimError
from ppsim.models.dtypes import WEIGHT_BYTES
from ppsim.models.shape import from_hf_config, load_model


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # Published: DeepSeek-V3 tech report (671B total, 37B activated; MTP module excluded),
        # Qwen3 model card (235B / 22B), Mistral (46.7B / 12.9B).
        ("deepseek-v3", 671, 37),
        ("deepseek-r1", 671, 37),
        ("qwen3-235b-a22b", 235, 22),
        ("mixtral-8x7b", 46.7, 12.9),
    ],
)
def test_parameter_counts_match_published(name: str, total_b: float, active_b: float) -> None:
    m = load_model(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)


def test_deepseek_v3_fields() -> None:
    m = load_model("deepseek-v3")
    assert (m.hidden_size, m.num_layers, m.num_heads, m.vocab_size) == (7168, 61, 128, 129280)
    assert (m.n_routed_experts, m.num_experts_per_tok, m.n_shared_experts) == (256, 8, 1)
    assert (m.moe_intermediate_size, m.intermediate_size, m.first_k_dense_replace) == (2048, 18432, 3)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == (
        512,
        64,
        128,
        128,
        1536,
    )
    assert m.attention == "mla" and m.weight_dtype == "fp8"  # the checkpoint's quantization_config
    assert [m.layer_is_moe(i) for i in range(5)] == [False, False, False, True, True]
    assert m.num_moe_layers() == 58


def test_mla_kv_bytes_per_token_is_the_latent() -> None:
    m = load_model("deepseek-r1")
    assert m.kv_dim == 512 + 64
    assert m.kv_bytes_per_token_per_layer() == 576 * 2  # bf16 latent + rope key, no separate V
    assert m.with_dtypes(kv_cache_dtype="fp8").kv_bytes_per_token_per_layer() == 576


def test_qwen3_moe_dense_layers_follow_vllm_rule() -> None:
    cfg = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    m = from_hf_config(cfg, "q")
    # MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    assert [m.layer_is_moe(i) for i in range(6)] == [False, True, False, False, False, True]
    assert m.attention == "gqa" and m.qk_norm


def test_dense_presets_unchanged() -> None:
    # Published parameter counts of the dense checkpoints (safetensors metadata).
    assert load_model("llama-3-8b").total_params() == 8_030_261_248
    assert load_model("llama-3-70b").total_params() == 70_553_706_496
    for name in ("llama-3-8b", "llama-2-7b", "qwen2.5-7b", "tiny"):
        m = load_model(name)
        h, i = m.hidden_size, m.intermediate_size
        qkv = h * (m.q_dim + 2 * m.kv_dim) + (m.q_dim + 2 * m.kv_dim) * m.attention_bias
        assert m.layer_weight_bytes() == (qkv + m.q_dim * h + 3 * h * i + 2 * h) * m.dtype_bytes
        assert m.kv_bytes_per_token_per_layer() == 2 * m.num_kv_heads * m.head_dim * m.dtype_bytes
        assert not m.is_moe and m.num_moe_layers() == 0 and m.weight_bytes_per_param == m.dtype_bytes


def test_weight_dtypes_and_scale_overhead() -> None:
    assert WEIGHT_BYTES["fp4"] == 0.5 + 1 / 16  # NVFP4: one fp8 scale per 16 values
    assert WEIGHT_BYTES["fp8"] == 1 + 4 / (128 * 128)  # DeepSeek block fp8: one fp32 scale per 128x128
    r1 = load_model("deepseek-r1")
    fp4 = r1.with_dtypes(weight_dtype="nvfp4")
    bf16_extras = (2 * r1.vocab_size + 1) * r1.hidden_size * 2  # embedding + lm_head stay bf16
    quantized = 671e9 - bf16_extras / 2
    assert fp4.total_weight_bytes() == pytest.approx(quantized * 0.5625 + bf16_extras, rel=0.01)
    assert r1.with_dtypes(weight_dtype="bf16").total_weight_bytes() == pytest.approx(2 * 671e9, rel=0.01)
    with pytest.raises(PPSimError, match="weight_dtype"):
        r1.with_dtypes(weight_dtype="int3")


def test_scenario_dtype_aliases() -> None:
    s = build_scenario(
        None,
        {
            "model": "tiny-moe",  # a routing skew on a dense model is refused (it changes nothing)
            "weight_dtype": "modelopt_fp4",
            "kv_cache_dtype": "fp8_e4m3",
            "cost": {"moe_routing_skew": 2.0},
        },
    )
    assert (s.weight_dtype, s.kv_cache_dtype, s.cost.moe_routing_skew) == ("fp4", "fp8", 2.0)
    with pytest.raises(PPSimError, match="weight_dtype"):
        build_scenario(None, {"weight_dtype": "int3"})


def test_cli_flags_map_onto_scenario() -> None:
    import argparse

    from ppsim.cli import add_scenario_flags, scenario_from_args

    p = argparse.ArgumentParser()
    add_scenario_flags(p)
    s = scenario_from_args(
        p.parse_args(
            ["--model", "tiny-moe", "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--moe-routing-skew", "3"]
        )
    )
    assert (s.weight_dtype, s.kv_cache_dtype, s.cost.moe_routing_skew) == ("fp8", "fp8", 3.0)
