"""The legitimate neighbours of the bad inputs of tests/bad_inputs_config.py (whose refusals
tests/test_bad_inputs.py runs) are still accepted."""

from __future__ import annotations

import json

import pytest

from ppsim.config import build_scenario
from ppsim.errors import PPSimError
from ppsim.models.shape import from_hf_config, load_hf_config


def _tiny(**extra: object) -> dict:
    cfg, _ = load_hf_config("tiny")
    return {**cfg, **extra}


@pytest.mark.parametrize(
    "extra",
    [
        {"num_key_value_heads": 8},  # MHA
        {"num_key_value_heads": 1},  # MQA
        {"num_key_value_heads": None, "head_dim": None},  # null: the defaults
        {"num_hidden_layers": 8.0, "head_dim": 32.0},  # JSON whole numbers written as floats
        {"torch_dtype": "bf16"},
        {"torch_dtype": None, "dtype": "float16"},  # newer transformers write "dtype"
        {"quantization_config": {}},
    ],
)
def test_legitimate_hf_configs_still_load(extra):
    m = from_hf_config(_tiny(**extra), "t")
    assert m.num_layers == 8 and m.num_heads % m.num_kv_heads == 0


@pytest.mark.parametrize(
    "extra",
    [
        {"hidden_size": 2**20, "intermediate_size": 2**20, "vocab_size": 2**24},  # the bounds themselves
        {"max_position_embeddings": 10_485_760},  # Llama 4 Scout's 10M context (MAX_TOKENS: 16 Mi)
        {"hidden_size": 250, "head_dim": 32},  # hidden not divisible by heads: fine with an explicit head_dim
        # rms_norm_eps absent (None drops it): the older layer_norm_epsilon; an int rope_theta
        {"rms_norm_eps": None, "layer_norm_epsilon": 1e-6, "rope_theta": 1_000_000},
        # an older name beside the newer is not read (a null or junk there was refused)
        {"rms_norm_eps": 1e-6, "layer_norm_epsilon": None, "rope_theta": 5e5, "rotary_emb_base": "x"},
        {
            "model_type": "qwen3_moe",
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [0, 7],
        },
    ],
)
def test_hf_configs_at_the_bounds_load(extra):
    cfg = {k: v for k, v in _tiny(**extra).items() if v is not None}
    m = from_hf_config(cfg, "t")
    assert m.hidden_size == cfg["hidden_size"] and m.max_position_embeddings == cfg["max_position_embeddings"]
    if m.is_moe:  # layers 1, 3, 5 are MoE: even (layer + 1) % 2 and not mlp_only
        assert [m.layer_is_moe(i) for i in range(8)] == [False, True, False, True, False, True, False, False]


def test_a_huge_number_names_its_field_wherever_it_is(tmp_path):
    from ppsim.models.shape import load_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps(_tiny())[:-1] + ', "extra": {"deep": [1, 2, -' + "9" * 4400 + "]}}")
    with pytest.raises(PPSimError, match="field deep has 4400 digits"):
        load_model(str(p))


@pytest.mark.parametrize(
    "quant,dtype",
    [
        ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "fp8"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "fp4"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
            },
            "fp8",
        ),
    ],
)
def test_modelled_quantization_formats_load(quant, dtype):
    assert from_hf_config(_tiny(quantization_config=quant), "t").weight_dtype == dtype


def test_integer_compressed_tensors_is_refused():
    q = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}}
    with pytest.raises(PPSimError, match="quantization_config: quant_method 'compressed-tensors'"):
        from_hf_config(_tiny(quantization_config=q), "t")


def test_same_knob_flat_and_in_table_with_one_value_is_accepted(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"engine": {"max_num_batched_tokens": 64, "policy": {"max_num_batched_tokens": 64}}}))
    assert build_scenario(str(p), {"model": "tiny"}).engine.step_token_budget == 64


def test_a_flag_still_overrides_the_files_table(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[engine.policy]\nkind = "vllm-batch-queue"\nmax_num_batched_tokens = 128\n')
    s = build_scenario(str(p), {"model": "tiny", "engine": {"max_num_batched_tokens": 256}})
    assert s.engine.step_token_budget == 256


def test_bounds_leave_the_presets_and_real_values_alone():
    s = build_scenario(
        None,
        {
            "hardware": {"name": "big", "peak_tflops": 20000, "hbm_bandwidth_gbps": 20000, "memory_gib": 1024},
            "workload": {"num_prompts": 1000, "request_rate": 1e-4, "burstiness": 0.01},
            "engine": {"policy": {"kind": "sglang-ring", "pp_async_batch_depth": 8}},
        },
    )
    assert s.workload.request_rate == 1e-4


def test_a_production_traces_other_columns_are_ignored(tmp_path):
    """Request ids, timestamps and the like ride along; only near misses of ppsim's columns are refused."""
    from ppsim.workload import read_trace

    p = tmp_path / "t.csv"
    p.write_text("request_id,arrival_s,input_tokens,output_tokens,ttft_ms\nr0,0,16,4,12.5\nr1,0.5,8,2,9\n")
    w = read_trace(str(p))
    assert len(w) == 2
