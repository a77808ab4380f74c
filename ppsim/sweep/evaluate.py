"""One configuration of a sweep, evaluated in a worker: memory check, then the rate search.

Runs in any process (local pool or Ray worker): it takes a picklable :class:`Task` and returns
a JSON-ready dict, writes no files, and depends only on the task, so every executor gives the
same result. Each probe is ``prepare`` + ``simulate`` + ``summarize`` in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from ppsim.config import Scenario
from ppsim.errors import PPSimError
from ppsim.metrics.summary import summarize
from ppsim.sim.build import prepare
from ppsim.sim.executor import simulate
from ppsim.sweep.search import Probe, bisect_rate, check_slo

KEPT_METRICS = (
    "completed", "request_throughput", "output_throughput", "total_token_throughput",
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms",
    "pipeline_bubble_fraction", "num_preemptions",
)
RESULT_VERSION = 1


@dataclass(frozen=True)
class Task:
    key: str
    labels: dict[str, str]
    scenario: Scenario
    slo: dict[str, float]
    rel_tolerance: float
    max_steps: int


def config_key(scenario: Scenario, slo: dict[str, float], rel_tolerance: float, max_steps: int) -> str:
    """A hash of everything that decides the result: the resolved scenario (rate excluded), SLOs, search."""
    d = scenario.model_dump(mode="json")
    d["workload"].pop("request_rate", None)
    blob = json.dumps({"v": RESULT_VERSION, "scenario": d, "slo": slo, "tol": rel_tolerance, "steps": max_steps},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _run(s: Scenario, rate: float, slo: dict[str, float]) -> Probe:
    s = s.model_copy(update={"workload": s.workload.model_copy(update={"request_rate": rate})})
    prep = prepare(s)
    res = simulate(prep)
    summary = summarize(res.requests, res.ops, len(prep.topology.stages))
    ok, limit = check_slo(summary, slo, len(prep.requests))
    return Probe(rate, ok, limit, {k: summary[k] for k in KEPT_METRICS})


def _probe_json(p: Probe) -> dict[str, Any]:
    return {"rate": "inf" if math.isinf(p.rate) else p.rate, "ok": p.ok, "limit": p.limit, **p.metrics}


def _base(task: Task) -> dict[str, Any]:
    c = task.scenario.cluster
    return {"key": task.key, "labels": task.labels, "num_gpus": c.pipeline_parallel_size * c.tensor_parallel_size,
            "version": RESULT_VERSION}


def memory_check(s: Scenario) -> dict[str, Any]:
    """KV figures of the configuration; raises PPSimError if it does not fit."""
    prep = prepare(s, requests=[])
    return {"kv_num_blocks": prep.num_blocks, "kv_capacity_tokens": prep.num_blocks * s.engine.block_size}


def evaluate(task: Task) -> dict[str, Any]:
    """The sweep result of one configuration (status ok, slo-unmet, no-fit or error)."""
    t0 = time.perf_counter()
    out = _base(task)
    try:
        out.update(memory_check(task.scenario))
    except PPSimError as err:
        status = "no-fit" if str(err).startswith("memory:") else "error"
        out.update(status=status, message=str(err), runs=0, max_rate_rps=0.0)
        return {**out, "wall_s": time.perf_counter() - t0}
    try:
        found = bisect_rate(lambda r: _run(task.scenario, r, task.slo), task.rel_tolerance, task.max_steps)
    except (PPSimError, NotImplementedError) as err:
        out.update(status="error", message=str(err).splitlines()[0], runs=0, max_rate_rps=0.0)
        return {**out, "wall_s": time.perf_counter() - t0}
    best: Probe | None = found["best"]
    rate = found["max_rate_rps"]
    out.update(
        status="ok" if best is not None else "slo-unmet",
        max_rate_rps=rate,
        rate_per_gpu=rate / out["num_gpus"],
        limit=found["limit"],
        saturation_rps=found["saturation_rps"],
        runs=len(found["probes"]),
        probes=[_probe_json(p) for p in found["probes"]],
    )
    if best is not None:
        out["at_max_rate"] = dict(best.metrics)
        out["output_tok_s_per_gpu"] = best.metrics["output_throughput"] / out["num_gpus"]
    else:
        lowest = min(found["probes"], key=lambda p: p.rate)
        out["message"] = f"{lowest.limit} misses its SLO even at {lowest.rate:.4g} req/s"
    return {**out, "wall_s": time.perf_counter() - t0}
