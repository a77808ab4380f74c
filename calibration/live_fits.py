"""The live engine's fits: calibration's live pipeline runs, their stage computes timed again alone, against the
stage model (level, depth ratio, co-run, spread, the decode batch's shape, the last stage's excess)."""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration.samples import plan_of, stage_spec
from ppsim.cost.profiled import OpFit, Profile, ProfiledCost
from ppsim.models.shape import ModelShape


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
    fits: dict[str, OpFit],
    meta: dict[str, Any],
    shape: ModelShape,
    rows: list[dict[str, Any]],
    shape_only: bool = False,
) -> OpFit | None:
    """``decode_batch``: calibration's live decode-only steps timed alone (both depths' stages, ``alone_s``) over the
    stage model ``fits`` prices them at, the median per bin of requests (:data:`DECODE_BINS`, at the bin's median
    request count; ``interp`` over requests, held beyond the ends). A glue linear in tokens and requests prices the
    one-request decode 5-19% over these same steps on every calibration read (docs/validation.md part 45); the
    profiled cost multiplies a decode-only stage compute by this where the profile charges it. ``shape_only`` (part
    46): each bin over the median of every kept step's ratio, so the calibration's decodes timed alone keep the stage
    model's level (median one) and only its shape across request counts moves. None with fewer than two bins."""
    cost = ProfiledCost(Profile(meta, {k: v for k, v in fits.items() if k != "decode_batch"}), shape, None, 1)
    kept = [v for v in decode_ratios(cost, rows).values() if len(v) >= DECODE_BIN_MIN_STEPS]
    if len(kept) < 2:
        return None
    xs = [float(np.median([n for n, _ in v])) for v in kept]
    ys = [float(np.median([q for _, q in v])) for v in kept]
    if shape_only:
        level = float(np.median([q for v in kept for _, q in v]))
        ys = [y / level for y in ys]
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
