"""Bad inputs in the files a scenario reads: a HF ``config.json``, a trace CSV, a ``--config`` file, and
values far outside any real hardware or workload. Same table form as :mod:`tests.bad_inputs`; every case
must end ``refused`` (exit 2, one ``error:`` line containing the fragment, nothing written)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs import TINY, Case, _files

SIM = ["simulate", "--quiet", "--no-dashboard", "--output-dir", "{d}/out"]
CONFIG = [*SIM, *TINY, "--config", "{d}/c.toml"]
HF_MODEL = [*SIM, "--model", "{d}/config.json", "-pp", "2", "--num-prompts", "4", "--random-input-len", "16"]
TRACE_RUN = [*SIM, "--model", "tiny", "-pp", "2", "--trace", "{d}/t.csv"]
HEADER = "arrival_s,input_tokens,output_tokens\n"


HF_BASE: dict[str, object] = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 8,
    "vocab_size": 2048,
    "num_attention_heads": 8,
    "torch_dtype": "float32",
}

QWEN_MOE: dict[str, object] = {
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
}
DCC = "engine: {{policy: sglang-ring, enable_dynamic_chunking: {0}, dynamic_chunking_coefficients: {1}}}\n"
DEEPSEEK_MOE: dict[str, object] = {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128}


def _hf(**extra: object) -> Callable[[Path], None]:
    """A tiny Llama ``config.json`` with ``extra`` fields set (``None`` removes one)."""
    cfg = {**HF_BASE, **extra}
    return _files(**{"config.json": json.dumps({k: v for k, v in cfg.items() if v is not None})})


def _toml(text: str) -> Callable[[Path], None]:
    return _files(**{"c.toml": text})


def _trace(text: str) -> Callable[[Path], None]:
    return _files(**{"t.csv": text})


def _sparse(name: str, size: int) -> Callable[[Path], None]:
    """A file of ``size`` bytes that takes no disk space."""

    def make(d: Path) -> None:
        with open(d / name, "wb") as f:
            f.truncate(size)

    return make


def _bomb(d: Path) -> None:
    """A 400-byte YAML alias bomb: seed is a list of 10^8 strings once expanded."""
    lines = ["seed:", '  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    (d / "c.yaml").write_text("\n".join(lines) + "\n")


HW = 'hardware = {{name = "g", peak_tflops = {0}, hbm_bandwidth_gbps = {1}, memory_gib = {2}}}\n'

CASES_CONFIG: list[Case] = [
    # --- HF config.json ------------------------------------------------------------------------
    Case("hf-heads-zero", HF_MODEL, "num_attention_heads", _hf(num_attention_heads=0)),
    Case("hf-max-position-inf", HF_MODEL, "max_position_embeddings", _hf(max_position_embeddings=float("inf"))),
    Case("hf-kv-heads-not-dividing", HF_MODEL, "num_key_value_heads 5 must divide", _hf(num_key_value_heads=5)),
    Case("hf-kv-heads-above-heads", HF_MODEL, "num_key_value_heads 16 must divide", _hf(num_key_value_heads=16)),
    Case("hf-layers-fraction", HF_MODEL, "num_hidden_layers = 8.7", _hf(num_hidden_layers=8.7)),
    Case("hf-layers-bool", HF_MODEL, "num_hidden_layers = True", _hf(num_hidden_layers=True)),
    Case("hf-layers-absurd", HF_MODEL, "num_hidden_layers", _hf(num_hidden_layers=10**12)),
    Case("hf-kv-heads-zero", HF_MODEL, "num_key_value_heads", _hf(num_key_value_heads=0)),
    Case("hf-head-dim-zero", HF_MODEL, "head_dim", _hf(head_dim=0)),
    Case("hf-awq", HF_MODEL, "quantization_config", _hf(quantization_config={"quant_method": "awq", "bits": 4})),
    Case("hf-quantization-not-table", HF_MODEL, "quantization_config", _hf(quantization_config="gptq")),
    Case("hf-torch-dtype-int8", HF_MODEL, "torch_dtype = 'int8'", _hf(torch_dtype="int8")),
    Case("hf-torch-dtype-list", HF_MODEL, "torch_dtype", _hf(torch_dtype=["float16"])),
    Case("hf-tied-not-bool", HF_MODEL, "tie_word_embeddings", _hf(tie_word_embeddings="false")),
    Case("hf-eps-nan", HF_MODEL, "rms_norm_eps", _hf(rms_norm_eps=float("nan"))),
    Case("hf-config-dev-zero", [*SIM, "--model", "/dev/zero"], "model: unknown preset or missing file"),
    # --- trace CSV -----------------------------------------------------------------------------
    Case("trace-cell-too-big", TRACE_RUN, "field larger than field limit", _trace(HEADER + "0,16," + "4" * 200_000)),
    Case("trace-arrival-1e300", TRACE_RUN, "arrival_s 1e+300", _trace(HEADER + "0,16,4\n1e300,16,4\n")),
    Case("trace-arrival-in-epoch", TRACE_RUN, "ms or epoch time", _trace(HEADER + "0,16,4\n1e15,16,4\n")),
    Case(
        "trace-abort-after-s-absurd",
        TRACE_RUN,
        "abort_after_s",
        _trace("arrival_s,input_tokens,output_tokens,abort_after_s\n0,16,4,1e300\n"),
    ),
    Case(
        "trace-misspelled-column",
        TRACE_RUN,
        "the column 'abort_after_token', not abort_after_tokens",
        _trace("arrival_s,input_tokens,output_tokens,abort_after_token\n0,16,4,2\n"),
    ),
    Case("trace-duplicate-column", TRACE_RUN, "arrival_s twice", _trace("arrival_s," + HEADER + "0,0,16,4\n")),
    Case("trace-header-only", TRACE_RUN, "has a header but no requests", _trace(HEADER)),
    Case(  # the file's line, not the count of non-blank rows ("row 2")
        "trace-bad-cell-after-blank-lines",
        TRACE_RUN,
        "t.csv line 4: output_tokens is 'x', not a whole number",
        _trace(HEADER + "\n\n0,10,x\n"),
    ),
    Case(
        "trace-float-token-count",
        TRACE_RUN,
        "line 2: input_tokens is '10.0', not a whole number",
        _trace(HEADER + "0,10.0,5\n"),
    ),
    Case("trace-missing-cell", TRACE_RUN, "line 2: no output_tokens value", _trace(HEADER + "0,10\n")),
    Case(
        "trace-bad-optional-cell",
        TRACE_RUN,
        "line 2: abort_after_s is 'soon', not a number of seconds",
        _trace("arrival_s,input_tokens,output_tokens,abort_after_s\n0,16,4,soon\n"),
    ),
    Case("trace-dev-zero", [*SIM, "--model", "tiny", "--trace", "/dev/zero"], "not a regular file"),
    Case("trace-is-dir", [*SIM, "--model", "tiny", "--trace", "{d}"], "not a regular file"),
    Case(
        "trace-path-nul",
        [*SIM, "--model", "tiny", "--config", "{d}/c.json"],
        "workload.trace",
        _files(**{"c.json": '{"workload": {"trace": "x.csv\\u0000"}}'}),
    ),
    Case(
        "trace-empty-path",
        [*SIM, "--model", "tiny", "--config", "{d}/c.toml"],
        "workload.trace: empty",
        _toml('[workload]\ntrace = ""\n'),
    ),
    Case("trace-empty-flag", [*SIM, "--model", "tiny", "--trace", ""], "workload.trace: empty"),
    Case("profile-dir-empty", CONFIG, "cost.profile_dir: empty", _toml('[cost]\nprofile_dir = ""\n')),
    # --- unbounded allocations -----------------------------------------------------------------
    Case("memory-gib-in-bytes", CONFIG, "hardware.memory_gib", _toml(HW.format(989, 3350, 85899345920))),
    Case(
        "async-batch-depth-absurd",
        [*SIM, *TINY, "--policy", "sglang-ring", "--pp-async-batch-depth", "1000000000"],
        "pp_async_batch_depth",
    ),
    Case(
        "llamacpp-n-copies-absurd",
        [*SIM, *TINY, "--policy", "llamacpp", "--llamacpp-n-copies", "1000000000"],
        "llamacpp_n_copies",
    ),
    Case("yaml-alias-bomb", [*SIM, *TINY, "--config", "{d}/c.yaml"], "seed", _bomb),
    Case("config-dev-zero", [*SIM, *TINY, "--config", "/dev/zero"], "--config: /dev/zero is not a regular file"),
    Case("config-is-dir", [*SIM, *TINY, "--config", "{d}"], "not a regular file"),
    Case("config-too-big", [*SIM, *TINY, "--config", "{d}/c.toml"], "MiB limit", _sparse("c.toml", 17 * 2**20)),
    # --- finite but absurd floats --------------------------------------------------------------
    Case("request-rate-denormal", [*SIM, *TINY, "--request-rate", "1e-320"], "workload.request_rate"),
    Case(
        "request-rate-span-too-long",
        [*SIM, "--model", "tiny", "-pp", "2", "--num-prompts", "1000", "--request-rate", "1e-5"],
        "raise request_rate",
    ),
    Case("burstiness-denormal", [*SIM, *TINY, "--burstiness", "1e-320"], "workload.burstiness"),
    Case(
        "abort-window-absurd",
        [*SIM, *TINY, "--abort-rate", "0.5", "--abort-window-s", "1e300"],
        "workload.abort_window_s",
    ),
    Case("cpu-schedule-us-absurd", CONFIG, "engine.cpu.schedule_us", _toml("[engine.cpu]\nschedule_us = 1e308\n")),
    Case("peak-tflops-tiny", CONFIG, "hardware.peak_tflops", _toml(HW.format("1e-300", 100, 80))),
    Case("hbm-bandwidth-tiny", CONFIG, "hardware.hbm_bandwidth_gbps", _toml(HW.format(100, "1e-300", 80))),
    Case("memory-gib-absurd", CONFIG, "hardware.memory_gib", _toml(HW.format(100, 100, "1e300"))),
    Case(
        "link-bandwidth-tiny",
        CONFIG,
        "cluster.link.bandwidth_gbps",
        _toml('[cluster]\nlink = {name = "x", latency_us = 1, bandwidth_gbps = 1e-300}\n'),
    ),
    Case("compute-efficiency-tiny", CONFIG, "cost.compute_efficiency", _toml("[cost]\ncompute_efficiency = 1e-300\n")),
    Case("step-overhead-absurd", CONFIG, "cost.step_overhead_us", _toml("[cost]\nstep_overhead_us = 1e300\n")),
    Case("layer-overhead-absurd", CONFIG, "cost.layer_overhead_us", _toml("[cost]\nlayer_overhead_us = 1e300\n")),
    # --- -inf and -nan are values, not flags (they were "expected one argument") ---------------------
    Case("request-rate-minus-inf", [*SIM, *TINY, "--request-rate", "-inf"], "workload.request_rate"),
    Case(
        "trace-window-minus-inf",
        [*SIM, *TINY, "--trace-window-s", "-inf"],
        "--trace-window-s: '-inf' is not a positive number of seconds",
    ),
    Case(
        "coefficients-minus-inf",
        ["chunk-plan", "--model", "tiny", "--coefficients", "-inf,0,0", "--prompt-len", "100"],
        "--coefficients: inf and nan are not coefficients",
    ),
    Case(
        "coefficients-minus-infinity-second",
        ["chunk-plan", "--model", "tiny", "--coefficients", "-1,-Infinity,0", "--prompt-len", "100"],
        "--coefficients: inf and nan are not coefficients",
    ),
    # --trace-window-s: the flag named once, with the form it takes (was "invalid _window_s value", or
    # "argument --trace-window-s: --trace-window-s: 0 ...")
    Case(
        "trace-window-zero",
        [*SIM, *TINY, "--trace-window-s", "0"],
        "argument --trace-window-s: '0' is not a positive number of seconds; give one such as 60",
    ),
    Case(
        "trace-window-not-a-number",
        [*SIM, *TINY, "--trace-window-s", "abc"],
        "argument --trace-window-s: 'abc' is not a positive number of seconds",
    ),
    # without --save-detailed no trace.json is written, so the window changed nothing (it was accepted)
    Case(
        "trace-window-without-save-detailed",
        [*SIM, *TINY, "--trace-window-s", "5"],
        "--trace-window-s: it sets the span of trace.json, which only --save-detailed writes; add --save-detailed",
    ),
    # --- a step budget below one KV block: the setting given is named (it blamed max_num_batched_tokens) -----
    Case(
        "sglang-chunk-below-block",
        [*SIM, *TINY, "--policy", "sglang-ring", "--chunked-prefill-size", "8"],
        "engine.chunked_prefill_size: 8 tokens per step, fewer than one KV block of engine.block_size 16",
    ),
    Case(
        "sglang-prefill-budget-below-block",
        [*SIM, *TINY, "--policy", "sglang-ring", "--max-prefill-tokens", "8"],
        "engine.max_prefill_tokens: 8 tokens per step",
    ),
    Case(
        "block-above-default-budget",
        [*SIM, *TINY, "--policy", "llamacpp", "--block-size", "4096"],
        "engine.block_size: 4096 tokens per KV block, more than the 2048 tokens a step may take",
    ),
    Case(
        "block-size-absurd",
        [*SIM, *TINY, "--block-size", "100000000000000", "--max-num-batched-tokens", "100000000000000"],
        "engine.block_size: Input should be less than or equal to 4096",
    ),
    # --- a value that changes nothing in this run (accepted silently) ---------------------------------
    Case(
        "abort-window-without-rate",
        [*SIM, *TINY, "--abort-window-s", "5"],
        "workload.abort_window_s: no request is aborted (abort_rate is 0)",
    ),
    Case(
        "moe-skew-on-dense-model",
        [*SIM, *TINY, "--moe-routing-skew", "1e308"],
        "cost.moe_routing_skew: 'tiny' is a dense model",
    ),
    Case(
        "chunking-coefficients-negative-while-off",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine.policy.dynamic_chunking_coefficients: a=-1 and b=-2 must be >= 0",
        _files(**{"c.yaml": "engine: {policy: sglang-ring, dynamic_chunking_coefficients: [-1, -2, -3]}\n"}),
    ),
    # --- one file, one value -------------------------------------------------------------------
    Case(
        "knob-flat-and-in-policy-table",
        CONFIG,
        "engine.max_num_batched_tokens",
        _toml(
            "[engine]\nmax_num_batched_tokens = 64\n[engine.policy]\n"
            'kind = "vllm-batch-queue"\nmax_num_batched_tokens = 128\n'
        ),
    ),
    # --- a section that is not a table: a flag's table merged into it replaced it (TINY sets workload, -pp) ------
    Case("section-scalar-under-flag", CONFIG, "c.toml sets workload to 5, not a table", _toml("workload = 5\n")),
    Case(
        "sections-garbage-under-flags",
        [*CONFIG, "--max-num-seqs", "8"],
        "c.toml sets cluster to [1, 2], not a table",
        _toml('engine = "garbage"\ncluster = [1, 2]\n'),
    ),
    Case("subsection-scalar", CONFIG, "c.toml sets engine.cpu to 5", _toml("[engine]\ncpu = 5\n")),
    # --- lax values: pydantic reads true as 1 -----------------------------------------------------
    Case(
        "int-field-true",
        CONFIG,
        "engine.max_num_seqs: expects a number, not true",
        _toml("[engine]\nmax_num_seqs = true\n"),
    ),
    Case(
        "rate-false",
        CONFIG,
        "workload.request_rate: expects a number, not false",
        _toml("[workload]\nrequest_rate = false\n"),
    ),
    Case(
        "policy-knob-true",
        CONFIG,
        "pp_async_batch_depth: expects a number",
        _toml('[engine.policy]\nkind = "sglang-ring"\npp_async_batch_depth = true\n'),
    ),
    Case("device-memory-true", CONFIG, "memory_gib: expects a number", _toml(HW.format(100, 1000, "true"))),
    # --- a key given twice: the parsers keep the last one silently ---------------------------------
    Case(
        "yaml-duplicate-key",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "key 'max_num_seqs' appears twice in one mapping (line 3)",
        _files(**{"c.yaml": "engine:\n  max_num_seqs: 4\n  max_num_seqs: 8\n"}),
    ),
    Case(
        "json-duplicate-key",
        [*SIM, *TINY, "--config", "{d}/c.json"],
        "key 'seed' appears twice",
        _files(**{"c.json": '{"workload": {"seed": 1, "seed": 2}}'}),
    ),
    Case(
        "hf-duplicate-key",
        HF_MODEL,
        "key 'hidden_size' appears twice",
        _files(**{"config.json": json.dumps(HF_BASE)[:-1] + ', "hidden_size": 512}'}),
    ),
    # --- HF config.json: sizes far past any model (float overflow in the cost model), values HF refuses ----
    Case("hf-intermediate-400-digits", HF_MODEL, "intermediate_size", _hf(intermediate_size=10**400)),
    Case("hf-vocab-400-digits", HF_MODEL, "field vocab_size", _hf(vocab_size=10**400)),
    Case("hf-hidden-400-digits", HF_MODEL, "field hidden_size", _hf(hidden_size=10**400)),
    Case("hf-experts-absurd", HF_MODEL, "field n_routed_experts", _hf(**{**DEEPSEEK_MOE, "n_routed_experts": 10**9})),
    Case(
        "hf-vocab-5000-digits",
        HF_MODEL,
        "field vocab_size has 5000 digits",
        _files(**{"config.json": json.dumps(HF_BASE)[:-1] + ', "vocab_size": 1' + "0" * 4999 + "}"}),
    ),
    Case("hf-rope-theta-string", HF_MODEL, "rope_theta = 'abc' is not a number", _hf(rope_theta="abc")),
    Case(
        "hf-eps-null",
        HF_MODEL,
        "rms_norm_eps = None is not a number",
        _files(**{"config.json": json.dumps({**HF_BASE, "rms_norm_eps": None})}),
    ),
    Case("hf-eps-negative", HF_MODEL, "field rms_norm_eps = -1", _hf(rms_norm_eps=-1)),
    Case("hf-rope-theta-negative", HF_MODEL, "field rope_theta = -1", _hf(rope_theta=-1)),
    Case("hf-max-position-absurd", HF_MODEL, "field max_position_embeddings", _hf(max_position_embeddings=10**15)),
    Case("hf-max-position-400-digits", HF_MODEL, "field max_position_embeddings", _hf(max_position_embeddings=10**400)),
    Case("hf-hidden-not-divisible", HF_MODEL, "not divisible by num_attention_heads = 8", _hf(hidden_size=250)),
    Case("hf-sparse-step-zero", HF_MODEL, "decoder_sparse_step = 0", _hf(**QWEN_MOE, decoder_sparse_step=0)),
    Case("hf-sparse-step-negative", HF_MODEL, "decoder_sparse_step = -2", _hf(**QWEN_MOE, decoder_sparse_step=-2)),
    Case(
        "hf-mlp-only-layers-out-of-range",
        HF_MODEL,
        "layer 100 is not one of the num_hidden_layers = 8 layers",
        _hf(**QWEN_MOE, mlp_only_layers=[100, -1]),
    ),
    Case("hf-mlp-only-layers-negative", HF_MODEL, "layer -1 is not one", _hf(**QWEN_MOE, mlp_only_layers=[-1])),
    # --- SGLang's dynamic-chunking coefficients in a scenario file --------------------------------------
    Case(
        "coefficients-negative-in-file",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine.policy.dynamic_chunking_coefficients: a=-1 and b=-2 must be >= 0",
        _files(**{"c.yaml": DCC.format("true", "[-1, -2, -3]")}),
    ),
    Case(
        "coefficients-negative-in-file-unused",  # dynamic chunking off: still meaningless, still refused
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine.policy.dynamic_chunking_coefficients: a=-1",
        _files(**{"c.yaml": DCC.format("false", "[-1, -2, -3]")}),
    ),
    Case(
        "coefficients-zero-in-file",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine.policy.dynamic_chunking_coefficients: a=0 and b=0",
        _files(**{"c.yaml": DCC.format("true", "[0, 0, 0]")}),
    ),
    Case(
        "coefficients-overflow-in-file",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine.policy.dynamic_chunking_coefficients: a=1e+308, b=1e+308 overflow",
        _files(**{"c.yaml": DCC.format("true", "[1.0e+308, 1.0e+308, 1.0e+308]")}),
    ),
    Case(
        "coefficients-of-another-policy-in-file",
        [*SIM, *TINY, "--config", "{d}/c.yaml"],
        "engine: dynamic_chunking_coefficients is not a knob of vllm-batch-queue",
        _files(**{"c.yaml": "engine: {dynamic_chunking_coefficients: [1, 2]}\n"}),
    ),
    Case(
        "sglang-page-above-chunk",
        [*SIM, *TINY, "--policy", "sglang-ring", "--page-size", "4096", "--chunked-prefill-size", "1024"],
        "engine.policy.page_size 4096 is above a prefill batch's budget",
    ),
]
