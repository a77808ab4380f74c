"""The resolved deployment: everything a run needs, resolved from a scenario in one place and checked
before the run (model shape, stage topology, KV figures, cost model, requests).

Both executors (the simulator, :mod:`ppsim.sim`, and the live engine, :mod:`engine`) read it; it imports
neither of them, nor SimPy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config import Scenario
from ppsim.cost.analytic import AnalyticCost
from ppsim.cost.base import CostModel, StageSpec
from ppsim.cost.chunk_fit import sglang_knobs
from ppsim.cost.memory import StageMemory, pipeline_blocks, stage_memory
from ppsim.errors import PPSimError
from ppsim.hardware.presets import DeviceSpec, resolve_device, resolve_link
from ppsim.models.partition import layer_ranges, partition_layers
from ppsim.models.shape import ModelShape, load_model
from ppsim.policy.kv import BlockPool
from ppsim.policy.pipelines import REPLICATED, PolicyKnobs
from ppsim.policy.requests import Request
from ppsim.units import GIB
from ppsim.workload import Workload, as_workload, build_workload


@dataclass(frozen=True)
class Topology:
    """Stages in order; link i joins stage i to stage i + 1; the last stage returns to the core."""

    stages: tuple[StageSpec, ...]

    @property
    def num_links(self) -> int:
        return len(self.stages) - 1

    def check(self, num_layers: int) -> None:
        expect = 0
        for i, s in enumerate(self.stages):
            if s.index != i or s.start_layer != expect or s.num_layers < 1:
                raise PPSimError(f"topology: stage {i} does not own a contiguous, non-empty layer range")
            expect = s.end_layer
        if expect != num_layers:
            raise PPSimError(f"topology: stages cover {expect} layers, the model has {num_layers}")
        if not (self.stages[0].is_first and self.stages[-1].is_last):
            raise PPSimError("topology: the first stage must own the embedding and the last the lm_head")


def build_topology(shape: ModelShape, pp: int, tp: int, rule: str | list[int]) -> Topology:
    parts = partition_layers(rule, shape.num_layers, pp)
    stages = tuple(StageSpec(i, a, b, i == 0, i == pp - 1, tp) for i, (a, b) in enumerate(layer_ranges(parts)))
    topo = Topology(stages)
    topo.check(shape.num_layers)
    return topo


@dataclass(frozen=True)
class Prepared:
    scenario: Scenario
    shape: ModelShape
    device: DeviceSpec
    topology: Topology
    memory: tuple[StageMemory, ...]
    num_blocks: int
    cost: CostModel
    requests: Workload  # columns; ``iter`` yields Request objects one at a time

    def __post_init__(self) -> None:
        if not isinstance(self.requests, Workload):  # a list of Request (tests, the engine's callers)
            object.__setattr__(self, "requests", as_workload(self.requests))

    def knobs(self) -> PolicyKnobs:
        """The policy's knobs resolved for the pure engine core, with its pipeline options."""
        e = self.scenario.engine
        pol = e.policy
        extra = pol.knob_values()
        if pol.kind == "sglang-ring":  # dynamic chunking is fitted to this deployment's cost model
            extra["sglang"] = sglang_knobs(pol, self.cost, self.topology.stages[0], self.requests.max_prompt_len())
        return PolicyKnobs(
            policy=pol.kind,
            pp=len(self.topology.stages),
            max_num_seqs=e.max_num_seqs,
            max_model_len=self.max_model_len,
            pipe=pol.pipe_options(),
            **extra,
        )

    @property
    def max_model_len(self) -> int:
        """vLLM --max-model-len if given, else the model's max_position_embeddings."""
        return self.scenario.engine.max_model_len or self.shape.max_position_embeddings

    def block_pool(self) -> BlockPool:
        return BlockPool(self.num_blocks, self.scenario.engine.block_size)


def build_cost(s: Scenario, shape: ModelShape, device: DeviceSpec) -> CostModel:
    link = resolve_link(s.cluster.link, "cluster.link")
    tp_link = resolve_link(s.cluster.tp_link, "cluster.tp_link")
    if s.cost.kind == "profile":
        from ppsim.cost.profiled import load_profiled_cost

        return load_profiled_cost(s.cost.profile_dir or "", shape, s, link)
    return AnalyticCost(shape, device, link, tp_link, s.cluster.tensor_parallel_size, s.cost, s.engine.cpu)


