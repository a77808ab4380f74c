import json

from ppsim.config import build_scenario


def test_file_then_flags_override(tmp_path, ppsim_cli):
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        'model = "llama-3-8b"\nseed = 5\n[cluster]\npipeline_parallel_size = 2\n'
        "[workload]\nnum_prompts = 20\nrandom_input_len = 128\n"
    )
    out = tmp_path / "out"
    r = ppsim_cli("simulate", "--config", str(cfg), "--num-prompts", "12", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["model"] == "llama-3-8b" and resolved["seed"] == 5
    assert resolved["workload"]["num_prompts"] == 12  # flag wins
    assert resolved["workload"]["random_input_len"] == 128  # file kept
    assert resolved["cluster"]["pipeline_parallel_size"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 12


def test_yaml_and_json_configs(tmp_path):
    y = tmp_path / "s.yaml"
    y.write_text("cluster:\n  pipeline_parallel_size: 8\n  layer_partition: 10,10,10,10,10,10,10,10\n")
    s = build_scenario(str(y))
    assert s.cluster.layer_partition == [10] * 8
    j = tmp_path / "s.json"
    j.write_text(
        json.dumps({"hardware": {"name": "mygpu", "peak_tflops": 100, "hbm_bandwidth_gbps": 1000, "memory_gib": 48}})
    )
    s = build_scenario(str(j))
    assert s.hardware.peak_tflops == 100


def test_summary_has_vllm_keys(tmp_path, ppsim_cli):
    out = tmp_path / "o"
    r = ppsim_cli(
        "simulate",
        "--model",
        "llama-3-8b",
        "-pp",
        "2",
        "--num-prompts",
        "10",
        "--output-dir",
        str(out),
        "--save-detailed",
    )
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    for k in (
        "completed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
    ):
        assert k in s
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert f"{stat}_{m}_ms" in s
    assert "pipeline_bubble_fraction" in s and len(s["stage_busy_fraction"]) == 2
    assert "Serving Benchmark Result" in r.stdout and "Mean TTFT (ms)" in r.stdout
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"stage0", "stage1", "link0->1"} <= names
    tokens = (out / "tokens.csv").read_text().splitlines()
    assert tokens[0] == "request_id,index,time_s" and len(tokens) == 1 + s["total_output_tokens"]
    header = (out / "requests.csv").read_text().splitlines()[0]
    assert header.startswith("request_id,status,arrival_s")


def test_profile_dir_alone_selects_the_profiled_model():
    """A config that names a profile directory and no kind uses that profile, as --profile DIR does."""
    s = build_scenario(None, {"model": "tiny", "cost": {"profile_dir": "some/profile"}})
    assert s.cost.kind == "profile" and s.cost.profile_dir == "some/profile"
    assert build_scenario(None, {"model": "tiny"}).cost.kind == "analytic"


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    """Duplicate keys are refused, but YAML's ``<<`` merge is not a duplicate: the mapping's own key wins."""
    y = tmp_path / "s.yaml"
    y.write_text("base: &b\n  num_prompts: 4\n  seed: 1\nworkload:\n  <<: *b\n  seed: 7\n")
    from ppsim.fileio import read_mapping

    data = read_mapping(str(y), "--config", "fields")
    assert data["workload"] == {"num_prompts": 4, "seed": 7}


def test_numbers_refuse_bools_and_bools_still_take_them():
    from ppsim.typed import takes_numbers_not_bools

    assert takes_numbers_not_bools(int) and takes_numbers_not_bools(float | None)
    assert takes_numbers_not_bools(float | str)
    assert not takes_numbers_not_bools(bool) and not takes_numbers_not_bools(bool | None)
    assert not takes_numbers_not_bools(str) and not takes_numbers_not_bools(int | bool)
    s = build_scenario(None, {"engine": {"enable_chunked_prefill": False, "max_num_seqs": 8}})
    assert s.engine.max_num_seqs == 8 and s.engine.policy.enable_chunked_prefill is False
