"""The speed-adjusted replay's cost model (``ppsim/cost/scaled.py``) and ``validate``'s replay: compute
scaled by the factor, everything else the inner model's; a factor of 1 replays the simulation exactly."""

from __future__ import annotations

import dataclasses

import pytest

from ppsim.config import build_scenario
from ppsim.cost.base import StageSpec
from ppsim.cost.scaled import ClassScaledCompute, ScaledCompute
from ppsim.deployment import kv_figures, prepare
from ppsim.metrics.summary import summarize
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.sim.executor import simulate
from ppsim.validate.run import speed_adjusted

STAGE = StageSpec(0, 0, 4, True, False)
PLAN = make_plan(0, [PlanItem(i, 100, 1, False, True) for i in range(4)])


def _prep(policy: str = "vllm-batch-queue"):
    s = build_scenario(
        None,
        {
            "model": "tiny",
            "seed": 3,
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": {"kind": policy}},
            "workload": {"num_prompts": 12, "request_rate": 20.0, "random_input_len": 64, "random_output_len": 12},
        },
    )
    return prepare(s)


def test_only_compute_is_scaled():
    cost = _prep().cost
    sc = ScaledCompute(cost, 1.5)
    assert sc.stage_time(STAGE, PLAN) == pytest.approx(1.5 * cost.stage_time(STAGE, PLAN), rel=1e-12)
    assert sc.link_time(4096) == cost.link_time(4096) and sc.return_time(3) == cost.return_time(3)
    assert sc.launch_time(3) == cost.launch_time(3) and sc.cpu_time("schedule", 3) == cost.cpu_time("schedule", 3)
    assert sc.stage_times is None  # the simulator must not take the inner model's unscaled batch form
    with pytest.raises(ValueError, match="must be > 0"):
        ScaledCompute(cost, 0.0)


def test_class_factors_follow_the_plan():
    """Prefill and mixed plans take the prefill factor, decode-only plans the decode factor, idle the run's."""
    cost = _prep().cost
    sc = ClassScaledCompute(cost, 1.1, 1.3, 0.9)
    prefill = make_plan(1, [PlanItem(0, 0, 64, True, True)])
    mixed = make_plan(2, [PlanItem(0, 0, 64, True, True), PlanItem(1, 100, 1, False, True)])
    for plan, f in ((PLAN, 0.9), (prefill, 1.3), (mixed, 1.3)):
        assert sc.stage_time(STAGE, plan) == pytest.approx(f * cost.stage_time(STAGE, plan), rel=1e-12)
    if sc.has_idle:
        assert sc.idle_time(STAGE, 0.01) == pytest.approx(1.1 * cost.idle_time(STAGE, 0.01), rel=1e-12)
    with pytest.raises(ValueError, match="must be > 0"):
        ClassScaledCompute(cost, 1.0, 0.0, 1.0)


@pytest.mark.parametrize("policy", ["vllm-batch-queue", "sglang-ring", "vllm-mrv2"])
def test_factor_one_replays_the_simulation_exactly(policy):
    prep = _prep(policy)
    res = simulate(prep)
    base = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    steps = [{"measured_s": 2.0, "predicted_s": 2.0}]
    adj = speed_adjusted(prep, steps, [base])
    assert adj["factor"] == 1.0
    assert all(r["error"] == 0.0 for r in adj["rows"])


def test_a_slower_host_slows_the_replay():
    prep = _prep()
    res = simulate(prep)
    base = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    adj = speed_adjusted(prep, [{"measured_s": 3.0, "predicted_s": 2.0}], [base])
    rows = {r["metric"]: r for r in adj["rows"]}
    assert adj["factor"] == 1.5 and rows["mean_tpot_ms"]["error"] > 0.3  # mostly compute: ~1.5x slower
    assert speed_adjusted(dataclasses.replace(prep), [], [base]) is None


