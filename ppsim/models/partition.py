"""Which contiguous layers each pipeline stage owns.

Rules:
- ``vllm``: vLLM's ``get_pp_indices`` (vllm/distributed/utils.py): ``layers // pp`` each, the
  remainder one layer each from the second-to-last stage backwards, never to the last stage
  (the last stage also carries the final norm and lm_head).
- ``last-heavy``: SGLang's advice (e.g. ``SGLANG_PP_LAYER_PARTITION=15,15,15,16``): the remainder
  goes to the last stages, which otherwise wait idle for their predecessors.
- an explicit list, like ``VLLM_PP_LAYER_PARTITION``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ppsim.errors import PPSimError


def vllm_partition(num_layers: int, pp: int) -> list[int]:
    per, rem = divmod(num_layers, pp)
    parts = [per] * pp
    for i in range(2, rem + 2):  # vLLM: partitions[-i] += 1 for i in range(2, remaining + 2)
        parts[-i] += 1
    return parts


def last_heavy_partition(num_layers: int, pp: int) -> list[int]:
    per, rem = divmod(num_layers, pp)
    return [per + (1 if s >= pp - rem else 0) for s in range(pp)]


def explicit_partition(parts: Sequence[int], num_layers: int, pp: int) -> list[int]:
    parts = list(parts)
    if len(parts) != pp:
        raise PPSimError(
            f"layer_partition: {len(parts)} entries for pipeline_parallel_size={pp}; give one count per stage"
        )
    if any(p < 1 for p in parts):
        raise PPSimError(f"layer_partition: {parts} has a stage with < 1 layer; every stage needs at least one")
    if sum(parts) != num_layers:
        raise PPSimError(
            f"layer_partition: {parts} sums to {sum(parts)} but the model has {num_layers} layers; make them add up"
        )
    return parts


def partition_layers(rule: str | Sequence[int], num_layers: int, pp: int) -> list[int]:
    """Layer counts per stage for ``rule`` (``vllm``, ``last-heavy`` or explicit counts)."""
    if pp < 1:
        raise PPSimError("pipeline_parallel_size: must be >= 1")
    if pp > num_layers:
        raise PPSimError(
            f"pipeline_parallel_size: {pp} stages for a {num_layers}-layer model; use at most {num_layers}"
        )
    if isinstance(rule, str):
        if rule == "vllm":
            return vllm_partition(num_layers, pp)
        if rule == "last-heavy":
            return last_heavy_partition(num_layers, pp)
        raise PPSimError(f"layer_partition: unknown rule {rule!r}; use vllm, last-heavy or counts like 20,20,20,20")
    return explicit_partition(rule, num_layers, pp)


def layer_ranges(parts: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) global layer indices per stage."""
    out, start = [], 0
    for p in parts:
        out.append((start, start + p))
        start += p
    return out
