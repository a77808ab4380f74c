"""Per-stage memory: weights, KV pool and the pipeline's usable KV blocks.

Each GPU's KV pool = memory x gpu_memory_utilization - its weights - an activation reserve,
for its own stage's layers only. The pipeline's usable block count is the minimum over stages
(vLLM ``unify_kv_cache_configs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.cost.analytic import kv_heads_per_gpu
from ppsim.cost.base import StageSpec
from ppsim.errors import PPSimError
from ppsim.models.shape import ModelShape
from ppsim.policy.kv import unify_num_blocks

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    weight_bytes: float  # per GPU
    kv_pool_bytes: float  # per GPU
    kv_bytes_per_token: float  # per GPU, all of the stage's layers
    num_blocks: int


def layer_weight_bytes_per_gpu(shape: ModelShape, tp: int) -> float:
    """One layer's weights on one GPU: sharded by tp, KV projections replicated past num_kv_heads."""
    h, b = shape.hidden_size, shape.dtype_bytes
    kv_gpu = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
    q_gpu = shape.q_dim / tp
    return b * (h * (q_gpu + 2 * kv_gpu) + q_gpu * h + 3 * h * shape.intermediate_size / tp + 2 * h)


def stage_weight_bytes(shape: ModelShape, stage: StageSpec) -> float:
    w = stage.num_layers * layer_weight_bytes_per_gpu(shape, stage.tp)
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
    per_tok = stage.num_layers * 2 * kv_heads_per_gpu(shape.num_kv_heads, stage.tp) * shape.head_dim * shape.dtype_bytes
    blocks = int(pool // (per_tok * block_size)) if pool > 0 else 0
    if blocks < 1:
        short = (weights + per_tok * block_size - budget) / GIB
        raise PPSimError(
            f"memory: stage {stage.index} needs {weights / GIB:.1f} GiB of weights per GPU but has "
            f"{budget / GIB:.1f} GiB (short by {short:.1f} GiB for even one KV block); raise "
            "--pipeline-parallel-size / --tensor-parallel-size or --gpu-memory-utilization"
        )
    return StageMemory(stage.index, weights, pool, per_tok, blocks)


def pipeline_blocks(stages: list[StageMemory]) -> int:
    return unify_num_blocks([s.num_blocks for s in stages])