def test_jitter_picks_by_stage_and_step():
    """The jittered replay's pick depends only on (seed, stage, step): repeatable, spread over the ratios."""
    from ppsim.cost.scaled import JitteredCompute

    cost = _prep().cost
    ratios = [0.8, 1.0, 1.6]
    jc = JitteredCompute(cost, ratios, seed=1)
    picks = [jc.ratio(s, step) for s in (0, 1) for step in range(300)]
    assert set(picks) == set(ratios) and all(80 < picks.count(r) < 120 * 2 for r in ratios)
    assert [JitteredCompute(cost, ratios, seed=1).ratio(0, k) for k in range(50)] == picks[:50]
    assert [JitteredCompute(cost, ratios, seed=2).ratio(0, k) for k in range(50)] != picks[:50]
    base = cost.stage_time(STAGE, PLAN)
    assert jc.stage_time(STAGE, PLAN) == pytest.approx(jc.ratio(0, 0) * base, rel=1e-12)
    assert jc.factor == pytest.approx(sum(ratios) / 3)  # idle time: the mean ratio
    with pytest.raises(ValueError, match="positive"):
        JitteredCompute(cost, [])


@pytest.mark.parametrize("policy", ["vllm-batch-queue", "sglang-ring", "vllm-mrv2"])
def test_jitter_same_answers_on_both_pipelines(policy):
    """Drawn per (stage, step), the jitter gives the closed form and the per-event reference one answer."""
    from ppsim.cost.scaled import JitteredCompute

    prep = _prep(policy)
    prep = dataclasses.replace(prep, cost=JitteredCompute(prep.cost, [0.7, 1.0, 1.9], seed=3))
    fast, ref = simulate(prep), simulate(prep, reference=True)
    flat = lambda res: [t for r in res.requests for t in r.token_times]  # noqa: E731
    assert flat(fast) == pytest.approx(flat(ref), rel=1e-9, abs=1e-12)
    plain = simulate(_prep(policy))
    assert [r.token_times for r in fast.requests] != [r.token_times for r in plain.requests]


def test_step_time_spread_costs_latency_with_two_micro_batches_in_flight():
    """Same mean speed, spread steps: at PP=2 with two micro-batches in flight a slow step delays the other
    one, so the jittered replay is slower than the mean's (the effect `replay_adjusted.py --jitter-draws`
    measures); the speed-adjusted replay of the same steps is the mean's."""
    from ppsim.validate.run import jittered

    s = build_scenario(
        None,
        {
            "model": "tiny",
            "seed": 3,
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": {"kind": "vllm-batch-queue", "pp_throttle": True}, "max_num_seqs": 8},
            "workload": {"num_prompts": 8, "request_rate": "inf", "random_input_len": 32, "random_output_len": 48},
        },
    )
    prep = prepare(s)
    res = simulate(prep)
    base = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    steps = [{"measured_s": m, "predicted_s": 1.0} for m in (0.4, 1.6)]  # mean 1: the speed factor is 1
    assert all(r["error"] == 0.0 for r in speed_adjusted(prep, steps, [base])["rows"])
    errs = [{r["metric"]: r["error"] for r in jittered(prep, steps, [base], seed=k)["rows"]} for k in range(3)]
    assert all(e["mean_tpot_ms"] > 0.05 for e in errs), [e["mean_tpot_ms"] for e in errs]


