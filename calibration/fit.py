"""Fitting per-operator time models to measured samples (numpy/scipy), with cross-validated error.

All fits minimise *relative* squared error (rows weighted by 1 / measured time), since timings span
three orders of magnitude and a planner cares about percent error, and keep coefficients
non-negative (``scipy.optimize.nnls``) so no prediction goes below zero outside the grid.

- GEMMs and elementwise ops: ``linear_floor`` = max(floor, c0 + c1 x). Small token counts hit a
  floor (launch overhead / reading the weights once); past the knee time grows linearly. The knee is
  chosen among the measured x values by least relative error; ``floor`` is the median below it.
- Prefill attention per chunk: call + tok c + cp c p + cc c^2 (the causal score matrix is c x (p + c/2));
  with ``ctx``, plus ctx (c + p): the item's K/V gathered and expanded to every query head, once a call
  (``engine/kvcache.py::paged_attention``; docs/validation.md part 30).
- Decode attention per step: call + req B + ctx sum(context) (each decode reads its whole KV).
- Grouped MoE experts: c0 + pair P + exp N (rows through the expert GEMMs; per-expert calls and
  weight reads).
- ``linear_lad``: a line by least absolute deviation, rows weighted by their repeats (``fit_linear_lad``), written
  as ``linear``; for wall-clock gaps whose per-count medians include a few stray small ones.

Cross-validation is leave-one-out over the grid points (50 interleaved folds past 50 points);
the median absolute relative error is stored per operator (``cv_median_abs_rel_err``) so a reader
sees how far to trust each fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import linprog, nnls

from ppsim.cost.profiled import OpFit

MAX_FOLDS = 50  # leave-one-out up to this many samples, then this many interleaved folds


def _wnnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error."""
    w = 1.0 / np.maximum(y, 1e-12)
    coef, _ = nnls(A * w[:, None], y * w)
    return coef


