"""Runs any registered policy on a small scenario and records what its engine core did (for tests)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from ppsim.config import POLICY_KNOBS, build_scenario, step_budget_fields
from ppsim.deployment import prepare
from ppsim.policy.actions import Emit, Launch
from ppsim.policy.plan import StepPlan
from ppsim.policy.requests import Request
from ppsim.sim.executor import SimResult, simulate

ASYNC_POLICIES = ("vllm-async", "vllm-mrv2")


@dataclass
class Trace:
    launches: list[StepPlan] = field(default_factory=list)
    emitted: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def __call__(self, act: Any) -> None:
        if type(act) is Launch:
            self.launches.append(act.plan)
        elif type(act) is Emit:
            for req_id, index, _finished in act.outputs:
                self.emitted[req_id].append(index)


def own_knobs(policy: str, engine: dict[str, Any]) -> dict[str, Any]:
    """``engine`` without the knobs of other policies (the scenario refuses those)."""
    return {k: v for k, v in engine.items() if k not in POLICY_KNOBS or policy in POLICY_KNOBS[k]}


def run_policy(
    policy: str,
    pp: int,
    requests: list[Request],
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 128,
    num_blocks: int | None = None,
    cost: Any = None,
    engine: dict[str, Any] | None = None,
    model: str = "tiny",
) -> tuple[SimResult, Trace]:
    eng = {
        "policy": policy,
        "max_num_seqs": max_num_seqs,
        **step_budget_fields(policy, max_num_batched_tokens),
        **own_knobs(policy, engine or {}),
    }
    s = build_scenario(None, {"model": model, "cluster": {"pipeline_parallel_size": pp}, "engine": eng})
    prep = prepare(s, requests)
    if num_blocks is not None:
        prep = replace(prep, num_blocks=num_blocks)
    if cost is not None:
        prep = replace(prep, cost=cost)
    trace = Trace()
    return simulate(prep, trace), trace
