"""A cost model whose stage computes run ``factor`` times as long: the host's speed during an engine run.

``ppsim validate`` uses it for its speed-adjusted replay: ``factor`` is the engine's own stage time
over the profile's prediction for the same plans (summed over every micro-batch of every repeat), so
the replay's error is what remains once the host's speed during the run is known: the scheduling,
the pipeline and the control path. It is not a prediction (``factor`` comes from the run it is
compared with); the prediction's error is the unadjusted one. Transfers and the engine core's path
are wall-clock measurements of their own and are not scaled; a profile's step-to-step spread
(``spread``) is kept, so the replay draws it as the prediction does.
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


class ClassScaledCompute(ScaledCompute):
    """``stage_time`` times ``prefill_factor`` for a plan with prompt tokens (prefill or mixed), else
    ``decode_factor``; ``idle_time`` times ``factor``. A diagnostic: this VM's speed states scale the
    overhead-bound decodes and the GEMM-bound prefills differently (docs/validation.md, part 13), which
    one factor per run (:class:`ScaledCompute`) cannot follow."""

    def __init__(self, inner: Any, factor: float, prefill_factor: float, decode_factor: float) -> None:
        super().__init__(inner, factor)
        if not (prefill_factor > 0 and decode_factor > 0):
            raise ValueError(f"class factors {prefill_factor}, {decode_factor} must be > 0")
        self.prefill_factor, self.decode_factor = prefill_factor, decode_factor

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        f = self.prefill_factor if plan.num_prefill_tokens else self.decode_factor
        return f * self.inner.stage_time(stage, plan)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit integer from ``x`` (no global state)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def draw(ratios: list[float], seed: int, stage: int, step_id: int) -> float:
    """One of ``ratios``, picked by (``seed``, stage, step id) alone: the closed-form and per-event
    pipelines, which time a stage's computes in different orders, draw alike."""
    return ratios[_mix((seed << 40) ^ (stage << 32) ^ (step_id & 0xFFFFFFFF)) % len(ratios)]


class JitteredCompute(ScaledCompute):
    """Every stage compute times one of ``ratios``, picked by (``seed``, stage, step id): the engine's own
    spread of measured over predicted stage time, replayed. A diagnostic like :class:`ScaledCompute`
    (the ratios come from the runs it is compared with): with two or more micro-batches in flight a
    slow step also delays the others, which a mean (``ScaledCompute``) cannot show. The pick depends
    only on the stage and the step, so the closed-form and per-event pipelines draw alike. Its ratios
    replace a profile's own ``stage_spread`` (:attr:`spread` None: drawn once, not twice)."""

    spread = None

    def __init__(self, inner: Any, ratios: list[float], seed: int = 0) -> None:
        if not ratios or min(ratios) <= 0:
            raise ValueError("ratios must be a non-empty list of positive numbers")
        super().__init__(inner, sum(ratios) / len(ratios))  # idle time: the mean
        self.ratios, self.seed = list(ratios), seed

    def ratio(self, stage: int, step_id: int) -> float:
        return draw(self.ratios, self.seed, stage, step_id)

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        return self.ratio(stage.index, plan.step_id) * self.inner.stage_time(stage, plan)
