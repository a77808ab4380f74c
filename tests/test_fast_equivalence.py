"""The closed-form pipeline (``ppsim.sim.fast``) gives the per-event reference's answers.

Every registered policy runs each scenario twice, through the reference pipeline
(``simulate(..., reference=True)``, one SimPy process per stage) and through the fast path; the
per-request records, every token time (to 1e-9 s), every operation and the summary must agree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ppsim.config import build_scenario, step_budget_fields
from ppsim.deployment import kv_figures, prepare
from ppsim.metrics.io import requests_csv
from ppsim.metrics.summary import summarize
from ppsim.policy.pipelines import BUILDERS
from ppsim.policy.requests import Request
from ppsim.sim.executor import SimResult, simulate
from ppsim.sim.fast import FastPipeline
from ppsim.workload import synthetic

TOL_S = 1e-9
POLICIES = sorted(BUILDERS)


def _mixed(n: int = 24, seed: int = 3) -> list[Request]:
    """Staggered arrivals, varied lengths, aborts by token count and by time."""
    base = synthetic(
        build_scenario(
            None,
            {
                "workload": {
                    "num_prompts": n,
                    "request_rate": 400.0,
                    "random_input_len": 90,
                    "random_output_len": 9,
                    "random_range_ratio": 0.8,
                }
            },
        ).workload,
        seed,
    )
    out = []
    for r in base:
        if r.req_id % 5 == 1 and r.output_len > 2:
            r = replace(r, abort_after_tokens=r.output_len // 2)
        elif r.req_id % 7 == 2:
            r = replace(r, abort_after_s=0.004 * (r.req_id % 3))
        out.append(r)
    return out


# name -> (engine (budget: the per-step token budget in the policy's own knob; chunked prefill on where
# the policy has the switch, as TensorRT-LLM's default is off), cluster, workload, requests, kv blocks)
SCENARIOS: dict[str, tuple[dict, dict, dict, Any, int | None]] = {
    "mixed-aborts": ({"max_num_seqs": 8, "budget": 128}, {}, {}, _mixed, None),
    "tight-kv-preemption": ({"max_num_seqs": 8, "budget": 96}, {}, {}, _mixed, 24),
    "chunked-prefill": (
        {"max_num_seqs": 4, "budget": 48},
        {},
        {},
        lambda: [Request(i, 0.0005 * i, 150 + 13 * i, 5) for i in range(6)],
        None,
    ),
    "closed-loop": ({"max_num_seqs": 8, "budget": 128}, {}, {"max_concurrency": 3}, _mixed, None),
    "pp2-offline": (
        {"max_num_seqs": 6, "budget": 256},
        {"pipeline_parallel_size": 2},
        {},
        lambda: [Request(i, 0.0, 40 + i, 6 + i % 4) for i in range(14)],
        None,
    ),
}
PP1_ONLY = ("vllm-async",)  # vLLM's V1 runner runs async scheduling only at PP=1


def _run(
    policy: str, name: str, reference: bool, engine_extra: dict | None = None, wrap: Any = None
) -> tuple[SimResult, dict]:
    engine, cluster, workload, reqs, blocks = SCENARIOS[name]
    engine = dict(engine)
    engine.update(step_budget_fields(policy, engine.pop("budget")))
    if policy != "sglang-ring":
        engine["enable_chunked_prefill"] = True
    pp = 1 if policy in PP1_ONLY else cluster.get("pipeline_parallel_size", 4)
    over = {
        "model": "tiny",
        "engine": {"policy": policy, **engine, **(engine_extra or {})},
        "cluster": {**cluster, "pipeline_parallel_size": pp},
        "workload": workload,
    }
    prep = prepare(build_scenario(None, over), reqs())
    if blocks is not None:
        prep = replace(prep, num_blocks=blocks)
    if wrap is not None:
        prep = replace(prep, cost=wrap(prep.cost))
    res = simulate(prep, reference=reference)
    summ = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    return res, summ


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=TOL_S)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_same(ref: SimResult, fast: SimResult, ref_sum: dict, fast_sum: dict) -> None:
    assert len(ref.requests) == len(fast.requests)
    for a, b in zip(ref.requests, fast.requests, strict=True):
        assert (a.req_id, a.status, a.preemptions, len(a.token_times)) == (
            b.req_id,
            b.status,
            b.preemptions,
            len(b.token_times),
        ), a.req_id
        for x, y in ((a.sent_s, b.sent_s), (a.scheduled_s, b.scheduled_s), (a.finish_s, b.finish_s)):
            assert (x is None) == (y is None) and (x is None or abs(x - y) <= TOL_S), a.req_id
        assert all(abs(x - y) <= TOL_S for x, y in zip(a.token_times, b.token_times, strict=True)), a.req_id
    key = lambda o: (o.track, o.step_id, o.kind, round(o.start_s, 6))  # noqa: E731
    ra, fa = sorted(ref.ops, key=key), sorted(fast.ops, key=key)
    assert [(o.track, o.kind, o.step_id, o.num_tokens, o.num_reqs) for o in ra] == [
        (o.track, o.kind, o.step_id, o.num_tokens, o.num_reqs) for o in fa
    ]
    for x, y in zip(ra, fa, strict=True):
        assert abs(x.start_s - y.start_s) <= TOL_S and abs(x.end_s - y.end_s) <= TOL_S, (x, y)
    assert ref.num_preemptions == fast.num_preemptions and ref.peak_blocks_used == fast.peak_blocks_used
    assert ref_sum.keys() == fast_sum.keys()
    bad = {k: (ref_sum[k], fast_sum[k]) for k in ref_sum if not _close(ref_sum[k], fast_sum[k])}
    assert not bad


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_same_answers(policy: str, name: str) -> None:
    ref, rs = _run(policy, name, reference=True)
    fast, fs = _run(policy, name, reference=False)
    assert_same(ref, fast, rs, fs)
    assert rs["completed"] + rs["aborted"] + rs["failed"] == len(ref.requests)


@pytest.mark.parametrize("broadcast", ["overlapped", "serialized"])
@pytest.mark.parametrize("name", ["mixed-aborts", "tight-kv-preemption"])
def test_mrv2_broadcast(broadcast: str, name: str) -> None:
    extra = {"pp_broadcast": broadcast, "mrv2_decode_cap": True}
    ref, rs = _run("vllm-mrv2", name, True, extra)
    fast, fs = _run("vllm-mrv2", name, False, extra)
    assert_same(ref, fast, rs, fs)
    assert any(o.kind == "broadcast" for o in fast.ops)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sglang_output_deferral(depth: int, name: str) -> None:
    """SGLang's last rank sends outputs ``pp_async_batch_depth`` iterations later: the fast path's
    release (a later plan's arrival, or the core's wait) gives the reference's times."""
    extra = {"pp_async_batch_depth": depth}
    ref, rs = _run("sglang-ring", name, True, extra)
    fast, fs = _run("sglang-ring", name, False, extra)
    assert_same(ref, fast, rs, fs)
    assert rs["completed"] + rs["aborted"] + rs["failed"] == len(ref.requests)


