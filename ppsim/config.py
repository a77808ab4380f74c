"""The typed scenario: one pydantic root, loaded from a file and overridden by CLI flags.

Every default is here, with the reason for it; nothing else in ppsim invents a default.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ppsim.errors import PPSimError
from ppsim.fileio import cut_text, read_mapping, short_repr
from ppsim.hardware.presets import DeviceSpec, LinkSpec, resolve_device
from ppsim.live_engine import LiveEngineConfig
from ppsim.policies import (  # noqa: F401 - POLICY_KNOBS re-exported (tests, tools)
    DEFAULT_POLICY,
    POLICIES,
    POLICY_KNOBS,
    PolicyConfig,
    VllmBatchQueue,
    policy_table,
)
from ppsim.typed import Model

# Bounds on what would otherwise be unbounded (a typo of a few zeros must not allocate terabytes):
MAX_NUM_PROMPTS = 10_000_000  # requests in one run
MAX_TOKENS = 16 * 1024**2  # tokens in one sequence (the longest context served today: Llama 4 Scout, 10,485,760)
# Tokens per KV block: vLLM 0.9-0.16 accept 1 to 256 (CacheConfig.BlockSize), later ones any positive int, and
# hybrid (Mamba) models align attention blocks to the state's page, a few thousand tokens at most
MAX_BLOCK_SIZE = 4096
# Simulated times: float seconds keep sub-microsecond resolution up to ~1e7 s (~4 months); times in ms or
# epoch seconds would round TTFT and TPOT to 0 there, and far above that overflow integer nanoseconds.
MAX_ARRIVAL_S = 1e7  # arrivals (and client abort delays) at most this many seconds after the run starts
MAX_OVERHEAD_US = 1e7  # a CPU or per-step overhead of more than 10 s is a unit mistake (ms or ns given as us)
MIN_REQUEST_RATE = 1e-6  # req/s: one request in ~12 days
MIN_BURSTINESS = 1e-3  # gamma shape; below this almost every gap is 0 and a rare one is astronomically long
MIN_EFFICIENCY = 1e-3  # achieved / peak; 0.1 % of peak is already far below any real kernel


class _Frozen(Model):
    # inf and nan are refused everywhere, except where a field says what infinity means
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _path_or_none(v: str | None, what: str) -> str | None:
    """A path setting: ``None`` (not set) or a non-empty path without NUL bytes."""
    if v is None:
        return None
    if not v.strip():
        raise ValueError(f"empty path; give {what} or remove the setting")
    if "\0" in v:
        raise ValueError("the path contains a NUL byte; fix the path")
    return v


def step_budget_fields(policy: str, tokens: int) -> dict[str, int]:
    """The engine fields that give ``policy`` a per-step token budget of ``tokens`` (SGLang's are its own)."""
    return POLICIES[policy or DEFAULT_POLICY].budget_fields(tokens)


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

    schedule_us: float = Field(default=150.0, ge=0, le=MAX_OVERHEAD_US, description="scheduler.schedule(), fixed part")
    schedule_per_req_us: float = Field(default=4.0, ge=0, le=MAX_OVERHEAD_US, description="per request in the step")
    update_us: float = Field(default=100.0, ge=0, le=MAX_OVERHEAD_US, description="update_from_output, fixed part")
    update_per_req_us: float = Field(default=3.0, ge=0, le=MAX_OVERHEAD_US)
    relay_per_req_us: float = Field(
        default=1.0, ge=0, le=MAX_OVERHEAD_US, description="scheduler token relay, per token id"
    )
    return_latency_us: float = Field(
        default=50.0, ge=0, le=MAX_OVERHEAD_US, description="last stage -> engine core message"
    )
    launch_latency_us: float = Field(
        default=30.0,
        ge=0,
        le=MAX_OVERHEAD_US,
        description="engine core -> first stage control message (vLLM's shm broadcast)",
    )


class EngineConfig(_Frozen):
    """The engine settings every policy has, and the policy: one typed object of its own knobs
    (``ppsim/policies.py``; a table ``[engine.policy]`` with ``kind``, or the older flat form)."""

    policy: PolicyConfig = VllmBatchQueue()
    # None: the engine's own default for the policy and GPU, set by Scenario (Policy.default_max_num_seqs);
    # sglang-ring: stands in for max_running_requests (SGLang sizes it by memory)
    max_num_seqs: int | None = Field(default=None, ge=1, description="running requests at most")
    # vLLM --max-model-len: prompt + output tokens a request may have; None: the model's max_position_embeddings
    max_model_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    block_size: int = Field(default=16, ge=1, le=MAX_BLOCK_SIZE, description="tokens per KV block (vLLM default 16)")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    activation_reserve_gib: float = Field(default=2.0, ge=0, description="per GPU, kept out of the KV pool")
    cpu: CpuOverheads = CpuOverheads()

    @model_validator(mode="before")
    @classmethod
    def _policy_table(cls, data: Any) -> Any:
        """The policy as a table of its own knobs: a name or the flat form is mapped, a foreign knob refused."""
        return policy_table(data) if isinstance(data, dict) else data

    @property
    def step_token_budget(self) -> int:
        """Tokens one step may take: ``max_num_batched_tokens``, or SGLang's prefill budget."""
        return self.policy.step_token_budget


class CostConfig(_Frozen):
    """Analytic roofline: time = max(flops / (peak x compute_eff), bytes / (bw x memory_eff))."""

    kind: Literal["analytic", "profile"] = "analytic"
    profile_dir: str | None = None
    # None: the numbers fitted for the device to Vidur's measured kernels (ppsim/cost/kernels.py)
    compute_efficiency: float | None = Field(
        default=None, ge=MIN_EFFICIENCY, le=1, description="achieved / peak FLOP/s for GEMMs"
    )
    memory_efficiency: float | None = Field(
        default=None, ge=MIN_EFFICIENCY, le=1, description="achieved / peak HBM bandwidth"
    )
    layer_overhead_us: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_US, description="extra per layer per step")
    step_overhead_us: float | None = Field(
        default=None, ge=0, le=MAX_OVERHEAD_US, description="per stage per step: input preparation"
    )
    # MoE: the step's T tokens route like T / skew independent tokens (1 = uniform routing; see ppsim/models/moe.py)
    moe_routing_skew: float = Field(default=1.0, ge=1, description="tokens sharing one expert choice, on average")

    @field_validator("profile_dir")
    @classmethod
    def _profile_path(cls, v: str | None) -> str | None:
        return _path_or_none(v, "a calibration directory")

    @model_validator(mode="before")
    @classmethod
    def _profile_dir_selects_profile(cls, data: Any) -> Any:
        """A ``profile_dir`` without a ``kind`` selects the profiled model, as ``--profile DIR`` does."""
        if isinstance(data, dict) and data.get("profile_dir") and "kind" not in data:
            return {**data, "kind": "profile"}
        return data

    @model_validator(mode="after")
    def _profile_needs_dir(self) -> CostConfig:
        if self.kind == "profile" and not self.profile_dir:
            raise ValueError("kind=profile needs profile_dir (use --profile DIR)")
        if self.kind == "analytic" and self.profile_dir:
            raise ValueError(
                "profile_dir is set but kind is 'analytic', so the profile would be ignored: "
                "set kind = 'profile' (or pass --profile DIR), or remove profile_dir"
            )
        return self


