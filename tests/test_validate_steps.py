"""Step-level cost error: every engine micro-batch against the cost model's time for the same plan."""

import pytest

from ppsim.cost.base import StageSpec
from ppsim.metrics.records import OpRecord
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.validate.report import steps_csv
from ppsim.validate.steps import bucket_of, format_steps, step_costs, summarize_steps


class LinearCost:
    """1 ms per token per layer, +2 ms on the last stage: easy to predict by hand."""

    def stage_time(self, stage, plan):
        return 1e-3 * plan.num_tokens * stage.num_layers + (2e-3 if stage.is_last else 0.0)


STAGES = (StageSpec(0, 0, 2, True, False), StageSpec(1, 2, 4, False, True))


def _plan(step, n_decode, prefill=0):
    items = [PlanItem(i, 100, 1, False, True) for i in range(n_decode)]
    if prefill:
        items.append(PlanItem(99, 0, prefill, True, True))
    return make_plan(step, items)


def test_each_engine_compute_is_timed_with_its_own_plan():
    plans = {0: _plan(0, 4), 1: _plan(1, 1, prefill=60)}
    ops = [
        OpRecord("stage0", "compute", 0, 0.0, 0.010, 4, 4),  # predicted 8 ms: -20%
        OpRecord("stage1", "compute", 0, 0.010, 0.020, 4, 4),  # predicted 10 ms: 0%
        OpRecord("stage0", "compute", 1, 0.020, 0.142, 61, 2),  # predicted 122 ms: 0%
        OpRecord("link0->1", "send", 0, 0.010, 0.011, 4, 4),  # not a compute
        OpRecord("stage0", "compute", 7, 0.2, 0.3, 1, 1),
    ]  # plan unknown: skipped
    cpu = {(0, 0): 0.005, (1, 0): 0.010}  # stage 0 ran 5 of its 10 ms: waited 5 ms for a core
    rows = step_costs(LinearCost(), STAGES, plans, ops, run=3, cpu_s=cpu)
    assert [(r["stage"], r["step_id"]) for r in rows] == [(0, 0), (1, 0), (0, 1)]
    assert rows[0]["cpu_error"] == pytest.approx(0.6) and rows[1]["cpu_error"] == pytest.approx(0.0)
    assert rows[2]["cpu_s"] == -1.0 and rows[2]["cpu_error"] is None  # no CPU reading: left out of cpu stats
    assert [r["error"] for r in rows] == pytest.approx([-0.2, 0.0, 0.0])
    assert rows[0]["predicted_s"] == pytest.approx(0.008) and rows[0]["run"] == 3
    assert rows[2]["decode_ctx_tokens"] == 101 and rows[2]["num_prefill_tokens"] == 60
    s = summarize_steps(rows)
    assert s["steps"] == 3 and s["median_error"] == pytest.approx(0.0)
    assert s["median_cpu_error"] == pytest.approx(0.3) and s["median_cpu_share"] == pytest.approx(0.75)
    assert s["by_stage"]["0"]["steps"] == 2 and s["by_stage"]["1"]["median_abs_error"] == pytest.approx(0.0)
    assert s["by_tokens"]["2-4"]["median_error"] == pytest.approx(-0.1)  # the two 4-token steps
    assert s["by_tokens"]["17-64"]["steps"] == 1
    table = format_steps(s)
    assert "step-level cost error" in table and "stage 1" in table and "17-64 tokens" in table
    assert steps_csv(rows).splitlines()[0].startswith("run,stage,step_id")
    assert "by_run" not in s  # one repeat: nothing to compare
    again = step_costs(LinearCost(), STAGES, plans, [OpRecord("stage0", "compute", 0, 0.0, 0.016, 4, 4)], run=4)
    two = summarize_steps(rows + again)
    assert two["by_run"]["4"]["median_error"] == pytest.approx(-0.5) and "engine run 3" in format_steps(two)
    assert "cpu/wall" in table and "+60.0%" in format_steps(summarize_steps(rows[:1]))
    assert summarize_steps([]) == {} and "no engine micro-batch" in format_steps({})


