"""Step-level cost error: the cost model's prediction for every micro-batch the engine ran.

For each stage compute the engine recorded (``OpRecord`` track ``stageN``, kind ``compute``: the
stage's ``build_batch`` + layers + sampling on the last stage, timed by the stage process), the
plan the engine core launched for that step is timed by the very cost model the simulator uses
(``cost.stage_time(stage, plan)``: same items, same token counts, same contexts). The signed error
is (predicted - measured) / measured, as for the metrics: negative means the model is too fast.

This separates the cost model from the batching feedback: when the simulated engine is faster it
forms other (smaller) micro-batches, so end-to-end metrics mix the two; the step-level error does not.
Where the simulator charges stages computing at once (a profile's ``stage_corun``, PP > 1), so does
the prediction here, by the pipelines' rule read off the engine's own records (:func:`corun_steps`).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from ppsim.cost.base import CostModel, StageSpec
from ppsim.metrics.records import OpRecord
from ppsim.policy.plan import StepPlan

# a compute's plan class: every token a prompt's, some, none
STEP_CLASSES = ("prefill", "mixed", "decode")
# micro-batch size in tokens: [lo, hi] inclusive
TOKEN_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 64), (65, 256), (257, 1 << 30))
STEP_FIELDS = [
    "run",
    "stage",
    "step_id",
    "num_tokens",
    "num_reqs",
    "num_prefill_tokens",
    "decode_ctx_tokens",
    "measured_s",
    "cpu_s",
    "predicted_s",
    "error",
    "cpu_error",
    "preempted",
]


def bucket_name(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"{lo}-{hi}" if hi < (1 << 30) else f">={lo}"


def step_class(num_tokens: int, num_prefill_tokens: int) -> str:
    """``prefill`` (every token a prompt's), ``mixed`` or ``decode`` (no prompt token)."""
    if num_prefill_tokens == 0:
        return "decode"
    return "prefill" if num_prefill_tokens == num_tokens else "mixed"


def prefill_minus_decode(errors: dict[str, list[float]]) -> float | None:
    """Median error of the prefill and mixed computes minus that of the decodes (``errors``: class ->
    errors); None without both. Within one run the host's speed level cancels in it: what is left is
    how the cost model prices the two classes against each other (docs/validation.md, part 13)."""
    pre, dec = errors.get("prefill", []) + errors.get("mixed", []), errors.get("decode", [])
    if not pre or not dec:
        return None
    return float(np.median(pre) - np.median(dec))


def bucket_of(num_tokens: int) -> str:
    for lo, hi in TOKEN_BUCKETS:
        if lo <= num_tokens <= hi:
            return bucket_name(lo, hi)
    return bucket_name(*TOKEN_BUCKETS[-1])


def inner_with(cost: Any, name: str) -> Any:
    """The cost model under any wrappers (a ring policy's return path, ...) that has the attribute ``name``: the
    profiled model inside them, or the innermost one where none has it."""
    while not hasattr(cost, name) and hasattr(cost, "inner"):
        cost = cost.inner
    return cost


def model_factor(cost: Any, name: str) -> float:
    """The profiled model's factor ``name`` (:class:`ppsim.cost.profiled.ProfiledCost`'s ``live_factor``,
    ``depth_factor`` or ``corun_factor``) under any wrappers (a ring policy's return path, ...); 1 for a
    model without it."""
    return float(getattr(inner_with(cost, name), name, 1.0))


def corun_factor_of(cost: Any) -> float:
    """``corun_factor`` (a profile's ``stage_corun``, charged at PP > 1; 1 at one stage, as the cost model
    is built for the scenario's depth): ``validation.json`` records it, as its step predictions include it."""
    return model_factor(cost, "corun_factor")


def corun_steps(ops: list[OpRecord], num_stages: int) -> set[int]:
    """Steps whose first-stage compute started while an earlier step (by first-stage start) had not yet
    ended its last-stage compute: the micro-batches the pipelines charge ``corun_factor``
    (:mod:`ppsim.sim.fast`), read off a run's records. Empty at one stage."""
    if num_stages < 2:
        return set()
    last, first = f"stage{num_stages - 1}", []
    ends: dict[int, float] = {}
    for op in ops:
        if op.kind == "compute" and op.track == "stage0":
            first.append((op.start_s, op.step_id))
        elif op.kind == "compute" and op.track == last:
            ends[op.step_id] = op.end_s
    out, pending = set(), []  # min-heap of earlier steps' last-stage ends
    for start, step in sorted(first):
        while pending and pending[0] <= start:
            heapq.heappop(pending)
        if pending:
            out.add(step)
        heapq.heappush(pending, ends.get(step, float("inf")))  # never reached the last stage: still in it
    return out


def idle_gaps(ops: list[OpRecord]) -> dict[tuple[int, int], float]:
    """(stage, step id) -> seconds that stage idled before that compute: its previous compute's end to this
    one's start (the first compute's from the run's start), as the simulator's ``stage_idle`` charge reads it."""
    last_end: dict[str, float] = {}
    out: dict[tuple[int, int], float] = {}
    for op in sorted(ops, key=lambda o: o.start_s):
        if op.kind != "compute" or not op.track.startswith("stage"):
            continue
        out[(int(op.track[len("stage") :]), op.step_id)] = op.start_s - last_end.get(op.track, 0.0)
        last_end[op.track] = op.end_s
    return out


def step_costs(
    cost: CostModel,
    stages: tuple[StageSpec, ...] | list[StageSpec],
    plans: dict[int, StepPlan],
    ops: list[OpRecord],
    run: int = 0,
    cpu_s: dict[tuple[int, int], float] | None = None,
    preempted: dict[tuple[int, int], int] | None = None,
) -> list[dict[str, Any]]:
    """One row per engine stage compute whose plan is known: measured vs predicted seconds (the plan's
    ``stage_time``, plus for a profile with ``stage_idle`` the cost of the idle gap since that stage's
    previous compute, as the simulator charges it).

    ``cpu_s`` ((stage, step id) -> the stage thread's CPU seconds in that compute; the engine's
    ``EngineRun.stage_cpu_s``) adds the prediction's error against CPU time: wall above CPU is time
    the stage was runnable but had no core; CPU above the prediction is slower execution. ``preempted``
    ((stage, step id) -> involuntary context switches of the stage thread in that compute) marks the
    computes another thread or process interrupted."""
    cpu_s, preempted = cpu_s or {}, preempted or {}
    idle = cost.idle_time if getattr(cost, "has_idle", False) else None
    corun = corun_factor_of(cost)
    co = corun_steps(ops, len(stages)) if corun != 1.0 else set()
    gaps = idle_gaps(ops)  # the idle gap before each compute
    rows = []
    for op in sorted(ops, key=lambda o: o.start_s):
        if op.kind != "compute" or not op.track.startswith("stage"):
            continue
        plan = plans.get(op.step_id)
        if plan is None or plan.is_empty:
            continue
        i = int(op.track[len("stage") :])
        gap = gaps[(i, op.step_id)]
        measured = op.end_s - op.start_s
        pred = cost.stage_time(stages[i], plan)
        if op.step_id in co:  # computed beside an earlier micro-batch, as the simulator charges it
            pred *= corun
        if idle is not None:  # the step after the stage idled, as the simulator charges it
            pred += idle(stages[i], gap)
        cpu = cpu_s.get((i, op.step_id), -1.0)
        rows.append(
            {
                "run": run,
                "stage": i,
                "step_id": op.step_id,
                "num_tokens": plan.num_tokens,
                "num_reqs": plan.num_reqs,
                "num_prefill_tokens": plan.num_prefill_tokens,
                "decode_ctx_tokens": plan.decode_ctx_tokens,
                "measured_s": measured,
                "cpu_s": cpu,
                "predicted_s": pred,
                "error": (pred - measured) / measured if measured > 0 else 0.0,
                "cpu_error": (pred - cpu) / cpu if cpu > 0 else None,
                "preempted": preempted.get((i, op.step_id), -1),
            }
        )
    return rows


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    err = np.array([r["error"] for r in rows])
    timed = [r for r in rows if r.get("cpu_error") is not None]
    cpu: dict[str, Any] = {"median_cpu_ms": None, "median_cpu_error": None, "median_cpu_share": None}
    if timed:
        cpu = {
            "median_cpu_ms": float(np.median([r["cpu_s"] for r in timed]) * 1e3),
            "median_cpu_error": float(np.median([r["cpu_error"] for r in timed])),
            "median_cpu_share": float(np.median([min(1.0, r["cpu_s"] / r["measured_s"]) for r in timed])),
        }
    return {
        **cpu,
        **_preemption(rows),
        "steps": len(rows),
        "median_error": float(np.median(err)),
        "median_abs_error": float(np.median(np.abs(err))),
        "p90_abs_error": float(np.percentile(np.abs(err), 90)),
        "median_measured_ms": float(np.median([r["measured_s"] for r in rows]) * 1e3),
        "median_predicted_ms": float(np.median([r["predicted_s"] for r in rows]) * 1e3),
    }


def _preemption(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Share of computes interrupted at least once, and the median error of those and of the others."""
    known = [r for r in rows if r.get("preempted", -1) >= 0]
    hit = [r["error"] for r in known if r["preempted"] > 0]
    calm = [r["error"] for r in known if r["preempted"] == 0]
    return {
        "preempted_share": len(hit) / len(known) if known else None,
        "median_error_preempted": float(np.median(hit)) if hit else None,
        "median_error_not_preempted": float(np.median(calm)) if calm else None,
    }


def summarize_steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall, per stage, per engine repeat (when more than one), per micro-batch size (tokens)
    bucket and per plan class (with the prefill-minus-decode difference where both ran); empty dict
    when no steps."""
    if not rows:
        return {}
    out = _stats(rows)
    stages = sorted({r["stage"] for r in rows})
    out["by_stage"] = {str(s): _stats([r for r in rows if r["stage"] == s]) for s in stages}
    runs = sorted({r["run"] for r in rows})
    if len(runs) > 1:  # run-to-run: a slower repeat with the same cpu/wall is a slower host, not batching
        out["by_run"] = {str(k): _stats([r for r in rows if r["run"] == k]) for k in runs}
    out["by_tokens"] = {}
    for lo, hi in TOKEN_BUCKETS:
        sel = [r for r in rows if lo <= r["num_tokens"] <= hi]
        if sel:
            out["by_tokens"][bucket_name(lo, hi)] = _stats(sel)
    classes: dict[str, list[dict[str, Any]]] = {c: [] for c in STEP_CLASSES}
    for r in rows:
        classes[step_class(r["num_tokens"], r["num_prefill_tokens"])].append(r)
    out["by_class"] = {c: _stats(sel) for c, sel in classes.items() if sel}
    clock = "cpu_error" if all(r.get("cpu_error") is not None for r in rows) else "error"  # calibration's clock
    out["prefill_minus_decode"] = prefill_minus_decode({c: [r[clock] for r in sel] for c, sel in classes.items()})
    out["prefill_minus_decode_clock"] = "thread CPU" if clock == "cpu_error" else "wall"
    return out


def format_steps(s: dict[str, Any]) -> str:
    """The step-level table: first the overall line, then per stage and per micro-batch size."""
    if not s:
        return "step-level cost error: no engine micro-batch with a known plan"
    head = (
        f"{'micro-batches':<16}{'steps':>6}{'measured':>10}{'predicted':>11}{'median':>9}"
        f"{'med |e|':>9}{'p90 |e|':>9}{'cpu':>9}{'vs cpu':>8}{'cpu/wall':>9}"
    )
    lines = [
        f"{' step-level cost error (cost model vs engine stage time, same plan) ':=^{len(head)}}",
        head,
        "-" * len(head),
    ]

    def line(name: str, d: dict[str, Any]) -> str:
        cpu = (
            ""
            if d.get("median_cpu_ms") is None
            else (f"{d['median_cpu_ms']:>7.2f}ms{d['median_cpu_error']:>+8.1%}{d['median_cpu_share']:>9.0%}")
        )
        return (
            f"{name:<16}{d['steps']:>6}{d['median_measured_ms']:>8.2f}ms{d['median_predicted_ms']:>9.2f}ms"
            f"{d['median_error']:>+9.1%}{d['median_abs_error']:>9.1%}{d['p90_abs_error']:>9.1%}{cpu}"
        )

    lines.append(line("all", s))
    for k, d in s["by_stage"].items():
        lines.append(line(f"stage {k}", d))
    for k, d in s.get("by_run", {}).items():
        lines.append(line(f"engine run {k}", d))
    for lo, hi in TOKEN_BUCKETS:  # in size order (validation.json may hold them sorted by name)
        k = bucket_name(lo, hi)
        if k in s["by_tokens"]:
            lines.append(line(f"{k} tokens", s["by_tokens"][k]))
    for k in STEP_CLASSES:
        if k in s.get("by_class", {}):
            lines.append(line(k, s["by_class"][k]))
    lines.append("=" * len(head))
    lines.append(
        "error = (predicted - measured wall) / measured; 'vs cpu' against the stage thread's CPU time; "
        "cpu/wall below 100%: the stage waited for a core"
    )
    if s.get("prefill_minus_decode") is not None:
        lines.append(
            f"prefill and mixed computes against decodes: {s['prefill_minus_decode']:+.1%} (median error minus "
            f"median error, {s.get('prefill_minus_decode_clock', 'wall')} clock; the host's speed level cancels "
            "in it: what is left is how the model prices the two classes)"
        )
    lines += [preemption_line(f"stage {k}", d) for k, d in s["by_stage"].items() if d.get("preempted_share")]
    return "\n".join(lines)


def preemption_line(name: str, d: dict[str, Any]) -> str:
    """One stage's interrupted computes: how many, and how their error compares with the others'."""
    hit, calm = d["median_error_preempted"], d["median_error_not_preempted"]
    return (
        f"{name}: {d['preempted_share']:.0%} of computes interrupted by another thread or process "
        f"(median error {hit:+.1%}" + ("" if calm is None else f", the others {calm:+.1%}") + ")"
    )
