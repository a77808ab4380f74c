"""Pipeline policies: which engine-core loop, queue depth and scheduler caps a design uses."""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.policy.engine_core import BatchQueueCore
from ppsim.policy.kv import BlockPool
from ppsim.policy.scheduler import Scheduler, SchedulerLimits


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """The engine settings a policy reads (mirrors :class:`ppsim.config.EngineConfig`)."""

    policy: str
    pp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    pp_throttle: bool = True
    max_model_len: int | None = None


def pp_throttle_cap(max_num_seqs: int, pp: int) -> int:
    """Requests newly scheduled or resumed per step under the PP throttle."""
    return max(1, max_num_seqs // pp)


def build_core(knobs: PolicyKnobs, kv: BlockPool) -> BatchQueueCore:
    """The engine core for ``knobs.policy`` over a fresh scheduler."""
    base = dict(
        max_num_seqs=knobs.max_num_seqs,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        enable_chunked_prefill=knobs.enable_chunked_prefill,
        max_model_len=knobs.max_model_len,
    )
    if knobs.policy == "vllm-sync":
        return BatchQueueCore(Scheduler(SchedulerLimits(**base), kv), depth=1)
    if knobs.policy == "vllm-batch-queue":
        cap = pp_throttle_cap(knobs.max_num_seqs, knobs.pp) if knobs.pp_throttle and knobs.pp > 1 else None
        return BatchQueueCore(Scheduler(SchedulerLimits(**base, admit_cap=cap), kv), depth=knobs.pp)
    raise NotImplementedError(f"policy {knobs.policy!r} is not implemented yet")
