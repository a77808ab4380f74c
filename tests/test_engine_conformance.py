"""Conformance: the engine and the simulator launch the same plans on the same workload (``actions.csv``).

Both executors run the same engine-core code through the same driver, which writes every launched
plan to ``actions.csv``. Where the core's decisions do not depend on timing (no ``Poll``: vLLM's
synchronous step, SGLang's ring loop, TensorRT-LLM's slots, llama.cpp's ubatches; every request
present before the first schedule) the two files must be equal row for row, whatever path the sampled
tokens take in the engine (ring return, deferred sends, overlapped sends). The batch-queue policies
poll the oldest micro-batch, so which plan holds what depends on when outputs come back; there the
invariant is each request's token schedule (positions and counts of its items, in order), on a
workload where no prompt is chunked.
"""

from __future__ import annotations

import csv
import os
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from engine.run import run_engine  # noqa: E402
from ppsim.run import run_scenario  # noqa: E402
from tests.engine_scenarios import tiny_scenario  # noqa: E402


def scenario(policy: str, pp: int = 2, budget: int = 32, **engine):
    """Tiny model, 6 requests at t = 0: prompts 36..44 tokens, outputs 5..6 (chunked at ``budget``)."""
    return tiny_scenario(policy, pp, budget, seed=5, range_ratio=0.1, **engine)


def actions(path) -> list[dict[str, str]]:
    with (path / "actions.csv").open() as f:
        return list(csv.DictReader(f))


RING = {"sglang-ring", "trtllm-slots"}  # the last rank returns sampled tokens to rank 0 over the ring


def both(tmp_path, policy: str, pp: int, budget: int = 32, **engine):
    """Simulate and run ``policy``; (simulator's actions, engine's actions)."""
    s = scenario(policy, pp, budget, **engine)
    run_scenario(s, tmp_path / "sim", save_detailed=True, dashboard=False)
    run = run_engine(s, tmp_path / "engine", dashboard=False)
    assert run.summary["completed"] == len(run.requests) and run.summary["failed"] == 0
    check_token_path(run, policy, pp, engine.get("pp_async_batch_depth", 0))
    return actions(tmp_path / "sim"), actions(tmp_path / "engine")


def check_token_path(run, policy: str, pp: int, depth: int) -> None:
    """The sampled tokens took the policy's own path: who handed them to the core, who fed the first stage."""
    path = run.info["data_path"]
    assert path["defer_outputs"] == (depth if policy == "sglang-ring" else 0)
    assert path["ring_return"] == (policy in RING and pp > 1)  # one stage has no ring
    assert path["overlap_sends"] == (policy in RING)
    assert path["token_path"] == ("broadcast" if policy == "vllm-mrv2" else "core")
    returner = 0 if policy in RING else pp - 1  # rank 0 forwards what the last rank sent it
    assert run.info["outputs_returned_by_rank"] == {returner: run.info["num_steps_launched"]}
    if policy == "vllm-mrv2":  # placeholders are filled from the last rank's broadcast, never from the core
        assert run.info["sampled_forwarded_by_core"] == 0
    if policy == "sglang-ring" and not depth:  # no deferral: every output leaves at once
        assert run.info["outputs_deferred"] == 0
    if pp > 1 and hasattr(os, "SCHED_IDLE"):  # every gloo event loop at SCHED_IDLE, MRV2's broadcast group's too
        assert [run.info[f"loops_not_idle_rank{r}"] for r in range(pp)] == [0] * pp


def token_schedule(rows: list[dict[str, str]]) -> dict[int, list[tuple[int, int]]]:
    """Request id -> its (start, tokens) items in launch order."""
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        for item in r["requests"].split():
            req, start, n = (int(x) for x in item.split(":"))
            out[req].append((start, n))
    return dict(out)


@pytest.mark.parametrize(
    "policy, pp, engine",
    [
        ("vllm-sync", 2, {}),
        ("sglang-ring", 2, {}),
        ("sglang-ring", 2, {"pp_async_batch_depth": 1}),
        ("sglang-ring", 3, {"pp_async_batch_depth": 2}),  # a middle stage; outputs held two iterations
        ("trtllm-slots", 2, {}),
        ("llamacpp", 2, {"llamacpp_ubatch_tokens": 16}),
    ],
)
def test_engine_launches_the_simulators_plans(tmp_path, policy, pp, engine):
    sim, eng = both(tmp_path, policy, pp, **engine)
    assert sim, "no plan launched"
    chunked = [req for req, items in token_schedule(sim).items() if any(st > 0 and n > 1 for st, n in items)]
    assert chunked, "no prompt was split over steps: the workload does not test chunking"
    assert eng == sim


@pytest.mark.parametrize(
    "policy, pp, engine",
    [
        ("vllm-batch-queue", 2, {}),
        ("vllm-mrv2", 2, {}),
        ("vllm-mrv2", 2, {"pp_broadcast": "serialized"}),
        ("vllm-mrv2", 3, {}),  # a middle stage joins every broadcast
        ("vllm-async", 1, {}),
    ],
)
def test_polling_policies_give_every_request_the_simulators_token_schedule(tmp_path, policy, pp, engine):
    sim, eng = both(tmp_path, policy, pp, budget=2048, **engine)
    want = token_schedule(sim)
    assert len(want) == 6 and all(len(v) > 1 for v in want.values())
    assert token_schedule(eng) == want
    assert sum(int(r["tokens"]) for r in eng) == sum(int(r["tokens"]) for r in sim)


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_last_rank_defers_the_output_send_by_depth_iterations(monkeypatch, depth):
    """The engine's side of the simulator's ``defer_outputs`` (same scenario as the simulator's test in
    tests/test_sglang_ring.py): step b's outputs leave when step b + d reaches the last rank, or when
    the core waits for b; what is held at the end leaves at the end."""
    from engine.datapath import RingSender

    sent: list[int] = []
    ring = RingSender(torch.device("cpu"), depth, timeout_s=1.0)
    monkeypatch.setattr(ring, "_send", lambda step, _buf: sent.append(step))
    for step in range(3):  # each step reaches the last rank and finishes before the next arrives
        ring.arrived(step)
        ring.sampled(step, [7])
    assert sent == list(range(3 - depth))
    ring.flush(2)  # the core waits for the newest step
    if depth:
        assert sent[-1] == 2 and ring.stats == {"outputs_deferred": 3, "outputs_sent_on_flush": 1}
    ring.flush(9)  # the core waits for a step not yet done: it leaves as soon as it is
    ring.arrived(9)
    ring.sampled(9, [7])
    assert sent[-1] == 9 and not ring.awaited
    ring.close()
    assert sorted(sent) == [0, 1, 2, 9]
