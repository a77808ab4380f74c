"""The engine with real stage processes: greedy output equals the reference forward, every policy
conserves requests and frees its KV, aborts, and the output files have the simulator's form."""

from __future__ import annotations

import csv
import json

import pytest

torch = pytest.importorskip("torch")

from engine.model import build_stage, reference_generate  # noqa: E402
from engine.run import EngineOptions, make_prompts, run_engine  # noqa: E402
from ppsim.deployment import prepare  # noqa: E402
from ppsim.policy.requests import Request  # noqa: E402
from ppsim.run import run_scenario  # noqa: E402
from tests.engine_scenarios import tiny_scenario  # noqa: E402


def scenario(pp: int = 2, policy: str = "vllm-batch-queue", **engine):
    """Tiny model; prompts 20..60 tokens with a 32-token budget (chunked), outputs 1..11 (some prefill-only)."""
    return tiny_scenario(policy, pp, 32, seed=3, range_ratio=0.9, **engine)


_REF: dict[int, list[int]] = {}


def reference(s) -> dict[int, list[int]]:
    """Greedy tokens of a single-process, no-cache forward over the same weights and prompts."""
    if not _REF:
        torch.set_num_threads(1)
        full = build_stage(prepare(s).shape, 0, 8, True, True, s.seed, torch.float32)
        reqs = prepare(s).requests
        prompts = make_prompts(reqs, 2048, s.seed)
        _REF.update({r.req_id: reference_generate(full, prompts[r.req_id], r.output_len) for r in reqs})
    return _REF


def check_run(run, s) -> None:
    n = len(prepare(s).requests)
    assert run.summary["completed"] == n and run.summary["failed"] == 0
    assert run.info["kv_blocks_used_at_end"] == 0
    assert run.result.tokens == reference(s)


def test_pp2_matches_reference_and_simulator_schema(tmp_path):
    s = scenario()
    reqs = prepare(s).requests
    assert any(r.output_len == 1 for r in reqs) and any(r.prompt_len > 32 for r in reqs)
    run = run_engine(s, tmp_path / "engine")
    check_run(run, s)
    compute = [o for o in run.ops if o.kind == "compute"]
    assert {o.track for o in compute} == {"stage0", "stage1"}
    assert any(o.num_prefill_tokens and o.num_decode_tokens for o in compute), "no mixed batch ran"
    assert any(o.track == "link0->1" and o.end_s >= o.start_s and o.nbytes > 0 for o in run.ops)
    for o in compute:  # every step runs on stage 0 before stage 1
        s1 = next(x for x in compute if x.track == "stage1" and x.step_id == o.step_id)
        assert o.track == "stage1" or o.end_s <= s1.start_s + 1e-6
    # same files, columns, summary keys and trace form as the simulator
    sim_dir = tmp_path / "sim"
    run_scenario(s, sim_dir, save_detailed=True)
    eng_dir = tmp_path / "engine"
    sim_files = {p.name for p in sim_dir.iterdir()}
    assert sim_files <= {p.name for p in eng_dir.iterdir()}
    for name in ("requests.csv", "stage_ops.csv"):
        heads = [next(csv.reader((d / name).open())) for d in (sim_dir, eng_dir)]
        assert heads[0] == heads[1]
    sums = [json.loads((d / "summary.json").read_text()) for d in (sim_dir, eng_dir)]
    assert set(sums[0]) == set(sums[1])
    traces = [json.loads((d / "trace.json").read_text())["traceEvents"] for d in (sim_dir, eng_dir)]
    sim_x = next(e for e in traces[0] if e["ph"] == "X")
    eng_x = next(e for e in traces[1] if e["ph"] == "X")
    assert set(sim_x) == set(eng_x) and set(sim_x["args"]) == set(eng_x["args"])
    assert "core_gc" in json.loads((eng_dir / "engine.json").read_text())  # the core's collections, recorded
    tokens = json.loads((eng_dir / "tokens.json").read_text())
    assert {int(k): v for k, v in tokens.items()} == reference(s)
    check_stage_loop(eng_dir, compute)


