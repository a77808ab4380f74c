"""The closed-form pipeline bubble (P-1)/(M+P-1) checked against the simulator.

Equal stages (a constant stage time), zero link latency, no CPU overheads and M equal
micro-batches all launched at t = 0, run through the same stage processes as any simulation.
"""

from __future__ import annotations

import simpy

from ppsim.cost.base import StageSpec
from ppsim.metrics.records import OpRecord
from ppsim.metrics.summary import busy_fractions
from ppsim.policy.plan import PlanItem, StepPlan, make_plan
from ppsim.sim.pipeline import PipelineSim

PP_VALUES = (2, 4, 8)
MB_VALUES = (4, 8, 16, 32, 64)


class ConstantCost:
    """Every stage takes ``stage_s`` on any non-empty micro-batch; links and CPU are free."""

    def __init__(self, stage_s: float = 1e-3, link_s: float = 0.0) -> None:
        self.stage_s, self.link_s = stage_s, link_s

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        return 0.0 if plan.is_empty else self.stage_s

    def link_time(self, nbytes: float) -> float:
        return self.link_s

    def cpu_time(self, kind: str, n: int) -> float:
        return 0.0

    def launch_time(self, n: int) -> float:
        return 0.0

    def return_time(self, n: int) -> float:
        return 0.0


def simulate_microbatches(pp: int, microbatches: int, cost: ConstantCost | None = None) -> list[OpRecord]:
    env = simpy.Environment()
    ops: list[OpRecord] = []
    stages = tuple(StageSpec(i, i, i + 1, i == 0, i == pp - 1) for i in range(pp))
    pipe = PipelineSim(env, stages, cost or ConstantCost(), lambda n: 0.0, ops)
    for m in range(microbatches):
        pipe.launch(make_plan(m, [PlanItem(m, 0, 1, True, True)]))
    env.run()
    return ops


def analytic_bubble(pp: int, microbatches: int) -> float:
    return (pp - 1) / (microbatches + pp - 1)


def bubble_rows() -> list[dict[str, float | int]]:
    rows = []
    for p in PP_VALUES:
        for m in MB_VALUES:
            _, sim, _ = busy_fractions(simulate_microbatches(p, m), p)
            rows.append({"pp": p, "microbatches": m, "analytic": analytic_bubble(p, m), "simulated": sim})
    return rows
