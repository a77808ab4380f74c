"""Calibration's sample rows as the fits read them: a row's time, its plan, its stage, its features."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppsim.cost.base import StageSpec
from ppsim.policy.plan import PlanItem, StepPlan, make_plan

# stage sample op -> (is first, is last) stage (calibration/stage_step.py times them; the first and
# last are the stage ends alone, with no layers)
KINDS = {
    "stage_first": (True, False),
    "stage_mid": (False, False),
    "stage_last": (False, True),
    "stage_full": (True, True),
}


def features(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys = {
        k
        for r in rows
        for k in r
        if k
        in ("tokens", "reqs", "chunk", "prefix", "batch", "ctx_tokens", "bytes", "n", "pairs", "experts", "repeats")
    }
    return {k: np.array([float(r.get(k, 0)) for r in rows]) for k in keys}


def statistic(clock: str, device: str) -> str:
    """ "mean" for thread CPU time and CUDA events, "median" for wall clock (see the module doc)."""
    return "mean" if clock == "thread" or device == "cuda" else "median"


def value(r: dict[str, Any], stat: str) -> float:
    """A sample row's time under ``stat`` (artifacts written before the mean was kept: the median)."""
    return float(r["mean_s"]) if stat == "mean" and "mean_s" in r else float(r["median_s"])


def plan_of(items: str) -> StepPlan:
    """A StepPlan from the ``items`` column ("start:n;..."); one-token items after a prefix are decodes."""
    its = []
    for i, part in enumerate(items.split(";")):
        start, n = (int(v) for v in part.split(":"))
        its.append(PlanItem(i, start, n, is_prefill=(n > 1 or start == 0), samples=True))
    return make_plan(0, its)


def plan_of_seqs(seqs: list[Any]) -> StepPlan:
    """:func:`plan_of` for a plan's :class:`calibration.layer.Seq` list (``start``, ``n``)."""
    return plan_of(";".join(f"{q.start}:{q.n}" for q in seqs))


def has_prefill(plan: StepPlan) -> float:
    """1 where ``plan`` holds a prefill item, else 0: what ``layer_glue``'s ``pstep`` term counts (part 31), by the
    test :class:`ppsim.cost.profiled.ProfiledCost` charges it on (prefill tokens in the plan)."""
    return 1.0 if plan.num_prefill_tokens else 0.0


def prefill_sq(plan: StepPlan) -> float:
    """The sum over ``plan``'s prefill items of their tokens squared: what ``layer_glue``'s ``sq`` term multiplies.
    One item of 512 tokens costs more beyond its operators than 32 of 16 (docs/validation.md, part 22)."""
    return float(sum(it.num_tokens * it.num_tokens for it in plan.items if it.is_prefill))


def decode_reqs(plan: StepPlan) -> int:
    """The plan's decode requests: what ``layer_glue``'s ``dreq`` term counts."""
    return sum(1 for it in plan.items if not it.is_prefill)


def multi_item(r: dict[str, Any]) -> bool:
    """Whether a sample's plan holds more than one prefill item (the grid's ``P<c>@<p>x<n>`` plans)."""
    return sum(1 for it in plan_of(r["items"]).items if it.is_prefill) > 1


def stage_spec(r: dict[str, Any]) -> StageSpec:
    """The stage a ``stage_*`` sample ran: its layers and which ends it had."""
    first, last = KINDS[r["op"]]
    start = int(r.get("start_layer", 0))
    return StageSpec(0, start, start + int(r["layers"]), first, last)


def one_prefill(plan: StepPlan) -> bool:
    """Whether ``plan`` is one prefill item alone (the grid's ``P<c>@<p>`` plans): what ``tok_prefill`` fits the
    glue's token term on."""
    return len(plan.items) == 1 and plan.items[0].is_prefill
