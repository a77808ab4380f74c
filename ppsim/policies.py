"""Each pipeline policy as one typed object: its own knobs and defaults, its engine core, its pipeline
options and its return-path cost.

``engine.policy`` is a discriminated union on ``kind``::

    [engine]
    max_num_seqs = 64
    [engine.policy]
    kind = "sglang-ring"
    pp_async_batch_depth = 1

A knob lives only on the policies that read it, so a knob of another policy is refused by the type
(one line naming its owners, :func:`policy_table`). The older flat form (``engine.policy = "NAME"``
with the knobs beside it in ``[engine]``) is mapped onto the table when a scenario loads.

A policy compares equal to its name and prints as it (``engine.policy == "sglang-ring"``), so code
that asks which policy runs reads the same as before. The pure engine cores are in
:mod:`ppsim.policy`; the objects here only resolve their knobs into :class:`PolicyKnobs` (with the
pipeline options) for them. Sources of every default: docs/policies.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ppsim.hardware.presets import DeviceSpec
from ppsim.policy.pipelines import PipeOptions
from ppsim.typed import TaggedModel

DEFAULT_POLICY = "vllm-batch-queue"
TRTLLM_MAX_NUM_TOKENS = 8192  # tensorrt_llm/llmapi/llm_args.py::BaseLlmArgs.max_num_tokens
LLAMACPP_N_BATCH = 2048  # llama.cpp common/common.h: common_params.n_batch
# Micro-batch slots and buffer copies are allocated one per unit: a bound far above what either engine is
# run with (SGLang's pp_async_batch_depth defaults to 0; llama.cpp's GGML_SCHED_MAX_COPIES is 4)
MAX_PIPELINE_SLOTS = 1024


def vllm_batch_defaults(device: DeviceSpec) -> tuple[int, int]:
    """``vllm serve``'s (max_num_seqs, max_num_batched_tokens): ``vllm/engine/arg_utils.py::
    EngineArgs.get_batch_defaults``, OPENAI_API_SERVER context: (1024, 8192) on a GPU of >= 70 GiB that
    is not an A100, else (256, 2048)."""
    big = device.memory_gib >= 70 and "a100" not in device.name.lower()
    return (1024, 8192) if big else (256, 2048)


# knobs without a command-line flag (a tuple: scenario files only; chunk-plan has --coefficients)
FILE_ONLY_KNOBS = frozenset({"dynamic_chunking_coefficients"})
COEFFICIENTS_EXAMPLE = "e.g. 1e-6,0.02,1.5"


def chunk_coefficients_problem(coeffs: Sequence[float]) -> str | None:
    """Why ``a,b,c`` (or ``a,b,c,gamma``) cannot drive SGLang's dynamic chunking, or None.

    f(l) = a l^2 + b l + c must grow with length (a, b >= 0 and not both 0, so that the target time
    f(C) - f(0) is positive), the refined form's prefix work gamma L too (gamma >= 0), and the chunk-size
    solver (``ppsim.policy.chunking.solve_chunk``) must stay finite for sequences up to ``MAX_TOKENS``:
    only the coefficients' ratios set the chunks, so an overflow is a matter of units."""
    from ppsim.config import MAX_TOKENS  # ppsim.config imports this module

    a, b, _, gamma = (*coeffs, 0.0)[:4]
    if not all(math.isfinite(v) for v in coeffs):
        return f"inf and nan are not coefficients; give finite numbers, {COEFFICIENTS_EXAMPLE}"
    if a < 0 or b < 0:
        return f"a={a:g} and b={b:g} must be >= 0 (f(l) = a l^2 + b l + c grows with length), {COEFFICIENTS_EXAMPLE}"
    if a == b == 0:
        return (
            "a=0 and b=0 give every length the same time c, so no chunk size follows from them; "
            f"give a > 0 or b > 0, {COEFFICIENTS_EXAMPLE}"
        )
    if gamma < 0:
        return f"gamma={gamma:g} must be >= 0 (the prefix adds gamma L to a chunk's time), e.g. 1e-6,0.02,1.5,1e-5"
    n = float(MAX_TOKENS)
    slope = 2 * a * n + b  # the solver's B after an n-token prefix; its discriminant B^2 + 4 a T
    if not math.isfinite(slope * slope + 4 * a * (a * n * n + b * n) + gamma * n):
        return (
            f"a={a:g}, b={b:g} overflow the chunk-size solver at {MAX_TOKENS} tokens; only their ratios "
            f"matter, so scale them down (SGLang fits milliseconds), {COEFFICIENTS_EXAMPLE}"
        )
    return None


