"""Per-stage memory: weights, KV pool and the pipeline's usable KV blocks.

Each GPU's KV pool = memory x gpu_memory_utilization - its weights - an activation reserve,
for its own stage's layers only. The pipeline's usable block count is the minimum over stages
(vLLM ``unify_kv_cache_configs``).

Weights are summed layer by layer (:func:`ppsim.cost.layers.layer_weight_bytes_per_gpu`): a stage
holds every expert of its MoE layers (no expert parallelism) and only the dense MLP of its dense
layers; the first stage adds the embedding, the last the final norm and lm_head. KV bytes per
token follow the attention kind and the KV cache dtype (MLA: one latent per token and layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.cost.base import StageSpec
from ppsim.cost.layers import kv_bytes_per_token_per_gpu
from ppsim.cost.layers import layer_weight_bytes_per_gpu as _layer_bytes
from ppsim.errors import PPSimError
from ppsim.models.shape import ModelShape
from ppsim.policy.kv import unify_num_blocks
from ppsim.units import GIB, format_gib


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    weight_bytes: float  # per GPU
    kv_pool_bytes: float  # per GPU
    kv_bytes_per_token: float  # per GPU, all of the stage's layers
    num_blocks: int


def layer_weight_bytes_per_gpu(shape: ModelShape, tp: int, layer: int | None = None) -> float:
    """One layer's weights on one GPU: sharded by tp, KV projections replicated past num_kv_heads."""
    return _layer_bytes(shape, tp, layer)


def stage_weight_bytes(shape: ModelShape, stage: StageSpec) -> float:
    if shape.is_moe:
        w = sum(_layer_bytes(shape, stage.tp, i) for i in range(stage.start_layer, stage.end_layer))
    else:
        w = stage.num_layers * _layer_bytes(shape, stage.tp)
    if stage.is_first:
        w += shape.embedding_bytes() / stage.tp
    if stage.is_last:
        w += shape.lm_head_bytes() / stage.tp
    return w


def stage_memory(
    shape: ModelShape,
    stage: StageSpec,
    memory_gib: float,
    gpu_memory_utilization: float,
    activation_reserve_gib: float,
    block_size: int,
) -> StageMemory:
    weights = stage_weight_bytes(shape, stage)
    budget = memory_gib * GIB * gpu_memory_utilization - activation_reserve_gib * GIB
    pool = budget - weights
    per_tok = stage.num_layers * kv_bytes_per_token_per_gpu(shape, stage.tp)
    blocks = int(pool // (per_tok * block_size)) if pool > 0 else 0
    if budget <= 0:
        raise PPSimError(
            f"hardware.memory_gib: {memory_gib:g} GiB x gpu_memory_utilization {gpu_memory_utilization:g} leaves "
            f"nothing after the {activation_reserve_gib:g} GiB activation reserve "
            "(engine.activation_reserve_gib); use a device with more memory or lower the reserve"
        )
    if blocks < 1:
        short = weights + per_tok * block_size - budget
        block = per_tok * block_size
        fix = (  # the block alone larger than the memory: its size is the first thing to fix
            f"one KV block of {block_size} tokens alone takes {format_gib(block)}: lower --block-size, or "
            if block > budget
            else ""
        )
        raise PPSimError(
            f"memory: stage {stage.index} needs {format_gib(weights)} of weights per GPU but has "
            f"{format_gib(budget)} (short by {format_gib(short)} for even one KV block); {fix}raise "
            "--pipeline-parallel-size / --tensor-parallel-size or --gpu-memory-utilization"
        )
    return StageMemory(stage.index, weights, pool, per_tok, blocks)


def pipeline_blocks(stages: list[StageMemory]) -> int:
    return unify_num_blocks([s.num_blocks for s in stages])