@pytest.mark.parametrize("name", ["pp2-offline", "mixed-aborts"])
def test_deferred_outputs_same_answers(name: str) -> None:
    """SGLang's output deferral (pp_async_batch_depth 2) reaches the closed form, which gives the
    reference's answers. (What the deferral does to the send times is pinned, for both pipelines, by
    ``test_sglang_ring.py::test_last_rank_defers_the_output_send_by_depth_iterations``; whether it moves
    a whole run's token times depends on whether the core ever waits after a plan ended, which the
    cost model's numbers decide.)"""
    from ppsim.sim.executor import Simulation

    knobs = {"pp_async_batch_depth": 2}
    ref, rs = _run("sglang-ring", name, True, knobs)
    fast, fs = _run("sglang-ring", name, False, knobs)
    assert_same(ref, fast, rs, fs)
    engine, cluster, _, reqs, _ = SCENARIOS[name]
    over = {
        "model": "tiny",
        "engine": {"policy": "sglang-ring", **step_budget_fields("sglang-ring", engine["budget"]), **knobs},
        "cluster": {"pipeline_parallel_size": cluster.get("pipeline_parallel_size", 4)},
    }
    pipe = Simulation(prepare(build_scenario(None, over), reqs())).pipe
    assert isinstance(pipe, FastPipeline) and pipe.defer_outputs == 2


