"""Bad input: one clear line on stderr, non-zero exit, nothing written."""

import pytest


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--num-prompts", "0"], "workload.num_prompts"),
        (["--max-num-seqs", "-1"], "engine.max_num_seqs"),
        (["-pp", "0"], "cluster.pipeline_parallel_size"),
        (["--request-rate", "-2"], "workload.request_rate"),
        (["--block-size", "0"], "engine.block_size"),
        (["--model", "llama-3-8b", "--layer-partition", "10,10,10"], "layer_partition"),
        (["--model", "llama-3-8b", "-pp", "4", "--layer-partition", "8,8,8,9"], "sums to 33"),
        (["--model", "gpt-17"], "unknown preset"),
        (["--hardware", "tpu-v9"], "hardware: unknown preset"),
        (["--link", "carrier-pigeon"], "cluster.link: unknown preset"),
        (["--config", "/nonexistent/scenario.toml"], "--config: cannot read"),
        (["--gpu-memory-utilization", "1.5"], "engine.gpu_memory_utilization"),
        (["--model", "llama-3-70b", "-pp", "1"], "memory: stage 0"),
        (["--model", "llama-3-8b", "-tp", "3"], "tensor_parallel_size: 32 attention heads"),
        (
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "512", "--random-input-len", "1024"],
            "engine.max_num_batched_tokens: 512 is below a 1024-token prompt",
        ),
    ],
)
def test_bad_input_one_line_exit_2(ppsim_cli, tmp_path, args, fragment):
    out = tmp_path / "out"
    r = ppsim_cli("simulate", *args, "--output-dir", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert not out.exists()


def test_unparseable_config(ppsim_cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("cluster = [[[\n")
    r = ppsim_cli("simulate", "--config", str(bad))
    assert r.returncode == 2 and "cannot parse" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_field_in_config(ppsim_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  max_num_seq: 4\n")
    r = ppsim_cli("simulate", "--config", str(bad))
    assert r.returncode == 2 and "engine.max_num_seq" in r.stderr


def test_bad_model_config_json(ppsim_cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"hidden_size": 64}')
    r = ppsim_cli("simulate", "--model", str(cfg))
    assert r.returncode == 2 and "missing field" in r.stderr


@pytest.mark.parametrize(
    "rows,fragment",
    [
        ("inf,100,10", "arrival_s must be finite"),
        ("nan,100,10", "arrival_s must be finite"),
        ("0,100,10,20", "abort_after_tokens must be in"),
    ],
)
def test_bad_trace_rows(ppsim_cli, tmp_path, rows, fragment):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens,abort_after_tokens\n" + rows + "\n")
    out = tmp_path / "out"
    r = ppsim_cli("simulate", "--model", "tiny", "--trace", str(trace), "--output-dir", str(out))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_custom_hardware_error_names_the_field(ppsim_cli, tmp_path):
    cfg = tmp_path / "h.toml"
    cfg.write_text('hardware = {name = "x", peak_tflops = -5, hbm_bandwidth_gbps = 100, memory_gib = 80}\n')
    r = ppsim_cli("simulate", "--config", str(cfg))
    assert r.returncode == 2 and r.stderr.startswith("error: hardware.peak_tflops:")
