"""``ppsim calibrate``: measure operators, link and CPU overheads, fit once, check on held-out shapes.

Steps: (1) time every task of the grid (:mod:`calibration.profile_ops`), (2) time ppsim's scheduler
(:mod:`calibration.cpu_overheads`) and the link (:mod:`calibration.link`), (3) fit each operator
(:mod:`calibration.fit`) with leave-one-out error, (4) fit the stage glue to the engine's own stage
steps (:mod:`calibration.stage_step`): ``layer_glue`` per layer from middle stages and the live engine's
steps timed alone (:func:`fit_layer_glue_live`), ``first_glue`` and ``last_glue`` from the stage ends (the
gaps are reported), (5) predict the held-out samples, which no
fit saw, and report their errors, (6) write the artifact.

Statistic: with the thread CPU clock or CUDA events, each operator's time is the *mean* of its
samples, else the median. The simulator sums step times, so the expected cost is what it needs;
the median was there against other processes' one-sided noise in wall-clock samples, which those two
clocks do not contain. On the 2-vCPU VM of this project the speed of each vCPU flips between two
states second by second (a pure-Python loop 5.5 or 9.8 ms, a matmul loop 68 or 82 ms, at 100% CPU):
the median took the fast state and the engine's steps averaged both (median 9.5 ms, mean 10.0 ms for
one decode step over 30 s).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from calibration import stage_layers
from calibration.artifact import base_meta, check_output_dir, device_name, write_artifact
from calibration.fit import fit_select, fit_to_json, predict
from calibration.host_memory import check_memory
from ppsim.cost.base import StageSpec
from ppsim.cost.profile_check import LIVE_CHARGED, LIVE_RECORDED, live_charged
from ppsim.cost.profiled import (
    REQ_OPS,
    TOKEN_OPS,
    OpFit,
    Profile,
    ProfiledCost,
    corun_ratio,
    depth_charged,
    fit_from_json,
    largest_prefill_log2,
    live_level,
    stage_layers_ratio,
)
from ppsim.errors import PPSimError
from ppsim.live_engine import MAX_THREADS_PER_STAGE
from ppsim.models.shape import ModelShape, load_model, refuse_skew_on_dense
from ppsim.policy.plan import PlanItem, StepPlan, make_plan
from ppsim.validate.host import cpu_identity, cpu_probe

# operator -> (form, feature)
FORMS: dict[str, tuple[str, str]] = {
    **{op: ("linear_floor", "tokens") for op in (*TOKEN_OPS, "embedding", "moe_router", "moe_shared")},
    "moe_experts": ("tok_exp", ""),
    "attn_prefill": ("prefill_attn", ""),
    "attn_decode": ("decode_attn", ""),
    **{op: ("linear_floor", "reqs") for op in REQ_OPS},
    "schedule": ("linear", "n"),
    "update": ("linear", "n"),
    "send_recv": ("linear", "bytes"),
    "launch": ("linear", "n"),
    "launch_multi": ("linear", "n"),
    "return": ("linear", "n"),
    # the rest of the control path at two stages: fitted, and charged at PP > 1, only with ``path_multi`` (part 40)
    "return_multi": ("linear", "n"),
    "schedule_multi": ("linear", "n"),
    "update_multi": ("linear", "n"),
    "ring_launch": ("linear", "n"),
    "ring_return": ("linear", "n"),
}
LINK_SIZES = {"quick": (1024, 65536, 1 << 20), "full": (256, 4096, 65536, 262144, 1 << 20, 1 << 22)}
STACK_BYTES = 256 * 1024**2  # whole-layer timings run up to this many bytes of distinct layers in a row
CPU_NS = {"quick": (1, 16, 64), "full": (1, 4, 16, 64, 256)}
# stage sample op -> (is first, is last) stage (calibration/stage_step.py times them; the first and
# last are the stage ends alone, with no layers)
KINDS = {
    "stage_first": (True, False),
    "stage_mid": (False, False),
    "stage_last": (False, True),
    "stage_full": (True, True),
}
GLUE_KIND = {"layer_glue": "stage_mid", "first_glue": "stage_first", "last_glue": "stage_last"}
LIVE_GLUE_NOTE = "; and the live engine's steps timed alone, the two sets at equal total weight (fit_layer_glue_live)"
WHOLE_GLUE_NOTE = "; its one-stage runs' only, the whole model in one stage (glue_whole, part 36)"


def _feats(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
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


RING_OPS = ("ring_launch", "ring_return")  # by least absolute deviation with ``ring_lad`` (part 34; reverted by (c))
PATH_MULTI = ("return_multi", "schedule_multi", "update_multi")  # fitted only with ``path_multi`` (part 40)


def fit_all(
    rows: list[dict[str, Any]],
    stat: str = "median",
    attn_ctx: bool = False,
    ring_lad: bool = False,
    ring_own_schedule: bool = True,
    path_multi: bool = False,
) -> tuple[dict[str, OpFit], dict[str, dict[str, Any]]]:
    """Every operator's fit on its ``fit`` samples (``attn_ctx``: ``attn_prefill`` with its context term;
    ``ring_lad`` (:func:`analyse_and_write`'s default from part 34 (a) until (c) reverted it): :data:`RING_OPS` as a
    line by least absolute deviation over every recorded gap, else by relative least squares over the per-count
    medians as every other line; ``ring_own_schedule``, the default since part 35's verdict: ``ring_launch`` from its
    own samples, each launch from the step's own schedule; off, from the ``ring_launch_any`` samples where a
    calibration kept them, each launch from whichever schedule came last, as measured until part 35);
    ``path_multi``: :data:`PATH_MULTI` where the calibration measured them, which the simulator then charges at PP > 1
    (part 40: not adopted on its fresh readings, 0 for, 1 against, 5 level; recorded, not fitted, by default); off,
    the one-stage fits at every depth."""
    fits, stats = {}, {}
    for op, (form, x) in FORMS.items():
        sel = [r for r in rows if r["op"] == op and r["split"] == "fit"]
        if op in PATH_MULTI and not path_multi:
            continue
        if op == "ring_launch" and not ring_own_schedule:
            sel = [{**r, "op": op} for r in rows if r["op"] == "ring_launch_any"] or sel
        if not sel:
            continue
        form = "linear_lad" if ring_lad and op in RING_OPS else form
        forms = (form, "interp") if form == "linear_floor" else (form,)
        y = np.array([value(r, stat) for r in sel])
        fits[op], stats[op] = fit_select(op, forms, x, _feats(sel), y, attn_ctx)
    return fits, stats


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


def _ols_tok_req(
    name: str,
    T: list[float],
    R: list[float],
    y: list[float],
    scale: list[float] | None = None,
    weight: list[float] | None = None,
    sq: list[float] | None = None,
    per_decode: bool = False,
    prefill_step: list[float] | None = None,
    prefill_log: list[float] | None = None,
) -> OpFit:
    """Least squares of ``y`` on (1, tokens, requests): the ``tok_req`` form. With ``scale`` (one positive
    number per sample), the residuals are divided by it first: least squares of relative errors. With
    ``weight``, each squared residual counts that many times. With ``sq`` (each sample's sum over its prefill
    items of their tokens squared), a fourth term ``sq`` x that, held at zero or more: where the fit gives it
    a negative coefficient it is refitted without it (``sq`` 0). ``per_decode``: ``R`` counts each sample's decode
    requests only, and its coefficient is ``dreq`` (``req`` 0): a prefill item costs no work of its own beyond its
    operators and tokens (docs/validation.md, part 22). ``prefill_step`` (each sample 1 where its plan holds a prefill
    item, else 0): least squares on (1, decode requests ``R``, that) instead, coefficients ``c0``, ``dreq`` and
    ``pstep`` (``tok`` and ``req`` 0): a step's prefill items cost one charge, their tokens none beyond their
    operators (part 31). ``prefill_log`` with it (each sample's log2 of its largest prefill item's tokens, 0 without
    one): a fourth column, coefficient ``plog`` (part 32)."""
    if prefill_step is None:
        cols = [np.ones(len(T)), np.array(T, dtype=float), np.array(R, dtype=float)]
    else:
        cols = [np.ones(len(R)), np.array(R, dtype=float), np.array(prefill_step, dtype=float)]
        if prefill_log is not None:
            cols.append(np.array(prefill_log, dtype=float))
    if sq is not None:
        cols.append(np.array(sq, dtype=float))
    A = np.column_stack(cols)
    b = np.array(y, dtype=float)
    w = np.ones(len(T)) if scale is None else 1.0 / np.array(scale, dtype=float)
    if weight is not None:
        w = w * np.sqrt(np.array(weight, dtype=float))
    if scale is not None or weight is not None:
        A, b = A * w[:, None], b * w
    c, *_ = np.linalg.lstsq(A, b, rcond=None)
    if prefill_step is not None:
        coef = {"c0": float(c[0]), "tok": 0.0, "req": 0.0, "dreq": float(c[1]), "pstep": float(c[2])}
        if prefill_log is not None:
            coef["plog"] = float(c[3])
        return OpFit(name, "tok_req", "", coef)
    if sq is not None and c[3] < 0:
        c = [*np.linalg.lstsq(A[:, :3], b, rcond=None)[0], 0.0]
    coef = {"c0": float(c[0]), "tok": float(c[1]), "req": float(c[2])}
    if per_decode:
        coef.update(req=0.0, dreq=float(c[2]))
    if sq is not None:
        coef["sq"] = float(c[3])
    return OpFit(name, "tok_req", "", coef)


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


def fit_stage_glue(
    fits: dict[str, OpFit],
    meta: dict[str, Any],
    shape: ModelShape,
    rows: list[dict[str, Any]],
    stat: str,
    relative: bool = True,
    live: list[dict[str, Any]] | None = None,
    sq: bool = False,
    per_decode: bool = False,
    tok_prefill: bool = False,
    prefill_step: bool = False,
    prefill_log: bool = False,
) -> tuple[dict[str, OpFit], list[dict[str, Any]]]:
    """The glue between the operators and the engine's stage steps, in three least-squares fits on
    (1, tokens, requests): ``layer_glue`` per layer from middle stages (measured minus the operators'
    prediction, over the stage's layers), then ``first_glue`` and ``last_glue`` from first and last
    stages (measured minus the prediction with ``layer_glue``). Returns the fits and per-sample gaps.

    ``relative`` (the default) minimises each stage step's relative error; ``False`` its error in
    seconds, which the large prefill steps dominate. Once the operators were timed cold (2026-12-01)
    the fit in seconds put the small decode steps 13-17% short in-sample (``tiny``) and a held-out
    draw's decodes 19% short; docs/calibration.md "The glue's fit",
    ``experiments/validation/glue_fit.py`` compares the two on finished runs. ``sq``: ``layer_glue`` also on
    the plan's prefill items' tokens squared; ``per_decode``: its request term over decode requests only
    (:func:`_ols_tok_req`; docs/validation.md, part 22); ``tok_prefill``: with ``live``, its token term from the
    grid's one-item prefill plans (:func:`fit_layer_glue_live`, part 27); ``prefill_step``: ``layer_glue`` on (1, decode
    requests, holds a prefill item) instead (:func:`_ols_tok_req`, part 31); ``prefill_log`` with it, and log2 of its
    largest prefill item's tokens (part 32)."""
    out: dict[str, OpFit] = {}
    gaps: list[dict[str, Any]] = []
    for name, kind in (("layer_glue", "stage_mid"), ("first_glue", "stage_first"), ("last_glue", "stage_last")):
        sel = [r for r in rows if r["op"] == kind]
        if not sel:
            continue
        cost = ProfiledCost(Profile(meta, {**fits, **out}), shape, None, 1)
        glue_fit = name == "layer_glue"
        T, R, y, scale, S, P, PL = [], [], [], [], [], [], []
        for r in sel:
            spec, plan, measured = stage_spec(r), plan_of(r["items"]), value(r, stat)
            pred = cost.stage_time(spec, plan)
            per = spec.num_layers if glue_fit else 1
            T.append(r["tokens"])
            R.append(decode_reqs(plan) if (per_decode or prefill_step) and glue_fit else r["reqs"])
            S.append(prefill_sq(plan))
            P.append(has_prefill(plan))
            PL.append(largest_prefill_log2(plan))
            y.append((measured - pred) / per)
            scale.append(measured / per)  # residual / scale = the stage step's relative error
            gaps.append(
                {
                    "stage": kind,
                    "plan": r["plan"],
                    "measured_s": measured,
                    "predicted_s": pred,
                    "gap_rel": (measured - pred) / measured,
                }
            )
        with_sq = S if sq and glue_fit else None
        out[name] = _ols_tok_req(
            name,
            T,
            R,
            y,
            scale if relative else None,
            sq=with_sq,
            per_decode=per_decode and glue_fit,
            prefill_step=P if prefill_step and glue_fit else None,
            prefill_log=PL if prefill_step and prefill_log and glue_fit else None,
        )
    if live and "layer_glue" in out:
        out["layer_glue"] = fit_layer_glue_live(
            fits, meta, shape, rows, live, stat, out, relative, sq, per_decode, tok_prefill, prefill_step, prefill_log
        )
    return out, gaps