def fit_linear(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    c = _wnnls(np.column_stack([np.ones_like(x), x]), y)
    return {"c0": float(c[0]), "c1": float(c[1])}


def fit_linear_lad(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    """c0 + c1 x by least absolute deviation, each row weighted by ``w`` (its repeats; default 1), c0 and c1
    non-negative: a median line, which a few stray small rows do not pull down as they pull a relative least-squares
    line (``ring_launch``'s per-count medians, some from one to three gaps; docs/validation.md part 34). A linear
    program: minimise sum w (u + v) with c0 + c1 x - y = u - v."""
    n = len(y)
    w = np.ones(n) if w is None else np.maximum(np.asarray(w, float), 1.0)
    cost = np.concatenate([[0.0, 0.0], w, w])
    eq = np.hstack([np.column_stack([np.ones(n), x]), -np.eye(n), np.eye(n)])
    res = linprog(cost, A_eq=eq, b_eq=y, bounds=[(0, None)] * (2 + 2 * n), method="highs")
    if not res.success:  # cannot happen for a feasible, bounded LP; fall back to the relative least squares
        return fit_linear(x, y)
    return {"c0": float(res.x[0]), "c1": float(res.x[1])}


def fit_linear_floor(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """max(floor, c0 + c1 x) with the knee at the best measured x (floor 0 when there is no knee)."""
    order = np.argsort(x)
    x, y = x[order], y[order]
    best: tuple[float, dict[str, float]] | None = None
    for k in range(0, max(1, len(x) - 2)):
        lin = fit_linear(x[k:], y[k:])
        floor = float(np.median(y[:k])) if k else 0.0
        pred = np.maximum(floor, lin["c0"] + lin["c1"] * x)
        err = float(np.sum(((pred - y) / y) ** 2))
        if best is None or err < best[0] - 1e-12:
            best = (err, {"floor": floor, **lin})
    assert best is not None
    return best[1]


def fit_interp(x: np.ndarray, y: np.ndarray) -> dict[str, list[float]]:
    """Piecewise-linear table through the median time at each measured x."""
    xs = np.unique(x)
    return {"xs": [float(v) for v in xs], "ys": [float(np.median(y[x == v])) for v in xs]}


def prefill_features(chunk: np.ndarray, prefix: np.ndarray, ctx: bool = False) -> np.ndarray:
    cols = [np.ones_like(chunk), chunk, chunk * prefix, chunk * chunk]
    return np.column_stack([*cols, chunk + prefix] if ctx else cols)


def fit_prefill(chunk: np.ndarray, prefix: np.ndarray, y: np.ndarray, ctx: bool = False) -> dict[str, float]:
    """``prefill_attn``'s coefficients; ``ctx``: with the term on the item's context, chunk + prefix."""
    names = ("call", "tok", "cp", "cc", "ctx") if ctx else ("call", "tok", "cp", "cc")
    c = _wnnls(prefill_features(chunk, prefix, ctx), y)
    return dict(zip(names, map(float, c), strict=True))


def fit_decode(batch: np.ndarray, ctx: np.ndarray, y: np.ndarray) -> dict[str, float]:
    c = _wnnls(np.column_stack([np.ones_like(batch), batch, ctx]), y)
    return dict(zip(("call", "req", "ctx"), map(float, c), strict=True))


# --- one entry point per form: (features dict of arrays, y) -> coef; prediction through OpFit ---

Fitter = Callable[[dict[str, np.ndarray], np.ndarray], dict[str, float]]


def _fitter(form: str, x: str, attn_ctx: bool = False) -> Fitter:
    if form == "linear":
        return lambda f, y: fit_linear(f[x], y)
    if form == "linear_lad":
        return lambda f, y: fit_linear_lad(f[x], y, f.get("repeats"))
    if form == "linear_floor":
        return lambda f, y: fit_linear_floor(f[x], y)
    if form == "interp":
        return lambda f, y: fit_interp(f[x], y)
    if form == "prefill_attn":
        return lambda f, y: fit_prefill(f["chunk"], f["prefix"], y, attn_ctx)
    if form == "decode_attn":
        return lambda f, y: fit_decode(f["batch"], f["ctx_tokens"], y)
    if form == "tok_exp":
        return lambda f, y: dict(
            zip(
                ("c0", "pair", "exp"),
                map(float, _wnnls(np.column_stack([np.ones_like(f["pairs"]), f["pairs"], f["experts"]]), y)),
                strict=True,
            )
        )
    raise ValueError(f"no fitter for form {form}")


def predict(fit: OpFit, feats: dict[str, np.ndarray], i: int) -> float:
    if fit.form == "prefill_attn":
        return fit.prefill(int(feats["chunk"][i]), int(feats["prefix"][i]))
    if fit.form == "decode_attn":
        return fit.decode(int(feats["batch"][i]), int(feats["ctx_tokens"][i]))
    if fit.form == "tok_exp":
        return fit.tok_exp(float(feats["pairs"][i]), float(feats["experts"][i]))
    return fit.at(float(feats[fit.x][i]))


def fit_op(
    name: str, form: str, x: str, feats: dict[str, np.ndarray], y: np.ndarray, attn_ctx: bool = False
) -> tuple[OpFit, dict[str, Any]]:
    """Fit ``name`` on all samples, and leave-one-out error statistics of the same form (``attn_ctx``:
    ``prefill_attn`` with its context term)."""
    fitter = _fitter(form, x, attn_ctx)
    form = "linear" if form == "linear_lad" else form  # a line, however fitted: the cost model reads it as one
    fit = OpFit(name, form, x, fitter(feats, y))
    n = len(y)
    fold = np.arange(n) % MAX_FOLDS if n > MAX_FOLDS else np.arange(n)  # leave-one-out on small grids
    answered = _answered_by_table(feats[x]) if form == "interp" else np.zeros(n, bool)
    errs = [0.0] * int(answered.sum())
    for k in np.unique(fold):
        keep = fold != k
        if keep.sum() < 2:
            continue
        sub = OpFit(name, form, x, fitter({f: v[keep] for f, v in feats.items()}, y[keep]))
        errs += [abs(predict(sub, feats, i) - y[i]) / y[i] for i in np.flatnonzero(~keep & ~answered)]
    fit_err = [abs(predict(fit, feats, i) - y[i]) / y[i] for i in range(n)]
    stats = {
        "n_samples": n,
        "cv_median_abs_rel_err": float(np.median(errs)) if errs else None,
        "cv_max_abs_rel_err": float(np.max(errs)) if errs else None,
        "fit_median_abs_rel_err": float(np.median(fit_err)) if fit_err else None,
    }
    return fit, stats


def _answered_by_table(x: np.ndarray) -> np.ndarray:
    """Points of a table (``interp``) that no query falls beside: integer features (tokens, requests)
    measured at x - 1 and x + 1 too (or at 1 and 2: no count is below 1). The table answers a query
    at such a point with its own sample, so leaving it out, which interpolates over twice the gap
    the grid has, would measure an error no query meets: on a CPU GEMM, whose time saw-tooths with the
    token count (rows in blocks of 4), that made a straight line look better than the table through
    every count from 1 to 16. Their cross-validated error is the table's own: zero."""
    if not np.allclose(x, np.round(x)):
        return np.zeros(len(x), bool)
    have = set(np.round(x).astype(int).tolist())
    return np.array([(v - 1 in have or v <= 1) and v + 1 in have for v in np.round(x).astype(int)])


def fit_select(
    name: str, forms: tuple[str, ...], x: str, feats: dict[str, np.ndarray], y: np.ndarray, attn_ctx: bool = False
) -> tuple[OpFit, dict[str, Any]]:
    """Fit each candidate form and keep the one with the least cross-validated median error.

    The physics form comes first and wins ties. On a CPU, GEMM efficiency changes with the token
    count (blocking, cache fit), so a straight line can miss mid-grid points by 15-20% where the
    piecewise-linear table through the neighbours does not; the CV error decides, per operator.
    """
    best: tuple[OpFit, dict[str, Any]] | None = None
    cands = {}
    for form in forms:
        fit, stats = fit_op(name, form, x, feats, y, attn_ctx)
        cands[form] = stats["cv_median_abs_rel_err"]
        if best is None or (stats["cv_median_abs_rel_err"] or 0) < (best[1]["cv_median_abs_rel_err"] or 0) * 0.9:
            best = (fit, stats)
    assert best is not None
    return best[0], {**best[1], "cv_median_abs_rel_err_by_form": cands}


def fit_to_json(fit: OpFit, stats: dict[str, Any]) -> dict[str, Any]:
    return {"form": fit.form, "x": fit.x, "coef": fit.coef, **stats}
