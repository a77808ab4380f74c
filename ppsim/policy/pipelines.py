"""Pipeline policies: which engine-core loop, queue depth and scheduler caps a design uses.

The policy's typed configuration object (:mod:`ppsim.policies`) resolves its knobs into a
:class:`PolicyKnobs`, the plain data the pure cores read, together with the policy's
:class:`PipeOptions`. ``build_core(knobs, pool)`` runs the policy's builder in :data:`BUILDERS`, one
small builder per design; each returns an engine core (an object with ``scheduler`` and a ``run()``
generator of actions, see :mod:`ppsim.policy.actions`). :func:`pipe_options` is the accessor of
what the executor's pipeline must model for the design. ``no-pp`` runs one synchronous core per
data-parallel replica (see :mod:`ppsim.policy.nopp`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ppsim.policy.engine_core import BatchQueueCore
from ppsim.policy.kv import BlockPool
from ppsim.policy.llamacpp import UbatchPipelineCore
from ppsim.policy.scheduler import Scheduler, SchedulerLimits
from ppsim.policy.sglang import SGLangKnobs, build_sglang_core
from ppsim.policy.trtllm import SlotRingCore, trtllm_micro_batches


@dataclass(frozen=True, slots=True)
class PipeOptions:
    """What the executor models beyond stages and links.

    ``token_path``: how a plan's ``deps`` (steps whose sampled tokens the first stage needs) are
    met: ``core`` when the engine core has them and forwards them, ``broadcast`` when the last stage
    broadcasts them to every rank (MRV2 ``PPHandler``). ``broadcast_serialized``: the broadcast
    shares the p2p communicator, so it holds up every stage's sends. ``overlap_sends``: a stage's
    next compute does not wait for its previous send; only the next send does. vLLM's worker waits
    on ``_pp_send_work`` at the start of ``execute_model`` (so the next compute waits); SGLang waits
    on ``send_proxy_work`` before its next send (``scheduler_pp_mixin.py``) and TensorRT-LLM on the
    slot's previous send handle before reusing its buffer (``py_executor.py``), so their sends
    overlap the next compute.
    """

    token_path: Literal["core", "broadcast"] = "core"
    broadcast_serialized: bool = False
    overlap_sends: bool = False
    defer_outputs: int = 0  # SGLang: the last rank sends outputs pp_async_batch_depth iterations later


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """The resolved settings the pure cores read, built by the policy object (``ppsim.policies``):
    the values here are only the dataclass's own defaults; every engine default lives on the policy."""

    policy: str
    pp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    pp_throttle: bool = False  # the proposed V1 cap (vLLM has none): new admissions per step <= max_num_seqs // pp
    max_model_len: int | None = None
    # a policy's own knobs: None where another policy runs (their defaults live on the policy objects)
    sglang: SGLangKnobs | None = None  # sglang-ring settings
    mrv2_decode_cap: bool = False  # vllm-mrv2: at most ceil(max_num_seqs / pp) decodes per step
    pp_broadcast: Literal["overlapped", "serialized"] | None = None  # vllm-mrv2 sampled-token broadcast
    trtllm_relay: Literal["sync", "async"] | None = None  # trtllm-slots sample-state relay
    max_batch_size: int | None = None  # trtllm-slots: requests per micro-batch (TRT-LLM --max_batch_size)
    llamacpp_ubatch_tokens: int | None = None  # llama.cpp -ub (n_ubatch)
    llamacpp_n_copies: int | None = None  # GGML_SCHED_MAX_COPIES
    dp_routing: Literal["round-robin", "least-loaded"] | None = None  # no-pp router
    pipe: PipeOptions | None = None  # the policy's pipeline options (None: vLLM's defaults)


class EngineCore(Protocol):
    scheduler: Scheduler

    def run(self) -> Generator[Any, Any, None]: ...


