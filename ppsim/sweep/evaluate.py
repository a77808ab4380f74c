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
from pathlib import Path
from typing import Any

from ppsim.config import Scenario
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.metrics.summary import summarize
from ppsim.sim.executor import simulate
from ppsim.sweep.search import Probe, bisect_rate, check_slo

KEPT_METRICS = (
    "completed",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "pipeline_bubble_fraction",
    "num_preemptions",
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


PROFILE_FILES = ("fits.json", "meta.json")


def profile_digest(profile_dir: str | Path) -> str:
    """A hash of a calibration artifact's contents (fits.json, meta.json), so re-calibrating into
    the same directory changes the sweep keys; a missing or unreadable file hashes as absent."""
    h = hashlib.sha256()
    for name in PROFILE_FILES:
        try:
            data = (Path(profile_dir) / name).read_bytes()
        except OSError:
            data = b"<absent>"
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def config_key(scenario: Scenario, slo: dict[str, float], rel_tolerance: float, max_steps: int) -> str:
    """A hash of everything that decides the result: the resolved scenario (rate excluded), SLOs,
    search settings and, for a profiled cost model, the profile's contents (not only its path)."""
    d = scenario.model_dump(mode="json")
    d["workload"].pop("request_rate", None)
    blob: dict[str, Any] = {"v": RESULT_VERSION, "scenario": d, "slo": slo, "tol": rel_tolerance, "steps": max_steps}
    if scenario.cost.kind == "profile" and scenario.cost.profile_dir:
        blob["profile_sha256"] = profile_digest(scenario.cost.profile_dir)
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _run(s: Scenario, rate: float, slo: dict[str, float]) -> Probe:
    s = s.model_copy(update={"workload": s.workload.model_copy(update={"request_rate": rate})})
    prep = prepare(s)
    res = simulate(prep, keep_ops=False, keep_tokens=False)  # the summary needs only running totals
    summary = summarize(res.ledger, res.ops, len(prep.topology.stages))
    ok, limit = check_slo(summary, slo, len(prep.requests))
    return Probe(rate, ok, limit, {k: summary[k] for k in KEPT_METRICS})


def _probe_json(p: Probe) -> dict[str, Any]:
    return {"rate": "inf" if math.isinf(p.rate) else p.rate, "ok": p.ok, "limit": p.limit, **p.metrics}


def _base(task: Task) -> dict[str, Any]:
    c = task.scenario.cluster
    return {
        "key": task.key,
        "labels": task.labels,
        "num_gpus": c.pipeline_parallel_size * c.tensor_parallel_size,
        "version": RESULT_VERSION,
    }


def memory_check(s: Scenario) -> dict[str, Any]:
    """KV figures of the configuration; raises PPSimError if it does not fit."""
    prep = prepare(s, requests=[])
    return {"kv_num_blocks": prep.num_blocks, "kv_capacity_tokens": prep.num_blocks * s.engine.block_size}


def one_line(err: BaseException) -> str:
    """``Type: first line of the message`` for an unexpected exception (PPSimError: the message alone)."""
    text = (str(err).strip().splitlines() or [""])[0]
    if isinstance(err, PPSimError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def error_result(task: Task, err: BaseException, wall_s: float = 0.0) -> dict[str, Any]:
    """The result of a configuration whose evaluation raised: status ``error``, a one-line message."""
    return {
        **_base(task),
        "status": "error",
        "message": one_line(err),
        "runs": 0,
        "max_rate_rps": 0.0,
        "wall_s": wall_s,
    }


def evaluate(task: Task) -> dict[str, Any]:
    """The sweep result of one configuration (status ok, slo-unmet, no-fit or error).

    Never raises for a bad configuration: any exception (a PPSimError or a bug the configuration
    hits) becomes status ``error`` with a one-line message, so one configuration cannot end a sweep.
    """
    t0 = time.perf_counter()
    try:
        return _evaluate(task, t0)
    except Exception as err:  # noqa: BLE001 - recorded in the results table, the sweep goes on
        return error_result(task, err, time.perf_counter() - t0)


def _evaluate(task: Task, t0: float) -> dict[str, Any]:
    out = _base(task)
    try:
        out.update(memory_check(task.scenario))
    except PPSimError as err:
        status = "no-fit" if str(err).startswith("memory:") else "error"
        out.update(status=status, message=one_line(err), runs=0, max_rate_rps=0.0)
        return {**out, "wall_s": time.perf_counter() - t0}
    found = bisect_rate(lambda r: _run(task.scenario, r, task.slo), task.rel_tolerance, task.max_steps)
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