def sglang_chunked_prefill_size(memory_gib: float) -> int:
    """SGLang's ``chunked_prefill_size`` for a GPU (``server_args.py::ServerArgs._handle_gpu_memory_settings``,
    thresholds on the GPU's memory in MiB): 2048 below 35 GiB, 4096 below 60, 8192 below 160, else 16384."""
    mib = memory_gib * 1024
    for limit_gib, chunk in ((35, 2048), (60, 4096), (160, 8192)):
        if mib < limit_gib * 1024:
            return chunk
    return 16384


class Policy(TaggedModel):
    """What every policy object has; a subclass adds its knobs (fields) and overrides what differs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    kind: str
    # hints for a knob of another policy given to this one: knob -> advice
    foreign_hints: ClassVar[dict[str, str]] = {}

    # --- a policy reads as its name -------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.kind == other
        return BaseModel.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(self.kind)

    def __str__(self) -> str:
        return self.kind

    # --- defaults, budgets, checks --------------------------------------------------------------
    def default_max_num_seqs(self, device: DeviceSpec, pp: int) -> int:
        return vllm_batch_defaults(device)[0]

    def fill_defaults(self, device: DeviceSpec, pp: int) -> dict[str, Any]:
        """The engine's own value for each ``None`` knob (what the real engine would use)."""
        return {}

    @property
    def step_token_budget(self) -> int:
        raise NotImplementedError

    @classmethod
    def budget_fields(cls, tokens: int) -> dict[str, int]:
        """The knobs that give this policy a per-step token budget of ``tokens``."""
        return {"max_num_batched_tokens": tokens}

    @property
    def chunks_prompts(self) -> bool:
        """Whether a prompt longer than one step's budget is split over steps."""
        return True

    def check(self, pp: int) -> str | None:
        """Why this policy cannot run at ``pp`` stages, or None."""
        return None

    # --- what the executors need ----------------------------------------------------------------
    def pipe_options(self) -> PipeOptions:
        return PipeOptions()

    def return_cost(self, cost: Any, cpu: Any, pp: int) -> Any:
        """The cost model with this policy's return path at ``pp`` stages (vLLM's engine-core return:
        unchanged)."""
        return cost

    def knob_values(self) -> dict[str, Any]:
        """The knobs the pure engine cores read (:class:`ppsim.policy.pipelines.PolicyKnobs` fields)."""
        return {}