def pp_throttle_cap(max_num_seqs: int, pp: int) -> int:
    """Requests newly scheduled or resumed per step under the PP throttle."""
    return max(1, max_num_seqs // pp)


def mrv2_decode_cap(max_num_seqs: int, pp: int) -> int:
    """Decodes per step under MRV2's cohort balance: ``ceil(max_num_seqs / pp)``."""
    return math.ceil(max_num_seqs / pp)


def _limits(k: PolicyKnobs, **caps: Any) -> SchedulerLimits:
    return SchedulerLimits(
        max_num_seqs=k.max_num_seqs,
        max_num_batched_tokens=k.max_num_batched_tokens,
        enable_chunked_prefill=k.enable_chunked_prefill,
        max_model_len=k.max_model_len,
        **caps,
    )


def _own(k: PolicyKnobs, *names: str) -> None:
    """The policy's own knobs are given (its configuration object resolves them; no default here)."""
    missing = [n for n in names if getattr(k, n) is None]
    if missing:
        raise ValueError(f"{k.policy}: knobs {', '.join(missing)} not given (build PolicyKnobs from the policy object)")


def _throttle(k: PolicyKnobs) -> int | None:
    return pp_throttle_cap(k.max_num_seqs, k.pp) if k.pp_throttle and k.pp > 1 else None


def _vllm_sync(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """``vllm/v1/engine/core.py::EngineCore.step``: one step in flight, the core waits for it."""
    return BatchQueueCore(Scheduler(_limits(k), kv), depth=1, relay=k.pp > 1)


def _vllm_batch_queue(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """``EngineCore.step_with_batch_queue`` with ``max_concurrent_batches = pp``."""
    return BatchQueueCore(Scheduler(_limits(k, admit_cap=_throttle(k)), kv), depth=k.pp, relay=k.pp > 1)


def _vllm_async(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """V1 ``AsyncScheduler`` at PP=1: a batch queue of 2 (``VllmConfig.max_concurrent_batches``).

    The V1 model runner gives async scheduling ``pp + 1`` batches only with the V2 runner, so the
    scenario refuses ``vllm-async`` at PP > 1 (use ``vllm-mrv2``).
    """
    if k.pp > 1:
        raise ValueError("vllm-async runs at pp = 1 only (use vllm-mrv2 for async scheduling with PP)")
    return BatchQueueCore(Scheduler(_limits(k, async_placeholders=True), kv), depth=2, relay=False)


def _vllm_mrv2(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """ModelRunnerV2 + ``PPHandler``: async scheduling, tokens broadcast by the last rank, no relay.

    MRV2's only PP throttle is per request: ``AsyncScheduler._update_after_schedule`` sets
    ``next_decode_eligible_step = current_step + pp_size`` for every request that samples (not for
    prefill chunks, which pipeline in consecutive steps), so each request decodes at most once per
    ``pp`` steps. Admissions and tokens per step are not capped beyond ``max_num_seqs`` and
    ``max_num_batched_tokens`` (vLLM RFC #50853 lists the missing admission cap as open work).
    """
    cap = mrv2_decode_cap(k.max_num_seqs, k.pp) if k.mrv2_decode_cap and k.pp > 1 else None
    lim = _limits(
        k, admit_cap=_throttle(k), decode_cap=cap, decode_spacing=k.pp if k.pp > 1 else 0, async_placeholders=True
    )
    return BatchQueueCore(Scheduler(lim, kv), depth=k.pp + 1, relay=False)


def _trtllm_slots(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """``PyExecutor._executor_loop_pp``: micro-batch slots, sample state relayed on a ring.

    Each micro-batch holds at most ``max_batch_size`` requests and at most ``max_batch_size x pp``
    are active (``PyTorchModelEngine.get_max_num_sequences``); the sync relay keeps ``pp`` slots,
    the async relay ``max(pp, MIN_ASYNC_MICRO_BATCH_NUM)`` (see :mod:`ppsim.policy.trtllm`).
    """
    _own(k, "max_batch_size", "trtllm_relay")
    lim = SchedulerLimits(
        max_num_seqs=min(k.max_num_seqs, k.max_batch_size * k.pp),
        max_num_batched_tokens=k.max_num_batched_tokens,
        enable_chunked_prefill=k.enable_chunked_prefill,
        max_model_len=k.max_model_len,
        max_batch_reqs=k.max_batch_size,
    )
    sync = k.trtllm_relay == "sync"
    return SlotRingCore(
        Scheduler(lim, kv), num_slots=trtllm_micro_batches(k.pp, sync), inline_relay=sync and k.pp > 1, blocking=sync
    )


def _llamacpp(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """``llama_decode`` over a layer split: ubatches pipeline through ``n_copies`` buffer copies."""
    _own(k, "llamacpp_ubatch_tokens", "llamacpp_n_copies")
    return UbatchPipelineCore(Scheduler(_limits(k), kv), k.llamacpp_ubatch_tokens, k.llamacpp_n_copies)


def _sglang_ring(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """SGLang ``event_loop_pp`` (see :mod:`ppsim.policy.sglang`); its budgets are its own knobs."""
    return build_sglang_core(
        k.pp,
        k.max_num_seqs,
        k.max_model_len,  # type: ignore[return-value]
        k.sglang or SGLangKnobs(),
        kv,
    )


def _no_pp_replica(k: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """One data-parallel replica: a synchronous vLLM core over the whole model (pp = 1)."""
    return BatchQueueCore(Scheduler(_limits(k), kv), depth=1, relay=False)


BUILDERS: dict[str, Callable[[PolicyKnobs, BlockPool], EngineCore]] = {
    "vllm-sync": _vllm_sync,
    "vllm-batch-queue": _vllm_batch_queue,
    "vllm-async": _vllm_async,
    "vllm-mrv2": _vllm_mrv2,
    "sglang-ring": _sglang_ring,
    "trtllm-slots": _trtllm_slots,
    "llamacpp": _llamacpp,
    "no-pp": _no_pp_replica,
}

REPLICATED = frozenset({"no-pp"})  # policies the executor runs as pp data-parallel replicas


def build_core(knobs: PolicyKnobs, kv: BlockPool) -> EngineCore:
    """The engine core for ``knobs.policy`` over a fresh scheduler."""
    builder = BUILDERS.get(knobs.policy)
    if builder is None:
        raise NotImplementedError(f"policy {knobs.policy!r} is not implemented; known: {', '.join(BUILDERS)}")
    return builder(knobs, kv)


def pipe_options(knobs: PolicyKnobs) -> PipeOptions:
    """What the executor's pipeline models for the policy (set by its configuration object)."""
    return knobs.pipe if knobs.pipe is not None else PipeOptions()
