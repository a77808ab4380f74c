"""The scenario's command-line flags, generated from the config's fields and one table of flag names.

:data:`FLAG_TABLE` is the only hand-kept list: for a scenario field, the flag(s) users know (the
engines' own names: ``vllm serve``, SGLang's ``server_args.py``, TensorRT-LLM's ``LlmArgs``, llama.cpp)
and a help line. The type, the choices and the on/off form of each flag come from the field
(:func:`flag_specs`); every knob of every policy (:data:`ppsim.policies.POLICY_KNOBS`) gets a flag,
named after the knob unless the table says otherwise, with its owners in the help. ``ppsim simulate``,
``engine``, ``validate``, ``chunk-plan`` and ``fit-chunks`` add them (``ppsim.cli.add_scenario_flags``)
and the sweep's axis names (``ppsim.sweep.space``) are read from the same fields.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from ppsim.config import EngineConfig, Scenario
from ppsim.policies import FILE_ONLY_KNOBS, POLICIES, POLICY_KNOBS

# scenario path -> (flags, help). Flags are the engines' names; help None: the field's description.
FLAG_TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], str | None]] = {
    ("model",): (("--model",), "preset name (see `ppsim models`) or path to a HF config.json"),
    ("hardware",): (("--hardware",), "device preset (see `ppsim hardware`)"),
    ("weight_dtype",): (
        ("-q", "--quantization"),
        "weight dtype: auto (the checkpoint's), bf16, fp8, fp4 (modelopt_fp4)",
    ),
    ("kv_cache_dtype",): (("--kv-cache-dtype",), "KV cache dtype: auto (activation dtype), bf16, fp8"),
    ("cost", "moe_routing_skew"): (
        ("--moe-routing-skew",),
        "MoE: tokens sharing one expert choice (1 = uniform routing)",
    ),
    ("moe_router_zipf",): (("--moe-router-zipf",), "MoE engine router: expert e's odds x (e+1)^-s (0 = router alone)"),
    ("cluster", "pipeline_parallel_size"): (("-pp", "--pipeline-parallel-size"), None),
    ("cluster", "tensor_parallel_size"): (("-tp", "--tensor-parallel-size"), None),
    ("cluster", "layer_partition"): (("--layer-partition",), "vllm | last-heavy | counts like 20,20,20,20"),
    ("cluster", "link"): (("--link",), "link preset between stages"),
    ("cluster", "tp_link"): (("--tp-link",), "link preset inside a stage"),
    ("engine", "policy"): (("--policy",), "pipeline policy (default vllm-batch-queue; see docs/policies.md)"),
    ("engine", "max_num_seqs"): (("--max-num-seqs",), None),
    ("engine", "max_model_len"): (
        ("--max-model-len",),
        "prompt + output tokens per request (default: the "
        "model's max_position_embeddings); longer requests are rejected",
    ),
    ("engine", "block_size"): (("--block-size",), None),
    ("engine", "gpu_memory_utilization"): (("--gpu-memory-utilization",), None),
    # policy knobs (owners are added to the help)
    ("engine", "max_num_batched_tokens"): (
        ("--max-num-batched-tokens",),
        "token budget per step (TRT-LLM's max_num_tokens, llama.cpp's n_batch)",
    ),
    ("engine", "enable_chunked_prefill"): (("--enable-chunked-prefill",), None),
    ("engine", "pp_throttle"): (
        ("--pp-throttle",),
        "the proposed cap of new requests per step at max_num_seqs // pp (vLLM has none; default off)",
    ),
    ("engine", "pp_async_batch_depth"): (("--pp-async-batch-depth",), "extra micro-batch slots (default 0)"),
    ("engine", "pp_max_micro_batch_size"): (("--pp-max-micro-batch-size",), "requests per micro-batch"),
    ("engine", "chunked_prefill_size"): (
        ("--chunked-prefill-size",),
        "(initial) prefill chunk (default by GPU memory)",
    ),
    ("engine", "max_prefill_tokens"): (("--max-prefill-tokens",), "prefill-batch token budget (SGLang default 16384)"),
    ("engine", "dynamic_chunking_form"): (
        ("--dynamic-chunking-form",),
        "dynamic chunking fit: SGLang's f(l) (default) or the refined t(L, x)",
    ),
    ("engine", "enable_dynamic_chunking"): (("--enable-dynamic-chunking",), None),
    ("engine", "smooth_factor"): (("--smooth-factor",), "dynamic chunking smoothing (default 0.75)"),
    ("engine", "page_size"): (("--page-size",), "KV page size (chunk alignment max(page, 64))"),
    ("engine", "mrv2_decode_cap"): (("--mrv2-decode-cap",), "at most ceil(max_num_seqs / pp) decodes per step"),
    ("engine", "pp_broadcast"): (("--pp-broadcast",), "sampled-token broadcast"),
    ("engine", "max_batch_size"): (("--max-batch-size",), "requests per micro-batch (TRT-LLM default 2048)"),
    ("engine", "trtllm_relay"): (("--trtllm-relay",), "sample-state relay (default sync)"),
    ("engine", "llamacpp_ubatch_tokens"): (("--llamacpp-ubatch-tokens",), "n_ubatch (default 512)"),
    ("engine", "llamacpp_n_copies"): (("--llamacpp-n-copies",), "pipeline buffer copies (default 4)"),
    ("engine", "dp_routing"): (("--dp-routing",), "request router"),
    # workload (``vllm bench serve`` names)
    ("workload", "abort_rate"): (
        ("--abort-rate",),
        "fraction of requests cancelled mid-prefill or mid-decode (seeded)",
    ),
    ("workload", "abort_window_s"): (
        ("--abort-window-s",),
        "time-based aborts fall within this many seconds of arrival",
    ),
    ("workload", "num_prompts"): (("--num-prompts",), None),
    ("workload", "request_rate"): (("--request-rate",), "requests/s; inf sends all at once"),
    ("workload", "burstiness"): (("--burstiness",), None),
    ("workload", "max_concurrency"): (("--max-concurrency",), None),
    ("workload", "random_input_len"): (("--random-input-len",), None),
    ("workload", "random_output_len"): (("--random-output-len",), None),
    ("workload", "random_range_ratio"): (("--random-range-ratio",), None),
    ("workload", "trace"): (("--trace",), "CSV trace: arrival_s,input_tokens,output_tokens"),
    ("cost", "profile_dir"): (("--profile",), "calibration artifact directory (profiled cost model)"),
    ("seed",): (("--seed",), None),
}
# live_engine field -> (flag, help): the flags of `ppsim engine` and `ppsim validate` only (the simulator
# has no use for them); each maps onto the scenario's ``live_engine`` section, so a config file can set it
LIVE_ENGINE_FLAGS: dict[str, tuple[str, str]] = {
    "backend": ("--backend", "torch.distributed backend (default gloo)"),
    "device": ("--device", "where stages compute (default cpu)"),
    "threads_per_stage": ("--threads-per-stage", "torch threads per stage process (default 1)"),
    "stage_timeout_s": (
        "--stage-timeout-s",
        "declare a stage dead after this long without progress (default 5 s + 4 x a full step)",
    ),
    "startup_timeout_s": (
        "--startup-timeout-s",
        "give up if a stage is not ready (spawned, joined, weights loaded, warmed up) within this (default 60)",
    ),
    "kv_num_blocks": ("--kv-blocks", "KV pool size (default: what the workload can hold at once)"),
    "max_kv_gib": ("--max-kv-gib", "refuse a larger KV cache per stage (default 4)"),
    "checkpoint": ("--checkpoint", "HF-layout safetensors directory (default: random weights from --seed)"),
    "inject_fault": ("--inject-fault", "test hook for the fault path: kill:STAGE:STEP or stall:STAGE:STEP"),
    "data_path": (
        "--data-path",
        "policy: each policy's own sends and token route (default); vllm-v1: vLLM V1's for every policy",
    ),
}
LIVE_ENGINE_DEST = "live_engine_"  # dest prefix: no clash with a command's own --device or --checkpoint
NOT_FLAGS = FILE_ONLY_KNOBS  # a tuple: scenario files only (chunk-plan has --coefficients)
ALIASED = {"weight_dtype", "kv_cache_dtype"}  # take the engines' aliases (bfloat16, nvfp4, ...): no choices


@dataclass(frozen=True)
class FlagSpec:
    path: tuple[str, ...]  # where the value goes in the scenario
    flags: tuple[str, ...]
    dest: str
    kwargs: dict[str, Any]


def field_info(path: tuple[str, ...]) -> Any:
    """The pydantic field at ``path``; a policy knob (``engine.<knob>``) is its first owner's field."""
    model: type[BaseModel] = Scenario
    for i, name in enumerate(path):
        fields = model.model_fields
        if model is EngineConfig and name not in fields and name in POLICY_KNOBS:
            fields = POLICIES[POLICY_KNOBS[name][0]].model_fields
        info = fields[name]
        if i == len(path) - 1:
            return info
        model = info.annotation  # a section: a model class