def check_tensor_parallel(shape: ModelShape, tp: int) -> None:
    """vLLM's rules: query heads divide evenly over the TP group; KV heads are split or replicated evenly."""
    if shape.num_heads % tp:
        raise PPSimError(
            f"tensor_parallel_size: {shape.num_heads} attention heads of {shape.name} do not divide "
            f"over {tp} GPUs; use a divisor of {shape.num_heads}"
        )
    kv = shape.num_kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):
        raise PPSimError(
            f"tensor_parallel_size: {kv} KV heads of {shape.name} can be neither split nor replicated "
            f"evenly over {tp} GPUs; use a divisor or a multiple of {kv}"
        )


def check_prompt_budget(s: Scenario, requests: Workload) -> None:
    """Without chunked prefill a prompt must fit one step's token budget (vLLM refuses such a config)."""
    if s.engine.policy.chunks_prompts or not len(requests):
        return
    longest = requests.max_prompt_len()
    budget = s.engine.step_token_budget
    if longest > budget:
        raise PPSimError(
            f"engine.max_num_batched_tokens: {budget} is below a "
            f"{longest}-token prompt with chunked prefill disabled; raise it or enable chunked prefill"
        )


def prepare(s: Scenario, requests: Workload | Iterable[Request] | None = None) -> Prepared:
    shape = load_model(s.model).with_dtypes(
        None if s.weight_dtype == "auto" else s.weight_dtype,
        None if s.kv_cache_dtype == "auto" else s.kv_cache_dtype,
    )
    device = resolve_device(s.hardware)
    c = s.cluster
    check_tensor_parallel(shape, c.tensor_parallel_size)
    topo = build_topology(shape, c.pipeline_parallel_size, c.tensor_parallel_size, c.layer_partition)
    e = s.engine
    mem = tuple(
        stage_memory(shape, st, device.memory_gib, e.gpu_memory_utilization, e.activation_reserve_gib, e.block_size)
        for st in topo.stages
    )
    cost = e.policy.return_cost(build_cost(s, shape, device), e.cpu, c.pipeline_parallel_size)  # its return path
    reqs = as_workload(requests) if requests is not None else build_workload(s.workload, s.seed)
    check_prompt_budget(s, reqs)
    return Prepared(s, shape, device, topo, mem, pipeline_blocks(list(mem)), cost, reqs)


def replica_prepared(prep: Prepared) -> Prepared:
    """The one-stage preparation of a ``no-pp`` replica: whole model on one TP group, same requests."""
    s = prep.scenario
    one = s.model_copy(
        update={"cluster": s.cluster.model_copy(update={"pipeline_parallel_size": 1, "layer_partition": "vllm"})}
    )
    try:
        rp = prepare(one, prep.requests)
    except PPSimError as err:
        why = str(err).split("; raise")[0]  # the stage-level advice (more stages) does not apply here
        raise PPSimError(
            f"engine.policy: no-pp puts the whole model on each group of "
            f"{s.cluster.tensor_parallel_size} GPU(s) and it does not fit ({why}); "
            "raise --tensor-parallel-size or pick a pipeline policy"
        ) from None
    return replace(rp, scenario=one)


def kv_figures(prep: Prepared, peak_used: int) -> dict[str, Any]:
    """KV capacity of the deployment: per pipeline, or per replica for the data-parallel ``no-pp``."""
    if prep.scenario.engine.policy in REPLICATED:
        return {**_pipeline_kv(replica_prepared(prep), peak_used), "kv_replicas": len(prep.topology.stages)}
    return _pipeline_kv(prep, peak_used)


def _pipeline_kv(prep: Prepared, peak_used: int) -> dict[str, Any]:
    bs = prep.scenario.engine.block_size
    mean_len = prep.requests.mean_total_len()
    cap = prep.num_blocks * bs
    return {
        "kv_num_blocks": prep.num_blocks,
        "kv_block_size": bs,
        "kv_capacity_tokens": cap,
        "kv_concurrency_at_mean_len": round(cap / mean_len, 2) if mean_len else 0.0,
        "kv_blocks_per_stage": [m.num_blocks for m in prep.memory],
        "kv_peak_blocks_used": peak_used,
        "weights_gib_per_gpu": [round(m.weight_bytes / GIB, 3) for m in prep.memory],
        "layers_per_stage": [s.num_layers for s in prep.topology.stages],
    }
