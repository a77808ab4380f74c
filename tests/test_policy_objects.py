"""Each policy one typed object (issue 12 part 2): the table form and the older flat form load to the same
scenario, config.json round-trips, a foreign knob is refused by the type, the policy object gives the
executor its pipeline options and return path, and the generated flags keep every former flag name."""

from __future__ import annotations

import argparse
import json

import pytest

from ppsim.config import EngineConfig, build_scenario, scenario_json
from ppsim.cost.ring import RingReturnCost
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.flags import flag_specs
from ppsim.policies import POLICIES, POLICY_KNOBS, SglangRing
from ppsim.policy.pipelines import PipeOptions, pipe_options
from ppsim.policy.requests import Request
from ppsim.run import run_scenario
from ppsim.sweep.space import ALIASES

# every scenario flag ppsim had before the flags were generated (users know them)
FORMER_FLAGS = {
    "--config",
    "--model",
    "--hardware",
    "-q",
    "--quantization",
    "--kv-cache-dtype",
    "--moe-routing-skew",
    "--moe-router-zipf",
    "-pp",
    "--pipeline-parallel-size",
    "-tp",
    "--tensor-parallel-size",
    "--layer-partition",
    "--link",
    "--tp-link",
    "--policy",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-model-len",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--block-size",
    "--gpu-memory-utilization",
    "--pp-throttle",
    "--no-pp-throttle",
    "--pp-async-batch-depth",
    "--pp-max-micro-batch-size",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--dynamic-chunking-form",
    "--enable-dynamic-chunking",
    "--no-enable-dynamic-chunking",
    "--smooth-factor",
    "--page-size",
    "--mrv2-decode-cap",
    "--no-mrv2-decode-cap",
    "--pp-broadcast",
    "--max-batch-size",
    "--trtllm-relay",
    "--llamacpp-ubatch-tokens",
    "--llamacpp-n-copies",
    "--dp-routing",
    "--abort-rate",
    "--abort-window-s",
    "--num-prompts",
    "--request-rate",
    "--burstiness",
    "--max-concurrency",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--trace",
    "--profile",
    "--seed",
}
TINY = {
    "model": "tiny",
    "cluster": {"pipeline_parallel_size": 2},
    "workload": {"num_prompts": 12, "random_input_len": 200, "random_output_len": 12, "request_rate": 300.0},
}


def _with(engine: dict) -> dict:
    return {**TINY, "engine": engine}


def test_the_flat_form_maps_onto_the_policy_table(tmp_path):
    flat = build_scenario(
        None,
        _with({"policy": "sglang-ring", "pp_async_batch_depth": 1, "max_num_seqs": 8, "chunked_prefill_size": 128}),
    )
    path = tmp_path / "s.toml"
    path.write_text(
        'model = "tiny"\n[cluster]\npipeline_parallel_size = 2\n'
        "[workload]\nnum_prompts = 12\nrandom_input_len = 200\nrandom_output_len = 12\n"
        "request_rate = 300.0\n[engine]\nmax_num_seqs = 8\n"
        '[engine.policy]\nkind = "sglang-ring"\npp_async_batch_depth = 1\nchunked_prefill_size = 128\n'
    )
    table = build_scenario(str(path))
    assert table == flat and isinstance(table.engine.policy, SglangRing)
    assert run_scenario(table).summary == run_scenario(flat).summary


def test_config_json_writes_the_table_and_loads_back(tmp_path):
    s = build_scenario(None, _with({"policy": "trtllm-slots", "max_batch_size": 4, "trtllm_relay": "async"}))
    d = json.loads(scenario_json(s))
    assert d["engine"]["policy"]["kind"] == "trtllm-slots" and d["engine"]["policy"]["max_batch_size"] == 4
    assert "max_batch_size" not in d["engine"]  # the knob lives on its policy only
    (tmp_path / "config.json").write_text(scenario_json(s))
    assert build_scenario(str(tmp_path / "config.json")) == s


@pytest.mark.parametrize(
    "engine, owner",
    [
        (
            {"policy": {"kind": "vllm-sync", "pp_async_batch_depth": 2}},
            "--pp-async-batch-depth is not a knob of vllm-sync (it is of sglang-ring)",
        ),
        ({"policy": {"kind": "sglang-ring", "max_num_batched_tokens": 64}}, "--max-prefill-tokens"),
        ({"policy": "llamacpp", "max_batch_size": 4}, "(it is of trtllm-slots)"),
        ({"policy": {"pp_throttle": True, "kind": "no-pp"}}, "vllm-batch-queue and vllm-mrv2"),
        ({"pp_async_batch_depth": 1}, "not a knob of vllm-batch-queue"),  # the default policy
        # a knob without a flag is named as the file's key
        ({"dynamic_chunking_coefficients": [1, 2, 3]}, "dynamic_chunking_coefficients is not a knob of vllm-batch"),
    ],
)
def test_a_foreign_knob_is_refused_in_one_line(engine, owner):
    with pytest.raises(PPSimError) as e:
        build_scenario(None, _with(engine))
    assert owner in str(e.value) and "\n" not in str(e.value)