def _kwargs(info: Any, name: str) -> dict[str, Any]:
    """argparse settings from a field's type: on/off flags for bools, choices for literals."""
    ann = info.annotation
    args = (
        [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) in (typing.Union, types.UnionType)
        else [ann]
    )
    if name == "policy" or name in ALIASED:
        return {}  # a name (the union's tag) or an alias: a wrong one gets the scenario's one-line message
    if args == [bool]:
        return {"action": argparse.BooleanOptionalAction, "default": None}
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        return {"choices": list(typing.get_args(args[0]))}
    if args == [int]:
        return {"type": int}
    if args == [float]:
        return {"type": float}
    return {}  # strings (and str | table fields: a preset name)


def flag_specs() -> list[FlagSpec]:
    """Every scenario flag: the table's, then a flag for any policy knob the table does not name."""
    paths = list(FLAG_TABLE) + [
        ("engine", k) for k in POLICY_KNOBS if ("engine", k) not in FLAG_TABLE and k not in NOT_FLAGS
    ]
    out = []
    for path in paths:
        flags, help_ = FLAG_TABLE.get(path, (("--" + path[-1].replace("_", "-"),), None))
        info = field_info(path)
        text = help_ or info.description
        owners = POLICY_KNOBS.get(path[-1]) if path[0] == "engine" else None
        if owners and len(owners) < len(POLICIES) - 1:
            text = f"{', '.join(owners)}: {text}" if text else ", ".join(owners)
        dest = flags[-1].lstrip("-").replace("-", "_")
        kw = _kwargs(info, path[-1])
        if text:
            kw["help"] = text
        out.append(FlagSpec(path, flags, dest, kw))
    return out


def live_engine_flag_specs() -> list[FlagSpec]:
    """The flags of the ``live_engine`` section (``ppsim engine``, ``ppsim validate``); no defaults, so a
    config file's values stand unless a flag is given."""
    out = []
    for name, (flag, help_) in LIVE_ENGINE_FLAGS.items():
        path = ("live_engine", name)
        kw = {**_kwargs(field_info(path), name), "help": help_}
        out.append(FlagSpec(path, (flag,), LIVE_ENGINE_DEST + name, kw))
    return out


def flag_paths() -> dict[str, tuple[str, ...]]:
    """Flag dest -> path in the scenario (policy knobs go beside ``engine.policy``, the mapped flat form)."""
    return {f.dest: f.path for f in flag_specs()}
