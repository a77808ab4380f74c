"""experiments/validation/host_drift.py: the step level, the correlation, the summary, bad input, and
one real cycle (a co-run reading, then `validate` at PP=1 and PP=2 on the tiny model)."""

from __future__ import annotations

import csv
import json
import math

import pytest

from experiments.validation.host_drift import correlation, main, step_level, summary_md
from tests.conftest import ROOT

PROFILE = str(ROOT / "profiles" / "tiny-cpu")


def costs(pairs):
    head = "run,stage,step_id,measured_s,predicted_s\n"
    return head + "".join(f"0,0,{i},{m},{p}\n" for i, (m, p) in enumerate(pairs))


def test_step_level_is_sum_predicted_over_sum_measured():
    assert step_level(costs([(0.010, 0.009), (0.030, 0.027)])) == pytest.approx(-0.1)
    assert step_level(costs([(0.010, 0.012)])) == pytest.approx(0.2)
    assert math.isnan(step_level(costs([])))


def test_correlation():
    assert correlation([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert correlation([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    assert math.isnan(correlation([1, 2], [3, 4]))  # too few pairs
    assert math.isnan(correlation([1, 1, 1], [3, 4, 5]))  # one side does not vary


def test_summary_ranges_and_depth_difference():
    rows = [
        {"cycle": i, "t_s": 70.0 * i, "corun": c, "speed": s, "level_pp1": a, "level_pp2": b}
        for i, (c, s, a, b) in enumerate(
            [(1.0, 1.1, -0.10, -0.20), (1.1, 1.3, -0.20, -0.25), (0.95, 1.0, -0.05, -0.05)]
        )
    ]
    md = summary_md(rows, [1, 2], "python experiments/validation/host_drift.py ...")
    assert "| 1 | 70 | 1.100 | 1.300 | -0.200 | -0.250 |" in md
    assert "| PP=1 | -0.200 | -0.100 | -0.050 |" in md
    assert "| PP=2 - PP=1 | -0.100 | -0.050 | +0.000 |" in md
    assert "r with co-run" in md


@pytest.mark.parametrize("argv", [["--cycles", "0"], ["--pp", "0"]])
def test_bad_counts_exit_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--config", "x.json", "--profile", PROFILE, "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and "--cycles and --pp" in capsys.readouterr().err


def test_bad_config_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--config", str(tmp_path / "missing.json"), "--profile", PROFILE, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and not out.exists()


@pytest.mark.slow
def test_one_cycle_on_the_live_engine(tmp_path):
    cfg = tmp_path / "s.json"
    cfg.write_text(
        json.dumps(
            {
                "model": "tiny",
                "seed": 3,
                "engine": {"policy": {"kind": "vllm-sync"}, "max_num_seqs": 4},
                "workload": {"num_prompts": 4, "request_rate": "inf", "random_input_len": 16, "random_output_len": 4},
                "live_engine": {"device": "cpu", "threads_per_stage": 1},
            }
        )
    )
    out = tmp_path / "drift"
    assert main(["--config", str(cfg), "--profile", PROFILE, "--out", str(out), "--cycles", "1"]) == 0
    rows = list(csv.DictReader((out / "cycles.csv").open()))
    assert len(rows) == 1 and set(rows[0]) == {"cycle", "t_s", "corun", "speed", "level_pp1", "level_pp2"}
    r = rows[0]
    # real measurements: positive readings, levels of real runs (the engine within 3x of the profile)
    assert float(r["corun"]) > 0 and float(r["speed"]) > 0
    assert all(-0.67 < float(r[k]) < 2.0 for k in ("level_pp1", "level_pp2"))
    for p in (1, 2):
        assert (out / "runs" / f"cycle0-pp{p}" / "step_costs.csv").is_file()
    assert "| PP=2 - PP=1 |" in (out / "host_drift.md").read_text()