def test_the_fast_path_is_what_runs() -> None:
    """Without ``reference`` the executor uses the closed form (except the serialized broadcast)."""
    from ppsim.sim.executor import Simulation

    prep = prepare(
        build_scenario(
            None, {"model": "tiny", "engine": {"policy": "vllm-async"}, "cluster": {"pipeline_parallel_size": 1}}
        ),
        _mixed(),
    )
    assert isinstance(Simulation(prep).pipe, FastPipeline)
    assert not isinstance(Simulation(prep, reference=True).pipe, FastPipeline)


def test_the_comparison_can_fail() -> None:
    """A one-nanosecond-plus shift in one token time is caught."""
    ref, rs = _run("vllm-batch-queue", "pp2-offline", True)
    fast, fs = _run("vllm-batch-queue", "pp2-offline", False)
    fast.requests[3].token_times[2] += 2 * TOL_S
    with pytest.raises(AssertionError):
        assert_same(ref, fast, rs, fs)


@pytest.mark.parametrize("policy", ["vllm-batch-queue", "vllm-async", "no-pp"])
def test_lean_records_give_the_same_summary_and_requests(policy: str) -> None:
    """Running totals and ledger columns (nothing per token or operation kept) give the summary and
    requests.csv of the full records, to the byte."""
    engine, _, workload, reqs, blocks = SCENARIOS["tight-kv-preemption"]
    engine = {"max_num_seqs": engine["max_num_seqs"], **step_budget_fields(policy, engine["budget"])}
    pp = 1 if policy in PP1_ONLY else 4
    prep = prepare(
        build_scenario(
            None, {"model": "tiny", "engine": {"policy": policy, **engine}, "cluster": {"pipeline_parallel_size": pp}}
        ),
        reqs(),
    )
    prep = replace(prep, num_blocks=blocks)
    kept, lean = simulate(prep), simulate(prep, keep_ops=False, keep_tokens=False)
    assert len(lean.ops) == 0 and len(kept.ops) > 0 and lean.ledger.times is None
    assert lean.ledger.gaps == {} and lean.ledger.live_times == {}  # nothing per token left once the run is over
    full = summarize(kept.requests, list(kept.ops), pp)
    assert summarize(lean.ledger, lean.ops, pp) == full
    assert requests_csv(lean.ledger) == requests_csv(kept.requests)
    assert sum(full[k] for k in ("completed", "aborted", "failed")) == len(prep.requests)


class IdleCost:
    """A cost model whose stage steps cost more after the stage idled (a profile's ``stage_idle``)."""

    has_idle = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def idle_time(self, stage: Any, gap_s: float) -> float:
        return stage.num_layers * 4e-5 * min(max(gap_s, 0.0), 0.02) / 0.02


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", POLICIES)
def test_idle_gaps_cost_the_same_on_both_paths(policy: str, name: str) -> None:
    """A profile's idle penalty (the gap since the stage's previous compute) is charged alike."""
    ref, rs = _run(policy, name, True, wrap=IdleCost)
    fast, fs = _run(policy, name, False, wrap=IdleCost)
    assert_same(ref, fast, rs, fs)
    plain, _ = _run(policy, name, reference=False)
    if policy != "no-pp":
        assert [o.end_s for o in fast.ops] != [o.end_s for o in plain.ops]  # the penalty was charged


