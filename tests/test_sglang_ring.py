"""The sglang-ring policy: conservation, per-micro-batch cap, chunked pipeline prefill, TTFT theory."""

import dataclasses

import pytest

from ppsim.config import build_scenario
from ppsim.deployment import prepare
from ppsim.policy.requests import Request
from ppsim.sim.executor import Simulation


class LinearCost:
    """Idealized stage: t per token, free links, no CPU, instant return (the textbook setting)."""

    def __init__(self, per_token_s: float = 1e-5) -> None:
        self.t = per_token_s

    def stage_time(self, stage, plan):
        return plan.num_tokens * self.t

    def link_time(self, nbytes):
        return 0.0

    def cpu_time(self, kind, n):
        return 0.0

    def launch_time(self, n):
        return 0.0

    def return_time(self, n):
        return 0.0


def scenario(pp=4, **engine):
    eng = {"policy": "sglang-ring", **engine}
    return build_scenario(
        None,
        {
            "model": "tiny",
            "cluster": {"pipeline_parallel_size": pp},
            "engine": eng,
            "workload": {
                "num_prompts": 40,
                "request_rate": 50.0,
                "random_input_len": 600,
                "random_output_len": 20,
                "random_range_ratio": 0.5,
            },
            "seed": 3,
        },
    )


def run(s, requests=None, cost=None):
    prep = prepare(s, requests)
    if cost is not None:
        prep = dataclasses.replace(prep, cost=cost)
    sim = Simulation(prep)
    return sim, sim.run()


