"""The speed-adjusted replay's cost model (``ppsim/cost/scaled.py``) and ``validate``'s replay: compute
scaled by the factor, everything else the inner model's; a factor of 1 replays the simulation exactly."""

from __future__ import annotations

import dataclasses

import pytest

from ppsim.config import build_scenario
from ppsim.cost.base import StageSpec
from ppsim.cost.scaled import ScaledCompute
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
