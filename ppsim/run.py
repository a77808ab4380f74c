"""One simulated run: scenario -> records -> summary and files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppsim.config import Scenario, scenario_json
from ppsim.deployment import kv_figures, prepare
from ppsim.metrics.io import write_run
from ppsim.metrics.summary import summarize
from ppsim.metrics.trace import chrome_trace
from ppsim.sim.executor import SimResult, simulate


@dataclass
class RunOutput:
    result: SimResult
    summary: dict[str, Any]


def run_scenario(s: Scenario, out_dir: str | Path | None = None) -> RunOutput:
    prep = prepare(s)
    res = simulate(prep)
    summary = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    if out_dir is not None:
        write_run(out_dir, scenario_json(s), summary, res.requests, res.ops, chrome_trace(res.ops))
    return RunOutput(res, summary)