def fit_layer_glue_live(
    fits: dict[str, OpFit],
    meta: dict[str, Any],
    shape: ModelShape,
    rows: list[dict[str, Any]],
    live: list[dict[str, Any]],
    stat: str,
    ends: dict[str, OpFit],
    relative: bool = True,
    sq: bool = False,
    per_decode: bool = False,
    tok_prefill: bool = False,
    prefill_step: bool = False,
    prefill_log: bool = False,
) -> OpFit:
    """``layer_glue`` fitted on the grid's middle stages and on calibration's live engine steps timed alone
    (``alone_s``: whole stages of one and two-stage pipelines, ends included, priced with ``ends``' glues),
    by relative least squares on (1, tokens, requests) (``relative`` False: in seconds), the two sets at equal
    total weight. The grid's plans are decodes at contexts 64-768 and prefills of up to 512 tokens; the live
    steps are the plans the engine forms itself (decodes of 1-32 requests at short contexts, prefills joining
    them), where a glue
    fitted on the grid alone came out 5-15% over the steps timed alone at one request and within a few
    percent at 13-20 (docs/validation.md, part 18). ``tok_prefill`` (part 27, not adopted): the token term first, from
    the grid's plans of one prefill item alone (:func:`one_prefill`: 1 request, 64-512 tokens; relative least squares
    on (1, tokens), held at 0 or more), then the constant and the request term on every sample with it held: the
    decodes, most of the samples, have as many tokens as requests and cannot split the two. ``prefill_step`` (part 31):
    on (1, decode requests, holds a prefill item) instead, at the same weights; ``prefill_log`` (part 32): and log2 of
    its largest prefill item's tokens."""
    zero = OpFit("layer_glue", "tok_req", "", {"c0": 0.0, "tok": 0.0, "req": 0.0})
    cost = ProfiledCost(Profile(meta, {**fits, **ends, "layer_glue": zero}), shape, None, 1)
    sets = (
        [(r, value(r, stat)) for r in rows if r["op"] == "stage_mid"],
        [(r, float(r["alone_s"])) for r in live if int(r.get("layers", 0)) > 0],
    )
    T, R, y, scale, weight, S, alone, P, PL = [], [], [], [], [], [], [], [], []
    for k, sel in enumerate(sets):
        for r, measured in sel:
            spec, plan = stage_spec(r), plan_of(r["items"])
            per = spec.num_layers * stage_layers_ratio(fits.get("stage_layers"), spec.num_layers)  # where charged
            T.append(plan.num_tokens)
            R.append(decode_reqs(plan) if per_decode or prefill_step else plan.num_reqs)
            S.append(prefill_sq(plan))
            P.append(has_prefill(plan))
            PL.append(largest_prefill_log2(plan))
            y.append((measured - cost.stage_time(spec, plan)) / per)
            scale.append(measured / per)
            weight.append(1.0 / len(sel))
            alone.append(k == 0 and one_prefill(plan))
    if prefill_step:
        logs = PL if prefill_log else None
        return _ols_tok_req(
            "layer_glue", T, R, y, scale if relative else None, weight, prefill_step=P, prefill_log=logs
        )
    if not tok_prefill or sum(alone) < 2:
        return _ols_tok_req("layer_glue", T, R, y, scale if relative else None, weight, S if sq else None, per_decode)
    pick = [i for i, a in enumerate(alone) if a]
    first = _ols_tok_req(
        "layer_glue", [T[i] for i in pick], [0.0] * len(pick), [y[i] for i in pick], [scale[i] for i in pick]
    )
    tok = max(first.coef["tok"], 0.0)
    rest = _ols_tok_req(
        "layer_glue", [0.0] * len(T), R, [v - tok * t for v, t in zip(y, T, strict=True)], scale, weight
    )
    return OpFit("layer_glue", "tok_req", "", {**rest.coef, "tok": tok})


def one_prefill(plan: StepPlan) -> bool:
    """Whether ``plan`` is one prefill item alone (the grid's ``P<c>@<p>`` plans): what ``tok_prefill`` fits the
    glue's token term on."""
    return len(plan.items) == 1 and plan.items[0].is_prefill


