"""The cost-model interface shared by the analytic roofline and the profiled model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ppsim.policy.plan import StepPlan


@dataclass(frozen=True, slots=True)
class StageSpec:
    """A pipeline stage: global layers [start_layer, end_layer) on ``tp`` GPUs."""

    index: int
    start_layer: int
    end_layer: int
    is_first: bool
    is_last: bool
    tp: int = 1

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.start_layer


class CostModel(Protocol):
    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        """Seconds for ``stage`` to run ``plan`` (compute, TP collectives, per-step overhead)."""
        ...

    def link_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` across one stage boundary (latency + size / bandwidth)."""
        ...

    def cpu_time(self, kind: str, n: int) -> float:
        """Seconds of engine-core CPU for a step of ``kind`` over ``n`` requests."""
        ...

    def launch_time(self, n: int) -> float:
        """Seconds for a launched micro-batch of ``n`` requests to reach the first stage (control message)."""
        ...

    def return_time(self, n: int) -> float:
        """Seconds for the sampled tokens of ``n`` requests to reach the engine core."""
        ...
