"""One decoder layer on one GPU of a TP group: its GEMMs, resident weight bytes and KV bytes.

How vLLM shards each block across ``tp`` ranks (no expert parallelism):

- GQA/MHA (``QKVParallelLinear``, ``RowParallelLinear``): query heads split; KV heads split, and
  replicated once ``tp`` exceeds their count.
- MLA (vllm/model_executor/models/deepseek_v2.py ``DeepseekV2MLAAttention``): the down-projections
  ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated; ``q_b_proj``, ``kv_b_proj`` (column) and
  ``o_proj`` (row) split the heads. The latent KV cache is replicated on every TP rank.
- Dense MLP: gate/up column-parallel, down row-parallel.
- MoE (``FusedMoE`` without EP): every rank holds every expert, each expert's intermediate dim
  split by ``tp``; the router ``gate`` is replicated; shared experts are a TP-split MLP.

A GEMM is a tuple ``(weight bytes per GPU, FLOPs per token, activation elements per token)``.
"""

from __future__ import annotations

import math

from ppsim.models.shape import ModelShape

Gemm = tuple[float, float, float]


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads split across TP ranks; replicated (one per rank) once tp exceeds their count."""
    return max(1, math.ceil(num_kv_heads / tp))


def heads_per_gpu(shape: ModelShape, tp: int) -> int:
    return max(1, shape.num_heads // tp)


def attention_gemms(shape: ModelShape, tp: int) -> list[Gemm]:
    """Projection GEMMs of one attention block on one GPU."""
    h, wb = shape.hidden_size, shape.weight_bytes_per_param
    if shape.attention == "mla":
        hg, nope, rope, v = heads_per_gpu(shape, tp), shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
        r_kv, qh = shape.kv_lora_rank, heads_per_gpu(shape, tp) * (shape.qk_nope_head_dim + shape.qk_rope_head_dim)
        out: list[Gemm] = []
        if shape.q_lora_rank:
            r_q = shape.q_lora_rank
            out += [(h * r_q * wb, 2 * h * r_q, h + r_q), (r_q * qh * wb, 2 * r_q * qh, r_q + qh)]
        else:
            out.append((h * qh * wb, 2 * h * qh, h + qh))
        kvb = hg * (nope + v)  # kv_b_proj: also the absorbed W_UK / W_UV of decode, same FLOPs per token
        return out + [
            (h * (r_kv + rope) * wb, 2 * h * (r_kv + rope), h + r_kv + rope),
            (r_kv * kvb * wb, 2 * r_kv * kvb, r_kv + kvb),
            (hg * v * h * wb, 2 * hg * v * h, hg * v + h),
        ]
    q = shape.q_dim // tp if shape.num_heads >= tp else shape.head_dim
    kv = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
    return [(h * (q + 2 * kv) * wb, 2 * h * (q + 2 * kv), h + q + 2 * kv), (q * h * wb, 2 * q * h, q + h)]


def mlp_gemms(shape: ModelShape, width: float, tp: int) -> list[Gemm]:
    """A gated MLP of ``width`` split over ``tp``: gate+up, down."""
    h, wb, i = shape.hidden_size, shape.weight_bytes_per_param, width / tp
    return [(2 * h * i * wb, 4 * h * i, h + 2 * i), (i * h * wb, 2 * i * h, i + h)]


def router_gemm(shape: ModelShape) -> Gemm:
    """The MoE gate, replicated, kept in the activation dtype."""
    h, e = shape.hidden_size, shape.n_routed_experts
    return (h * e * shape.dtype_bytes, 2 * h * e, h + e)


def expert_gemm(shape: ModelShape, tp: int) -> Gemm:
    """One routed expert on one GPU: (weight bytes, FLOPs per routed token, activation elements per routed token)."""
    h, i = shape.hidden_size, shape.moe_intermediate_size / tp
    return (3 * h * i * shape.weight_bytes_per_param, 6 * h * i, 2 * h + 3 * i)


def layer_weight_bytes_per_gpu(shape: ModelShape, tp: int, layer: int | None = None) -> float:
    """Resident weights of one layer on one GPU (all experts); ``layer=None``: the heaviest layer kind."""
    h, b, wb = shape.hidden_size, shape.dtype_bytes, shape.weight_bytes_per_param
    moe = shape.is_moe if layer is None else shape.layer_is_moe(layer)
    if shape.attention == "mla":
        attn = sum(g[0] for g in attention_gemms(shape, tp))
        other = (shape.q_lora_rank or 0) + shape.kv_lora_rank + 2 * h
    else:
        kv_gpu = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
        q_gpu = shape.q_dim / tp
        attn = wb * (h * (q_gpu + 2 * kv_gpu) + q_gpu * h)
        other = 2 * h
    if not moe:
        return attn + wb * 3 * h * shape.intermediate_size / tp + b * other
    experts = shape.n_routed_experts * expert_gemm(shape, tp)[0]
    shared = wb * 3 * h * shape.shared_expert_intermediate_size / tp
    return attn + experts + shared + router_gemm(shape)[0] + b * other


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int) -> float:
    """KV cache of one token in one layer on one GPU (MLA's latent is replicated across TP ranks)."""
    if shape.attention == "mla":
        return shape.kv_dim * shape.kv_dtype_bytes
    return 2 * kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim * shape.kv_dtype_bytes