class WorkloadConfig(_Frozen):
    """Named as in ``vllm bench serve`` (random dataset)."""

    num_prompts: int = Field(default=200, ge=1, le=MAX_NUM_PROMPTS)
    request_rate: float = Field(
        default=8.0, ge=MIN_REQUEST_RATE, allow_inf_nan=True, description="requests/s; inf sends all at t=0"
    )
    burstiness: float = Field(default=1.0, ge=MIN_BURSTINESS, description="gamma shape; 1 = Poisson")
    max_concurrency: int | None = Field(default=None, ge=1, description="closed loop: requests outstanding at most")
    random_input_len: int = Field(default=1024, ge=1, le=MAX_TOKENS)
    random_output_len: int = Field(default=128, ge=1, le=MAX_TOKENS)
    random_range_ratio: float = Field(default=0.0, ge=0, lt=1)
    trace: str | None = Field(default=None, description="CSV with arrival_s,input_tokens,output_tokens")
    abort_rate: float = Field(default=0.0, ge=0, le=1, description="fraction of requests the client cancels")
    abort_window_s: float = Field(
        default=1.0, gt=0, le=MAX_ARRIVAL_S, description="time aborts fall in [0, window) after arrival"
    )

    @field_validator("trace")
    @classmethod
    def _trace_path(cls, v: str | None) -> str | None:
        return _path_or_none(v, "a trace CSV")

    @model_validator(mode="after")
    def _trace_or_synthetic(self) -> WorkloadConfig:
        given = sorted(SYNTHETIC_FIELDS & self.model_fields_set)
        if self.trace and given:
            raise ValueError(
                f"--trace replays the requests and arrival times in its file; drop {', '.join(given)} "
                "(settings of the synthetic workload)"
            )
        span_s = (self.num_prompts - 1) / self.request_rate
        if not self.trace and span_s > MAX_ARRIVAL_S:
            raise ValueError(
                f"request_rate {self.request_rate:g} req/s sends {self.num_prompts} prompts over ~{span_s:.3g} s, "
                f"more than the {MAX_ARRIVAL_S:g} s a run may span; raise request_rate or lower num_prompts"
            )
        return self


