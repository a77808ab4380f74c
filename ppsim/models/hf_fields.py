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

from ppsim.fileio import short_repr

MAX_LAYERS = 10_000  # decoder layers; the deepest published models have ~130


class HfFieldError(ValueError):
    """A ``config.json`` field whose value ppsim cannot use; the message starts with the field's name."""


def hf_int(cfg: dict, key: str, default: int | None = None) -> int:
    """The whole number at ``key`` (``default`` if absent or null; no default: the field is required).

    JSON has no integer type of its own, so 4096.0 is taken; 8.7, true, "8" and Infinity are refused
    (``int()`` would truncate or convert them silently)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise KeyError(key)
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise HfFieldError(f"{key} = {short_repr(v)} is not a whole number")
    return v


def hf_float(cfg: dict, key: str, default: float) -> float:
    """The real number at ``key`` (``default`` if absent). A null is refused, unlike :func:`hf_int`'s: HF hands
    it to the model as None (an ``eps`` or ``rope_theta`` of None fails there); true and "1e-5" are refused too."""
    if key not in cfg:
        return default
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise HfFieldError(f"{key} = {short_repr(v)} is not a number")
    try:
        return float(v)
    except OverflowError:  # an int past the float range
        raise HfFieldError(f"{key} = {short_repr(v)} is too large for a number ppsim can use") from None


def hf_bool(cfg: dict, key: str, default: bool) -> bool:
    """The true/false at ``key`` (``default`` if absent or null)."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise HfFieldError(f"{key} = {short_repr(v)} is not true or false")
    return v


def _int(cfg: dict, key: str, default: int = 0) -> int:
    return hf_int(cfg, key, default)


def hf_num_layers(cfg: dict) -> int:
    """``num_hidden_layers``, checked before anything loops over the layers."""
    n = hf_int(cfg, "num_hidden_layers")
    if not 1 <= n <= MAX_LAYERS:
        raise HfFieldError(f"num_hidden_layers = {n} must be in [1, {MAX_LAYERS}]")
    return n


def _dense_ids(num_layers: int, mlp_only: list[int], sparse_step: int) -> tuple[int, ...]:
    dense = set(mlp_only)
    return tuple(i for i in range(num_layers) if i in dense or (i + 1) % sparse_step != 0)


def _sparse_step(cfg: dict) -> int:
    """``decoder_sparse_step``: every step-th layer is MoE (vLLM divides by it; 0 would crash there)."""
    step = _int(cfg, "decoder_sparse_step", 1)
    if step < 1:
        raise HfFieldError(f"decoder_sparse_step = {step} must be >= 1 (every decoder_sparse_step-th layer is MoE)")
    return step


def moe_fields(cfg: dict) -> dict[str, Any]:
    """Expert counts and which layers are dense, for any of the families above (empty for dense models)."""
    mt = str(cfg.get("model_type", ""))
    n_layers = hf_num_layers(cfg)
    if cfg.get("n_routed_experts"):  # DeepSeek-V2/V3 (and derivatives such as Kimi-K2)
        n_shared = _int(cfg, "n_shared_experts")
        moe_i = hf_int(cfg, "moe_intermediate_size")
        return {
            "n_routed_experts": hf_int(cfg, "n_routed_experts"),
            "num_experts_per_tok": hf_int(cfg, "num_experts_per_tok"),
            "n_shared_experts": n_shared,
            "moe_intermediate_size": moe_i,
            "shared_expert_intermediate_size": n_shared * moe_i,
            "first_k_dense_replace": _int(cfg, "first_k_dense_replace"),
            "moe_layer_freq": _int(cfg, "moe_layer_freq", 1),
        }
    if cfg.get("num_local_experts"):  # Mixtral
        return {
            "n_routed_experts": hf_int(cfg, "num_local_experts"),
            "num_experts_per_tok": hf_int(cfg, "num_experts_per_tok"),
            "moe_intermediate_size": hf_int(cfg, "intermediate_size"),
        }
    if cfg.get("num_experts") and mt.startswith(("qwen2_moe", "qwen3_moe")):
        shared_i = _int(cfg, "shared_expert_intermediate_size")
        return {
            "n_routed_experts": hf_int(cfg, "num_experts"),
            "num_experts_per_tok": hf_int(cfg, "num_experts_per_tok"),
            "n_shared_experts": 1 if shared_i else 0,
            "moe_intermediate_size": hf_int(cfg, "moe_intermediate_size"),
            "shared_expert_intermediate_size": shared_i,
            "mlp_only_layers": _dense_ids(n_layers, _mlp_only(cfg, n_layers), _sparse_step(cfg)),
        }
    return {}


def _mlp_only(cfg: dict, num_layers: int) -> list[int]:
    v = cfg.get("mlp_only_layers") or []
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise HfFieldError(f"mlp_only_layers = {short_repr(v)} is not a list of layer numbers")
    bad = [x for x in v if not 0 <= x < num_layers]
    if bad:
        raise HfFieldError(
            f"mlp_only_layers = {short_repr(v)}: layer {short_repr(bad[0])} is not one of the "
            f"num_hidden_layers = {num_layers} layers (0 to {num_layers - 1})"
        )
    return v


def mla_fields(cfg: dict) -> dict[str, Any]:
    """Multi-head latent attention (DeepSeek-V2/V3): the latent KV and the per-head dimensions."""
    if not cfg.get("kv_lora_rank"):
        return {}
    nope, rope = hf_int(cfg, "qk_nope_head_dim"), hf_int(cfg, "qk_rope_head_dim")
    return {
        "attention": "mla",
        "kv_lora_rank": hf_int(cfg, "kv_lora_rank"),
        "q_lora_rank": None if cfg.get("q_lora_rank") is None else hf_int(cfg, "q_lora_rank"),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": hf_int(cfg, "v_head_dim"),
        # vLLM's ModelConfig.get_num_kv_heads / get_head_size for MLA: one latent "head" cached per token.
        "num_kv_heads": 1,
        "head_dim": nope + rope,
    }
