"""The error arithmetic of validation: engine (over repeats) vs simulator, per metric and per request.

Signed error = (simulated - engine mean) / engine mean; for fractions (busy, bubble) it is the
absolute difference in fraction points, since a relative error of a near-zero bubble means nothing.
Run-to-run noise of the engine is reported
as its relative spread ((max - min) / mean over repeats) so an error can be judged against it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from ppsim.metrics.records import RequestRecord
from ppsim.metrics.summary import request_latencies

SCALAR_METRICS = (
    "request_throughput",
    "output_throughput",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")),
    "pipeline_bubble_fraction",
)
THROUGHPUT_AND_TPOT = {"request_throughput", "output_throughput", "mean_tpot_ms", "median_tpot_ms"}
FRACTION_LIMIT_POINTS = 0.05  # busy and bubble fractions: within 5 points


@dataclass(frozen=True)
class MetricRow:
    metric: str
    engine: float
    engine_spread: float  # (max - min) / mean over repeats
    simulated: float
    error: float  # signed relative error of the simulator

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_fraction(metric: str) -> bool:
    return metric.startswith("stage_busy_fraction") or metric == "pipeline_bubble_fraction"


def signed_error(sim: float, ref: float, absolute: bool = False) -> float:
    if absolute:
        return sim - ref
    if ref == 0:
        return 0.0 if sim == 0 else math.copysign(1.0, sim)  # capped at +-100%
    return (sim - ref) / ref


def _metric_values(summaries: list[dict[str, Any]], metric: str) -> list[float]:
    if metric.startswith("stage_busy_fraction["):
        i = int(metric[len("stage_busy_fraction[") : -1])
        return [float(s["stage_busy_fraction"][i]) for s in summaries]
    return [float(s[metric]) for s in summaries]


def metric_names(summary: dict[str, Any]) -> list[str]:
    stages = len(summary.get("stage_busy_fraction", []))
    return [*SCALAR_METRICS, *(f"stage_busy_fraction[{i}]" for i in range(stages))]


def compare_summaries(engine_runs: list[dict[str, Any]], sim: dict[str, Any]) -> list[MetricRow]:
    """One row per metric: engine mean and spread over ``engine_runs``, simulated value, signed error."""
    if not engine_runs:
        raise ValueError("need at least one engine run")
    rows = []
    for m in metric_names(engine_runs[0]):
        vals = _metric_values(engine_runs, m)
        mean = float(np.mean(vals))
        frac = is_fraction(m)
        spread = (max(vals) - min(vals)) if frac else (max(vals) - min(vals)) / mean if mean else 0.0
        s = _metric_values([sim], m)[0]
        rows.append(MetricRow(m, mean, spread, s, signed_error(s, mean, frac)))
    return rows


def per_request_errors(engine_runs: list[list[RequestRecord]], sim: list[RequestRecord]) -> dict[str, Any]:
    """Per-request TTFT and E2EL errors over every engine repeat (each engine request against the
    simulated request of the same id) and two-sample KS tests of all repeats' latencies pooled
    against the simulator's."""
    sim_by_id = {r.req_id: r for r in sim if r.status == "finished" and r.token_times}
    out: dict[str, Any] = {"repeats": len(engine_runs)}
    pairs = [
        (request_latencies(e), request_latencies(sim_by_id[e.req_id]))
        for run in engine_runs
        for e in run
        if e.status == "finished" and e.token_times and e.req_id in sim_by_id
    ]
    out["matched_requests"] = len(pairs)
    sim_lat = [request_latencies(r) for r in sim_by_id.values()]
    for key in ("ttft", "e2el"):
        if not pairs:
            out[key] = {}
            continue
        eng = np.array([p[0][key] for p in pairs])
        sm = np.array([p[1][key] for p in pairs])
        rel = (sm - eng) / np.where(eng > 0, eng, np.nan)
        ks = stats.ks_2samp(eng, np.array([d[key] for d in sim_lat]))
        out[key] = {
            "median_abs_error": float(np.nanmedian(np.abs(rel))),
            "mean_signed_error": float(np.nanmean(rel)),
            "p90_abs_error": float(np.nanpercentile(np.abs(rel), 90)),
            "ks_statistic": float(ks.statistic),
            "ks_pvalue": float(ks.pvalue),
        }
    return out


def verdict(rows: list[MetricRow]) -> dict[str, Any]:
    """Targets: |error| <= 10% on every relative metric, <= 5% on throughput and TPOT, and busy and
    bubble fractions within 5 points. The median |error| is over relative metrics only (percent);
    fractions are summarised apart, in points, never mixed with percentages."""
    misses = []
    for r in rows:
        limit = FRACTION_LIMIT_POINTS if is_fraction(r.metric) else 0.05 if r.metric in THROUGHPUT_AND_TPOT else 0.10
        if not abs(r.error) <= limit:
            misses.append(r.metric)
    rel = [abs(r.error) for r in rows if not is_fraction(r.metric)]
    pts = [abs(r.error) for r in rows if is_fraction(r.metric)]
    bubble = [r.error for r in rows if r.metric == "pipeline_bubble_fraction"]
    return {
        "misses": misses,
        "median_abs_error": float(np.median(rel)) if rel else 0.0,
        "max_abs_fraction_points": float(max(pts)) if pts else 0.0,
        "bubble_error_points": float(bubble[0]) if bubble else None,
    }
