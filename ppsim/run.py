"""One simulated run: scenario -> records -> summary and files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppsim.config import Scenario, scenario_json
from ppsim.deployment import kv_figures, prepare
from ppsim.metrics.io import write_run
from ppsim.metrics.summary import summarize
from ppsim.metrics.trace import TRACE_WINDOW_S, chrome_trace
from ppsim.rejections import rejections_of
from ppsim.report.dashboard import drawn_dashboards, series_files
from ppsim.sim.executor import SimResult, simulate
from ppsim.sim.progress import RunProgress


@dataclass
class RunOutput:
    result: SimResult
    summary: dict[str, Any]
    rejections: str | None = None  # one line: how many requests were rejected and why (None: none)
    all_rejected: bool = False


def run_scenario(
    s: Scenario,
    out_dir: str | Path | None = None,
    *,
    save_detailed: bool = False,
    lean: bool = False,
    trace_window_s: float | None = TRACE_WINDOW_S,
    progress: bool = False,
    dashboard: bool = True,
) -> RunOutput:
    """Simulate ``s``; write its files to ``out_dir`` if given.

    ``save_detailed`` also writes ``tokens.csv``, ``stage_ops.csv`` and ``trace.json`` (the first
    ``trace_window_s`` seconds of simulated time; None: all). ``lean`` keeps in memory only what the
    files asked for need (the CLI's way: a long run then holds no per-token or per-operation
    record); otherwise ``result`` has every record. ``progress`` draws a bar on a terminal's stderr.
    The dashboard's ``timeseries.csv`` and ``timeline.csv`` are always written (bounded in size),
    ``dashboard.png`` with ``dashboard``.
    """
    prep = prepare(s)
    keep = save_detailed or not lean
    bar = RunProgress(len(prep.requests), enabled=progress)
    try:
        res = simulate(prep, keep_ops=keep, keep_tokens=keep, progress=bar)
    finally:
        bar.close()
    summary = summarize(res.ledger, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    if out_dir is not None:
        trace = chrome_trace(res.ops, window_s=trace_window_s) if save_detailed else None
        ops = res.ops if save_detailed else None
        write_run(
            out_dir,
            scenario_json(s),
            summary,
            res.ledger,
            ops,
            trace,
            extra=series_files(res.series),
            derived=drawn_dashboards("") if dashboard else None,
            actions=res.actions if save_detailed else None,
        )
    return RunOutput(res, summary, *rejections_of(prep, res.ledger, summary))