def test_interrupted_computes_are_counted_and_compared():
    plans = {k: _plan(k, 4) for k in range(4)}  # 8 ms predicted on stage 0
    ops = [
        OpRecord("stage0", "compute", k, 0.02 * k, 0.02 * k + t, 4, 4) for k, t in enumerate((8e-3, 10e-3, 16e-3, 8e-3))
    ]
    switches = {(0, 0): 0, (0, 1): 1, (0, 2): 3}  # step 3: no reading (e.g. not Linux)
    rows = step_costs(LinearCost(), STAGES, plans, ops, preempted=switches)
    assert [r["preempted"] for r in rows] == [0, 1, 3, -1]
    s = summarize_steps(rows)
    assert s["preempted_share"] == pytest.approx(2 / 3)  # of the 3 computes with a reading
    assert s["median_error_preempted"] == pytest.approx(-0.35)  # -20% and -50%
    assert s["median_error_not_preempted"] == pytest.approx(0.0)
    line = [x for x in format_steps(s).splitlines() if x.startswith("stage 0:")]
    assert line == [
        "stage 0: 67% of computes interrupted by another thread or process (median error -35.0%, the others +0.0%)"
    ]
    calm = summarize_steps(step_costs(LinearCost(), STAGES, plans, ops[:1], preempted={(0, 0): 0}))
    assert calm["preempted_share"] == 0.0 and "interrupted" not in format_steps(calm)
    unknown = summarize_steps(step_costs(LinearCost(), STAGES, plans, ops))
    assert unknown["preempted_share"] is None and "interrupted" not in format_steps(unknown)
    assert "preempted" in steps_csv(rows).splitlines()[0]


def test_token_buckets_cover_every_size():
    assert [bucket_of(n) for n in (1, 3, 8, 9, 64, 65, 300, 10**6)] == [
        "1",
        "2-4",
        "5-8",
        "9-16",
        "17-64",
        "65-256",
        ">=257",
        ">=257",
    ]


def test_steps_split_by_plan_class_with_the_level_free_difference():
    plans = {0: _plan(0, 4), 1: _plan(1, 1, prefill=60), 2: _plan(2, 0, prefill=30)}
    ops = [
        OpRecord("stage0", "compute", 0, 0.0, 0.010, 4, 4),  # decode, predicted 8 ms: -20%
        OpRecord("stage1", "compute", 0, 0.010, 0.020, 4, 4),  # decode, 10 ms: 0%
        OpRecord("stage0", "compute", 1, 0.020, 0.264, 61, 2),  # mixed, 122 ms: -50%
        OpRecord("stage0", "compute", 2, 0.3, 0.36, 30, 1),  # prefill, 60 ms: 0%
    ]
    s = summarize_steps(step_costs(LinearCost(), STAGES, plans, ops))
    assert {k: d["steps"] for k, d in s["by_class"].items()} == {"prefill": 1, "mixed": 1, "decode": 2}
    assert s["by_class"]["decode"]["median_error"] == pytest.approx(-0.1)
    # median of prefill + mixed (-25%) minus median of decodes (-10%); no CPU reading: the wall clock
    assert s["prefill_minus_decode"] == pytest.approx(-0.15) and s["prefill_minus_decode_clock"] == "wall"
    table = format_steps(s)
    assert "\nmixed " in table and "\ndecode " in table
    assert "prefill and mixed computes against decodes: -15.0% (median error minus median error, wall clock" in table
    cpu = {(0, 0): 0.010, (1, 0): 0.010, (0, 1): 0.122, (0, 2): 0.030}  # CPU clock: -20, 0, 0, +100%
    s = summarize_steps(step_costs(LinearCost(), STAGES, plans, ops, cpu_s=cpu))
    assert s["prefill_minus_decode_clock"] == "thread CPU" and s["prefill_minus_decode"] == pytest.approx(0.6)
    only_decodes = summarize_steps(step_costs(LinearCost(), STAGES, plans, ops[:2]))
    assert only_decodes["prefill_minus_decode"] is None and "against decodes" not in format_steps(only_decodes)