class SpreadCost:
    """A cost model with a step-to-step spread of stage computes (a profile's ``stage_spread``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def spread(self, stage: int, step_id: int, gap_s: float) -> float:
        from ppsim.cost.scaled import draw

        ratios = [0.6, 0.9, 1.0, 1.5] if gap_s > 1e-3 else [0.95, 1.05]  # part 29: a table by the gap before it
        return draw(ratios, 5, stage, step_id)


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", POLICIES)
def test_spread_computes_are_the_same_on_both_paths(policy: str, name: str) -> None:
    """Drawn per (stage, step) from a table chosen by the gap before the compute, the spread gives the closed form and
    the per-event reference one answer, with the idle penalty charged on top (the gap follows the spread compute
    before it)."""
    both = lambda c: SpreadCost(IdleCost(c))  # noqa: E731
    ref, rs = _run(policy, name, True, wrap=both)
    fast, fs = _run(policy, name, False, wrap=both)
    assert_same(ref, fast, rs, fs)
    plain, _ = _run(policy, name, reference=False, wrap=IdleCost)
    if policy != "no-pp":
        assert [o.end_s for o in fast.ops] != [o.end_s for o in plain.ops]  # the spread was charged


class TurnCost:
    """A cost model whose stages past the first restart 0.3 ms after a compute (a profile's turnaround)."""

    turnaround_s = 3e-4

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", POLICIES)
def test_turnaround_is_the_same_on_both_paths(policy: str, name: str) -> None:
    """A stage past the first restarts no sooner than ``turnaround_s`` after its previous compute, alike
    on both paths, with the spread and the idle penalty on top."""
    wrap = lambda c: TurnCost(SpreadCost(IdleCost(c)))  # noqa: E731
    ref, rs = _run(policy, name, True, wrap=wrap)
    fast, fs = _run(policy, name, False, wrap=wrap)
    assert_same(ref, fast, rs, fs)
    plain, _ = _run(policy, name, reference=False, wrap=lambda c: SpreadCost(IdleCost(c)))
    assert min(_restarts(fast), default=1.0) >= TurnCost.turnaround_s - 1e-12
    if min(_restarts(plain), default=1.0) < TurnCost.turnaround_s:  # it binds: the runs differ
        assert [o.end_s for o in fast.ops] != [o.end_s for o in plain.ops]


class TurnPerReqCost(TurnCost):
    """The turnaround by the step's requests (a profile's fit by ``reqs``): 0.1 ms + 0.05 ms a request."""

    turnaround_s = 1e-4
    turnaround_per_req_s = 5e-5


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", POLICIES)
def test_turnaround_per_request_is_the_same_on_both_paths(policy: str, name: str) -> None:
    """A stage past the first restarts no sooner than ``turnaround_s`` plus ``turnaround_per_req_s`` per
    request of the plan it starts, alike on both paths; each restart at least that of its own plan."""
    wrap = lambda c: TurnPerReqCost(SpreadCost(IdleCost(c)))  # noqa: E731
    ref, rs = _run(policy, name, True, wrap=wrap)
    fast, fs = _run(policy, name, False, wrap=wrap)
    assert_same(ref, fast, rs, fs)
    if policy == "no-pp":  # its stages are replicas, each the first stage of its own: no turnaround
        return
    for gap, reqs in _restarts_by_reqs(fast):
        assert gap >= TurnPerReqCost.turnaround_s + TurnPerReqCost.turnaround_per_req_s * reqs - 1e-12


class TurnSteepCost(TurnCost):
    """A steep line by the step's requests, 0.1 ms + 1 ms a request, so that it binds."""

    turnaround_s = 1e-4
    turnaround_per_req_s = 1e-3


class TurnHeldCost(TurnSteepCost):
    """That line held at 2 requests (a fit's ``n_max``, part 25 (c))."""

    turnaround_max_reqs = 2.0


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", ["vllm-sync", "trtllm-slots", "vllm-mrv2"])
def test_turnaround_held_is_the_same_on_both_paths(policy: str, name: str) -> None:
    """A held line charges a step of more requests than ``turnaround_max_reqs`` the line's value there, alike on
    both paths: some restart of more requests comes sooner than the unheld line would allow."""
    wrap = lambda c: TurnHeldCost(SpreadCost(IdleCost(c)))  # noqa: E731
    ref, rs = _run(policy, name, True, wrap=wrap)
    fast, fs = _run(policy, name, False, wrap=wrap)
    assert_same(ref, fast, rs, fs)
    line = lambda n: TurnHeldCost.turnaround_s + TurnHeldCost.turnaround_per_req_s * n  # noqa: E731
    restarts = _restarts_by_reqs(fast)
    assert all(gap >= line(min(reqs, 2)) - 1e-12 for gap, reqs in restarts)
    assert any(gap < line(reqs) for gap, reqs in restarts if reqs > 2)
    steep, _ = _run(policy, name, reference=False, wrap=lambda c: TurnSteepCost(SpreadCost(IdleCost(c))))
    assert all(gap >= line(reqs) - 1e-12 for gap, reqs in _restarts_by_reqs(steep))  # unheld: the whole line


def _restarts_by_reqs(res: SimResult) -> list[tuple[float, int]]:
    """Every gap between two computes of a stage past the first, with the requests of the later one."""
    comps: dict[str, list] = {}
    for o in res.ops:
        if o.kind == "compute" and o.track != "stage0":
            comps.setdefault(o.track, []).append(o)
    out = []
    for cs in comps.values():
        cs.sort(key=lambda o: o.start_s)
        out += [(b.start_s - a.end_s, b.num_reqs) for a, b in zip(cs, cs[1:], strict=False)]
    return out


def _restarts(res: SimResult) -> list[float]:
    """Every gap between two computes of a stage past the first."""
    return [gap for gap, _ in _restarts_by_reqs(res)]


class CorunCost:
    """A cost model whose stages slow each other when they compute at once (a profile's ``stage_corun``)."""

    corun_factor = 1.3

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _corun_steps(res: SimResult, stages: int) -> set[int]:
    """Steps whose first-stage compute started while an earlier step had not ended on the last stage."""
    first = {o.step_id: o.start_s for o in res.ops if o.kind == "compute" and o.track == "stage0"}
    last = {o.step_id: o.end_s for o in res.ops if o.kind == "compute" and o.track == f"stage{stages - 1}"}
    order = sorted(first, key=lambda s: (first[s], s))
    return {s for i, s in enumerate(order) if any(last[j] > first[s] for j in order[:i])}


@pytest.mark.parametrize("name", ["mixed-aborts", "pp2-offline"])
@pytest.mark.parametrize("policy", POLICIES)
def test_corun_is_the_same_on_both_paths(policy: str, name: str) -> None:
    """Stages computing at once: every compute of a micro-batch that starts on the first stage while an
    earlier one is still in the pipeline times ``corun_factor``, alike on both paths, with the spread, the
    idle penalty and the turnaround on top; exactly those computes, by the records' own intervals."""
    wrap = lambda c: CorunCost(TurnCost(SpreadCost(IdleCost(c))))  # noqa: E731
    ref, rs = _run(policy, name, True, wrap=wrap)
    fast, fs = _run(policy, name, False, wrap=wrap)
    assert_same(ref, fast, rs, fs)
    if policy in PP1_ONLY or policy == "no-pp":
        return  # one stage: nothing computes beside it, nothing charged
    stages = 1 + max(int(o.track[5:]) for o in fast.ops if o.kind == "compute")
    co = _corun_steps(fast, stages)
    if policy == "vllm-sync":  # one step in flight: never two at once
        assert not co
    if (policy, name) == ("vllm-batch-queue", "mixed-aborts"):
        assert co, "a full batch queue should put two micro-batches in the pipeline at once"
    plain, _ = _run(policy, name, reference=False, wrap=lambda c: TurnCost(SpreadCost(IdleCost(c))))
    assert (co != set()) == ([o.end_s for o in fast.ops] != [o.end_s for o in plain.ops])
