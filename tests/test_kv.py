"""KV sizing, unification across stages, admission and preemption."""

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config import build_scenario
from ppsim.cost.memory import stage_memory
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.models.shape import load_model
from ppsim.policy.kv import BlockPool, unify_num_blocks
from ppsim.policy.requests import Request
from ppsim.policy.scheduler import Scheduler, SchedulerLimits
from ppsim.run import run_scenario
from ppsim.units import GIB


def test_unify_is_minimum_over_stages():
    assert unify_num_blocks([120, 80, 95]) == 80
    s = build_scenario(overrides={"model": "llama-3-8b", "cluster": {"pipeline_parallel_size": 3}})
    prep = prepare(s)  # 32 layers over 3 stages: 10, 11, 11 -> the 11-layer stages have fewer blocks
    assert prep.num_blocks == min(m.num_blocks for m in prep.memory)
    assert len({m.num_blocks for m in prep.memory}) > 1


def test_stage_kv_pool_arithmetic():
    shape = load_model("llama-3-70b")
    prep = prepare(build_scenario(overrides={"model": "llama-3-70b"}))
    st = prep.topology.stages[1]  # a middle stage: 20 layers, no embedding/lm_head
    m = stage_memory(shape, st, 79.6, 0.9, 2.0, 16)
    layer_params = 8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672 + 2 * 8192
    assert m.weight_bytes == pytest.approx(20 * layer_params * 2)
    per_tok = 20 * 2 * 1024 * 2  # layers x (K+V) x kv_dim x bf16
    assert m.kv_bytes_per_token == per_tok
    assert m.num_blocks == int((79.6 * 0.9 * GIB - 2 * GIB - m.weight_bytes) // (per_tok * 16))


def test_model_that_does_not_fit_names_stage_and_shortfall():
    s = build_scenario(overrides={"model": "llama-3-70b", "cluster": {"pipeline_parallel_size": 1}})
    with pytest.raises(PPSimError, match=r"stage 0 .*short by [0-9.]+ GiB"):
        prepare(s)


def test_block_larger_than_memory_names_block_size():
    """One block bigger than the whole budget names --block-size first (the message named only -pp / -tp /
    --gpu-memory-utilization, and an absurd block size is now refused by its bound)."""
    shape = load_model("llama-3-70b")
    st = prepare(build_scenario(overrides={"model": "llama-3-70b"})).topology.stages[1]
    with pytest.raises(PPSimError, match=r"one KV block of 4096 tokens alone takes 0\.3 GiB: lower --block-size, or"):
        stage_memory(shape, st, 0.5, 0.5, 0.0, 4096)
    with pytest.raises(PPSimError, match=r"KV block\); raise --pipeline"):  # the block fits: -pp / -tp only
        stage_memory(shape, st, 0.5, 0.5, 0.0, 16)
    with pytest.raises(PPSimError, match="engine.block_size: Input should be less than or equal to 4096"):
        build_scenario(overrides={"engine": {"block_size": 100_000_000_000_000, "max_num_batched_tokens": 10**14}})


def test_block_pool_allocate_free():
    pool = BlockPool(4, 16)
    assert pool.allocate(1, 17)  # 2 blocks
    assert pool.num_free == 2
    assert not pool.allocate(2, 48)  # needs 3
    assert pool.num_free == 2 and pool.holders() == 1
    assert pool.allocate(1, 32)  # still 2 blocks
    assert pool.allocate(1, 33) and pool.num_free == 1
    pool.free(1)
    assert pool.num_free == 4 and pool.peak_used == 3


class _ListPool:
    """The pool as it was: a FIFO deque of every free id, returned ids appended."""

    def __init__(self, n: int, size: int) -> None:
        self.size, self.free_ids, self.tables = size, deque(range(n)), {}

    def allocate(self, rid: int, tokens: int) -> bool:
        table = self.tables.setdefault(rid, [])
        need = -(-tokens // self.size) - len(table)
        if need > len(self.free_ids):
            if not table:
                del self.tables[rid]
            return False
        table.extend(self.free_ids.popleft() for _ in range(max(0, need)))
        return True

    def free(self, rid: int) -> None:
        self.free_ids.extend(self.tables.pop(rid, ()))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 40),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 200)), max_size=80),
)
def test_block_pool_hands_out_the_ids_a_fifo_list_of_every_block_would(n, ops):
    pool, ref = BlockPool(n, 16), _ListPool(n, 16)
    for alloc, rid, tokens in ops:
        if alloc:
            assert pool.allocate(rid, tokens) == ref.allocate(rid, tokens)
        else:
            pool.free(rid)
            ref.free(rid)
        assert pool.num_free == len(ref.free_ids)
        assert {r: pool.block_table(r) for r in range(7)} == {r: ref.tables.get(r, []) for r in range(7)}


def test_a_pool_of_a_billion_blocks_costs_the_blocks_in_use():
    pool = BlockPool(10**9, 1)  # block size 1 on a large GPU: the old free list took tens of GB
    assert pool.allocate(0, 1000) and pool.block_table(0)[-1] == 999
    pool.free(0)
    assert pool.allocate(1, 1001) and pool.block_table(1)[:2] == [1000, 1001] and pool.num_free == 10**9 - 1001


def test_admission_waits_for_blocks():
    pool = BlockPool(8, 16)  # 128 tokens
    sch = Scheduler(SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1000), pool)
    for i in range(3):
        sch.add_request(Request(i, 0.0, 50, 4))  # 4 blocks each
    plan = sch.schedule()
    assert [it.req_id for it in plan.items] == [0, 1]  # the third does not fit
    assert len(sch.waiting) == 1


def test_request_longer_than_kv_is_rejected():
    pool = BlockPool(2, 16)
    sch = Scheduler(SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1000), pool)
    assert not sch.add_request(Request(0, 0.0, 40, 1))
    assert not sch.has_requests()


def test_preemption_under_kv_pressure_and_all_blocks_free_at_end():
    s = build_scenario(
        overrides={
            "model": "llama-3-70b",
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"gpu_memory_utilization": 0.9},
            "workload": {"num_prompts": 60, "request_rate": "inf", "random_input_len": 2000, "random_output_len": 400},
        }
    )
    out = run_scenario(s)
    assert out.summary["num_preemptions"] > 0
    assert out.summary["completed"] == 60
    assert out.summary["kv_peak_blocks_used"] <= out.summary["kv_num_blocks"]
