"""One simulated run: scenario -> records -> summary and files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppsim.config import Scenario, scenario_json
from ppsim.metrics.io import write_run
from ppsim.metrics.summary import summarize
from ppsim.metrics.trace import chrome_trace
from ppsim.policy.pipelines import REPLICATED
from ppsim.rejections import rejection_message
from ppsim.report.dashboard import drawn_dashboards, series_files
from ppsim.sim.build import Prepared, prepare
from ppsim.sim.executor import SimResult, simulate


@dataclass
class RunOutput:
    result: SimResult
    summary: dict[str, Any]
    rejections: str | None = None  # one line: how many requests were rejected and why (None: none)
    all_rejected: bool = False


def rejections_of(prep: Prepared, records: Any, summary: dict[str, Any]) -> tuple[str | None, bool]:
    """The line about rejected requests of a run, and whether every request was rejected."""
    rejected = {r.req_id for r in records if r.status == "rejected"}
    msg = rejection_message(prep.requests, rejected, prep.max_model_len, summary["kv_num_blocks"],
                            summary["kv_block_size"])
    return msg, bool(prep.requests) and len(rejected) == len(prep.requests)


def kv_figures(prep: Prepared, peak_used: int) -> dict[str, Any]:
    """KV capacity of the deployment: per pipeline, or per replica for the data-parallel ``no-pp``."""
    if prep.scenario.engine.policy in REPLICATED:
        from ppsim.sim.replicas import replica_prepared

        return {**_pipeline_kv(replica_prepared(prep), peak_used), "kv_replicas": len(prep.topology.stages)}
    return _pipeline_kv(prep, peak_used)


def _pipeline_kv(prep: Prepared, peak_used: int) -> dict[str, Any]:
    bs = prep.scenario.engine.block_size
    reqs = prep.requests
    mean_len = sum(r.prompt_len + r.output_len for r in reqs) / max(1, len(reqs))
    cap = prep.num_blocks * bs
    return {
        "kv_num_blocks": prep.num_blocks,
        "kv_block_size": bs,
        "kv_capacity_tokens": cap,
        "kv_concurrency_at_mean_len": round(cap / mean_len, 2) if mean_len else 0.0,
        "kv_blocks_per_stage": [m.num_blocks for m in prep.memory],
        "kv_peak_blocks_used": peak_used,
        "weights_gib_per_gpu": [round(m.weight_bytes / 1024**3, 3) for m in prep.memory],
        "layers_per_stage": [s.num_layers for s in prep.topology.stages],
    }


def run_scenario(s: Scenario, out_dir: str | Path | None = None, dashboard: bool = True) -> RunOutput:
    prep = prepare(s)
    res = simulate(prep)
    summary = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    if out_dir is not None:
        write_run(out_dir, scenario_json(s), summary, res.requests, res.ops, chrome_trace(res.ops),
                  extra=series_files(res.series), derived=drawn_dashboards("") if dashboard else None)
    return RunOutput(res, summary, *rejections_of(prep, res.requests, summary))