def fit_glue(
    cost: ProfiledCost, layer_rows: list[dict[str, Any]], stat: str = "median"
) -> tuple[OpFit, list[dict[str, Any]]]:
    """Artifacts written before stage steps were timed: ``layer_glue`` from functional whole-layer
    timings (OLS of whole layer minus sum of operators on (1, tokens, requests))."""
    gaps, T, R, res = [], [], [], []
    for r in layer_rows:
        ops, measured = cost.layer_time(plan_of(r["items"])), value(r, stat)
        gaps.append(
            {
                "stage": "layer",
                "plan": r["plan"],
                "measured_s": measured,
                "predicted_s": ops,
                "gap_rel": (measured - ops) / measured,
            }
        )
        T.append(r["tokens"])
        R.append(r["reqs"])
        res.append(measured - ops)
    return _ols_tok_req("layer_glue", T, R, res), gaps


def fit_idle(rows: list[dict[str, Any]], stat: str) -> OpFit | None:
    """``stage_idle``: seconds a stage step costs more after an idle gap than back to back, as a table
    over the gap (``interp`` from 0 at no gap; the cost model holds its last value beyond the longest
    gap), non-decreasing: a longer idle never warms the caches.

    ``idle_paired`` rows (:meth:`calibration.stage_step.EngineStages.idle_penalty_fn`) carry the
    penalty itself, measured against the adjacent back-to-back step; the table is the mean over plans
    of each plan's median, per step (``coef["per"] = "step"``): on this project's VM the penalty does
    not grow with the stage's depth (one to eight tiny layers, interleaved: +0.10-0.33 ms after 3 ms
    idle, +0.30-0.85 ms after 10 ms; ``benchmarks/bench_idle_penalty.py``), nor vanish when the gap
    is spent spinning instead of sleeping.
    ``idle`` rows (artifacts from before) carry absolute step times, one task per gap: the mean over
    plans of (t(gap) - t(0)) / layers, charged per layer."""
    paired = [r for r in rows if r["split"] == "idle_paired"]
    by: dict[str, dict[float, float]] = {}
    for r in paired or rows:
        v = float(r["median_s"]) if paired else value(r, stat) / int(r["layers"])  # differences: the median
        by.setdefault(r["plan"], {})[float(r["gap_s"])] = v
    if paired:
        plans = [{0.0: 0.0, **p} for p in by.values()]
    else:
        plans = [{g: t - p[0.0] for g, t in p.items()} for p in by.values() if 0.0 in p]
    if not plans:
        return None
    gaps = sorted(set.intersection(*(set(p) for p in plans)))
    ys = [max(0.0, float(np.mean([p[g] for p in plans]))) for g in gaps]
    for i in range(1, len(ys)):
        ys[i] = max(ys[i], ys[i - 1])
    return OpFit("stage_idle", "interp", "gap_s", {"xs": gaps, "ys": ys, **({"per": "step"} if paired else {})})


def fit_handoff(fits: dict[str, OpFit], rows: list[dict[str, Any]]) -> OpFit | None:
    """``handoff``: seconds the live engine's stage-to-stage transfer takes beyond the link ping-pong
    (``calibration/core_path.py``): the median over its transfers of measured minus ``send_recv`` at
    the same payload, a constant per transfer. None without both."""
    if "send_recv" not in fits or not rows:
        return None
    excess = [float(r["median_s"]) - fits["send_recv"].at(float(r["bytes"])) for r in rows for _ in range(r["repeats"])]
    return OpFit("handoff", "linear", "bytes", {"c0": float(np.median(excess)), "c1": 0.0})