def check_stage_loop(eng_dir, compute) -> None:
    """stage_loop.csv: one row per stage compute, the loop's readings in order around it, and the
    experiment that splits the restarts reads it."""
    from experiments.validation import stage_loop
    from ppsim.metrics.records import LOOP_FIELDS

    with (eng_dir / "stage_loop.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == LOOP_FIELDS and len(rows) == len(compute)
    ops = {(o.track, o.step_id): o for o in compute}
    for r in rows:
        x = {k: float(v) for k, v in r.items()}
        o = ops[(f"stage{int(x['stage'])}", int(x["step_id"]))]
        assert (x["start_s"], x["end_s"], x["num_reqs"]) == (o.start_s, o.end_s, o.num_reqs)
        assert 0 <= x["ready_s"] <= x["start_s"] <= x["end_s"]
        assert x["recv_done_s"] == -1 if x["stage"] == 0 else x["ready_s"] <= x["recv_done_s"] <= x["start_s"]
        assert min(x["ctrl_s"], x["out_s"], x["out_cpu_s"], x["out_switched"]) >= 0
    restarts = stage_loop.restarts(stage_loop.read_loop(eng_dir / "stage_loop.csv"), 1, [])
    assert all(abs(sum(r[p] for p in stage_loop.PARTS) - r["restart"]) < 1e-9 for r in restarts)
    assert stage_loop.main([str(eng_dir)]) == 0


def test_pp1_matches_reference(monkeypatch):
    """Also: the engine core ran at the engine's thread switch interval and gave the caller's back, and
    with the caller's heap frozen (engine/core_gc.py), unfrozen after."""
    import gc
    import sys

    import engine.run as er
    from engine.transport import SWITCH_INTERVAL_S, switch_interval

    seen, before = [], sys.getswitchinterval()

    def spy(seconds=SWITCH_INTERVAL_S):
        seen.append(seconds)
        return switch_interval(seconds)

    monkeypatch.setattr(er, "switch_interval", spy)
    s = scenario(pp=1, policy="vllm-sync")
    run = run_engine(s)
    check_run(run, s)
    assert seen == [SWITCH_INTERVAL_S] and sys.getswitchinterval() == before
    core = run.info["core_gc"]
    assert core["frozen_objects"] > 10_000 and gc.get_freeze_count() == 0  # this process's torch, at least
    assert len(core["collections_by_generation"]) == 3 and core["longest_pause_s"] <= core["pause_s"]


def test_switch_interval_is_restored_even_on_error():
    import sys

    from engine.transport import switch_interval

    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError), switch_interval(0.0003):
        assert sys.getswitchinterval() == pytest.approx(0.0003)
        raise RuntimeError("a fault inside the run")
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    "policy, engine",
    [
        ("vllm-sync", {}),
        ("vllm-batch-queue", {"pp_throttle": True}),
        ("sglang-ring", {}),
        ("vllm-mrv2", {}),  # async scheduling with PP (vllm-async is PP=1 only)
    ],
)
def test_policies_conserve_requests_and_free_kv(policy, engine):
    s = scenario(policy=policy, **engine)
    run = run_engine(s)
    check_run(run, s)
    if policy == "vllm-mrv2":
        assert run.info["async_filled_tokens"] > 0, "no decode was scheduled ahead of its input token"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["trtllm-slots", "llamacpp"])
def test_more_policies_run_in_the_engine(policy):
    s = scenario(policy=policy)
    run = run_engine(s)
    check_run(run, s)
    if policy == "vllm-mrv2":  # decodes scheduled ahead of their input token, filled from the broadcast
        assert run.info["async_filled_tokens"] > 0 and run.info["sampled_forwarded_by_core"] == 0


def test_aborts_free_kv_on_every_stage():
    s = scenario()
    reqs = [
        Request(0, 0.0, 30, 8, abort_after_tokens=3),  # cancelled mid-decode
        Request(1, 0.0, 400, 4, abort_after_s=0.05),  # long prompt, 32-token chunks: cancelled mid-prefill
        Request(2, 0.0, 25, 5),
    ]
    run = run_engine(s, options=EngineOptions(kv_num_blocks=64), requests=reqs)
    status = {r.req_id: r.status for r in run.requests}
    assert status == {0: "aborted", 1: "aborted", 2: "finished"}
    assert len(run.result.tokens[0]) == 3 and len(run.result.tokens[1]) < 4
    assert run.info["kv_blocks_used_at_end"] == 0
    full = build_stage(prepare(s).shape, 0, 8, True, True, s.seed, torch.float32)
    prompts = make_prompts(reqs, 2048, s.seed)
    assert run.result.tokens[2] == reference_generate(full, prompts[2], 5)
    assert run.result.tokens[0] == reference_generate(full, prompts[0], 3)


def test_cancel_between_schedule_and_launch_runs_on_the_scratch_block(monkeypatch):
    """The driver takes the client's cancellations before every action, so one can land between a
    plan's schedule and its launch, after its blocks were freed (a held-out draw, seed 34, died on it:
    "block table holds 0 tokens"). Forced here at the launch of request 1's second prefill chunk: the
    stages run the chunk on the scratch block, the request ends cancelled, the others match the reference."""
    from engine.executor import EngineExecutor

    launch, hit = EngineExecutor.launch, []

    def cancel_first(self, plan):
        if not hit and any(it.req_id == 1 and it.start > 0 for it in plan.items):
            hit.append(plan.step_id)
            self.driver.abort(1, self.now())  # as _before_action's client pump would
        launch(self, plan)

    monkeypatch.setattr(EngineExecutor, "launch", cancel_first)
    s = scenario()
    reqs = [Request(0, 0.0, 30, 6), Request(1, 0.0, 200, 4), Request(2, 0.0, 25, 5)]
    run = run_engine(s, options=EngineOptions(kv_num_blocks=64), requests=reqs)
    assert hit, "request 1's second chunk was never launched"
    assert {r.req_id: r.status for r in run.requests} == {0: "finished", 1: "aborted", 2: "finished"}
    assert run.info["kv_blocks_used_at_end"] == 0
    full = build_stage(prepare(s).shape, 0, 8, True, True, s.seed, torch.float32)
    prompts = make_prompts(reqs, 2048, s.seed)
    assert run.result.tokens[0] == reference_generate(full, prompts[0], 6)
    assert run.result.tokens[2] == reference_generate(full, prompts[2], 5)


def test_block_table_for_a_cancelled_request_covers_its_context_on_the_scratch_block():
    from engine.executor import block_table_for
    from engine.kvcache import build_batch
    from engine.transport import StepItem
    from ppsim.policy.kv import BlockPool
    from ppsim.policy.plan import PlanItem

    pool = BlockPool(num_blocks=8, block_size=16)
    assert pool.allocate(7, 40)
    it = PlanItem(7, 32, 8, True, True)
    own = block_table_for(pool, it, True, scratch_block=8)
    assert len(own) == 3 and 8 not in own
    pool.free(7)
    table = block_table_for(pool, it, False, scratch_block=8)
    assert table == (8, 8, 8)
    batch = build_batch((StepItem(7, 32, 8, True, table),), block_size=16)
    assert batch.num_tokens == 8 and int(batch.slots.min()) >= 8 * 16 and int(batch.slots.max()) < 9 * 16
