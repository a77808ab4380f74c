"""The stage glue: ``layer_glue``, ``first_glue`` and ``last_glue``, fitted between the operators and the engine's
stage steps (grid and live), by least squares on (1, tokens, requests) and the forms judged in docs/validation.md."""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration.samples import decode_reqs, has_prefill, one_prefill, plan_of, prefill_sq, stage_spec, value
from ppsim.cost.profiled import OpFit, Profile, ProfiledCost, largest_prefill_log2, stage_layers_ratio
from ppsim.models.shape import ModelShape


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
    the grid's plans of one prefill item alone (:func:`calibration.samples.one_prefill`: 1 request, 64-512 tokens;
    relative least squares
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