class _Budgeted(Policy):
    """A per-step token budget and the chunked-prefill switch (vLLM, TensorRT-LLM, llama.cpp)."""

    # None: the engine's default for the GPU (see fill_defaults)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, description="token budget per step")
    # None: the engine's default: on in vLLM V1 (always chunks), off in TensorRT-LLM
    enable_chunked_prefill: bool | None = None
    chunked_default: ClassVar[bool] = True

    def default_tokens(self, device: DeviceSpec) -> int:
        return vllm_batch_defaults(device)[1]

    def fill_defaults(self, device: DeviceSpec, pp: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_num_batched_tokens is None:
            out["max_num_batched_tokens"] = self.default_tokens(device)
        if self.enable_chunked_prefill is None:
            out["enable_chunked_prefill"] = self.chunked_default
        return out

    @property
    def step_token_budget(self) -> int:
        return self.max_num_batched_tokens or 0

    @property
    def chunks_prompts(self) -> bool:
        return self.enable_chunked_prefill is not False

    def knob_values(self) -> dict[str, Any]:
        return {"max_num_batched_tokens": self.step_token_budget, "enable_chunked_prefill": self.chunks_prompts}


class _Throttled(_Budgeted):
    # vLLM V1 has no PP throttle (Scheduler.schedule admits up to max_num_seqs); on: the proposed cap of
    # new admissions per step at max(1, max_num_seqs // pp)
    pp_throttle: bool = False

    def knob_values(self) -> dict[str, Any]:
        return {**super().knob_values(), "pp_throttle": self.pp_throttle}


class VllmSync(_Budgeted):
    kind: Literal["vllm-sync"] = "vllm-sync"


class VllmBatchQueue(_Throttled):
    kind: Literal["vllm-batch-queue"] = "vllm-batch-queue"


class VllmAsync(_Budgeted):
    kind: Literal["vllm-async"] = "vllm-async"

    def check(self, pp: int) -> str | None:
        if pp > 1:  # vllm/config/vllm.py::VllmConfig.max_concurrent_batches: pp + 1 only with the V2 runner
            return (
                "vllm-async is vLLM's V1 model runner, which runs async scheduling only at "
                "pipeline_parallel_size 1; use --policy vllm-mrv2 for async scheduling with PP"
            )
        return None


class VllmMrv2(_Throttled):
    kind: Literal["vllm-mrv2"] = "vllm-mrv2"
    # cap decodes per step at ceil(max_num_seqs / pp) (open vLLM PR #57433)
    mrv2_decode_cap: bool = False
    # sampled-token broadcast on its own NCCL group/stream, or serialized with the p2p sends
    pp_broadcast: Literal["overlapped", "serialized"] = "overlapped"

    def pipe_options(self) -> PipeOptions:
        return PipeOptions("broadcast", self.pp_broadcast == "serialized")

    def knob_values(self) -> dict[str, Any]:
        return {**super().knob_values(), "mrv2_decode_cap": self.mrv2_decode_cap, "pp_broadcast": self.pp_broadcast}


class SglangRing(Policy):
    """SGLang ``event_loop_pp`` (server_args.py names and defaults; see ppsim/policy/sglang.py)."""

    kind: Literal["sglang-ring"] = "sglang-ring"
    pp_async_batch_depth: int = Field(
        default=0, ge=0, le=MAX_PIPELINE_SLOTS, description="extra micro-batch slots (SGLang default 0)"
    )
    pp_max_micro_batch_size: int | None = Field(default=None, ge=1, description="None: max(max_num_seqs // pp, 1)")
    # None: SGLang's default for the GPU's memory (ServerArgs._handle_gpu_memory_settings)
    chunked_prefill_size: int | None = Field(default=None, ge=1, description="SGLang prefill chunk")
    max_prefill_tokens: int = Field(default=16384, ge=1, description="SGLang prefill-batch token budget")
    enable_dynamic_chunking: bool = False  # SGLang --enable-dynamic-chunking
    smooth_factor: float = Field(default=0.75, ge=0, le=1, description="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR")
    page_size: int = Field(default=1, ge=1, description="SGLang --page-size (chunk alignment max(page, 64))")
    # f(l) = a l^2 + b l + c of one stage's prefill (or a,b,c,gamma of the refined form);
    # None: fitted from the cost model at start-up
    dynamic_chunking_coefficients: tuple[float, float, float] | tuple[float, float, float, float] | None = None
    # quadratic: SGLang's f(l) fit; refined: ppsim's t(L, x) with per-chunk prefix work (ppsim/policy/chunking.py)
    dynamic_chunking_form: Literal["quadratic", "refined"] = "quadratic"
    foreign_hints: ClassVar[dict[str, str]] = {
        "max_num_batched_tokens": "SGLang bounds a prefill batch by --max-prefill-tokens and "
        "--chunked-prefill-size; give those",
        "enable_chunked_prefill": "SGLang chunks prompts by --chunked-prefill-size; give that",
    }

    @field_validator("dynamic_chunking_coefficients")
    @classmethod
    def _coefficients(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        """Checked with dynamic chunking on or off (``chunk_coefficients_problem``)."""
        why = None if v is None else chunk_coefficients_problem(v)
        if why:
            raise ValueError(why)
        return v

    @classmethod
    def budget_fields(cls, tokens: int) -> dict[str, int]:
        return {"chunked_prefill_size": tokens, "max_prefill_tokens": tokens}

    def fill_defaults(self, device: DeviceSpec, pp: int) -> dict[str, Any]:
        if self.chunked_prefill_size is None:
            return {"chunked_prefill_size": sglang_chunked_prefill_size(device.memory_gib)}
        return {}

    def check(self, pp: int) -> str | None:
        # PrefillAdder takes whole pages of a prompt it chunks: a page above the budget takes nothing
        if self.page_size > self.step_token_budget:
            return (
                f"engine.policy.page_size {self.page_size} is above a prefill batch's budget "
                f"min(chunked_prefill_size, max_prefill_tokens) = {self.step_token_budget}: a chunk is whole "
                "pages, so a long prompt could never be scheduled; lower --page-size or raise --chunked-prefill-size"
            )
        return None

    @property
    def step_token_budget(self) -> int:
        return min(self.chunked_prefill_size or self.max_prefill_tokens, self.max_prefill_tokens)

    def pipe_options(self) -> PipeOptions:
        return PipeOptions(overlap_sends=True, defer_outputs=self.pp_async_batch_depth)

    def return_cost(self, cost: Any, cpu: Any, pp: int) -> Any:
        """Outputs return over the ring: one hop plus the last rank's post-processing (ppsim/cost/ring.py).
        One stage has no ring (SGLang runs ``event_loop_pp`` only when ``pp_size > 1``): unchanged."""
        from ppsim.cost.ring import RingReturnCost

        if pp == 1:
            return cost
        return RingReturnCost(cost, cpu.update_us, cpu.update_per_req_us, self.pp_async_batch_depth)

    def knob_values(self) -> dict[str, Any]:
        return {"max_num_batched_tokens": self.step_token_budget}


class TrtllmSlots(_Budgeted):
    kind: Literal["trtllm-slots"] = "trtllm-slots"
    # requests per micro-batch (TRT-LLM --max_batch_size, default 2048); at most max_batch_size x pp in flight
    max_batch_size: int = Field(default=2048, ge=1, description="TRT-LLM requests per micro-batch")
    # sample state relayed inline on the executor thread (TRT-LLM default) or a relay thread
    trtllm_relay: Literal["sync", "async"] = "sync"
    chunked_default: ClassVar[bool] = False  # TorchLlmArgs.enable_chunked_prefill = False

    def default_max_num_seqs(self, device: DeviceSpec, pp: int) -> int:
        return self.max_batch_size * pp  # PyTorchModelEngine.get_max_num_sequences

    def default_tokens(self, device: DeviceSpec) -> int:
        return TRTLLM_MAX_NUM_TOKENS

    def pipe_options(self) -> PipeOptions:
        return PipeOptions(overlap_sends=True)

    def return_cost(self, cost: Any, cpu: Any, pp: int) -> Any:
        """The sample-state ring: one hop to rank 0, then forwarded inline (sync). One stage has no ring
        (``_executor_loop_pp`` runs only when pp > 1): unchanged."""
        from ppsim.cost.ring import RingReturnCost

        if pp == 1:
            return cost
        return RingReturnCost(cost, 0.0, 0.0, depth=1)

    def knob_values(self) -> dict[str, Any]:
        return {**super().knob_values(), "max_batch_size": self.max_batch_size, "trtllm_relay": self.trtllm_relay}


class Llamacpp(_Budgeted):
    kind: Literal["llamacpp"] = "llamacpp"
    llamacpp_ubatch_tokens: int = Field(default=512, ge=1, description="llama.cpp -ub (n_ubatch, default 512)")
    llamacpp_n_copies: int = Field(
        default=4, ge=1, le=MAX_PIPELINE_SLOTS, description="GGML_SCHED_MAX_COPIES pipeline buffer copies"
    )

    def default_tokens(self, device: DeviceSpec) -> int:
        return LLAMACPP_N_BATCH

    def knob_values(self) -> dict[str, Any]:
        return {
            **super().knob_values(),
            "llamacpp_ubatch_tokens": self.llamacpp_ubatch_tokens,
            "llamacpp_n_copies": self.llamacpp_n_copies,
        }


class NoPP(_Budgeted):
    kind: Literal["no-pp"] = "no-pp"
    dp_routing: Literal["round-robin", "least-loaded"] = "round-robin"  # request router

    def knob_values(self) -> dict[str, Any]:
        return {**super().knob_values(), "dp_routing": self.dp_routing}


POLICY_TYPES: tuple[type[Policy], ...] = (
    VllmSync,
    VllmBatchQueue,
    VllmAsync,
    VllmMrv2,
    SglangRing,
    TrtllmSlots,
    Llamacpp,
    NoPP,
)
POLICIES: dict[str, type[Policy]] = {t.model_fields["kind"].default: t for t in POLICY_TYPES}
PolicyConfig = Annotated[
    VllmSync | VllmBatchQueue | VllmAsync | VllmMrv2 | SglangRing | TrtllmSlots | Llamacpp | NoPP,
    Field(discriminator="kind"),
]


def knobs_of(kind: str) -> tuple[str, ...]:
    """The knobs (fields other than ``kind``) of policy ``kind``."""
    return tuple(f for f in POLICIES[kind].model_fields if f != "kind")


# knob -> the policies that read it (derived from the types: one place)
POLICY_KNOBS: dict[str, tuple[str, ...]] = {}
for _kind, _t in POLICIES.items():
    for _f in knobs_of(_kind):
        POLICY_KNOBS.setdefault(_f, ())
        POLICY_KNOBS[_f] += (_kind,)


def foreign_knob(name: str, kind: str) -> str:
    """The one-line refusal of knob ``name`` given to policy ``kind``."""
    owners = POLICY_KNOBS[name]
    flag = name if name in FILE_ONLY_KNOBS else "--" + name.replace("_", "-")
    hint = POLICIES[kind].foreign_hints.get(name) or f"drop it or use --policy {owners[0]}"
    whose = " and ".join(owners) if len(owners) <= 2 else "the other policies"
    return f"{flag} is not a knob of {kind} (it is of {whose}); {hint}"


def policy_table(engine: dict[str, Any]) -> dict[str, Any]:
    """``engine`` with its policy as a table (``{"kind": ..., knobs}``): a name becomes ``{"kind": name}``,
    knobs given flat beside it (the older form) move into it; a knob of another policy is refused."""
    pol = engine.get("policy", {})
    if isinstance(pol, Policy):
        pol = {"kind": pol.kind, **pol.model_dump(exclude={"kind"}, exclude_unset=True)}
    elif isinstance(pol, str):
        pol = {"kind": pol}
    elif not isinstance(pol, dict):
        return engine  # pydantic names the type error
    flat = {k: v for k, v in engine.items() if k in POLICY_KNOBS}
    table = {"kind": DEFAULT_POLICY, **pol, **flat}  # a flat knob (a flag) wins over the table's (a file's)
    kind = table["kind"]
    if kind in POLICIES:
        own = POLICIES[kind].model_fields
        for name in table:
            if name not in own and name in POLICY_KNOBS:
                raise ValueError(foreign_knob(name, kind))
    return {**{k: v for k, v in engine.items() if k not in flat}, "policy": table}
