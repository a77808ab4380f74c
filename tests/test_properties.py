"""Hypothesis properties that every registered pipeline policy must keep, on random workloads."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ppsim.policy.pipelines import BUILDERS, mrv2_decode_cap, pp_throttle_cap
from ppsim.policy.requests import Request
from ppsim.policy.sglang import micro_batch_cap
from tests.policy_harness import ASYNC_POLICIES, own_knobs, run_policy

POLICIES = sorted(BUILDERS)


@hs.composite
def workloads(draw: hs.DrawFn) -> list[Request]:
    n = draw(hs.integers(1, 10))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(hs.sampled_from([0.0, 0.0, 0.001, 0.02]))
        out = draw(hs.integers(1, 10))
        abort_tok = draw(hs.one_of(hs.none(), hs.integers(1, 10))) if draw(hs.booleans()) else None
        abort_after = draw(hs.floats(0, 0.01)) if draw(hs.integers(0, 5)) == 0 else None
        reqs.append(
            Request(
                i,
                t,
                draw(hs.integers(1, 160)),
                out,
                abort_tok if abort_tok is not None and abort_tok < out else None,
                abort_after,
            )
        )
    return reqs


def _ops_index(ops):  # (track, step) -> (start, end)
    return {(o.track, o.step_id): (o.start_s, o.end_s) for o in ops if o.kind == "compute"}


def check_run(
    policy: str, pp: int, reqs: list[Request], max_num_seqs: int, mnbt: int, blocks: int, engine: dict
) -> None:
    res, trace = run_policy(
        policy, pp, reqs, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt, num_blocks=blocks, engine=engine
    )
    by_id = {r.req_id: r for r in reqs}
    # Conservation: each request ends exactly once; output counts match.
    for rec in res.requests:
        assert rec.status in ("finished", "aborted", "rejected"), rec
        n = len(rec.token_times)
        if rec.status == "finished":
            assert n == rec.output_tokens
        else:
            assert n < rec.output_tokens or rec.status == "rejected"
        limit = by_id[rec.req_id].abort_after_tokens
        if rec.status == "aborted" and limit is not None and by_id[rec.req_id].abort_after_s is None:
            assert n == limit
    # Ordering: tokens reach the core in order, one at a time.
    for rid, idx in trace.emitted.items():
        assert idx == list(range(1, len(idx) + 1)), (rid, idx)
    # KV: never over-committed, all free at the end.
    for pool in res.pools:
        assert pool.peak_used <= pool.num_blocks
        assert pool.num_used == 0 and pool.holders() == 0
    # Budgets: each engine's rule, on the knob values the scenario's policy object holds (its defaults
    # included, read from the object rather than restated here).
    pol = res.prepared.scenario.engine.policy
    throttle = pp_throttle_cap(max_num_seqs, pp) if pp > 1 and getattr(pol, "pp_throttle", False) else None
    ring_cap = micro_batch_cap(max_num_seqs, pp, pol.pp_max_micro_batch_size) if policy == "sglang-ring" else None
    if policy == "trtllm-slots":
        ring_cap = pol.max_batch_size
    dcap = mrv2_decode_cap(max_num_seqs, pp) if getattr(pol, "mrv2_decode_cap", False) else None
    for plan in trace.launches:
        assert plan.num_tokens <= mnbt and plan.num_reqs <= max_num_seqs
        if policy == "llamacpp":
            assert plan.num_tokens <= pol.llamacpp_ubatch_tokens
        if throttle is not None:
            assert sum(it.start == 0 for it in plan.items) <= throttle
        if dcap is not None:
            assert sum(not it.is_prefill for it in plan.items) <= dcap
        if ring_cap is not None:
            assert plan.num_reqs <= ring_cap
    if policy == "no-pp":
        return  # replicas reuse step ids; each is a one-stage synchronous core
    # Ordering in the pipeline: a request's next sampling item starts on stage 0 only after the
    # previous one left the last stage (a decode is never in two in-flight micro-batches), and its
    # prefill chunks reach every stage in order; decode spacing for the async policies.
    ops = _ops_index(res.ops)
    last = f"stage{pp - 1}"
    seq: dict[tuple[int, int], list] = defaultdict(list)
    for plan in trace.launches:
        for it in plan.items:
            seq[(it.req_id, it.epoch)].append((plan.step_id, it))
    for items in seq.values():
        prev_sample = None
        for (step, it), (step2, it2) in zip(items, items[1:], strict=False):
            assert it2.start == it.start + it.num_tokens  # contiguous, in order
            for s in range(pp):
                a, b = ops.get((f"stage{s}", step)), ops.get((f"stage{s}", step2))
                if a and b:
                    assert b[0] >= a[1] - 1e-12
        for step, it in items:
            if not it.samples:
                continue
            if prev_sample is not None:
                done, start = ops.get((last, prev_sample)), ops.get(("stage0", step))
                if done and start:
                    assert start[0] >= done[1] - 1e-12
                if policy in ASYNC_POLICIES and pp > 1:
                    assert step - prev_sample >= pp
            prev_sample = step


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=workloads(),
    pp=hs.integers(1, 4),
    max_num_seqs=hs.integers(1, 6),
    mnbt=hs.integers(16, 200),
    blocks=hs.integers(6, 40),
    decode_cap=hs.booleans(),
    serialized=hs.booleans(),
    ub=hs.integers(8, 64),
    copies=hs.integers(1, 4),
    relay=hs.sampled_from(["sync", "async"]),
    routing=hs.sampled_from(["round-robin", "least-loaded"]),
    throttle=hs.booleans(),
    depth=hs.integers(0, 2),
    mb_cap=hs.one_of(hs.none(), hs.integers(1, 4)),
    chunked=hs.booleans(),
)
def test_policy_invariants(
    policy,
    reqs,
    pp,
    max_num_seqs,
    mnbt,
    blocks,
    decode_cap,
    serialized,
    ub,
    copies,
    relay,
    routing,
    throttle,
    depth,
    mb_cap,
    chunked,
):
    engine = {
        "mrv2_decode_cap": decode_cap,
        "pp_broadcast": "serialized" if serialized else "overlapped",
        "llamacpp_ubatch_tokens": ub,
        "llamacpp_n_copies": copies,
        "trtllm_relay": relay,
        "dp_routing": routing,
        "block_size": 16,
        "pp_throttle": throttle,
        "pp_async_batch_depth": depth,
        "pp_max_micro_batch_size": mb_cap,
        "max_batch_size": mb_cap or 2048,
        "enable_chunked_prefill": chunked,
    }
    if not chunked:  # every prompt must then fit one step (the scenario refuses it otherwise), and so must a
        # preempted request's recompute of its prompt and the tokens it had generated
        mnbt = max(mnbt, *(r.prompt_len + r.output_len for r in reqs))
    engine = own_knobs(policy, engine)
    if policy == "vllm-async":
        pp = 1  # vLLM runs V1 async scheduling at PP=1 only (the scenario refuses more)
    check_run(policy, pp, reqs, max_num_seqs, mnbt, blocks, engine)
