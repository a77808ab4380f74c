"""The live engine's options are the scenario's ``live_engine`` section: a config file sets them, the
engine's flags override them, a bad value is one line naming the field (or the flag), and an engine
run's config.json records how the engine ran."""

from __future__ import annotations

import json

import pytest

from ppsim.cli import build_parser, main, scenario_from_args
from ppsim.config import build_scenario
from ppsim.live_engine import LiveEngineConfig

LIVE = """model = "tiny"
[live_engine]
threads_per_stage = 2
stage_timeout_s = 45.5
startup_timeout_s = 90
max_kv_gib = 1.5
data_path = "vllm-v1"
"""
TINY_RUN = ["--num-prompts", "3", "--random-input-len", "16", "--random-output-len", "4", "--request-rate", "inf"]


def _write(tmp_path, text: str, name: str = "s.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("command", ["engine", "validate"])
def test_config_file_sets_the_engine_options_and_flags_override_them(tmp_path, command):
    cfg = _write(tmp_path, LIVE)
    s = scenario_from_args(build_parser().parse_args([command, "--config", cfg]))
    assert s.live_engine == LiveEngineConfig(
        threads_per_stage=2, stage_timeout_s=45.5, startup_timeout_s=90.0, max_kv_gib=1.5, data_path="vllm-v1"
    )
    args = build_parser().parse_args(
        [command, "--config", cfg, "--threads-per-stage", "3", "--stage-timeout-s", "9", "--data-path", "policy"]
    )
    le = scenario_from_args(args).live_engine
    assert (le.threads_per_stage, le.stage_timeout_s, le.data_path) == (3, 9.0, "policy")
    assert (le.startup_timeout_s, le.max_kv_gib) == (90.0, 1.5)  # the file's, where no flag is given


def test_defaults_are_the_engines_defaults():
    le = build_scenario().live_engine
    assert (le.backend, le.device, le.threads_per_stage, le.stage_timeout_s, le.startup_timeout_s) == (
        "gloo",
        "cpu",
        1,
        None,
        60.0,
    )
    assert (le.kv_num_blocks, le.max_kv_gib, le.checkpoint, le.inject_fault, le.data_path) == (
        None,
        4.0,
        None,
        None,
        "policy",
    )


@pytest.mark.parametrize(
    "table, field",
    [
        ("threads_per_stage = 0", "live_engine.threads_per_stage"),
        ("startup_timeout_s = -1", "live_engine.startup_timeout_s"),
        ("stage_timeout_s = inf", "live_engine.stage_timeout_s"),
        ('device = "tpu"', "live_engine.device"),
        ("kv_blocks = 8", "live_engine.kv_blocks"),  # the flag's name is not a field: refused, not ignored
        ("stage_timeout_s = 1e-300", "live_engine.stage_timeout_s"),  # "no micro-batch came back for 0.0 s"
        ("max_kv_gib = 1e-300", "live_engine.max_kv_gib"),
        ("max_kv_gib = 1e300", "live_engine.max_kv_gib"),
        ('checkpoint = ""', "live_engine.checkpoint"),  # was random weights, silently
        ('inject_fault = ""', "live_engine.inject_fault"),
        ('inject_fault = "kill:0:-5"', "live_engine.inject_fault"),  # was a kill at start-up
    ],
)
def test_bad_value_in_the_file_is_one_line_naming_the_field(tmp_path, capsys, table, field):
    cfg = _write(tmp_path, f'model = "tiny"\n[live_engine]\n{table}\n')
    out = tmp_path / "out"
    assert main(["engine", "--config", cfg, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {field}: ") and err.count("\n") == 1, err
    assert not out.exists()


def test_bad_flag_value_names_the_flag_even_over_a_file(tmp_path, capsys):
    cfg = _write(tmp_path, LIVE)
    assert main(["validate", "--config", cfg, "--max-kv-gib", "0", "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --max-kv-gib: ") and err.count("\n") == 1, err


def test_simulate_config_json_holds_the_default_section_and_reloads(tmp_path, capsys):
    out = tmp_path / "sim"
    args = ["simulate", "--model", "tiny", *TINY_RUN, "--quiet", "--no-dashboard", "--output-dir", str(out)]
    assert main(args) == 0
    written = json.loads((out / "config.json").read_text())
    assert written["live_engine"] == LiveEngineConfig().model_dump(mode="json")
    assert build_scenario(str(out / "config.json")).live_engine == LiveEngineConfig()


def test_engine_run_config_json_records_the_engine_options(tmp_path, capsys):
    pytest.importorskip("torch")
    cfg = _write(tmp_path, LIVE)
    out = tmp_path / "eng"
    args = ["engine", "--config", cfg, *TINY_RUN, "--kv-blocks", "32", "--no-dashboard", "--output-dir", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    written = json.loads((out / "config.json").read_text())["live_engine"]
    assert written["threads_per_stage"] == 2 and written["stage_timeout_s"] == 45.5
    assert written["startup_timeout_s"] == 90.0 and written["max_kv_gib"] == 1.5
    assert written["data_path"] == "vllm-v1" and written["kv_num_blocks"] == 32  # flag over file default
    info = json.loads((out / "engine.json").read_text())
    assert info["threads_per_stage"] == 2 and info["kv_num_blocks"] == 32 and info["stage_timeout_s"] == 45.5
    # the file re-runs as it ran: config.json is a scenario file
    assert build_scenario(str(out / "config.json")).live_engine.threads_per_stage == 2
