"""The engine's stage loop outside the computes: the idle-gap charge (``stage_idle``), the hand-over beyond the
link (``handoff``) and the restart between computes (``turnaround``), fitted from calibration's rows."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from calibration.samples import value
from ppsim.cost.profiled import OpFit


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
