"""A cost model whose stage computes run ``factor`` times as long: the host's speed during an engine run.

``ppsim validate`` uses it for its speed-adjusted replay: ``factor`` is the engine's own stage time
over the profile's prediction for the same plans (summed over every micro-batch of every repeat), so
the replay's error is what remains once the host's speed during the run is known: the scheduling,
the pipeline and the control path. It is not a prediction (``factor`` comes from the run it is
compared with); the prediction's error is the unadjusted one. Transfers and the engine core's path
are wall-clock measurements of their own and are not scaled.
"""

from __future__ import annotations

from typing import Any

from ppsim.cost.base import StageSpec
from ppsim.policy.plan import StepPlan


class ScaledCompute:
    """Wraps a cost model; ``stage_time`` and ``idle_time`` are multiplied by ``factor``."""

    stage_times = None  # the batched form is the inner model's, unscaled: the simulator uses stage_time

    def __init__(self, inner: Any, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"compute speed factor {factor} must be > 0")
        self.inner, self.factor = inner, factor

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        return self.factor * self.inner.stage_time(stage, plan)

    @property
    def has_idle(self) -> bool:
        return bool(getattr(self.inner, "has_idle", False))

    def idle_time(self, stage: StageSpec, gap_s: float) -> float:
        return self.factor * self.inner.idle_time(stage, gap_s)

    def __getattr__(self, name: str) -> Any:  # link, core path, relay: the inner model's
        return getattr(self.inner, name)
