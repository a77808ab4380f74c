"""What the engine refuses before it spawns a stage: what a stage would otherwise find out by dying.

The model kind and policy (a Llama-style pipeline), the dtypes (stages compute, hold their weights and
cache K/V in the model's activation dtype), CUDA and its GPUs, the KV cap ``--max-kv-gib``, and the
memory: every stage's weights and KV cache against the host's available memory on CPU, or against
each GPU's memory on CUDA. Each refusal is one :class:`PPSimError` line naming the flag or field.
"""

from __future__ import annotations

import torch

from engine.kvcache import PagedKVCache
from engine.model import TORCH_DTYPES
from ppsim.deployment import Prepared
from ppsim.errors import PPSimError
from ppsim.hostmem import host_available_bytes
from ppsim.live_engine import LiveEngineConfig
from ppsim.policy.pipelines import REPLICATED
from ppsim.units import GIB, format_bytes


def check_supported(prep: Prepared) -> None:
    """The engine runs Llama/Qwen2-style decoders, dense or MoE (engine/moe.py), on pipelines
    (no TP, MLA, qk-norm, replicas), in the model's activation dtype."""
    shape, policy = prep.shape, prep.scenario.engine.policy
    if getattr(shape, "kv_lora_rank", 0) or getattr(shape, "qk_norm", False):
        raise PPSimError(f"model {shape.name}: the engine runs Llama-style decoders, dense or MoE (no MLA, qk-norm)")
    if policy in REPLICATED:
        raise PPSimError(
            f"policy {policy}: runs data-parallel replicas, which the engine does not; use a pipeline policy"
        )
    check_dtypes(prep)


def check_dtypes(prep: Prepared) -> None:
    """Stages build their weights, activations and KV cache in the model's ``torch_dtype`` (engine/worker.py):
    refuse a weight or KV-cache dtype other than that, which the engine would not run (the simulator would)."""
    shape, s = prep.shape, prep.scenario
    act = shape.dtype
    if act not in TORCH_DTYPES:
        raise PPSimError(
            f"--model: {shape.name}'s torch_dtype is {act}; the engine computes in {', '.join(TORCH_DTYPES)}: "
            "give one of them in its config.json"
        )
    for field, flag, asked in (
        ("weight_dtype", "-q/--quantization", shape.weight_dtype),
        ("kv_cache_dtype", "--kv-cache-dtype", shape.kv_cache_dtype),
    ):
        if asked != act:
            fix = f"drop {flag}" if getattr(s, field) != "auto" else "remove quantization_config from its config.json"
            raise PPSimError(
                f"{field}: the engine runs {shape.name} in its torch_dtype {act} (weights, activations and KV "
                f"cache), not {asked}; {fix} for the engine, or see {asked} with ppsim simulate"
            )


def check_cuda(opts: LiveEngineConfig, num_stages: int) -> None:
    """Refuse before spawning what a stage would only find out by dying: no CUDA, or too few GPUs."""
    if opts.device != "cuda":
        return
    if not torch.cuda.is_available():
        raise PPSimError(
            "--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); use --device cpu"
        )
    count = torch.cuda.device_count()
    need = num_stages if opts.backend == "nccl" else 1
    if count < need:
        raise PPSimError(
            f"--device cuda --backend {opts.backend}: {num_stages} stages need {need} GPU(s), "
            f"torch sees {count}; use --backend gloo (stages share GPUs, host-staged) or fewer stages"
        )


def stage_kv_bytes(prep: Prepared, num_layers: int) -> int:
    """A stage's KV cache: its layers' K and V slots, the scratch block included (engine/run.py stage_configs)."""
    shape = prep.shape
    return PagedKVCache.bytes_needed(
        num_layers, prep.num_blocks + 1, prep.scenario.engine.block_size, shape.kv_dim, shape.dtype_bytes
    )


def check_kv_cap(prep: Prepared, opts: LiveEngineConfig) -> None:
    """``--max-kv-gib``: no stage's KV cache above it."""
    need = stage_kv_bytes(prep, max(st.num_layers for st in prep.topology.stages))
    cap = opts.max_kv_gib * GIB
    if need > cap:
        raise PPSimError(
            f"kv cache: {prep.num_blocks} blocks need {format_bytes(need)} on a stage, above --max-kv-gib "
            f"{opts.max_kv_gib:g} ({format_bytes(cap)}); use fewer/shorter requests or --kv-blocks"
        )


def stage_bytes(prep: Prepared, opts: LiveEngineConfig) -> list[tuple[float, int, float]]:
    """(weights as built, KV cache, weights as run) bytes of each stage. A CPU stage draws its weights in
    float32 and casts them (engine/model.py build_stage) before it allocates its KV cache, so its peak is
    the larger of the two phases; a GPU stage builds them in its dtype."""
    widen = max(1.0, 4 / prep.shape.dtype_bytes) if opts.device == "cpu" else 1.0
    return [
        (mem.weight_bytes * widen, stage_kv_bytes(prep, st.num_layers), float(mem.weight_bytes))
        for st, mem in zip(prep.topology.stages, prep.memory, strict=True)
    ]


def check_memory(prep: Prepared, opts: LiveEngineConfig) -> None:
    """The stages' weights and KV caches against the memory they will share: on CPU the host's available
    memory (all stages run on it), on CUDA each GPU's memory (stage ``rank`` runs on GPU ``rank % GPUs``)."""
    sizes = stage_bytes(prep, opts)
    if opts.device == "cpu":
        avail = host_available_bytes()
        if avail is not None:
            _check_fits(prep, opts, sizes, avail, "the host", " available (MemAvailable)")
        return
    gpus = torch.cuda.device_count()
    for g in range(gpus):
        ranks = [r for r in range(len(sizes)) if r % gpus == g]
        total = torch.cuda.get_device_properties(g).total_memory
        _check_fits(prep, opts, [sizes[r] for r in ranks], total, f"cuda:{g} (stages {ranks})", "")


def _check_fits(
    prep: Prepared, opts: LiveEngineConfig, sizes: list[tuple[float, int, float]], avail: int, where: str, note: str
) -> None:
    weights, kv = sum(w for w, _, _ in sizes), sum(k for _, k, _ in sizes)
    if sum(max(built, run + k) for built, k, run in sizes) <= avail:  # each stage at its peak phase
        return
    cpu = opts.device == "cpu"
    has = f"{where} has {format_bytes(avail)}{note}"
    if weights > avail:
        drawn = " (drawn in float32)" if cpu and prep.shape.dtype_bytes < 4 else ""
        more = "--device cuda" if cpu else "more GPUs"
        raise PPSimError(
            f"--model: the weights of {prep.shape.name} take {format_bytes(weights)}{drawn}, and {has}; "
            f"use a smaller model or {more}"
        )
    given = opts.kv_num_blocks is not None
    raise PPSimError(
        f"{'--kv-blocks' if given else 'kv cache'}: {prep.num_blocks} KV blocks take {format_bytes(kv)} beside "
        f"{format_bytes(weights)} of weights, and {has}; "
        + ("lower --kv-blocks" if given else "use fewer/shorter requests or a smaller --kv-blocks")
    )
