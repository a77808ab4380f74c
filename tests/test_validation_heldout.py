"""The held-out validation set: drawn at run time, reproducible from its seed, every engine policy,
knobs within their ranges; and the results tables keep development and held-out apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.validation.scenarios import ENGINE_POLICIES, held_out
from experiments.validation.tables import result_row, results_md
from ppsim.policy.pipelines import REPLICATED
from tests.conftest import ROOT

PROFILE = str(ROOT / "profiles" / "tiny-cpu")


def capacity(_s):
    return 10.0  # requests/s: injected, so the drawn rates do not depend on the cost model


def test_same_seed_same_set_every_policy():
    a = held_out(7, 2, "tiny", PROFILE, capacity)
    b = held_out(7, 2, "tiny", PROFILE, capacity)
    c = held_out(8, 2, "tiny", PROFILE, capacity)
    assert [k for k, _ in a.values()] == [k for k, _ in b.values()]
    assert [k for k, _ in a.values()] != [k for k, _ in c.values()]
    knobs = [k for k, _ in a.values()]
    assert sorted(k["policy"] for k in knobs) == sorted(ENGINE_POLICIES * 2)
    assert not set(ENGINE_POLICIES) & REPLICATED


def test_draws_stay_in_their_ranges_and_build():
    drawn = held_out(3, 3, "tiny", PROFILE, capacity)
    for name, (k, s) in drawn.items():
        assert k["pp"] in (1, 2) and s.cluster.pipeline_parallel_size == k["pp"]
        assert s.engine.policy == k["policy"] and k["policy"] in name
        assert 16 <= s.workload.num_prompts <= 40 and s.engine.step_token_budget in (64, 128, 256, 512)
        assert 0 <= s.workload.random_range_ratio <= 0.8 and 0 <= s.workload.abort_rate <= 0.3
        if k["load"] == "offline":
            assert s.workload.request_rate == float("inf")
        else:
            assert 0.15 <= k["load"] <= 1.2 and s.workload.request_rate == pytest.approx(10.0 * k["load"], abs=1e-3)
        assert s.cost.kind == "profile" and s.cost.profile_dir == PROFILE
    loads = [k["load"] for k, _ in drawn.values()]
    assert "offline" in loads and any(x != "offline" and x < 0.4 for x in loads)  # light to offline both drawn
    assert any(k.get("abort_rate", 0) > 0 for k, _ in drawn.values())


def _payload(err: float, bubble_pts: float) -> dict:
    metrics = [
        "output_throughput",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_e2el_ms",
        "p99_e2el_ms",
        "pipeline_bubble_fraction",
    ]
    rows = [
        {
            "metric": m,
            "engine": 1.0,
            "engine_spread": 0.02,
            "simulated": 1.0 + err,
            "error": bubble_pts if m == "pipeline_bubble_fraction" else err,
        }
        for m in metrics
    ]
    return {
        "rows": rows,
        "step_cost": {"median_error": -0.1, "p90_abs_error": 0.2, "median_cpu_error": -0.05, "median_cpu_share": 0.9},
        "per_request": {"ttft": {"ks_pvalue": 0.5}, "e2el": {"ks_pvalue": 0.4}},
        "host": {"ok": False, "problem": "drifted"},
    }


def test_results_tables_keep_sets_apart():
    rows = [
        result_row("development", "d1", {"policy": "vllm-sync", "pp": 1}, _payload(0.04, 0.01)),
        result_row("held-out", "h1", {"policy": "vllm-sync", "pp": 2, "seed": 5}, _payload(-0.3, -0.2)),
    ]
    md = results_md(rows, ["# t"])
    line = next(x for x in md.splitlines() if x.startswith("| vllm-sync |"))
    assert "| 1 | 4.0% (±2.0%) | 1 | 30.0% (±2.0%) |" in line  # dev and held-out side by side, spread beside
    assert "0.010 (±0.020) / 0.200 (±0.020)" in line  # bubble in points, never in the percent medians
    assert "## Held-out draws" in md and json.dumps({"policy": "vllm-sync", "pp": 2, "seed": 5}, sort_keys=True) in md
    assert "Host guard: 2 of 2 scenarios flagged" in md


def test_the_host_conditioned_prediction_has_its_own_column():
    p = _payload(-0.3, -0.2)
    p["host_conditioned"] = {"factor": 1.25, "rows": [{**r, "error": r["error"] / 10} for r in p["rows"]]}
    row = result_row("held-out", "h1", {"policy": "vllm-sync", "pp": 2}, p)
    assert row["host_factor"] == 1.25 and row["mean_tpot_ms_conditioned"] == pytest.approx(-0.03)
    md = results_md([row, result_row("held-out", "h2", {"policy": "vllm-sync", "pp": 1}, _payload(0.1, 0.0))], ["# t"])
    tpot = next(x for x in md.splitlines() if x.startswith("| mean_tpot_ms |") and "held-out" not in x)
    # the median over the scenarios that have it (h2's profile had no sampler reference): 3.0%
    assert "host-conditioned (in-run sampler)" in md and "| 3.0% |" in tpot


def test_the_probe_conditioned_prediction_has_its_own_column():
    p = _payload(-0.3, -0.2)
    p["probe_conditioned"] = {"factor": 1.1, "rows": [{**r, "error": r["error"] / 5} for r in p["rows"]]}
    row = result_row("held-out", "h1", {"policy": "vllm-sync", "pp": 2}, p)
    assert row["probe_factor"] == 1.1 and row["mean_tpot_ms_probed"] == pytest.approx(-0.06)
    assert row["mean_tpot_ms_conditioned"] == ""  # no sampler: its column empty, the probe's filled
    md = results_md([row], ["# t"])
    head = next(x for x in md.splitlines() if x.startswith("| metric (held-out)"))
    tpot = next(x for x in md.splitlines() if x.startswith("| mean_tpot_ms |"))
    assert "probe-conditioned (whole-model probe before each repeat)" in head
    assert tpot.split(" | ")[5:7] == ["-", "6.0%"]  # host-conditioned: none; probe-conditioned: 6.0%
    assert tpot.split(" | ")[7] == "-"  # the shaped probe (part 44) not read


def test_the_shaped_probe_s_prediction_has_its_own_column():
    p = _payload(-0.3, -0.2)
    p["probe_conditioned"] = {"factor": 1.1, "rows": [{**r, "error": r["error"] / 5} for r in p["rows"]]}
    p["probe_shaped"] = {"factor": 1.2, "step": [8, 60], "rows": [{**r, "error": r["error"] / 10} for r in p["rows"]]}
    row = result_row("held-out", "h1", {"policy": "vllm-sync", "pp": 2}, p)
    assert row["shaped_factor"] == 1.2 and row["mean_tpot_ms_shaped"] == pytest.approx(-0.03)
    md = results_md([row], ["# t"])
    head = next(x for x in md.splitlines() if x.startswith("| metric (held-out)"))
    tpot = next(x for x in md.splitlines() if x.startswith("| mean_tpot_ms |"))
    assert "| the other probe (part 44: on its trial the shaped one, since the fixed one) | speed-adjusted" in head
    assert tpot.split(" | ")[6:8] == ["6.0%", "3.0%"]  # probe-conditioned, then the shaped probe's
    del p["probe_shaped"]  # since part 44's adoption: probe_conditioned is the shaped probe's, the fixed one beside
    p["probe_fixed"] = {"factor": 1.3, "rows": [{**r, "error": r["error"] / 20} for r in p["rows"]]}
    row = result_row("held-out", "h1", {"policy": "vllm-sync", "pp": 2}, p)
    assert row["fixed_factor"] == 1.3 and row["mean_tpot_ms_shaped"] == "" and row["mean_tpot_ms_fixed"] == -0.015
    tpot = next(x for x in results_md([row], ["# t"]).splitlines() if x.startswith("| mean_tpot_ms |"))
    assert tpot.split(" | ")[6:8] == ["6.0%", "1.5%"]


def test_development_matrix_knobs_are_plain_values():
    """Every scenario's knobs go into results.csv as JSON: the development matrix's too."""
    from experiments.validation.run import parse_args, plan_scenarios

    todo = plan_scenarios(parse_args(["--set", "development", "--profile", PROFILE]), PROFILE)
    assert len(todo) == 9
    for set_name, _name, knobs, s in todo:
        assert set_name == "development" and knobs["policy"] == s.engine.policy.kind
        json.dumps(knobs)


@pytest.mark.slow
def test_interleaved_repeats_run_each_round_over_every_scenario(tmp_path):
    """``--interleave``: repeat 2 of the first scenario starts after repeat 1 of the second (the stage
    processes' pids, handed out in order by the kernel modulo its pid_max, say when each run started), and both
    validations are complete, with two engine runs each."""
    from experiments.validation.run import main

    names = ["pp1-sync-offline", "pp2-sync-offline"]
    argv = ["--set", "development", "--only", *names, "--profile", PROFILE, "--repeats", "2"]
    argv += ["--num-prompts-scale", "0.25", "--host-guard", "off", "--interleave"]
    assert main([*argv, "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    pids = {
        (n, k): min(
            json.loads((tmp_path / "runs" / "tiny" / n / f"engine-{k}" / "engine.json").read_text())["stage_pids"]
        )
        for n in names
        for k in (0, 1)
    }
    # in order of start, modulo the kernel's pid_max: a pid can wrap around between two runs (CI saw 32758, then 301)
    limit = Path("/proc/sys/kernel/pid_max")
    pid_max = int(limit.read_text()) if limit.exists() else 1 << 22
    order = [(n, k) for k in (0, 1) for n in names]
    after_first = [(pids[key] - pids[order[0]]) % pid_max for key in order]
    assert after_first == sorted(after_first) and len(set(after_first)) == 4
    for n in names:
        v = json.loads((tmp_path / "runs" / "tiny" / n / "validation.json").read_text())
        assert v["repeats"] == 2 and len(v["engine_summaries"]) == 2
    assert "Repeats: interleaved" in (tmp_path / "out" / "results.md").read_text()
