"""Hypothesis over the CLI and the config loader: random scenario files and flag lists end in exit 0,
or in one line on stderr with a non-zero exit (2 for bad input, 1 when no request could be served),
never in a traceback. Everything runs in process on the tiny model with at most 64 requests."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppsim.cli import main
from ppsim.policy.pipelines import BUILDERS

SMALL_INT = st.integers(-3, 64)
ANY_VALUE = st.one_of(
    SMALL_INT,
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 9), max_size=4),
)
POLICIES = [*BUILDERS, "vllm"]  # every registered policy and the plain alias

# (section or None, field) pairs of the scenario, plus names that do not exist
CONFIG_FIELDS = [
    (None, "seed"),
    (None, "weight_dtype"),
    (None, "kv_cache_dtype"),
    (None, "bogus"),
    ("cluster", "pipeline_parallel_size"),
    ("cluster", "tensor_parallel_size"),
    ("cluster", "layer_partition"),
    ("cluster", "link"),
    ("engine", "policy"),
    ("engine", "max_num_seqs"),
    ("engine", "max_num_batched_tokens"),
    ("engine", "block_size"),
    ("engine", "enable_chunked_prefill"),
    ("engine", "max_model_len"),
    ("engine", "gpu_memory_utilization"),
    ("engine", "pp_async_batch_depth"),
    ("engine", "smooth_factor"),
    ("engine", "maxnumseqs"),
    ("workload", "num_prompts"),
    ("workload", "request_rate"),
    ("workload", "burstiness"),
    ("workload", "random_input_len"),
    ("workload", "random_output_len"),
    ("workload", "random_range_ratio"),
    ("workload", "max_concurrency"),
    ("workload", "abort_rate"),
    ("workload", "abort_window_s"),
    ("cost", "compute_efficiency"),
    ("cost", "moe_routing_skew"),
]


@st.composite
def scenario_dicts(draw: st.DrawFn) -> dict:
    out: dict = {}
    for section, name in draw(st.lists(st.sampled_from(CONFIG_FIELDS), max_size=5, unique=True)):
        value = draw(st.sampled_from(POLICIES)) if name == "policy" else draw(ANY_VALUE)
        node = out if section is None else out.setdefault(section, {})
        if isinstance(node, dict):
            node[name] = value
    if draw(st.booleans()):
        out["workload"] = draw(st.one_of(st.just(out.get("workload", {})), ANY_VALUE))
    return out


FLAG_VALUES = {
    "--num-prompts": st.one_of(st.integers(-2, 64).map(str), st.text(max_size=4)),
    "--request-rate": st.sampled_from(["inf", "-inf", "nan", "0", "-1", "1e-9", "5", "1e308", "x"]),
    "--burstiness": st.sampled_from(["inf", "nan", "0", "0.5", "2", "-1"]),
    "--seed": st.sampled_from(["-1", "0", "7", str(2**70), "1.5"]),
    "-pp": st.integers(-1, 12).map(str),
    "--max-num-seqs": st.integers(-1, 300).map(str),
    "--max-num-batched-tokens": st.integers(-1, 600).map(str),
    "--block-size": st.integers(-1, 64).map(str),
    "--max-model-len": st.integers(-1, 200).map(str),
    "--random-input-len": st.integers(-1, 200).map(str),
    "--random-output-len": st.integers(-1, 40).map(str),
    "--random-range-ratio": st.sampled_from(["0", "0.5", "1", "-0.1", "nan"]),
    "--max-concurrency": st.integers(-1, 8).map(str),
    "--abort-rate": st.sampled_from(["0", "0.5", "1", "2", "nan"]),
    "--abort-window-s": st.sampled_from(["0.01", "1", "inf", "0", "-3"]),
    "--gpu-memory-utilization": st.sampled_from(["0.9", "0.01", "1", "1.5", "nan"]),
    "--policy": st.sampled_from(POLICIES),
    "--layer-partition": st.sampled_from(["vllm", "last-heavy", "4,4", "8,0", "a,b", "1,2,3"]),
    "--no-enable-chunked-prefill": st.none(),
    "--output-dir": st.sampled_from(["", "{d}/f", "{d}/out", "/proc/x"]),
    "--bogus-flag": st.none(),
}


@st.composite
def flag_lists(draw: st.DrawFn) -> list[str]:
    out: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=6, unique=True)):
        value = draw(FLAG_VALUES[flag])
        out += [flag] if value is None else [flag, value]
    return out


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    return code, err.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=scenario_dicts(), flags=flag_lists())
def test_cli_ends_cleanly(config, flags):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "f").write_text("a file")
        (d / "c.json").write_text(json.dumps(config))
        argv = [
            "simulate",
            "--model",
            "tiny",
            "--num-prompts",
            "8",
            "--random-input-len",
            "32",
            "--random-output-len",
            "8",
            "--output-dir",
            f"{d}/out",
            "--config",
            f"{d}/c.json",
        ]
        argv += [a.replace("{d}", tmp) for a in flags]  # later flags win
        code, err = run(argv)  # an exception escaping main fails the test with its traceback
        lines = err.strip().splitlines()
        assert "Traceback" not in err
        if code == 0:
            assert len(lines) <= 1 and all(x.startswith("warning: ") for x in lines), err
        else:
            assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
            if code == 2:
                assert not (d / "out").exists(), err


@settings(max_examples=200, deadline=None)
@given(config=scenario_dicts())
def test_config_loader_refuses_in_one_line(config):
    from ppsim.config import build_scenario
    from ppsim.errors import PPSimError

    try:
        build_scenario(None, config)
    except PPSimError as err:
        assert "\n" not in str(err) and str(err).split(":", 1)[0], err
