"""Exact-trace tests: hand-computed stage start/end times on tiny scenarios."""

import dataclasses

import simpy

from ppsim.bubble import ConstantCost
from ppsim.config import build_scenario
from ppsim.cost.base import StageSpec
from ppsim.deployment import prepare
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.sim.executor import simulate
from ppsim.sim.pipeline import PipelineSim


class PerStageCost(ConstantCost):
    def __init__(self, times_s, link_s):
        super().__init__(0.0, link_s)
        self.times_s = times_s

    def stage_time(self, stage, plan):
        return self.times_s[stage.index]


def test_two_stages_three_microbatches_exact():
    # stage0 takes 2, stage1 takes 3, each link send takes 1 (ms). A stage waits for its previous
    # send before its next compute (vLLM worker waits on _pp_send_work).
    env = simpy.Environment()
    ops = []
    stages = (StageSpec(0, 0, 1, True, False), StageSpec(1, 1, 2, False, True))
    pipe = PipelineSim(env, stages, PerStageCost([0.002, 0.003], 0.001), lambda n: 0.0, ops)
    done = [pipe.launch(make_plan(m, [PlanItem(m, 0, 4, True, True)])) for m in range(3)]
    finish = {}
    for m, ev in enumerate(done):
        ev.callbacks.append(lambda _e, m=m: finish.__setitem__(m, env.now))
    env.run()
    got = [(o.track, o.step_id, round(o.start_s * 1e3, 9), round(o.end_s * 1e3, 9)) for o in ops]
    assert got == [
        ("stage0", 0, 0.0, 2.0),
        ("link0->1", 0, 2.0, 3.0),
        ("stage0", 1, 3.0, 5.0),
        ("link0->1", 1, 5.0, 6.0),
        ("stage1", 0, 3.0, 6.0),
        ("stage0", 2, 6.0, 8.0),
        ("link0->1", 2, 8.0, 9.0),
        ("stage1", 1, 6.0, 9.0),
        ("stage1", 2, 9.0, 12.0),
    ]
    assert {m: round(t * 1e3, 9) for m, t in finish.items()} == {0: 6.0, 1: 9.0, 2: 12.0}


def test_engine_core_single_request_token_times():
    # pp=2, each stage 1 ms, free links and CPU: prefill (step 0) returns at 2 ms; the empty step 1
    # makes the core block on step 0; each decode then takes one full pipeline pass.
    s = build_scenario(overrides={"model": "tiny", "cluster": {"pipeline_parallel_size": 2}})
    prep = prepare(s)
    from ppsim.policy.requests import Request

    prep = dataclasses.replace(prep, cost=ConstantCost(0.001), requests=[Request(0, 0.0, 4, 3)])
    res = simulate(prep)
    rec = res.requests[0]
    assert [round(t * 1e3, 9) for t in rec.token_times] == [2.0, 4.0, 6.0]
    assert rec.status == "finished"
    computes = [(o.track, o.step_id, round(o.start_s * 1e3, 9)) for o in res.ops if o.kind == "compute"]
    assert computes == [
        ("stage0", 0, 0.0),
        ("stage1", 0, 1.0),
        ("stage0", 2, 2.0),
        ("stage1", 2, 3.0),
        ("stage0", 4, 4.0),
        ("stage1", 4, 5.0),
    ]


class LaunchCost(PerStageCost):
    """Launch messages take longer for bigger micro-batches (as the engine's pickled control path)."""

    def launch_time(self, n):
        return 0.001 * n


def test_launch_latency_delays_first_stage_and_keeps_order():
    env = simpy.Environment()
    ops = []
    stages = (StageSpec(0, 0, 1, True, False), StageSpec(1, 1, 2, False, True))
    pipe = PipelineSim(env, stages, LaunchCost([0.002, 0.002], 0.0), lambda n: 0.0, ops)
    big = make_plan(0, [PlanItem(i, 0, 1, True, True) for i in range(3)])  # arrives at 3 ms
    small = make_plan(1, [PlanItem(9, 0, 1, True, True)])  # would arrive at 1 ms, but not before `big`
    pipe.launch(big)
    pipe.launch(small)
    env.run()
    got = [(o.step_id, round(o.start_s * 1e3, 9)) for o in ops if o.track == "stage0"]
    assert got == [(0, 3.0), (1, 5.0)]


def test_overlapped_sends_do_not_hold_the_next_compute():
    # same pipeline as the first test, but sends overlap compute (SGLang / TensorRT-LLM): stage 0 runs
    # back to back; each send waits only for the link to be free.
    env = simpy.Environment()
    ops = []
    stages = (StageSpec(0, 0, 1, True, False), StageSpec(1, 1, 2, False, True))
    pipe = PipelineSim(env, stages, PerStageCost([0.002, 0.003], 0.001), lambda n: 0.0, ops, overlap_sends=True)
    for m in range(3):
        pipe.launch(make_plan(m, [PlanItem(m, 0, 4, True, True)]))
    env.run()
    got = [(o.track, o.step_id, round(o.start_s * 1e3, 9), round(o.end_s * 1e3, 9)) for o in ops]
    assert sorted(got, key=lambda x: (x[0], x[1])) == [
        ("link0->1", 0, 2.0, 3.0),
        ("link0->1", 1, 4.0, 5.0),
        ("link0->1", 2, 6.0, 7.0),
        ("stage0", 0, 0.0, 2.0),
        ("stage0", 1, 2.0, 4.0),
        ("stage0", 2, 4.0, 6.0),
        ("stage1", 0, 3.0, 6.0),
        ("stage1", 1, 6.0, 9.0),
        ("stage1", 2, 9.0, 12.0),
    ]