def back_to_back(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``turnaround_each`` rows (the calibration run's restarts one by one) whose stage's previous compute
    was itself a restart: ``after_handover`` 0 where recorded, else (the first calibrations that kept them) the
    step before (``step_id - 1``) among the same run's restarts. A restart right after a hand-over is the
    sample's fast mode (docs/validation.md part 24); a stage busy step after step restarts as these do."""
    each = [r for r in rows if r["op"] == "turnaround_each"]
    ids = {(r.get("run"), int(r["step_id"])) for r in each}
    keep = []
    for r in each:
        if "after_handover" in r:
            if not int(r["after_handover"]):
                keep.append(r)
        elif (r.get("run"), int(r["step_id"]) - 1) in ids:
            keep.append(r)
    return keep


def _turnaround_line(n: np.ndarray, y: np.ndarray, w: np.ndarray) -> OpFit:
    """A line in the requests through per-count medians ``y`` weighted by their counts ``w`` (least squares);
    the weighted median where one request count was seen or the slope came out negative."""
    if len(set(n.tolist())) > 1:
        c1, c0 = np.polyfit(n, y, 1, w=np.sqrt(w))
        if c1 >= 0.0:
            return OpFit("turnaround", "linear", "reqs", {"c0": float(c0), "c1": float(c1)})
    return OpFit("turnaround", "linear", "reqs", {"c0": float(np.median(np.repeat(y, w.astype(int)))), "c1": 0.0})


def _line_by_reqs(each: list[dict[str, Any]]) -> OpFit:
    """:func:`_turnaround_line` through restarts one by one: the median per request count, weighted by its count."""
    by_n: dict[int, list[float]] = defaultdict(list)
    for r in each:
        by_n[int(r["reqs"])].append(float(r["median_s"]))
    ks = sorted(by_n)
    y = np.array([float(np.median(by_n[k])) for k in ks])
    return _turnaround_line(np.array(ks, dtype=float), y, np.array([float(len(by_n[k])) for k in ks]))


def fit_turnaround(
    rows: list[dict[str, Any]],
    by_reqs: bool = False,
    b2b: bool = False,
    held: bool = False,
    wide: bool = False,
    wide_b2b: bool = False,
) -> OpFit | None:
    """``turnaround``: seconds between a stage's two computes where its next input was already sent
    (``calibration/core_path.py``). By default, and for an artifact from before 2026-12-05 (rows by ``stage``): the
    median over the restarts whose input came 1 ms or more before (``turnaround_waited``, the rows by stage), a
    constant. ``by_reqs`` (docs/validation.md part 21: tried, not adopted): the ``turnaround`` rows by the step's
    requests (``reqs``), a line in the requests through their medians, each weighted by its count (least squares; a
    constant, the weighted median, where one request count was seen or the slope came out negative). ``b2b``
    (``analyse_and_write``'s default from docs/validation.md part 24 until part 25 (a)): the same line through the
    back-to-back restarts only (:func:`back_to_back`); the constant where a calibration has none (calibrations
    before 2026-12-05 evening). ``held`` (with ``b2b``; docs/validation.md part 25 (c): not adopted): the line's
    ``n_max``, the most requests those restarts had: the cost model charges a step of more requests the line's value
    there, not an extrapolation. ``wide`` (docs/validation.md part 26): the same line through every restart of
    calibration's wide run (``turnaround_wide``: micro-batches of 1-32 requests, :data:`calibration.core_path.WIDE`),
    by the step's requests; the constant where a calibration has none (calibrations before 2026-12-06); calibration's
    default from part 26's verdict until part 28 (a) reverted it. ``wide_b2b`` (with ``wide``; part 28 (b), moot once
    the line was reverted): that line through the wide run's
    back-to-back restarts only (``after_handover`` 0), leaving out the fast ones right after a hand-over, which in
    round 56's wide run made all ten of its one-request restarts (0.18 ms) and the line's constant 0.19 ms. None
    without rows."""
    if wide and (each := [r for r in rows if r["op"] == "turnaround_wide"]):
        if wide_b2b and (b2b_each := [r for r in each if not int(r.get("after_handover", 0))]):
            return _line_by_reqs(b2b_each)
        return _line_by_reqs(each)
    if b2b and (each := back_to_back(rows)):
        line = _line_by_reqs(each)
        if held:
            line = OpFit(line.name, line.form, line.x, {**line.coef, "n_max": max(float(r["reqs"]) for r in each)})
        return line
    by = [r for r in rows if r["op"] == "turnaround" and "reqs" in r]
    if not by_reqs or not by:
        old = [r for r in rows if r["op"] == ("turnaround_waited" if by else "turnaround")]
        xs = [float(r["median_s"]) for r in old for _ in range(int(r["repeats"]))]
        return OpFit("turnaround", "linear", "stage", {"c0": float(np.median(xs)), "c1": 0.0}) if xs else None
    n = np.array([float(r["reqs"]) for r in by])
    y = np.array([float(r["median_s"]) for r in by])
    return _turnaround_line(n, y, np.array([float(r["repeats"]) for r in by]))


def _uncharged(r: dict[str, Any], corun: float) -> float:
    """A live row's wall time without the co-run charge the pipelines make on it (``corun`` on a compute
    that started beside an earlier micro-batch, ``stage_corun``): what ``live_stage`` and ``stage_spread``
    measure is the rest, so the two are not charged twice."""
    co = str(r.get("corun") or "0") not in ("0", "")
    return float(r["median_s"]) / (corun if co else 1.0)


IDLE_SCALE_STEPS = 40  # bisection steps of :func:`idle_live_scale` (2^-40: exact to the float)


def idle_live_scale(cost: ProfiledCost, rows: list[dict[str, Any]], corun: float = 1.0) -> float:
    """The share ``s`` in [0, 1] of the paired ``stage_idle`` table that the two-stage live runs bear out:
    1 unless those runs, net of the idle charge (and the co-run charge), come out cheaper against their
    steps alone than the one-stage runs net of the whole table (``live_stage(2) / live_stage(1)`` under
    1); then the largest ``s`` at which the two depths agree (0 if they do not even without the charge).
    Recorded in ``meta.json`` (``stage_idle_live_scale``) and printed; not charged.

    Why it exists: the table is timed on a sleeping thread
    (:meth:`calibration.stage_step.EngineStages.idle_penalty_fn`), the charge is made on a waiting engine stage. Two
    calibrations in a row on this project's VM (2026-12-03) timed the pairs at +40-100% of a step while their own
    two-stage live runs ran about half that over alone, and the held-out draws that followed predicted their
    two-stage steps 24-68 points too slow; charging ``s`` of the table at PP > 1 took their TPOT from 29.1% to 15.8%
    and 19.9% to 12.8% (in sample). On the first fresh draw where it acted (``tiny`` seed 50, ``s`` = 0.635) it took
    TPOT from 11.0% to 14.7%: the two-stage live runs of calibration do not predict the draws' two-stage steps well
    enough to charge (docs/validation.md, part 14)."""
    one = [x for x in (_live_ratio(cost, sel, corun) for sel in _live_runs(rows, 1)) if x is not None]
    two = _live_runs(rows, 2)
    if not one or not two:
        return 1.0
    level1 = float(np.median(one))

    def ratio_at(s: float) -> float | None:  # live_stage(2) / live_stage(1), s of the table charged at two
        level2 = [x for x in (_live_ratio(cost, sel, corun, s) for sel in two) if x is not None]
        return float(np.median(level2)) / level1 if level2 else None  # None: the charge above the live time

    at_one = ratio_at(1.0)
    if at_one is not None and at_one >= 1.0:
        return 1.0
    at_zero = ratio_at(0.0)
    if at_zero is None or at_zero < 1.0:
        return 0.0
    lo, hi = 0.0, 1.0  # ratio_at(lo) >= 1 > ratio_at(hi)
    for _ in range(IDLE_SCALE_STEPS):
        mid = (lo + hi) / 2
        r = ratio_at(mid)
        if r is not None and r >= 1.0:
            lo = mid
        else:
            hi = mid
    return lo


def fit_live(cost: ProfiledCost, rows: list[dict[str, Any]], corun: float = 1.0, shift: bool = False) -> OpFit | None:
    """``live_stage``: the live engine's stage compute over the same step timed alone in a hot loop, per
    pipeline depth (``interp`` over the stage count, 1 and 2). The stage model is fitted on stages
    timed alone; the engine's stage runs between the engine core's work, its messages and (at two
    stages) the other stage's. Over ``live<n>`` rows that carry ``alone_s``
    (:func:`calibration.core_path.live_steps`, :func:`calibration.stage_step.time_live_alone`): per
    live run the ratio of sums, after taking off the idle-gap charge that the simulator makes on its
    own (``stage_idle``; the hot loop has no gaps), and per depth the median over the runs (three
    each): this VM's speed flips within seconds, and one run of a calibration came out 1.21 and the
    next 1.51 against steps timed alone after both. Model-free: the stage model's own error on these
    plans does not enter. A compute charged ``corun`` (it started beside an earlier micro-batch) counts
    without that charge. With ``shift`` (recorded in ``meta.json``, not charged), each run's ratio
    times its rows' ``host_shift`` (the in-run sampler's reading of the host while the steps were timed
    alone over during the run, :func:`calibration.core_path.shift_by_host`; 1 without one). None
    without such rows."""
    xs, ys = [], []
    for n in (1, 2):
        ratios = (
            (_live_ratio(cost, sel, corun), sel[0].get("host_shift", 1.0) if shift else 1.0)
            for sel in _live_runs(rows, n)
        )
        factors = [f * float(k) for f, k in ratios if f is not None]
        if factors:
            xs.append(float(n))
            ys.append(float(np.median(factors)))
    return OpFit("live_stage", "interp", "stages", {"xs": xs, "ys": ys}) if xs else None


def live_ratios(cost: ProfiledCost, rows: list[dict[str, Any]], corun: float = 1.0) -> dict[int, tuple[float, float]]:
    """Depth -> (over the same steps alone, over the stage model), medians over calibration's live runs at
    that depth, each net of the idle charge and of ``corun`` on a co-running compute, as :func:`fit_live`. Where
    the two differ, the stage model's own error on the live steps' stages (``experiments/validation/plan_class.py
    live``): the charged factor leaves it out, and multiplies the model."""
    out = {}
    for n in (1, 2):
        alone, model = [], []
        for sel in _live_runs(rows, n):
            idle = sum(cost.idle_time(stage_spec(r), float(r["gap_s"])) for r in sel)
            net = sum(_uncharged(r, corun) for r in sel) - idle
            predicted = sum(cost.stage_time(stage_spec(r), plan_of(r["items"])) for r in sel)
            ratio = _live_ratio(cost, sel, corun)
            if ratio is not None and predicted > 0.0:
                alone.append(ratio)
                model.append(net / predicted)
        if alone:
            out[n] = (float(np.median(alone)), float(np.median(model)))
    return out


def fit_depth(cost: ProfiledCost, rows: list[dict[str, Any]], corun: float = 1.0) -> OpFit | None:
    """``live_depth``: the live runs at two stages over those at one, each over the stage model
    (:func:`live_ratios`), the depth ratio the simulator charges at PP > 1 (held at 1 or more,
    :func:`ppsim.cost.profiled.depth_charged`). ``live_stage``'s ratio is over the same steps timed alone:
    charged on the model, it counts the model's own error on the two-stage live steps' stages (0.82-0.99x
    on the first stage of ``dense-1024``, timed alone) a second time (docs/validation.md, part 16).
    ``linear`` with no slope (one ratio). None without live runs at both depths."""
    ratios = live_ratios(cost, rows, corun)
    if 1 not in ratios or 2 not in ratios or ratios[1][1] <= 0.0:
        return None
    return OpFit("live_depth", "linear", "stages", {"c0": ratios[2][1] / ratios[1][1], "c1": 0.0})


def fit_corun(rows: list[dict[str, Any]]) -> OpFit | None:
    """``stage_corun``: a stage's compute while another stage computes on the same host over the same step
    alone (:mod:`calibration.corun`): per reading (column ``reading``; an older artifact's rows are one)
    the median over its plans of their paired ratios, and the **mean** over the readings, which are
    spread over the calibration's minutes: what the two vCPUs cost each other flips between about 1.0
    and 1.3 within minutes on this VM (one calibration's seven readings: 0.99, 1.29, 0.92, 1.24, 0.99,
    1.01, 1.03), and the pipelines charge a draw's every co-running compute, i.e. the time average, not
    the typical reading. ``linear`` with no slope (one factor). None without such rows (a GPU
    calibration, an older artifact)."""
    by_reading: dict[str, list[float]] = {}
    for r in rows:
        if r["op"] == "stage_corun" and r.get("alone_s"):
            by_reading.setdefault(str(r.get("reading", "")), []).append(float(r["median_s"]) / float(r["alone_s"]))
    if not by_reading:
        return None
    c0 = float(np.mean([np.median(xs) for xs in by_reading.values()]))
    return OpFit("stage_corun", "linear", "stages", {"c0": c0, "c1": 0.0})


SPREAD_QUANTILES = 32  # the stage_spread table: this many quantiles of the pooled ratios
SPREAD_GAP_S = 0.005  # by_gap: a compute after a gap of at most this is "busy" (docs/validation.md, part 29)


def _spread_table(ratios: list[float]) -> list[float]:
    """``SPREAD_QUANTILES`` quantiles of ``ratios`` over their mean, the table's mean exactly one."""
    a = np.asarray(ratios) / float(np.mean(ratios))
    ys = np.quantile(a, (np.arange(SPREAD_QUANTILES) + 0.5) / SPREAD_QUANTILES)
    return (ys / float(np.mean(ys))).tolist()


def fit_spread(
    cost: ProfiledCost, rows: list[dict[str, Any]], corun: float = 1.0, by_gap: bool = False
) -> OpFit | None:
    """``stage_spread``: the live engine's step-to-step spread of stage computes at two stages, mean one.
    Over ``live2`` rows that carry ``alone_s`` (as :func:`fit_live`): each step's (live - the idle
    charge) / the same step alone, over its run's ratio of sums (:func:`_live_ratio`: the run's level,
    which moves with the host and is not charged, comes out), pooled over the runs and divided by their
    mean; the table keeps ``SPREAD_QUANTILES`` quantiles (``xs`` the levels, ``ys`` the ratios, mean
    exactly one). The pipelines multiply each compute at PP > 1 by one of them, drawn by (stage, step):
    with two or more micro-batches in flight a slow step holds the next stage and the micro-batch
    behind it. None without such rows.

    ``by_gap`` (part 29): two tables, split by the gap before the step (``gap_s``) at ``SPREAD_GAP_S``: ``ys``
    those of steps after a gap of at most that (a stage working back to back, as in the validation runs, gaps of
    1-3 ms), ``ys_idle`` the others (calibration's one-micro-batch runs wait ~20 ms for the other stage, and their
    steps spread twice as wide: cv 0.12-0.27 against 0.08-0.19 on MoE rounds 57-59); ``gap_s`` the split. The
    pipelines draw a compute from the table of the gap before it. A class of fewer than ``SPREAD_QUANTILES`` ratios
    takes the pooled table."""
    ratios: list[tuple[float, float]] = []  # (ratio, the gap before the step)
    for sel in _live_runs(rows, 2):
        level = _live_ratio(cost, sel, corun)
        if level is None:
            continue
        for r in sel:
            gap = float(r["gap_s"])
            live = _uncharged(r, corun) - cost.idle_time(stage_spec(r), gap)
            if live > 0:
                ratios.append((live / float(r["alone_s"]) / level, gap))
    if len(ratios) < SPREAD_QUANTILES:
        return None
    levels = ((np.arange(SPREAD_QUANTILES) + 0.5) / SPREAD_QUANTILES).tolist()
    pooled = _spread_table([x for x, _ in ratios])
    coef: dict[str, Any] = {"xs": levels, "ys": pooled}
    if by_gap:
        busy = [x for x, g in ratios if g <= SPREAD_GAP_S]
        idle = [x for x, g in ratios if g > SPREAD_GAP_S]
        coef["ys"] = _spread_table(busy) if len(busy) >= SPREAD_QUANTILES else pooled
        coef["ys_idle"] = _spread_table(idle) if len(idle) >= SPREAD_QUANTILES else pooled
        coef["gap_s"] = SPREAD_GAP_S
    return OpFit("stage_spread", "interp", "quantile", coef)


def timed_alone(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calibration's live-engine stage steps that were timed again alone (``alone_s``)."""
    return [r for r in rows if str(r["split"]).startswith("live") and r.get("alone_s")]


def whole_model_steps(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live steps of calibration's one-stage runs (``live1``): stages that hold every layer of the model, so
    the whole model's weights pass through the host's caches each step (docs/validation.md, part 36)."""
    return [r for r in live if r["split"] == "live1"]


DECODE_BINS = ((1, 1), (2, 3), (4, 7), (8, 12), (13, 20), (21, 64), (65, 1 << 20))  # fit_decode_batch's bins
DECODE_BIN_MIN_STEPS = 3  # a bin with fewer decode steps timed alone is left out


def decode_ratios(cost: Any, rows: list[dict[str, Any]]) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """Calibration's live decode-only steps timed alone (``alone_s``), each as (its requests, its time over what
    ``cost`` prices it at), by bin of requests (:data:`DECODE_BINS`, in order; empty bins left out)."""
    by: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for r in timed_alone(rows):
        plan = plan_of(r["items"])
        if plan.is_empty or plan.num_prefill_tokens:
            continue
        pred = cost.stage_time(stage_spec(r), plan)
        n = len(plan.items)
        if pred > 0:
            by.setdefault(next(b for b in DECODE_BINS if b[0] <= n <= b[1]), []).append((n, float(r["alone_s"]) / pred))
    return dict(sorted(by.items()))


def fit_decode_batch(
    fits: dict[str, OpFit], meta: dict[str, Any], shape: ModelShape, rows: list[dict[str, Any]]
) -> OpFit | None:
    """``decode_batch``: calibration's live decode-only steps timed alone (both depths' stages, ``alone_s``) over the
    stage model ``fits`` prices them at, the median per bin of requests (:data:`DECODE_BINS`, at the bin's median
    request count; ``interp`` over requests, held beyond the ends). A glue linear in tokens and requests prices the
    one-request decode 5-19% over these same steps on every calibration read (docs/validation.md part 45); the
    profiled cost multiplies a decode-only stage compute by this where the profile charges it. None with fewer than
    two bins."""
    cost = ProfiledCost(Profile(meta, {k: v for k, v in fits.items() if k != "decode_batch"}), shape, None, 1)
    kept = [v for v in decode_ratios(cost, rows).values() if len(v) >= DECODE_BIN_MIN_STEPS]
    if len(kept) < 2:
        return None
    xs = [float(np.median([n for n, _ in v])) for v in kept]
    ys = [float(np.median([q for _, q in v])) for v in kept]
    return OpFit("decode_batch", "interp", "reqs", {"xs": xs, "ys": ys})


LAST_LIVE_MIN_PAIRS = 5  # fit_last_live: at least this many two-stage steps timed alone at both stages
LAST_LIVE_NOTE = (
    "live engine's last stage over its first, measured minus priced, seconds a step (calibration's two-stage steps "
    "timed alone; part 42): the last stage is charged it less its layers' share, every other stage minus its share"
)


def last_live_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Calibration's two-stage live steps (``live2``) as (first stage, last stage) pairs of one step, both timed
    again alone (``alone_s``): each live run records its stages' computes in step order, so the k-th first-stage row
    and the k-th last-stage row are one step (same plan)."""
    first = [r for r in rows if r["split"] == "live2" and r["op"] == "stage_first"]
    last = [r for r in rows if r["split"] == "live2" and r["op"] == "stage_last"]
    pairs = zip(first, last, strict=False)
    return [(a, b) for a, b in pairs if a["items"] == b["items"] and a.get("alone_s") and b.get("alone_s")]


def fit_last_live(
    fits: dict[str, OpFit], meta: dict[str, Any], shape: ModelShape, rows: list[dict[str, Any]]
) -> float | None:
    """Seconds the live engine's last stage spends on a step beyond what its ends are priced at, against its first
    stage (docs/validation.md, part 42): the median over calibration's two-stage steps timed alone of (last stage -
    first stage, measured) - (the same, priced with ``fits``). The layers' glue cancels in the difference (both stages
    hold as many layers), so what is left is the last stage's final norm, lm_head and sampling (and ``last_glue``,
    fitted on the grid's in-process last stages) against the first stage's embedding, as the live engine runs them.
    None with fewer than :data:`LAST_LIVE_MIN_PAIRS` pairs."""
    pairs = last_live_pairs(rows)
    if len(pairs) < LAST_LIVE_MIN_PAIRS:
        return None
    cost = ProfiledCost(Profile(meta, fits), shape, None, 1)
    gaps = []
    for a, b in pairs:
        plan = plan_of(a["items"])
        priced = cost.stage_time(stage_spec(b), plan) - cost.stage_time(stage_spec(a), plan)
        gaps.append(float(b["alone_s"]) - float(a["alone_s"]) - priced)
    return float(np.median(gaps))


def _live_runs(rows: list[dict[str, Any]], stages: int) -> list[list[dict[str, Any]]]:
    """The ``live<stages>`` rows timed alone too (``alone_s``), one list per live run."""
    by_run: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["split"] == f"live{stages}" and r.get("alone_s"):
            by_run.setdefault(int(r.get("run", 0)), []).append(r)
    return list(by_run.values())


def _live_ratio(
    cost: ProfiledCost, sel: list[dict[str, Any]], corun: float = 1.0, idle_share: float = 1.0
) -> float | None:
    """One live run's (stage computes, the co-run charge off, - ``idle_share`` of the idle charge) / the
    same steps alone, ratio of sums; None where the charge is the live time or more."""
    idle = idle_share * sum(cost.idle_time(stage_spec(r), float(r["gap_s"])) for r in sel)
    measured, alone = sum(_uncharged(r, corun) for r in sel), sum(float(r["alone_s"]) for r in sel)
    return (measured - idle) / alone if alone > 0 and measured > idle else None


def heldout_errors(cost: ProfiledCost, rows: list[dict[str, Any]], stat: str = "median") -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if r["op"] == "layer":
            pred = cost.layer_time(plan_of(r["items"]))
        elif r["op"] in KINDS:
            pred = cost.stage_time(stage_spec(r), plan_of(r["items"]))
        else:
            pred = predict(cost.f[r["op"]], _feats([r]), 0)
        measured = value(r, stat)
        out.append(
            {
                "op": r["op"],
                "plan": r.get("plan") or "",
                "tokens": r.get("tokens"),
                "measured_s": measured,
                "predicted_s": pred,
                "rel_err": (pred - measured) / measured,
            }
        )
    return out


def _median_abs(xs: list[dict[str, Any]]) -> float | None:
    return float(np.median([abs(x["rel_err"]) for x in xs])) if xs else None


def _timed_rows(
    prof: Any,
    tasks: Any,
    progress: Any,
    rounds: int,
    model: str,
    device: str,
    threads: int | None,
    quick: bool,
    log: Callable[[str], None],
    corun: Any = None,
) -> list[dict[str, Any]]:
    """Every timed row of a calibration but the link's: the operator grid, the micro-benchmarks, the
    live engine's core path and stage steps, and with ``corun`` (a :class:`calibration.corun.CoRunner`,
    CPU) one co-run reading at the start of every grid round and one after the live runs."""
    corun_rows: list[dict[str, Any]] = []

    def round_start(i: int, n: int, t: Any) -> None:
        if corun is not None and i % len(tasks) == 0:
            corun_rows.extend(corun.reading(1))
        progress(i, n, t)

    rows = prof.run(tasks, round_start, rounds)
    kind = "quick" if quick else "full"
    clock = prof.timer.clock
    log(f"scheduler CPU overheads over n={CPU_NS[kind]} requests (micro-benchmark, kept for reference)")
    from calibration.cpu_overheads import profile_cpu

    micro = profile_cpu(CPU_NS[kind], repeats=5, clock=clock if device == "cpu" else "wall")
    log("engine control path between two bare processes (micro-benchmark, kept for reference)")
    from calibration.control import profile_control

    micro += profile_control(CPU_NS[kind], repeats=15 if quick else 40)
    rows += [{**r, "split": "micro"} for r in micro]
    log("engine core and control path on the live engine (one stage, 32 requests)")
    from calibration.core_path import profile_core_path
    from calibration.stage_step import time_live_alone

    # each live run's stage steps timed again alone right after it (the live engine's factor)
    rows += profile_core_path(model, device, threads or 1, lambda live: time_live_alone(prof.stages, prof.timer, live))
    if corun is not None:
        n = corun.readings + 1
        log(f"a stage's steps while another stage computes on the host's cores, and alone (stage_corun, {n} readings)")
        corun_rows.extend(corun.reading(1))
    return rows + corun_rows


def model_inputs(model: str) -> dict[str, str]:
    """``--model`` as a path the calibration reads (a config.json or a directory holding one), else nothing:
    the profile written may not replace it."""
    from ppsim.models.shape import list_presets

    return {} if model in list_presets() else {"--model": model}


def calibrate(
    model: str,
    device: str,
    out: str,
    quick: bool = False,
    threads: int | None = 1,
    dtype: str | None = None,
    link: bool = True,
    log: Callable[[str], None] | None = None,
    clock: str = "auto",
    router_zipf: float = 0.0,
) -> dict[str, Any]:
    """Run the whole calibration and write the artifact to ``out``; returns ``meta``.

    ``clock`` "auto" times CPU operators by thread CPU time when one torch thread runs them (robust on
    a shared host), else by wall clock; CUDA always uses CUDA events; the link always wall clock.
    ``threads`` >= 1 sets torch's CPU threads (``None`` leaves torch's default). ``threads`` and ``out``
    are checked before any profiling. ``router_zipf``: a MoE model's router skew (``engine/moe.py``),
    under which the router's expert load is measured for the cost model.
    """
    if threads is not None and threads < 1:
        raise PPSimError(f"--threads: {threads} is not a thread count; use 1 or more (default 1)")
    if threads is not None and threads > MAX_THREADS_PER_STAGE:
        raise PPSimError(
            f"--threads: {threads} is more than {MAX_THREADS_PER_STAGE}, the most torch threads a stage process "
            "may run (the live engine's limit); give about the CPU cores, e.g. 4"
        )
    check_output_dir(out, inputs=model_inputs(model))
    import torch

    from calibration.core_path import shift_by_host
    from calibration.corun import CoRunner
    from calibration.layer import TORCH_DTYPES, Layer
    from calibration.link import profile_link
    from calibration.profile_ops import FULL, QUICK, OpProfiler
    from calibration.timer import Timer
    from engine.host_sampler import SAMPLER_KIND, model_sampler
    from engine.probe import model_probe, model_probe_fits, model_probe_kind, stage_probe

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if device == "cuda" and not torch.cuda.is_available():
        raise PPSimError("--device cuda: torch sees no CUDA device; use --device cpu")
    shape: ModelShape = load_model(model)
    if getattr(shape, "attention", "gqa") == "mla":
        raise PPSimError(
            f"--model {model}: the profiler times Llama-style layers, dense or MoE; MLA is not profiled yet"
        )
    if router_zipf < 0:
        raise PPSimError(f"--moe-router-zipf: {router_zipf} is negative; use 0 (router alone) or more")
    if router_zipf:
        refuse_skew_on_dense(shape, "--moe-router-zipf", shape.name, "--moe-router-zipf", "the router skew")
    dtype = shape.dtype if dtype is None else dtype
    if dtype not in TORCH_DTYPES:
        raise PPSimError(f"--dtype: {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    check_memory(shape, dtype, TORCH_DTYPES[dtype].itemsize, STACK_BYTES, device)
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    probes: list[float] = []  # the host's speed at the start of each round and at the end (CPU only)
    steps: list[float] = []  # the same for the engine's own step (engine/probe.py)
    wholes: list[float] = []  # and for this model's whole step, if it fits (engine/probe.py::model_probe)
    grid = QUICK if quick else FULL
    if clock == "auto":
        clock = "thread" if device == "cpu" and torch.get_num_threads() == 1 else "wall"
    if clock == "thread" and (device != "cpu" or torch.get_num_threads() != 1):
        raise PPSimError("--clock thread: needs --device cpu and --threads 1 (thread CPU time misses other threads)")
    timer = Timer(device, clock=clock, repeats=3, warmup=2, min_repeat_s=0.002 if quick else 0.005)
    rounds = 2 if quick else 6
    layer = Layer(shape, dtype, device, router_zipf=router_zipf)
    stack = max(1, min(shape.num_layers, STACK_BYTES // max(1, layer.weight_bytes())))
    prof = OpProfiler(layer, timer, stack=stack)
    tasks = prof.tasks(grid) + stage_layers.tasks(prof)

    def host_readings() -> None:
        probes.append(cpu_probe()[0])
        steps.append(stage_probe())
        if model_probe_fits(shape):
            wholes.append(model_probe(shape))

    def progress(i: int, n: int, t: Any) -> None:
        if device == "cpu" and i % len(tasks) == 0:  # the host guard's probes (ppsim/validate/host.py)
            host_readings()
        if i % 50 == 0 or i == n - 1:
            log(f"[{i + 1}/{n}] {t.op} {t.plan or t.feats}  ({time.perf_counter() - t0:.0f} s)")

    # the host's speed through the whole timing, by the in-run sampler (engine/host_sampler.py)
    cpu = device == "cpu"
    with (
        model_sampler(shape) if cpu else contextlib.nullcontext() as sampler,
        CoRunner(prof.stages, shape, dtype) if cpu else contextlib.nullcontext() as corun,
    ):
        rows = _timed_rows(prof, tasks, progress, rounds, model, device, threads, quick, log, corun)
    sampled = sampler.stats()["mean_s"] if sampler is not None else None
    shift_by_host(rows, sampler.samples() if sampler is not None else [])  # the live factor's host shift
    kind = "quick" if quick else "full"
    if probes:
        host_readings()
    backend = None
    if link:
        log(f"link ping-pong over {LINK_SIZES[kind]} bytes")
        lrows = profile_link(LINK_SIZES[kind], repeats=20 if quick else 50, device=device)
        backend = lrows[0]["backend"]
        rows += lrows
    # the profile is of this dtype: a scenario whose model runs another dtype must not load it
    nbytes = torch.empty(0, dtype=TORCH_DTYPES[dtype]).element_size()
    measured = shape.model_copy(
        update={"dtype": dtype, "dtype_bytes": nbytes, "weight_dtype": dtype, "kv_cache_dtype": dtype}
    )
    meta = base_meta(
        measured, "ppsim calibrate", device_name(device), dtype, torch.get_num_threads(), 1, torch.__version__
    )
    if shape.is_moe:
        from calibration.moe_ops import router_load

        meta["moe"] = {
            "router_zipf": router_zipf,
            "expert_load": router_load(shape, router_zipf),
            "note": "P(token picks expert e), engine-initialised routers on unit-RMS states",
        }
    meta.update(
        {
            "grid": kind,
            "clock": clock,
            "statistic": statistic(clock, device),
            "rounds": rounds,
            "link_backend": backend,
            "layer_stack": stack,
            **({"host_cpu": cpu_identity()} if device == "cpu" else {}),
            **({"host_probe_s": sum(probes) / len(probes), "host_probes_s": probes} if probes else {}),
            **({"host_stage_probe_s": sum(steps) / len(steps), "host_stage_probes_s": steps} if steps else {}),
            **(
                {
                    "host_model_probe_s": sum(wholes) / len(wholes),
                    "host_model_probes_s": wholes,
                    "host_model_probe": model_probe_kind(shape),
                }
                if wholes
                else {}
            ),
            **({"host_sampler_s": sampled, "host_sampler": SAMPLER_KIND} if sampled and sampled > 0 else {}),
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    )
    return analyse_and_write(rows, shape, meta, out)


def analyse_and_write(
    rows: list[dict[str, Any]],
    shape: ModelShape,
    meta: dict[str, Any],
    out: str,
    relative_glue: bool = True,
    charge_stage_layers: bool = False,
    glue_live: bool = True,
    turnaround_by_reqs: bool = False,
    turnaround_b2b: bool = False,
    turnaround_held: bool = False,
    turnaround_wide: bool = False,
    turnaround_wide_b2b: bool = False,
    charge_live: bool = False,
    glue_sq: bool = False,
    multi_items: bool = False,
    glue_per_decode: bool = False,
    glue_tok_prefill: bool = False,
    spread_by_gap: bool = False,
    attn_ctx: bool = False,
    glue_prefill_step: bool = False,
    glue_prefill_log: bool = False,
    ring_lad: bool = False,
    ring_own_schedule: bool = True,
    glue_whole: bool = True,
    path_multi: bool = False,
    last_live: bool = False,
    decode_batch: bool = True,
) -> dict[str, Any]:
    """Fit every operator, the stage glue, score the held-out samples, and write the artifact. ``stage_layers``
    (:mod:`calibration.stage_layers`) is recorded in ``meta.json`` (docs/validation.md parts 17 and 20: charged from
    part 19 until part 20's fresh readings reverted it). ``charge_stage_layers=True`` puts it in the fits, fitted before
    the glue, whose live steps' stages it prices; the profiled cost charges it and the live ratios are over that model.
    ``turnaround_by_reqs``: the turnaround by the step's requests (part 21: tried, not adopted; :func:`fit_turnaround`);
    ``turnaround_b2b`` (the default from part 24's verdict until part 25 (a) reverted it on its fresh readings): the
    same line through the back-to-back restarts only, where the calibration kept them (else, and with it off, the
    constant); ``turnaround_held`` that line charged at no more requests than those restarts had (part 25 (c): not
    adopted); ``turnaround_wide`` the line through the restarts of calibration's wide run, 1-32 requests (the default
    from part 26's verdict until part 28 (a) reverted it on its fresh readings), ``turnaround_wide_b2b`` through its
    back-to-back ones only (part 28 (b): moot once (a) reverted the line).
    ``charge_live``: the simulator charges the live fits (level, depth ratio, co-run; meta ``live_charges``
    "charged"), as every calibration did until part 25 (b); by default they are fitted and recorded only
    ("recorded"). ``glue_sq``: ``layer_glue`` with a term on
    the plan's prefill items' tokens squared, else (1, tokens, requests); ``multi_items``: the glue also on the grid's
    stage plans of many prefill items, else without them, as calibrations before had none; ``glue_per_decode``: the
    glue's request term over decode requests only. The three were judged and not adopted (docs/validation.md, part 22);
    ``experiments/validation/glue_live.py refit --compare`` reproduces them on any calibration since.
    ``glue_tok_prefill``: the glue's token term from the grid's one-item prefill plans alone (part 27: not adopted).
    ``spread_by_gap``: ``stage_spread`` as two tables split by the gap before the step (:func:`fit_spread`; the default
    from part 29's verdict until part 29 (b) reverted it on its fresh readings; by default one pooled table).
    ``attn_ctx``: ``attn_prefill`` with a term on each item's context, chunk + prefix (part 30 (a): adopted; (c):
    reverted on its fresh readings; by default the four-term form). ``glue_prefill_step``: ``layer_glue`` charges a step
    holding a prefill item once (``pstep``) and its decode requests (``dreq``), no token term (part 31 (a): adopted;
    (c): reverted on its fresh readings; by default the (1, tokens, requests) glue, as ``glue_sq``, ``glue_per_decode``
    and ``glue_tok_prefill`` each name their own form). ``glue_prefill_log``: that charge growing with log2 of the
    step's largest prefill item's tokens (``pstep`` + ``plog`` log2 M; part 32: not the default unless its fresh
    readings adopt it). ``ring_lad`` (the default from part 34 (a)'s verdict until (c) reverted it on its fresh
    readings): ``ring_launch`` and ``ring_return`` as lines by least absolute deviation over every recorded gap, each
    per-count median weighted by its repeats; off, by relative least squares over the per-count medians.
    ``ring_own_schedule`` (the default since part 35's verdict): ``ring_launch`` from launches measured
    from the step's own schedule (:func:`calibration.core_path.step_paths`); off, from ``ring_launch_any`` where the
    calibration kept it (launches from whichever schedule came last, an empty one included, as measured before part
    35; a calibration from before part 35 has only those, as ``ring_launch``). ``glue_whole`` (the default since
    part 36's verdict): ``layer_glue``'s live steps are the one-stage runs' alone (:func:`whole_model_steps`: their
    stage holds every layer), so each stage's layers are priced as a layer costs when the whole model passes through
    the host's caches each step, as in a live pipeline whose stages share the host; off, the live steps of every
    depth, as before. ``path_multi``: :func:`fit_all`'s (part 40). ``last_live`` (part 42): fits ``last_live``, the
    live last stage's excess over its priced ends from calibration's two-stage steps timed alone
    (:func:`fit_last_live`), which the profiled cost charges at PP > 1 (``ProfiledCost._stage_parts``).
    ``decode_batch`` (the default since part 45's verdict): charges :func:`fit_decode_batch`, the live decodes timed
    alone over the stage model by requests (recorded in ``meta.json`` ``decode_batch`` either way; off: only there)."""
    stat = meta.get("statistic", "median")
    fits, stats = fit_all(rows, stat, attn_ctx, ring_lad, ring_own_schedule, path_multi)
    layers = stage_layers.fit(rows, fits.get("prepare_inputs"), stat, value)
    if layers is not None and charge_stage_layers:  # before the glue: the live steps' stages are priced with it
        fits["stage_layers"] = layers
    if any(r["split"] == "stage" for r in rows):
        stage_rows = [r for r in rows if r["split"] == "stage" and (multi_items or not multi_item(r))]
        alone = timed_alone(rows) if glue_live else None
        if alone and glue_whole:
            alone = whole_model_steps(alone)
        glue, gaps = fit_stage_glue(
            fits,
            meta,
            shape,
            stage_rows,
            stat,
            relative_glue,
            alone,
            glue_sq,
            glue_per_decode,
            glue_tok_prefill,
            (glue_prefill_step or glue_prefill_log) and not (glue_sq or glue_per_decode or glue_tok_prefill),
            glue_prefill_log,
        )
        note = "relative least squares: the engine's stage steps minus the operators (calibration/stage_step.py)"
        if not relative_glue:
            note = "OLS of the engine's stage steps minus the operators' prediction (calibration/stage_step.py)"
    else:  # an artifact from before stage steps were timed
        alone = None
        cost = ProfiledCost(Profile(meta, fits), shape, None, 1)
        g, gaps = fit_glue(cost, [r for r in rows if r["split"] == "layer"], stat)
        glue, note = {"layer_glue": g}, "OLS of whole layer minus sum of operators"
    fits.update(glue)
    shift = fit_last_live(fits, meta, shape, rows) if last_live else None
    if shift is not None:  # charged by ProfiledCost at PP > 1 (its stages' shares of it sum to 0 at every depth)
        fits["last_live"] = OpFit("last_live", "linear", "", {"c0": shift, "c1": 0.0})
    batch = fit_decode_batch(fits, meta, shape, rows)
    if batch is not None:
        meta["decode_batch"] = batch.coef  # recorded (part 45); charged with ``decode_batch``, the default
        if decode_batch:
            fits["decode_batch"] = batch
    idle = fit_idle([r for r in rows if r["split"] in ("idle", "idle_paired")], stat)
    if idle is not None:
        fits["stage_idle"] = idle
    handoff = fit_handoff(fits, [r for r in rows if r["op"] == "handoff"])
    if handoff is not None:
        fits["handoff"] = handoff
    turns = [r for r in rows if r["op"] in ("turnaround", "turnaround_waited", "turnaround_each", "turnaround_wide")]
    turnaround = fit_turnaround(
        turns, turnaround_by_reqs, turnaround_b2b, turnaround_held, turnaround_wide, turnaround_wide_b2b
    )
    if turnaround is not None:
        fits["turnaround"] = turnaround
    cost = ProfiledCost(Profile(meta, fits), shape, None, 1)
    held = heldout_errors(cost, [r for r in rows if r["split"] == "heldout"], stat)
    corun = fit_corun(rows)
    if corun is not None:
        fits["stage_corun"] = corun
    charged = corun_ratio(corun) if corun is not None else 1.0  # what the pipelines charge (PP > 1)
    if idle is not None and idle.coef.get("per") == "step":  # the paired table checked on the live runs: reported
        meta = {**meta, "stage_idle_live_scale": idle_live_scale(cost, rows, charged)}
    live = fit_live(cost, rows, charged)  # after the held-out scores: those are of stages timed alone
    if live is not None:
        fits["live_stage"] = live
        if any("host_shift" in r for r in rows):  # recorded, not charged (docs/calibration.md)
            shifted = fit_live(cost, rows, charged, shift=True)
            meta = {**meta, "live_stage_host_shifted": shifted.coef if shifted is not None else None}
    depth = fit_depth(cost, rows, charged)
    if depth is not None:
        fits["live_depth"] = depth
    spread = fit_spread(cost, rows, charged, spread_by_gap)
    if spread is not None:
        fits["stage_spread"] = spread
    whole = ("layer", *KINDS)
    meta = {k: v for k, v in meta.items() if k != "stage_layers"}  # a refit's earlier record: this fit's, or none
    if layers is not None and not charge_stage_layers:  # recorded (docs/validation.md, part 17)
        meta = {**meta, "stage_layers": {**layers.coef, "note": stage_layers.NOTE + "; recorded, not charged"}}
    meta = {
        **meta,
        "live_charges": LIVE_CHARGED if charge_live else LIVE_RECORDED,
        "layer_gap": {"median_abs_rel": _median_abs([{"rel_err": g["gap_rel"]} for g in gaps]), "plans": gaps},
        "heldout": {
            "median_abs_rel_err_ops": _median_abs([h for h in held if h["op"] not in whole]),
            "median_abs_rel_err_layer": _median_abs([h for h in held if h["op"] in whole]),
            "median_abs_rel_err_all": _median_abs(held),
            "points": held,
        },
    }
    fj = {op: fit_to_json(f, stats.get(op, {})) for op, f in fits.items()}
    if idle is not None:
        per = "step" if idle.coef.get("per") == "step" else "layer"
        fj["stage_idle"].update({"note": f"extra seconds of a stage step after an idle gap, per {per}"})
    if handoff is not None:
        fj["handoff"].update({"note": "live engine's stage transfer minus send_recv, seconds per transfer"})
    if turnaround is not None:
        how = "a constant, its input 1 ms early or more"
        if turnaround.x == "reqs":
            wide = turnaround_wide and any(r["op"] == "turnaround_wide" for r in turns)
            b2b = turnaround_b2b and not wide and bool(back_to_back(turns))
            how = "by the step's requests" + (", through its back-to-back restarts (part 24)" if b2b else "")
            how += ", through its wide run's restarts (part 26)" if wide else ""
            how += ", the back-to-back ones (part 28)" if wide and turnaround_wide_b2b else ""
        fj["turnaround"].update({"note": f"live engine's stage loop between computes, input waiting, seconds; {how}"})
    if "last_live" in fj:
        fj["last_live"].update({"note": LAST_LIVE_NOTE})
    if live is not None:
        fj["live_stage"].update({"note": "live engine's stage compute / the same steps alone, by pipeline stages"})
    if depth is not None:
        fj["live_depth"].update({"note": "live engine's stage compute at two stages / at one, each over the model"})
    if spread is not None:
        fj["stage_spread"].update({"note": "live engine's step-to-step stage compute spread at two stages, mean one"})
    if layers is not None and charge_stage_layers:
        fj["stage_layers"].update({"note": stage_layers.NOTE})
    if corun is not None:
        fj["stage_corun"].update({"note": "a stage's step while another stage computes on the host / alone"})
    for name in glue:
        fj[name].update({"n_samples": sum(1 for g in gaps if g["stage"] in ("layer", GLUE_KIND[name])), "note": note})
    if alone and "layer_glue" in glue:  # fit_layer_glue_live
        n_live = sum(1 for r in alone if int(r.get("layers", 0)) > 0)
        live_note = LIVE_GLUE_NOTE + (WHOLE_GLUE_NOTE if glue_whole else "")
        fj["layer_glue"].update({"n_live_samples": n_live, "note": note + live_note})
    write_artifact(out, meta, fj, rows)
    return meta


def refit(profile_dir: str, **options: bool) -> dict[str, Any]:
    """Re-fit an artifact from its own ``samples.csv`` (after a change to the fitting code), in place; ``options``
    are :func:`analyse_and_write`'s keywords (``relative_glue=False``: :func:`fit_stage_glue` in seconds, ...)."""
    import json
    from pathlib import Path

    from calibration.artifact import read_samples

    meta = json.loads((Path(profile_dir) / "meta.json").read_text())
    shape = ModelShape(**meta["model"])
    rows = read_samples(profile_dir)
    return analyse_and_write(rows, shape, meta, profile_dir, **options)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_report(meta: dict[str, Any], fits: dict[str, Any]) -> str:
    """Per-operator leave-one-out error, the whole-layer gap and held-out errors, as printed by the CLI."""
    lines = [f"{'operator':<26}{'form':<14}{'n':>4}{'cv med |err|':>14}{'cv max |err|':>14}"]
    for op, f in sorted(fits.items()):
        cv, mx = f.get("cv_median_abs_rel_err"), f.get("cv_max_abs_rel_err")
        lines.append(f"{op:<26}{f['form']:<14}{f.get('n_samples', 0):>4}{pct(cv):>14}{pct(mx):>14}")
    gap = meta.get("layer_gap", {})
    if gap.get("median_abs_rel") is not None:
        lines.append(
            f"engine stage steps vs sum of operators: median |gap| {100 * gap['median_abs_rel']:.1f}% "
            f"over {len(gap['plans'])} samples (absorbed by the glue fits)"
        )
    h = meta.get("heldout", {})
    for k, name in (
        ("median_abs_rel_err_ops", "operators"),
        ("median_abs_rel_err_layer", "whole stages"),
        ("median_abs_rel_err_all", "all"),
    ):
        if h.get(k) is not None:
            lines.append(f"held-out {name}: median |err| {100 * h[k]:.1f}%")
    per_layer = fits.get("stage_layers", {}).get("coef") or meta.get("stage_layers")
    if per_layer:
        at = ", ".join(f"{x:.0f} layers x{y:.3f}" for x, y in zip(per_layer["xs"], per_layer["ys"], strict=True))
        how = "charged" if "stage_layers" in fits else "recorded, not charged"
        lines.append(f"a layer in a stage of n layers over one in the stack (stage_layers, {how}): {at}")
    live = fits.get("live_stage", {}).get("coef")
    if live:
        at = ", ".join(
            f"{x:.0f} stage{'s' if x > 1 else ''} x{y:.3f}" for x, y in zip(live["xs"], live["ys"], strict=True)
        )
        shifted = meta.get("live_stage_host_shifted") or {}
        if shifted.get("ys"):
            at += " (host-shifted, recorded only: " + ", ".join(f"x{y:.3f}" for y in shifted["ys"]) + ")"
        lines.append(f"live engine's stage compute over the same steps alone (live_stage): {at}")
        fit = fit_from_json("live_stage", fits["live_stage"])
        verb = "charged" if live_charged(meta) else "recorded, not charged (part 25)"
        charged = f"{verb}: its level x{live_level(fit):.3f} at every depth"  # ProfiledCost.level_factor
        if len(live["xs"]) > 1:
            read = {k: fit_from_json(k, fits[k]) for k in ("live_stage", "live_depth") if k in fits}
            ratio = depth_charged(read, True)
            over = "over the model, live_depth" if "live_depth" in fits else "live_stage"
            charged += f", its depth ratio x{ratio:.3f} at PP > 1 ({over})"  # ProfiledCost.depth_factor
        lines.append(charged + " (each held at 1 or more)")
    spread = fits.get("stage_spread", {}).get("coef")
    if spread:
        ys = spread["ys"]
        lines.append(
            f"live engine's step-to-step spread at two stages (stage_spread, charged at PP > 1): "
            f"sd {float(np.std(ys)):.3f}, from {ys[0]:.2f} to {ys[-1]:.2f}"
            + (f" after gaps up to {spread['gap_s'] * 1e3:.0f} ms" if "ys_idle" in spread else "")
        )
        if "ys_idle" in spread:
            ys = spread["ys_idle"]
            lines.append(f"  after longer gaps: sd {float(np.std(ys)):.3f}, from {ys[0]:.2f} to {ys[-1]:.2f}")
    scale = meta.get("stage_idle_live_scale")
    if scale is not None and scale < 1.0:
        lines.append(
            f"idle charge (stage_idle) checked on the live runs: the two-stage runs bear out x{scale:.3f} of the "
            "paired table (reported, not charged)"
        )
    if "stage_corun" in fits:
        fit = fit_from_json("stage_corun", fits["stage_corun"])
        lines.append(
            f"a stage's step with another stage computing on the host (stage_corun): x{fit.coef['c0']:.3f}; "
            f"{'charged' if live_charged(meta) else 'recorded, not charged'} x{corun_ratio(fit):.3f} at PP > 1 to a "
            "micro-batch that starts with another in the pipeline"
        )
    return "\n".join(lines)