def stage_ops(res, track):
    return {o.step_id: o for o in res.ops if o.track == track and o.kind == "compute"}


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("dynamic", [False, True])
def test_conservation_and_cap(depth, dynamic):
    s = scenario(
        pp=4,
        max_num_seqs=8,
        chunked_prefill_size=256,
        pp_async_batch_depth=depth,
        enable_dynamic_chunking=dynamic,
        dynamic_chunking_coefficients=(1e-6, 0.01, 0.1),
    )
    sim, res = run(s)
    assert all(r.status == "finished" for r in res.requests)
    assert all(len(r.token_times) == r.output_tokens for r in res.requests)
    assert all(t2 >= t1 for r in res.requests for t1, t2 in zip(r.token_times, r.token_times[1:], strict=False))
    cap = max(8 // 4, 1)
    assert sim.scheduler.limits.max_batch_reqs == cap
    ops = stage_ops(res, "stage0").values()
    assert ops and max(o.num_reqs for o in ops) <= cap
    assert max(o.num_prefill_tokens for o in ops) <= 256
    assert sim.core.loop_size == 4 + depth
    assert sim.pool.num_used == 0


def test_explicit_micro_batch_cap_and_prefill_priority():
    s = scenario(pp=2, max_num_seqs=64, pp_max_micro_batch_size=3, chunked_prefill_size=4096)
    sim, res = run(s)
    ops = stage_ops(res, "stage0").values()
    assert max(o.num_reqs for o in ops) == 3
    # PP disables mixed chunks: a micro-batch is all prefill or all decode
    assert all(o.num_prefill_tokens == 0 or o.num_decode_tokens == 0 for o in ops)


def test_chunk_i_plus_1_enters_stage0_while_chunk_i_is_on_stage1():
    s = scenario(pp=4, chunked_prefill_size=1000)
    req = Request(0, 0.0, 4000, 2)
    _, res = run(s, [req])
    s0, s1 = stage_ops(res, "stage0"), stage_ops(res, "stage1")
    chunks = sorted(sid for sid, o in s0.items() if o.num_prefill_tokens)
    assert [s0[sid].num_prefill_tokens for sid in chunks] == [1000] * 4
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert s0[b].start_s < s1[a].end_s  # chunk i+1 computes on stage 0 while chunk i is on stage 1
        assert s1[a].start_s <= s0[b].end_s


@pytest.mark.parametrize("pp,length,chunk", [(2, 4000, 500), (4, 4000, 250), (4, 3840, 960), (8, 4000, 125)])
def test_chunked_pipeline_prefill_ttft_speedup(pp, length, chunk):
    """TTFT = (L + (P - 1) S) t with chunks vs L P t without: speedup P / (1 + (P - 1) S / L)."""

    def ttft(c):
        s = scenario(pp=pp, chunked_prefill_size=c, max_prefill_tokens=length)
        _, res = run(s, [Request(0, 0.0, length, 1)], LinearCost())
        return res.requests[0].first_token_s

    speedup = ttft(length) / ttft(chunk)
    assert speedup == pytest.approx(pp / (1 + (pp - 1) * chunk / length), rel=1e-9)


@pytest.mark.parametrize("chunk,max_prefill,expect", [(12288, None, 12288), (12288, 8192, 8192), (4096, None, 4096)])
def test_prefill_budget_is_sglangs_own(chunk, max_prefill, expect):
    """PrefillAdder: a chunk of chunked_prefill_size within max_prefill_tokens (default 16384); vLLM's
    max_num_batched_tokens (8192 by default) plays no part."""
    eng = {"chunked_prefill_size": chunk} | ({"max_prefill_tokens": max_prefill} if max_prefill else {})
    sim, _ = run(scenario(pp=2, **eng), [Request(0, 0.0, 30000, 1)], LinearCost())
    assert sim.scheduler.limits.max_num_batched_tokens == expect
    assert scenario(pp=2).engine.policy.max_prefill_tokens == 16384


def test_prefill_chunks_follow_chunked_prefill_size():
    from ppsim.policy.actions import Launch

    sizes = []
    s = build_scenario(
        None,
        {
            "model": "qwen2.5-7b",
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": "sglang-ring", "chunked_prefill_size": 12288},
        },
    )
    prep = dataclasses.replace(prepare(s, [Request(0, 0.0, 30000, 1)]), cost=LinearCost())
    Simulation(
        prep, observer=lambda a: sizes.append(a.plan.num_tokens) if type(a) is Launch and a.plan.items else None
    ).run()
    assert sizes == [12288, 12288, 30000 - 2 * 12288]


def test_async_depth_hides_the_straggler():
    """Depth 0: the last rank's post-processing sits between its batches; depth >= 1 hides it, at the
    price of one decode per pp + depth iterations (same 80 requests spread over more slots)."""
    idle, tpot = {}, {}
    for depth in (0, 1):
        s = build_scenario(
            None,
            {
                "model": "llama-3-70b",
                "cluster": {"pipeline_parallel_size": 4},
                "engine": {
                    "policy": "sglang-ring",
                    "max_num_seqs": 80,
                    "pp_async_batch_depth": depth,
                    "pp_max_micro_batch_size": 80 // (4 + depth),
                },
            },
        )
        _, res = run(s, [Request(i, 0.0, 64, 100) for i in range(80)])
        ops = sorted(stage_ops(res, "stage0").values(), key=lambda o: o.start_s)
        gaps = sum(max(0.0, b.start_s - a.end_s) for a, b in zip(ops, ops[1:], strict=False))
        idle[depth] = gaps / (ops[-1].end_s - ops[0].start_s)
        tpot[depth] = sum((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) for r in res.requests)
    assert idle[1] < idle[0]
    assert tpot[1] > tpot[0]


def test_determinism():
    s = scenario(pp=4, enable_dynamic_chunking=True, chunked_prefill_size=512)
    _, a = run(s)
    _, b = run(s)
    assert [r.token_times for r in a.requests] == [r.token_times for r in b.requests]


def test_fit_chunks_cli(ppsim_cli, tmp_path):
    png = tmp_path / "fit.png"
    r = ppsim_cli(
        "fit-chunks",
        "--model",
        "tiny",
        "-pp",
        "4",
        "--num-prompts",
        "4",
        "--request-rate",
        "inf",
        "--random-input-len",
        "3500",
        "--random-output-len",
        "2",
        "--chunk-sizes",
        "512,1024",
        "--smooth-factors",
        "0.5,1",
        "--plot",
        str(png),
    )
    assert r.returncode == 0, r.stderr
    assert "best: --chunked-prefill-size" in r.stdout and "fixed-chunk baseline" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_last_rank_defers_the_output_send_by_depth_iterations(depth, fast):
    """event_loop_pp: with pp_async_batch_depth = d the last rank sends micro-batch b's outputs at its
    iteration b + d (after receiving that iteration's hidden states), not when b finishes; the
    per-event reference pipeline and the closed form alike."""
    import simpy

    from ppsim.bubble import ConstantCost
    from ppsim.cost.base import StageSpec
    from ppsim.metrics.oplog import OpLog
    from ppsim.policy.plan import PlanItem, make_plan
    from ppsim.sim.fast import FastPipeline
    from ppsim.sim.pipeline import PipelineSim

    env = simpy.Environment()
    stages = (StageSpec(0, 0, 1, True, False), StageSpec(1, 1, 2, False, True))
    kind = FastPipeline if fast else PipelineSim
    pipe = kind(env, stages, ConstantCost(1e-3), lambda n: 0.0, OpLog(), overlap_sends=True, defer_outputs=depth)
    plans = [make_plan(i, [PlanItem(i, 0, 4, True, True)]) for i in range(3)]
    done_at = {}

    def core():
        for p in plans:  # one plan every 5 ms: the pipeline (2 ms deep) drains in between
            pipe.launch(p).callbacks.append(lambda _e, s=p.step_id: done_at.setdefault(s, env.now))
            yield env.timeout(5e-3)
        for p in plans:
            pipe.awaiting(p.step_id)
            yield pipe.done[p.step_id]

    env.run(until=env.process(core()))
    # plan 0 finishes on the last stage at 2 ms; plan k reaches the last stage at 5k + 1 ms
    expect0 = 2e-3 if depth == 0 else (5 * depth + 1) * 1e-3
    assert done_at[0] == pytest.approx(expect0)
    if depth:
        assert done_at[2] == pytest.approx(15e-3)  # no later iteration: sent when the core waits for it
