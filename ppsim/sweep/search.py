"""The highest request rate meeting the SLOs, by bisection on simulated runs.

First a saturation run (every request sent at t = 0) measures the configuration's capacity
``sat`` in requests/s. If even that run meets the SLOs, the answer is ``sat`` (limited by
throughput). Otherwise the rate is bisected in ``(0, sat]``, assuming the SLO check is monotone
in the rate (same seed: the arrival times only stretch), until the bracket is narrower than
``rel_tolerance x sat`` or ``max_steps`` runs were made. The limiting metric is the objective
furthest over its target in the first failing run above the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAILED = "failed_requests"


@dataclass(frozen=True)
class Probe:
    """One simulated run at ``rate`` (requests/s; inf = all at once)."""

    rate: float
    ok: bool
    limit: str | None  # the objective most over its target (None when ok)
    metrics: dict[str, float]


def check_slo(summary: dict[str, Any], slo: dict[str, float], num_prompts: int) -> tuple[bool, str | None]:
    """Whether a run meets every objective; if not, the one most over its target."""
    if summary["completed"] < num_prompts:
        return False, FAILED
    worst, worst_ratio = None, 1.0
    for key, target in slo.items():
        ratio = summary[key] / target
        if ratio > worst_ratio:
            worst, worst_ratio = key, ratio
    return worst is None, worst


def bisect_rate(probe: Callable[[float], Probe], rel_tolerance: float, max_steps: int) -> dict[str, Any]:
    """Search the highest passing rate; ``probe(math.inf)`` is the saturation run.

    Returns ``max_rate_rps`` (0 when no tested rate passes), ``limit``, the passing probe
    (``best``, or None), and every probe made (``probes``).
    """
    sat = probe(math.inf)
    probes = [sat]
    capacity = sat.metrics["request_throughput"]
    if sat.ok:
        return {
            "max_rate_rps": capacity,
            "limit": "throughput",
            "best": sat,
            "probes": probes,
            "saturation_rps": capacity,
        }
    lo, hi = 0.0, capacity
    best: Probe | None = None
    limit = sat.limit
    for _ in range(max_steps):
        if hi - lo <= rel_tolerance * capacity:
            break
        mid = (lo + hi) / 2
        p = probe(mid)
        probes.append(p)
        if p.ok:
            lo, best = mid, p
        else:
            hi, limit = mid, p.limit
    return {"max_rate_rps": lo, "limit": limit, "best": best, "probes": probes, "saturation_rps": capacity}