def test_a_foreign_knob_in_a_file_exits_2_with_one_line(tmp_path, capsys):
    from ppsim.cli import main

    path = tmp_path / "s.toml"
    path.write_text('[engine.policy]\nkind = "vllm-mrv2"\ntrtllm_relay = "async"\n')
    assert main(["simulate", "--config", str(path), "--model", "tiny", "--num-prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert "--trtllm-relay is not a knob of vllm-mrv2" in err and err.count("\n") == 1


def test_flags_merge_into_the_files_policy_table(tmp_path):
    from ppsim.cli import add_scenario_flags, scenario_from_args

    path = tmp_path / "s.toml"
    path.write_text('model = "tiny"\n[engine.policy]\nkind = "sglang-ring"\npp_async_batch_depth = 1\npage_size = 64\n')
    p = argparse.ArgumentParser()
    add_scenario_flags(p)
    s = scenario_from_args(p.parse_args(["--config", str(path), "--pp-async-batch-depth", "2"]))
    assert s.engine.policy.pp_async_batch_depth == 2 and s.engine.policy.page_size == 64
    # --policy replaces the file's policy (its knobs go with it)
    s = scenario_from_args(p.parse_args(["--config", str(path), "--policy", "vllm-sync"]))
    assert s.engine.policy == "vllm-sync"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_policy_object_gives_the_executor_its_data_path(policy):
    pp = 1 if policy == "vllm-async" else 2
    knobs = {"sglang-ring": {"pp_async_batch_depth": 2}, "vllm-mrv2": {"pp_broadcast": "serialized"}}.get(policy, {})
    s = build_scenario(
        None, {**TINY, "cluster": {"pipeline_parallel_size": pp}, "engine": {"policy": {"kind": policy, **knobs}}}
    )
    prep = prepare(s, [Request(0, 0.0, 40, 4)])
    opts = pipe_options(prep.knobs())
    assert opts == s.engine.policy.pipe_options()
    expect = {
        "vllm-mrv2": PipeOptions("broadcast", True),
        "sglang-ring": PipeOptions(overlap_sends=True, defer_outputs=2),
        "trtllm-slots": PipeOptions(overlap_sends=True),
    }.get(policy, PipeOptions())
    assert opts == expect
    # a ring returns the tokens only between stages: one stage has none (SGLang's event_loop_pp and
    # TRT-LLM's _executor_loop_pp run only at pp > 1)
    assert isinstance(prep.cost, RingReturnCost) == (policy in ("sglang-ring", "trtllm-slots") and pp > 1)


def test_a_policy_reads_as_its_name():
    e = EngineConfig(policy="no-pp")
    assert e.policy == "no-pp" and e.policy != "vllm-sync" and e.policy in {"no-pp"} and f"{e.policy}" == "no-pp"
    assert e.policy == EngineConfig(policy={"kind": "no-pp"}).policy


def test_generated_flags_keep_every_former_name_and_cover_every_knob():
    p = argparse.ArgumentParser()
    from ppsim.cli import add_scenario_flags

    add_scenario_flags(p)
    names = {s for a in p._actions for s in a.option_strings} - {"-h", "--help"}
    assert names >= FORMER_FLAGS
    dests = {f.dest for f in flag_specs()}
    assert set(POLICY_KNOBS) - {"dynamic_chunking_coefficients"} <= dests
    for knob in POLICY_KNOBS:  # a sweep can vary any policy knob by its name
        assert ALIASES.get(knob) == ("engine", knob) or knob == "dynamic_chunking_coefficients"


def test_a_sweep_axis_of_a_policy_knob():
    from ppsim.sweep.space import parse_space

    sp = parse_space(
        {
            "base": {"model": "tiny", "engine": {"policy": "sglang-ring"}},
            "space": {"pp_async_batch_depth": [0, 2]},
            "slo": {"p99_ttft_ms": 2000},
        }
    )
    assert [c.scenario.engine.policy.pp_async_batch_depth for c in sp.configs] == [0, 2]


@pytest.mark.parametrize("policy", ["sglang-ring", "trtllm-slots"])
def test_one_stage_has_no_ring_return(policy):
    """At PP=1 the tokens return as every engine core's do (no hop over a link, no straggler)."""
    one = {**TINY, "cluster": {"pipeline_parallel_size": 1}}
    ring = prepare(build_scenario(None, {**one, "engine": {"policy": {"kind": policy}}}), [Request(0, 0.0, 40, 4)])
    core = prepare(build_scenario(None, {**one, "engine": {"policy": {"kind": "vllm-sync"}}}), [Request(0, 0.0, 40, 4)])
    assert not isinstance(ring.cost, RingReturnCost)
    assert ring.cost.return_time(3) == core.cost.return_time(3)