def test_replay_script_refuses_bad_input_in_one_line(tmp_path, capsys):
    from experiments.validation.replay_adjusted import main

    def code(argv: list[str]) -> int:  # refused while parsing (SystemExit) or after (returned)
        try:
            return main(argv)
        except SystemExit as e:
            return e.code

    cases = (([str(tmp_path)], f"dirs: {tmp_path}"), (["--jitter-draws", "-1", str(tmp_path)], "--jitter-draws"))
    for argv, field in cases:
        assert code(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {field}: ") and len(err.strip().splitlines()) == 1
    (tmp_path / "validation.json").write_text("{}")
    (tmp_path / "step_costs.csv").write_text("run,stage,step_id,measured_s,predicted_s\n")
    assert code([str(tmp_path)]) == 2 and "no engine steps" in capsys.readouterr().err


def _control_ops(launch: float, ret: float, steps: int = 6, n: int = 3) -> list:
    """A one-stage run's records with ``launch`` and ``return`` gaps: schedule (0.1 ms), the stage's
    compute (5 ms), the core's update (0.05 ms), the next schedule right after."""
    from ppsim.metrics.records import OpRecord

    ops, t = [], 0.0
    for k in range(steps):
        ops.append(OpRecord("core", "schedule", -1, t, t + 1e-4, 0, n))
        c0 = t + 1e-4 + launch
        ops.append(OpRecord("stage0", "compute", k, c0, c0 + 5e-3, n, n))
        u0 = c0 + 5e-3 + ret
        ops.append(OpRecord("core", "update", -1, u0, u0 + 5e-5, 0, n))
        t = u0 + 5e-5
    return ops


def test_path_factor_is_the_engines_control_path_over_the_simulators(tmp_path):
    """Per (kind, n) the engine's median gap against the simulator's, summed over the engine's gaps: launch
    and return 0.6 ms against 0.4, schedule and update alike on both sides."""
    from experiments.validation.replay_adjusted import path_factor, run_path_factor

    sim = _control_ops(4e-4, 4e-4)
    assert path_factor([sim], sim) == pytest.approx(1.0)
    # six schedules and launches, five updates and returns (the last update has no schedule after it)
    expected = (6 * (1e-4 + 6e-4) + 5 * (5e-5 + 6e-4)) / (6 * (1e-4 + 4e-4) + 5 * (5e-5 + 4e-4))
    assert path_factor([_control_ops(6e-4, 6e-4)] * 2, sim) == pytest.approx(expected, rel=1e-9)
    assert path_factor([_control_ops(6e-4, 6e-4, n=5)], sim) is None  # no request count in common
    # a run dir's records, as validate writes them; none for a policy that schedules ahead
    header = "track,kind,step_id,start_s,end_s,num_tokens,num_reqs,num_prefill_tokens,num_decode_tokens,nbytes\n"
    for name, ops in (("engine-0", _control_ops(6e-4, 6e-4)), ("sim", sim)):
        (tmp_path / name).mkdir()
        rows = "".join(",".join(map(str, o.row())) + "\n" for o in ops)
        (tmp_path / name / "stage_ops.csv").write_text(header + rows)
    assert run_path_factor(tmp_path, "vllm-sync") == pytest.approx(expected, rel=1e-9)
    assert run_path_factor(tmp_path, "vllm-mrv2") is None and run_path_factor(tmp_path / "sim", "vllm-sync") is None


def test_with_path_scales_the_control_path_and_the_computes_apart():
    """``replay_adjusted.py --with-path``'s model: computes at ``factor``, launch, return, the core's CPU and
    the turnaround at ``path``, links as measured; a path of 1 is the plain speed-adjusted replay."""
    from experiments.validation.replay_adjusted import WithPath

    prep = _prep()
    cost = prep.cost
    wp = WithPath(cost, 1.2, 1.5)
    assert wp.stage_time(STAGE, PLAN) == pytest.approx(1.2 * cost.stage_time(STAGE, PLAN), rel=1e-12)
    assert wp.launch_time(3) == pytest.approx(1.5 * cost.launch_time(3), rel=1e-12)
    assert wp.return_time(3) == pytest.approx(1.5 * cost.return_time(3), rel=1e-12)
    assert wp.cpu_time("update", 3) == pytest.approx(1.5 * cost.cpu_time("update", 3), rel=1e-12)
    assert wp.link_time(4096) == cost.link_time(4096)
    assert wp.turnaround_s == pytest.approx(1.5 * float(getattr(cost, "turnaround_s", 0.0) or 0.0))
    with pytest.raises(ValueError, match="must be > 0"):
        WithPath(cost, 1.0, 0.0)
    res = simulate(prep)
    base = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    from ppsim.validate.run import replay_with

    same = replay_with(prep, WithPath(cost, 1.0, 1.0), [base])
    assert all(r["error"] == 0.0 for r in same["rows"])
    slow = {r["metric"]: r["error"] for r in replay_with(prep, WithPath(cost, 1.0, 3.0), [base])["rows"]}
    assert slow["mean_tpot_ms"] > 0.0 and slow["median_e2el_ms"] > 0.0
