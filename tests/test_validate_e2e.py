"""`ppsim validate` end to end on the tiny model: real engine processes vs the simulator."""

import json
import shutil

import pytest

from engine.host_sampler import SAMPLER_KIND


def test_validate_tiny_end_to_end(ppsim_cli, tmp_path):
    out, prof = tmp_path / "val", tmp_path / "profile"
    shutil.copytree("profiles/tiny-cpu", prof)  # with a live factor: its depth ratio is charged at PP=2
    fits = json.loads((prof / "fits.json").read_text())
    fits["live_stage"] = {"form": "interp", "x": "stages", "coef": {"xs": [1.0, 2.0], "ys": [1.02, 1.122]}}
    (prof / "fits.json").write_text(json.dumps(fits))
    meta = json.loads((prof / "meta.json").read_text())  # the in-run sampler's time through calibration
    (prof / "meta.json").write_text(json.dumps({**meta, "host_sampler_s": 0.0004, "host_sampler": SAMPLER_KIND}))
    r = ppsim_cli(
        "validate",
        "--model",
        "tiny",
        "-pp",
        "2",
        "--num-prompts",
        "8",
        "--request-rate",
        "inf",
        "--random-input-len",
        "64",
        "--random-output-len",
        "8",
        "--max-num-batched-tokens",
        "256",
        "--profile",
        str(prof),
        "--repeats",
        "2",
        "--output-dir",
        str(out),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ppsim validate: engine vs simulator" in r.stdout and "per-request TTFT" in r.stdout
    v = json.loads((out / "validation.json").read_text())
    assert v["repeats"] == 2 and len(v["engine_summaries"]) == 2
    rows = {row["metric"]: row for row in v["rows"]}
    assert {"request_throughput", "mean_ttft_ms", "p99_tpot_ms", "stage_busy_fraction[1]"} <= set(rows)
    for row in rows.values():
        assert row["engine"] >= 0 and row["simulated"] >= 0
    # same workload on both sides: every request matched, every output token accounted for
    assert v["per_request"]["matched_requests"] == 8 * 2  # every request of both repeats
    assert v["step_cost"]["steps"] > 0 and set(v["step_cost"]["by_stage"]) == {"0", "1"}
    assert [r["when"] for r in v["host"]["readings"]] == ["before 0", "after 0", "before 1", "after 1"]
    # the engine core froze this process's heap for each run (engine/core_gc.py), its collections recorded
    for i, cpu in enumerate(v["engine_cpu"]):
        core = json.loads((out / f"engine-{i}" / "engine.json").read_text())["core_gc"]
        assert core["frozen_objects"] > 0 and cpu["core_freeze_s"] == core["freeze_s"] > 0
    assert v["sim_summary"]["total_output_tokens"] == v["engine_summaries"][0]["total_output_tokens"] == 64
    # No speed ratio is asserted: the shipped profile was measured on another host, and this host may be
    # busy, so simulated/engine throughput says how loaded the machine is, not whether ppsim is right.
    # Accuracy is measured by experiments/validation/run.py (calibrated on the same host, idle).
    assert rows["output_throughput"]["simulated"] > 0 and rows["output_throughput"]["engine"] > 0
    # the speed-adjusted replay: the engine's stage time over the prediction, and the same metrics
    adj = v["speed_adjusted"]
    steps = [line.split(",") for line in (out / "step_costs.csv").read_text().splitlines()]
    col = {k: i for i, k in enumerate(steps[0])}
    measured = sum(float(r[col["measured_s"]]) for r in steps[1:])
    predicted = sum(float(r[col["predicted_s"]]) for r in steps[1:])
    assert adj["factor"] == pytest.approx(measured / predicted, rel=1e-6)
    # every compute carries its stage thread's involuntary switch count (Linux), 0 or more
    assert all(int(r[col["preempted"]]) >= 0 for r in steps[1:])
    assert 0.0 <= v["step_cost"]["preempted_share"] <= 1.0
    assert [r["metric"] for r in adj["rows"]] == [r["metric"] for r in v["rows"]]
    # the predictions charged the depth ratio (1.122 / 1.02) and say so; replay_adjusted.py scales the same model
    from experiments.validation.replay_adjusted import replay

    assert v["depth_factor"] == pytest.approx(1.1)
    again = replay(out, without_depth=True)
    assert again["factor"] == pytest.approx(adj["factor"])
    assert again["predicted now"] is again["predicted"]  # recorded by the current model: nothing to predict again
    assert again["adjusted"] == {r["metric"]: r["error"] for r in adj["rows"] if r["metric"] in again["adjusted"]}
    assert again["without depth"] != again["predicted"]
    # a dir recorded before the ratio was charged (no depth_factor): the current model predicts it again
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "validation.json").write_text(json.dumps({k: x for k, x in v.items() if k != "depth_factor"}))
    before = replay(old)
    assert before["predicted now"] is not before["predicted"] and before["predicted now"] == again["predicted"]
    assert "speed-adjusted replay (the engine's stages ran x" in r.stdout
    # part 6: each stage's span split the same way on both sides, and the hand-over on a free receiver
    path = v["path"]
    assert set(path["stages"]) == {"0", "1"} and set(path["handover"]) == {"0->1"}
    for side in ("engine", "sim"):
        st = path["stages"]["0"][side]
        assert st["busy_s"] + st["idle_others_s"] + st["idle_pipeline_s"] == pytest.approx(st["span_s"], abs=1e-9)
    assert "where each stage's time went" in r.stdout and "hand-over 0->1 on a free receiver" in r.stdout
    # the in-run sampler through each repeat, against its time through calibration: the host-conditioned
    # prediction scales every stage compute by that ratio, and reports the same metrics
    h, hc = v["host"], v["host_conditioned"]
    assert len(h["sampler_s"]) == 2 and all(0 < x < 1 for x in h["sampler_s"])
    assert hc["factor"] == pytest.approx(sum(h["sampler_s"]) / 2 / 0.0004) == pytest.approx(h["sampler_ratio"])
    assert [r["metric"] for r in hc["rows"]] == [r["metric"] for r in v["rows"]]
    assert "host-conditioned prediction (the in-run sampler read the host at x" in r.stdout
    # the probe-conditioned prediction (part 44): the whole model on the predicted run's own decode step before each
    # repeat, over the profile's price of that step; the fixed probe's (4 requests at 134 tokens) beside it
    pc, (reqs, ctx) = v["probe_conditioned"], h["shaped_step"]
    shaped = [x["shaped_probe_s"] for x in h["readings"] if x["when"].startswith("before")]
    assert pc["probe"] == "shaped" and pc["step"] == [reqs, ctx] and reqs >= 1 and ctx >= 1
    assert pc["factor"] == pytest.approx(sum(shaped) / 2 / h["shaped_price_s"]) == pytest.approx(h["shaped_factor"])
    assert [r["metric"] for r in pc["rows"]] == [r["metric"] for r in v["rows"]]
    on = f"probe-conditioned prediction (the whole-model probe before each repeat ran the predicted decode step, {reqs}"
    assert on in r.stdout
    pf = v["probe_fixed"]
    before = [x["model_probe_s"] for x in h["readings"] if x["when"].startswith("before")]
    assert len(before) == 2 and pf["factor"] == pytest.approx(sum(before) / 2 / h["model_price_s"])
    assert pf["factor"] == pytest.approx(h["probe_factor"]) and "fixed-probe prediction (4 requests at 134" in r.stdout
    assert (out / "latency_cdf.png").stat().st_size > 1000
    trace = json.loads((out / "trace_combined.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}


def test_validate_calibrates_this_host_without_a_profile(validated_without_profile):
    out, r = validated_without_profile
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no --profile; calibrating tiny" in r.stderr and "quick grid" in r.stderr
    meta = json.loads((out / "profile" / "meta.json").read_text())
    assert meta["grid"] == "quick"
    v = json.loads((out / "validation.json").read_text())
    assert v["scenario"]["cost"]["profile_dir"] == str(out / "profile")
    assert v["step_cost"]["steps"] >= 3 and "step-level cost error" in r.stdout


def test_validate_bad_input_fails_before_calibrating(ppsim_cli, tmp_path):
    r = ppsim_cli(
        "validate",
        "--model",
        "tiny",
        "--num-prompts",
        "2",
        "--host-max-drift",
        "0",
        "--output-dir",
        str(tmp_path / "v"),
    )
    assert r.returncode == 2 and "--host-max-drift" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "v" / "profile").exists()


def test_validate_calibrates_the_scenarios_model_even_from_a_config_file(tmp_path):
    """The model and router skew of --config (not only of flags) are what validate calibrates."""
    from ppsim.config import build_scenario
    from ppsim.validate.cli import calibrate_command

    s = build_scenario(None, {"model": "tiny-moe", "moe_router_zipf": 1.2})
    cmd = calibrate_command(s, tmp_path / "p", full=False)
    assert cmd[cmd.index("--model") + 1] == "tiny-moe" and cmd[cmd.index("--moe-router-zipf") + 1] == "1.2"
    assert "--quick" in cmd and "--quick" not in calibrate_command(s, tmp_path / "p", full=True)
    assert "--moe-router-zipf" not in calibrate_command(build_scenario(None, {"model": "tiny"}), tmp_path, False)


def test_a_failed_validation_leaves_the_output_dir_as_it_was(tmp_path):
    """validate's own calibration (OUTPUT/profile) is undone when the run then fails; a previous result
    set's profile comes back."""
    from ppsim.validate.cli import MadeProfile

    fresh = MadeProfile(tmp_path / "new")
    (tmp_path / "new" / "profile").mkdir(parents=True)
    (tmp_path / "new" / "profile" / "fits.json").write_text("{}")
    fresh.undo()
    assert not (tmp_path / "new").exists()
    old = tmp_path / "old"
    (old / "profile").mkdir(parents=True)
    (old / "profile" / "fits.json").write_text("old")
    (old / "validation.json").write_text("{}")
    again = MadeProfile(old)
    assert not (old / "profile").exists()  # moved aside while the new one is made
    (old / "profile").mkdir()
    (old / "profile" / "fits.json").write_text("new")
    again.undo()
    assert (old / "profile" / "fits.json").read_text() == "old" and (old / "validation.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # nothing left aside
    kept = MadeProfile(old)
    (old / "profile").mkdir()
    (old / "profile" / "fits.json").write_text("new")
    kept.keep()
    assert (old / "profile" / "fits.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "old"
    ]
