"""experiments/validation/host_drift.py: the step level, the correlation, the summary, bad input, and
one real cycle (a co-run reading, then `validate` at PP=1 and PP=2 on the tiny model, the in-run
sampler of host_sampler.py beside each)."""

from __future__ import annotations

import csv
import json
import math

import pytest

from engine.host_sampler import sample_stats
from experiments.validation.host_drift import correlation, main, sampler_md, step_level, summary_md
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


def test_sample_stats():
    st = sample_stats("0.003\n0.005\n0.004\n")
    assert st["n"] == 3 and st["mean_s"] == pytest.approx(0.004) and st["median_s"] == pytest.approx(0.004)
    assert sample_stats("")["n"] == 0 and math.isnan(sample_stats("")["mean_s"])


def test_sampler_table_scales_each_level_by_its_runs_sampler():
    # each run's level is exactly the sampler's slowdown against the median host: scaled, no spread is left
    samp = [3.0, 3.3, 3.6, 3.9]
    rows = [
        {"sampler_idle_ms": 3.5 + 0.1 * (i % 2), "sampler_pp1_ms": x, "level_pp1": 3.45 / x - 1}
        for i, x in enumerate(samp)
    ]
    md = summary_md([{"cycle": i, "t_s": 0.0, "corun": 1.0, "speed": 1.0, **r} for i, r in enumerate(rows)], [1], "c")
    line = next(ln for ln in md.splitlines() if ln.startswith("| PP=1 | 3.00 / 3.45 / 3.90"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[2]) < -0.95  # r with the sampler during the run
    assert float(cells[4]) > 0.05 and float(cells[5]) == pytest.approx(0.0, abs=1e-3)
    assert sampler_md(rows, [1])[-1] == line


@pytest.mark.parametrize("argv, flag", [(["--cycles", "0"], "--cycles: 0"), (["--pp", "0"], "--pp: 0")])
def test_bad_counts_exit_2(argv, flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--config", "x.json", "--profile", PROFILE, "--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"error: {flag}")


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
    argv = ["--config", str(cfg), "--profile", PROFILE, "--out", str(out), "--cycles", "1", "--sampler"]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "cycles.csv").open()))
    levels = {"level_pp1", "level_pp2"}
    samplers = {"sampler_idle_ms", "sampler_pp1_ms", "sampler_pp2_ms"}
    assert len(rows) == 1 and set(rows[0]) == {"cycle", "t_s", "corun", "speed"} | levels | samplers
    r = rows[0]
    # real measurements: positive readings, levels of real runs (the engine within 3x of the profile)
    assert float(r["corun"]) > 0 and float(r["speed"]) > 0
    assert all(0 < float(r[k]) < 1000 for k in samplers)  # ms per sampled matmul
    assert len((out / "sampler" / "cycle0-idle.txt").read_text().split()) >= 10  # 6 s at one per 0.25 s
    assert all(-0.67 < float(r[k]) < 2.0 for k in ("level_pp1", "level_pp2"))
    for p in (1, 2):
        assert (out / "runs" / f"cycle0-pp{p}" / "step_costs.csv").is_file()
    md = (out / "host_drift.md").read_text()
    assert "| PP=2 - PP=1 |" in md and "In-run sampler" in md


def test_sampler_output_carries_each_samples_time():
    from engine.host_sampler import samples_of, window_mean

    text = "100.0 0.003\n100.25 0.005\n100.5 0.004\n"
    assert samples_of(text) == [(100.0, 0.003), (100.25, 0.005), (100.5, 0.004)]
    assert sample_stats(text)["n"] == 3 and sample_stats(text)["mean_s"] == pytest.approx(0.004)
    assert window_mean(samples_of(text), 100.2, 101.0) == pytest.approx(0.0045)
    assert window_mean(samples_of(text), 100.4, 101.0) is None  # one sample: too few
    assert math.isnan(samples_of("0.003\n")[0][0])  # an older file, times not kept
