"""Family-specific fields of HF ``config.json`` files: mixture-of-experts layers and MLA attention.

Each reader returns the extra :class:`~ppsim.models.shape.ModelShape` fields of one family, as
vLLM's model files read them:

- ``deepseek_v2`` / ``deepseek_v3`` (vllm/model_executor/models/deepseek_v2.py): a layer is MoE when
  ``n_routed_experts`` is set, ``layer_idx >= first_k_dense_replace`` and
  ``layer_idx % moe_layer_freq == 0``; shared experts are one MLP of
  ``n_shared_experts x moe_intermediate_size``; attention is MLA (``kv_lora_rank``,
  ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank`` may be null).
- ``qwen2_moe`` / ``qwen3_moe`` (qwen3_moe.py ``Qwen3MoeDecoderLayer``): MoE when
  ``layer_idx not in mlp_only_layers`` and ``(layer_idx + 1) % decoder_sparse_step == 0``;
  ``num_experts``; Qwen2-MoE adds a shared expert of ``shared_expert_intermediate_size``.
- ``mixtral`` (mixtral.py): every layer is MoE, ``num_local_experts`` experts of
  ``intermediate_size``.
"""

from __future__ import annotations

from typing import Any


def _int(cfg: dict, key: str, default: int = 0) -> int:
    v = cfg.get(key)
    return default if v is None else int(v)


def _dense_ids(num_layers: int, mlp_only: list[int], sparse_step: int) -> tuple[int, ...]:
    step = max(1, sparse_step)
    return tuple(i for i in range(num_layers) if i in mlp_only or (i + 1) % step != 0)


def moe_fields(cfg: dict) -> dict[str, Any]:
    """Expert counts and which layers are dense, for any of the families above (empty for dense models)."""
    mt = str(cfg.get("model_type", ""))
    n_layers = int(cfg["num_hidden_layers"])
    if cfg.get("n_routed_experts"):  # DeepSeek-V2/V3 (and derivatives such as Kimi-K2)
        n_shared = _int(cfg, "n_shared_experts")
        moe_i = int(cfg["moe_intermediate_size"])
        return {
            "n_routed_experts": int(cfg["n_routed_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "n_shared_experts": n_shared,
            "moe_intermediate_size": moe_i,
            "shared_expert_intermediate_size": n_shared * moe_i,
            "first_k_dense_replace": _int(cfg, "first_k_dense_replace"),
            "moe_layer_freq": _int(cfg, "moe_layer_freq", 1),
        }
    if cfg.get("num_local_experts"):  # Mixtral
        return {
            "n_routed_experts": int(cfg["num_local_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]),
        }
    if cfg.get("num_experts") and mt.startswith(("qwen2_moe", "qwen3_moe")):
        shared_i = _int(cfg, "shared_expert_intermediate_size")
        return {
            "n_routed_experts": int(cfg["num_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "n_shared_experts": 1 if shared_i else 0,
            "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
            "shared_expert_intermediate_size": shared_i,
            "mlp_only_layers": _dense_ids(
                n_layers, list(cfg.get("mlp_only_layers") or []), _int(cfg, "decoder_sparse_step", 1)
            ),
        }
    return {}


def mla_fields(cfg: dict) -> dict[str, Any]:
    """Multi-head latent attention (DeepSeek-V2/V3): the latent KV and the per-head dimensions."""
    if not cfg.get("kv_lora_rank"):
        return {}
    nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    return {
        "attention": "mla",
        "kv_lora_rank": int(cfg["kv_lora_rank"]),
        "q_lora_rank": None if cfg.get("q_lora_rank") is None else int(cfg["q_lora_rank"]),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": int(cfg["v_head_dim"]),
        # vLLM's ModelConfig.get_num_kv_heads / get_head_size for MLA: one latent "head" cached per token.
        "num_kv_heads": 1,
        "head_dim": nope + rope,
    }
