"""The typed scenario: one pydantic root, loaded from a file and overridden by CLI flags.

Every default is here, with the reason for it; nothing else in ppsim invents a default.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ppsim.errors import PPSimError
from ppsim.fileio import read_mapping
from ppsim.hardware.presets import DeviceSpec, LinkSpec, resolve_device

PolicyName = Literal[
    "vllm-sync",
    "vllm-batch-queue",
    "vllm-async",
    "vllm-mrv2",
    "sglang-ring",
    "trtllm-slots",
    "llamacpp",
    "no-pp",
]


# Bounds on what would otherwise be unbounded (a typo of a few zeros must not allocate terabytes):
MAX_NUM_PROMPTS = 10_000_000  # requests in one run
MAX_TOKENS = 10_000_000  # tokens in one sequence (the longest context windows served today: 10M)


class _Frozen(BaseModel):
    # inf and nan are refused everywhere, except where a field says what infinity means
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def step_budget_fields(policy: str, tokens: int) -> dict[str, int]:
    """The engine fields that give ``policy`` a per-step token budget of ``tokens`` (SGLang's are its own)."""
    if policy == "sglang-ring":
        return {"chunked_prefill_size": tokens, "max_prefill_tokens": tokens}
    return {"max_num_batched_tokens": tokens}


def vllm_batch_defaults(device: DeviceSpec) -> tuple[int, int]:
    """``vllm serve``'s (max_num_seqs, max_num_batched_tokens): ``vllm/engine/arg_utils.py::
    EngineArgs.get_batch_defaults``, OPENAI_API_SERVER context: (1024, 8192) on a GPU of >= 70 GiB that
    is not an A100, else (256, 2048)."""
    big = device.memory_gib >= 70 and "a100" not in device.name.lower()
    return (1024, 8192) if big else (256, 2048)


TRTLLM_MAX_NUM_TOKENS = 8192  # tensorrt_llm/llmapi/llm_args.py::BaseLlmArgs.max_num_tokens
LLAMACPP_N_BATCH = 2048  # llama.cpp common/common.h: common_params.n_batch


def policy_defaults(e: EngineConfig, device: DeviceSpec, pp: int) -> dict[str, Any]:
    """The engine's own value for each ``None`` field of ``e`` (what the real engine would use)."""
    seqs, tokens = vllm_batch_defaults(device)
    out: dict[str, Any] = {}
    if e.policy == "trtllm-slots":  # PyTorchModelEngine.get_max_num_sequences = max_batch_size x pp
        seqs, tokens = e.max_batch_size * pp, TRTLLM_MAX_NUM_TOKENS
    elif e.policy == "llamacpp":
        tokens = LLAMACPP_N_BATCH
    if e.max_num_seqs is None:
        out["max_num_seqs"] = seqs  # sglang-ring: stands in for max_running_requests (SGLang sizes it by memory)
    if e.policy == "sglang-ring":
        if e.chunked_prefill_size is None:
            out["chunked_prefill_size"] = sglang_chunked_prefill_size(device.memory_gib)
    else:
        if e.max_num_batched_tokens is None:
            out["max_num_batched_tokens"] = tokens
        if e.enable_chunked_prefill is None:
            out["enable_chunked_prefill"] = e.policy != "trtllm-slots"
    return out


def sglang_chunked_prefill_size(memory_gib: float) -> int:
    """SGLang's ``chunked_prefill_size`` for a GPU (``server_args.py::ServerArgs._handle_gpu_memory_settings``,
    thresholds on the GPU's memory in MiB): 2048 below 35 GiB, 4096 below 60, 8192 below 160, else 16384."""
    mib = memory_gib * 1024
    for limit_gib, chunk in ((35, 2048), (60, 4096), (160, 8192)):
        if mib < limit_gib * 1024:
            return chunk
    return 16384


class ClusterConfig(_Frozen):
    pipeline_parallel_size: int = Field(default=4, ge=1, description="number of pipeline stages")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per stage")
    # "vllm" (get_pp_indices), "last-heavy", or explicit counts like VLLM_PP_LAYER_PARTITION.
    layer_partition: Literal["vllm", "last-heavy"] | list[int] = "vllm"
    link: str | LinkSpec = "nvlink"  # between stages
    tp_link: str | LinkSpec = "nvlink"  # inside a stage, for the TP all-reduces

    @field_validator("layer_partition", mode="before")
    @classmethod
    def _parse_partition(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in ("vllm", "last-heavy"):
            try:
                return [int(x) for x in v.split(",")]
            except ValueError:
                raise ValueError("use vllm, last-heavy or comma-separated counts like 20,20,20,20") from None
        return v


class CpuOverheads(_Frozen):
    """Per-step CPU costs on the engine-core process, microseconds.

    Defaults are from vLLM V1 on H100 (the schedule and output-processing costs in Vidur's
    cpu_overheads measurements are of this order): a fixed part plus a part per scheduled request.
    """

    schedule_us: float = Field(default=150.0, ge=0, description="scheduler.schedule(), fixed part")
    schedule_per_req_us: float = Field(default=4.0, ge=0, description="per request in the step")
    update_us: float = Field(default=100.0, ge=0, description="update_from_output, fixed part")
    update_per_req_us: float = Field(default=3.0, ge=0)
    relay_per_req_us: float = Field(default=1.0, ge=0, description="scheduler token relay, per token id")
    return_latency_us: float = Field(default=50.0, ge=0, description="last stage -> engine core message")
    launch_latency_us: float = Field(
        default=30.0, ge=0, description="engine core -> first stage control message (vLLM's shm broadcast)"
    )


# Which policies read each policy-specific engine knob (the others refuse a non-default value, see
# EngineConfig._foreign_knobs). Sources of every default: docs/policies.md.
NOT_SGLANG = ("vllm-sync", "vllm-batch-queue", "vllm-async", "vllm-mrv2", "trtllm-slots", "llamacpp", "no-pp")
POLICY_KNOBS: dict[str, tuple[str, ...]] = {
    "pp_throttle": ("vllm-batch-queue", "vllm-mrv2"),
    # TensorRT-LLM's max_num_tokens and llama.cpp's n_batch play this part; SGLang has its own budgets
    "max_num_batched_tokens": NOT_SGLANG,
    "enable_chunked_prefill": NOT_SGLANG,
    "pp_async_batch_depth": ("sglang-ring",),
    "pp_max_micro_batch_size": ("sglang-ring",),
    "chunked_prefill_size": ("sglang-ring",),
    "max_prefill_tokens": ("sglang-ring",),
    "enable_dynamic_chunking": ("sglang-ring",),
    "smooth_factor": ("sglang-ring",),
    "page_size": ("sglang-ring",),
    "dynamic_chunking_coefficients": ("sglang-ring",),
    "dynamic_chunking_form": ("sglang-ring",),
    "mrv2_decode_cap": ("vllm-mrv2",),
    "pp_broadcast": ("vllm-mrv2",),
    "max_batch_size": ("trtllm-slots",),
    "trtllm_relay": ("trtllm-slots",),
    "llamacpp_ubatch_tokens": ("llamacpp",),
    "llamacpp_n_copies": ("llamacpp",),
    "dp_routing": ("no-pp",),
}
KNOB_HINTS = {("max_num_batched_tokens", "sglang-ring"): "SGLang bounds a prefill batch by --max-prefill-tokens "
              "and --chunked-prefill-size; give those",
              ("enable_chunked_prefill", "sglang-ring"): "SGLang chunks prompts by --chunked-prefill-size; give that"}


class EngineConfig(_Frozen):
    policy: PolicyName = "vllm-batch-queue"
    # None: the engine's own default for the policy and GPU, set by Scenario (see policy_defaults)
    max_num_seqs: int | None = Field(default=None, ge=1, description="running requests at most")
    max_num_batched_tokens: int | None = Field(default=None, ge=1, description="token budget per step")
    # vLLM --max-model-len: prompt + output tokens a request may have; None: the model's max_position_embeddings
    max_model_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    # None: the engine's default: on in vLLM V1 (always chunks), off in TensorRT-LLM
    # (TorchLlmArgs.enable_chunked_prefill = False); SGLang chunks by --chunked-prefill-size instead
    enable_chunked_prefill: bool | None = None
    block_size: int = Field(default=16, ge=1, description="tokens per KV block (vLLM default 16)")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    activation_reserve_gib: float = Field(default=2.0, ge=0, description="per GPU, kept out of the KV pool")
    # vLLM V1 has no PP throttle (Scheduler.schedule admits up to max_num_seqs); on: the proposed cap of
    # new admissions per step at max(1, max_num_seqs // pp)
    pp_throttle: bool = False
    # sglang-ring (SGLang server_args.py names and defaults; see ppsim/policy/sglang.py)
    pp_async_batch_depth: int = Field(default=0, ge=0, description="extra micro-batch slots (SGLang default 0)")
    pp_max_micro_batch_size: int | None = Field(default=None, ge=1, description="None: max(max_num_seqs // pp, 1)")
    # None: SGLang's default for the GPU's memory (ServerArgs._handle_gpu_memory_settings), set by Scenario
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
    # vllm-mrv2 (ppsim/policy/pipelines.py): cap decodes per step at ceil(max_num_seqs / pp)
    mrv2_decode_cap: bool = False
    # vllm-mrv2: sampled-token broadcast on its own NCCL group/stream, or serialized with the p2p sends
    pp_broadcast: Literal["overlapped", "serialized"] = "overlapped"
    # trtllm-slots: requests per micro-batch (TRT-LLM --max_batch_size, default 2048); at most
    # max_batch_size x pp requests in flight
    max_batch_size: int = Field(default=2048, ge=1, description="TRT-LLM requests per micro-batch")
    # trtllm-slots: sample state relayed inline on the executor thread (TRT-LLM default) or a relay thread
    trtllm_relay: Literal["sync", "async"] = "sync"
    llamacpp_ubatch_tokens: int = Field(default=512, ge=1, description="llama.cpp -ub (n_ubatch, default 512)")
    llamacpp_n_copies: int = Field(default=4, ge=1, description="GGML_SCHED_MAX_COPIES pipeline buffer copies")
    dp_routing: Literal["round-robin", "least-loaded"] = "round-robin"  # no-pp: request router
    cpu: CpuOverheads = CpuOverheads()

    @property
    def step_token_budget(self) -> int:
        """Tokens one step may take: ``max_num_batched_tokens``, or SGLang's prefill budget."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return min(self.chunked_prefill_size or self.max_prefill_tokens, self.max_prefill_tokens)

    @model_validator(mode="after")
    def _foreign_knobs(self) -> EngineConfig:
        """A knob another policy reads, set away from its default, would be ignored: refuse it."""
        fields = type(self).model_fields
        for name, owners in POLICY_KNOBS.items():
            value = getattr(self, name)
            if self.policy not in owners and value != fields[name].default:
                flag = "--" + name.replace("_", "-")
                hint = KNOB_HINTS.get((name, self.policy), f"drop it or use --policy {owners[0]}")
                whose = " and ".join(owners) if len(owners) <= 2 else "the other policies"
                raise ValueError(f"{flag} is not a knob of {self.policy} (it is of {whose}); {hint}")
        return self


class CostConfig(_Frozen):
    """Analytic roofline: time = max(flops / (peak x compute_eff), bytes / (bw x memory_eff))."""

    kind: Literal["analytic", "profile"] = "analytic"
    profile_dir: str | None = None
    # None: the numbers fitted for the device to Vidur's measured kernels (ppsim/cost/kernels.py)
    compute_efficiency: float | None = Field(default=None, gt=0, le=1, description="achieved / peak FLOP/s for GEMMs")
    memory_efficiency: float | None = Field(default=None, gt=0, le=1, description="achieved / peak HBM bandwidth")
    layer_overhead_us: float = Field(default=0.0, ge=0, description="extra per layer per step")
    step_overhead_us: float | None = Field(default=None, ge=0, description="per stage per step: input preparation")
    # MoE: the step's T tokens route like T / skew independent tokens (1 = uniform routing; see ppsim/models/moe.py)
    moe_routing_skew: float = Field(default=1.0, ge=1, description="tokens sharing one expert choice, on average")

    @model_validator(mode="after")
    def _profile_needs_dir(self) -> CostConfig:
        if self.kind == "profile" and not self.profile_dir:
            raise ValueError("kind=profile needs profile_dir (use --profile DIR)")
        return self


class WorkloadConfig(_Frozen):
    """Named as in ``vllm bench serve`` (random dataset)."""

    num_prompts: int = Field(default=200, ge=1, le=MAX_NUM_PROMPTS)
    request_rate: float = Field(default=8.0, gt=0, allow_inf_nan=True, description="requests/s; inf sends all at t=0")
    burstiness: float = Field(default=1.0, gt=0, description="gamma shape; 1 = Poisson")
    max_concurrency: int | None = Field(default=None, ge=1, description="closed loop: requests outstanding at most")
    random_input_len: int = Field(default=1024, ge=1, le=MAX_TOKENS)
    random_output_len: int = Field(default=128, ge=1, le=MAX_TOKENS)
    random_range_ratio: float = Field(default=0.0, ge=0, lt=1)
    trace: str | None = Field(default=None, description="CSV with arrival_s,input_tokens,output_tokens")
    abort_rate: float = Field(default=0.0, ge=0, le=1, description="fraction of requests the client cancels")
    abort_window_s: float = Field(default=1.0, gt=0, description="time aborts fall in [0, window) after arrival")

    @model_validator(mode="after")
    def _trace_or_synthetic(self) -> WorkloadConfig:
        given = sorted(SYNTHETIC_FIELDS & self.model_fields_set)
        if self.trace and given:
            raise ValueError(f"--trace replays the requests and arrival times in its file; drop {', '.join(given)} "
                             "(settings of the synthetic workload)")
        return self


# WorkloadConfig fields that a trace replaces
SYNTHETIC_FIELDS = {"num_prompts", "request_rate", "burstiness", "random_input_len", "random_output_len",
                    "random_range_ratio"}


class Scenario(_Frozen):
    model: str = "llama-3-70b"
    # Storage dtypes (vLLM --quantization / --kv-cache-dtype); "auto": the checkpoint's
    # (quantization_config, else torch_dtype) for weights and the activation dtype for the KV cache.
    weight_dtype: Literal["auto", "bf16", "fp16", "fp32", "fp8", "fp4"] = "auto"
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    # MoE, live engine and its calibration: router logit bias -s ln(e + 1) on expert e (engine/moe.py; 0 = none)
    moe_router_zipf: float = Field(default=0.0, ge=0, le=8, description="engine MoE router popularity skew s")
    hardware: str | DeviceSpec = "h100-sxm"
    cluster: ClusterConfig = ClusterConfig()
    engine: EngineConfig = EngineConfig()
    cost: CostConfig = CostConfig()
    workload: WorkloadConfig = WorkloadConfig()
    seed: int = Field(default=0, ge=0, description="numpy seeds are non-negative")

    @field_validator("weight_dtype", "kv_cache_dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, v: Any) -> Any:
        aliases = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "none": "auto",
                   "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "nvfp4": "fp4", "modelopt_fp4": "fp4"}
        return aliases.get(v.lower(), v.lower()) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        fill = policy_defaults(self.engine, resolve_device(self.hardware), self.cluster.pipeline_parallel_size)
        if fill:
            return self.model_copy(update={"engine": self.engine.model_copy(update=fill)})._check()
        if self.engine.step_token_budget < self.engine.block_size:
            raise ValueError("engine.max_num_batched_tokens must be >= engine.block_size")
        if self.engine.policy == "vllm-async" and self.cluster.pipeline_parallel_size > 1:
            # vllm/config/vllm.py::VllmConfig.max_concurrent_batches: async + PP gets pp + 1 only with the V2 runner
            raise ValueError("vllm-async is vLLM's V1 model runner, which runs async scheduling only at "
                             "pipeline_parallel_size 1; use --policy vllm-mrv2 for async scheduling with PP")
        return self


# --- loading --------------------------------------------------------------------------------


def _read_file(path: str) -> dict[str, Any]:
    return read_mapping(path, "--config", "scenario fields")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


UNION_PREFIXES = ("function-", "literal[", "list[")  # pydantic's names for union branches in a loc
UNION_NAMES = {"str", "int", "float", "DeviceSpec", "LinkSpec"}


def format_validation_error(err: ValidationError) -> str:
    errs = err.errors()
    # a custom table given for a ``str | Spec`` field: report the table's error, not "not a string"
    e = next((x for x in errs if x["type"] != "string_type"), errs[0])
    loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith(UNION_PREFIXES) and str(x) not in UNION_NAMES)
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc or 'scenario'}: {msg} (got {e.get('input')!r})" if "input" in e and not isinstance(
        e.get("input"), dict
    ) else f"{loc or 'scenario'}: {msg}"


def build_scenario(config_path: str | None = None, overrides: dict[str, Any] | None = None) -> Scenario:
    """Scenario from an optional file, then nested ``overrides`` (CLI flags) on top."""
    data = _read_file(config_path) if config_path else {}
    data = _merge(data, overrides or {})
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise PPSimError(format_validation_error(err)) from None


def scenario_json(s: Scenario) -> str:
    d = s.model_dump(mode="json")
    if s.workload.trace:  # the trace replaces these; written, they would make the file contradict itself
        d["workload"] = {k: v for k, v in d["workload"].items() if k not in SYNTHETIC_FIELDS}
    elif math.isinf(s.workload.request_rate):
        d["workload"]["request_rate"] = "inf"
    return json.dumps(d, indent=2, sort_keys=True)