# WorkloadConfig fields that a trace replaces
SYNTHETIC_FIELDS = {
    "num_prompts",
    "request_rate",
    "burstiness",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
}


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
    # how `ppsim engine` / `ppsim validate` run the stages (the simulator ignores it): ppsim/live_engine.py
    live_engine: LiveEngineConfig = LiveEngineConfig()
    seed: int = Field(default=0, ge=0, description="numpy seeds are non-negative")

    @field_validator("weight_dtype", "kv_cache_dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, v: Any) -> Any:
        aliases = {
            "bfloat16": "bf16",
            "float16": "fp16",
            "half": "fp16",
            "float32": "fp32",
            "none": "auto",
            "fp8_e4m3": "fp8",
            "fp8_e5m2": "fp8",
            "nvfp4": "fp4",
            "modelopt_fp4": "fp4",
        }
        return aliases.get(v.lower(), v.lower()) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        e, pp = self.engine, self.cluster.pipeline_parallel_size
        device = resolve_device(self.hardware)
        fill = e.policy.fill_defaults(device, pp)
        pol = e.policy.model_copy(update=fill) if fill else e.policy
        if pol.step_token_budget < e.block_size:
            raise ValueError(_budget_below_block(e, pol))
        why = pol.check(pp)
        if why:
            raise ValueError(why)
        if fill or e.max_num_seqs is None:
            seqs = e.max_num_seqs or pol.default_max_num_seqs(device, pp)
            eng = e.model_copy(update={"policy": pol, "max_num_seqs": seqs})
            return self.model_copy(update={"engine": eng})
        return self


def _budget_below_block(e: EngineConfig, pol: PolicyConfig) -> str:
    """A step's token budget below one KV block, blamed on the setting the user gave: the policy's budget knob
    (``max_num_batched_tokens``, SGLang's ``chunked_prefill_size`` or ``max_prefill_tokens``), or block_size."""
    budget, bs = pol.step_token_budget, e.block_size
    names = list(type(pol).budget_fields(budget))
    knob = next((n for n in names if getattr(pol, n, None) == budget and n in e.policy.model_fields_set), None)
    if knob is None and "block_size" in e.model_fields_set:
        knob = next((n for n in names if getattr(pol, n, None) == budget), names[0])
        return (
            f"engine.block_size: {bs} tokens per KV block, more than the {budget} tokens a step may take "
            f"(engine.{knob}); lower block_size or raise {knob}"
        )
    return (
        f"engine.{knob or names[0]}: {budget} tokens per step, fewer than one KV block of "
        f"engine.block_size {bs} tokens; raise it to at least {bs}"
    )


# --- loading --------------------------------------------------------------------------------


def _read_file(path: str) -> dict[str, Any]:
    return read_mapping(path, "--config", "scenario fields")


def _table_fields(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that take only a table of fields (``str | Spec``, which also takes a name, excepted)."""
    fields = {name: f.annotation for name, f in model.model_fields.items()}
    return {n: a for n, a in fields.items() if isinstance(a, type) and issubclass(a, BaseModel)}


def _non_table(data: dict[str, Any], model: type[BaseModel] = Scenario, where: str = "") -> tuple[str, Any] | None:
    """The first section of ``data`` (``workload``, ``engine.cpu``, ...) given as something else than a table."""
    for name, sub in _table_fields(model).items():
        v = data.get(name, {})
        bad = _non_table(v, sub, f"{where}{name}.") if isinstance(v, dict) else (f"{where}{name}", v)
        if bad:
            return bad
    return None


def check_sections(data: dict[str, Any], source: str, prefix: str = "", field: str | None = None) -> None:
    """Refuse a section that ``source`` gives as something else than a table: merged with a flag's table (or a
    sweep's rate), it would be replaced, and the mistake hidden. ``prefix`` goes before the section's path in
    the message, ``field`` replaces both."""
    bad = _non_table(data)
    if bad:
        path, v = bad
        raise PPSimError(
            f"{field or prefix + path}: {source} sets {path} to {short_repr(v)}, not a table; it is a section: "
            "give a table of its fields or remove it"
        )


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top: tables merged key by key, any other value replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


UNION_PREFIXES = ("function-", "literal[", "list[")  # pydantic's names for union branches in a loc
UNION_NAMES = {"str", "int", "float", "DeviceSpec", "LinkSpec", *POLICIES}  # policy kinds: the union's tags


FIELD_NAMED = re.compile(r"[a-z_]+(\.[a-z_]+)+: ")  # "engine.block_size: ..."


def format_validation_error(err: ValidationError) -> str:
    errs = err.errors()
    # a custom table given for a ``str | Spec`` field: report the table's error, not "not a string"
    e = next((x for x in errs if x["type"] != "string_type"), errs[0])
    loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith(UNION_PREFIXES) and str(x) not in UNION_NAMES)
    loc, msg = cut_text(loc, 120), cut_text(e["msg"].removeprefix("Value error, "))
    # the value as given, cut short: a YAML alias bomb of 400 bytes has a repr of gigabytes
    if not loc and FIELD_NAMED.match(msg):  # a check across fields that names the field to fix
        return msg
    return (
        f"{loc or 'scenario'}: {msg} (got {short_repr(e.get('input'))})"
        if "input" in e and not isinstance(e.get("input"), dict)
        else f"{loc or 'scenario'}: {msg}"
    )


def _knob_given_twice(data: dict[str, Any], path: str) -> None:
    """Refuse a policy knob that one file sets both flat in ``engine`` and in ``engine.policy`` to
    different values (which one wins is not for the user to guess; a flag still wins over the file)."""
    eng = data.get("engine")
    pol = eng.get("policy") if isinstance(eng, dict) else None
    if not isinstance(pol, dict):
        return
    for k, v in pol.items():
        if k in POLICY_KNOBS and k in eng and eng[k] != v:
            raise PPSimError(
                f"engine.{cut_text(k, 60)}: {path} sets it twice, engine.{cut_text(k, 60)} = {short_repr(eng[k])} and "
                f"engine.policy.{cut_text(k, 60)} = {short_repr(v)}; keep one"
            )


def build_scenario(config_path: str | None = None, overrides: dict[str, Any] | None = None) -> Scenario:
    """Scenario from an optional file, then nested ``overrides`` (CLI flags) on top."""
    data = _read_file(config_path) if config_path else {}
    if config_path:
        check_sections(data, config_path)
        _knob_given_twice(data, config_path)
    data = deep_merge(data, overrides or {})
    try:
        s = Scenario.model_validate(data)
    except ValidationError as err:
        raise PPSimError(format_validation_error(err)) from None
    _refuse_without_effect(s)
    return s


def _refuse_without_effect(s: Scenario) -> None:
    """Refuse a setting away from its default that changes nothing in this run. Here, not in the models: a
    sweep's product may pair it with an axis value that turns it off (a window with ``abort_rate = 0``), which
    is no mistake; and the default is let pass, as every config.json written so far holds it."""
    if s.workload.abort_rate == 0 and s.workload.abort_window_s != WorkloadConfig().abort_window_s:
        raise PPSimError(
            "workload.abort_window_s: no request is aborted (abort_rate is 0), so the window changes nothing; "
            "set --abort-rate or drop --abort-window-s"
        )
    # the simulator's expert-load skew and the engine's router skew: both route to experts
    skews = {"cost.moe_routing_skew": s.cost.moe_routing_skew != 1, "moe_router_zipf": s.moe_router_zipf != 0}
    given = next((field for field, away in skews.items() if away), None)
    if given is not None:
        from ppsim.models.shape import load_model, refuse_skew_on_dense

        flag = "--" + given.split(".")[-1].replace("_", "-")
        refuse_skew_on_dense(load_model(s.model), given, short_repr(s.model, 80), flag)


def scenario_json(s: Scenario) -> str:
    d = s.model_dump(mode="json")
    if s.workload.trace:  # the trace replaces these; written, they would make the file contradict itself
        d["workload"] = {k: v for k, v in d["workload"].items() if k not in SYNTHETIC_FIELDS}
    elif math.isinf(s.workload.request_rate):
        d["workload"]["request_rate"] = "inf"
    return json.dumps(d, indent=2, sort_keys=True)
