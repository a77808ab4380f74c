"""Validation outputs: the terminal table, validation.json, step_costs.csv, CDF overlay PNG, combined trace."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from ppsim.metrics.io import dumps, figure_png, save_figure
from ppsim.metrics.records import OpRecord, RequestRecord
from ppsim.metrics.summary import request_latencies
from ppsim.metrics.trace import trace_events
from ppsim.validate.compare import MetricRow, is_fraction
from ppsim.validate.steps import STEP_FIELDS


def format_table(rows: list[MetricRow], title: str = "ppsim validate: engine vs simulator") -> str:
    head = f"{'metric':<28}{'engine':>12}{'spread':>9}{'simulated':>12}{'error':>9}"
    lines = [f"{' ' + title + ' ':=^{len(head)}}", head, "-" * len(head)]
    for r in rows:
        if is_fraction(r.metric):  # spread and error in fraction points
            tail = f"{r.engine_spread:>8.3f} {r.simulated:>12.3f}{r.error:>+9.3f}"
        else:
            tail = f"{r.engine_spread:>8.1%} {r.simulated:>12.3f}{r.error:>+9.1%}"
        lines.append(f"{r.metric:<28}{r.engine:>12.3f}{tail}")
    lines.append("=" * len(head))
    return "\n".join(lines)


def combined_trace(engine_ops: list[OpRecord], sim_ops: list[OpRecord]) -> dict[str, Any]:
    """Engine and simulator timelines as two processes, so their tracks sit next to each other."""
    ev = trace_events(engine_ops, pid=0, process_name="engine (measured)")
    ev += trace_events(sim_ops, pid=1, process_name="simulator (predicted)")
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def cdf_plot(path: Path, engine: list[RequestRecord], sim: list[RequestRecord]) -> None:
    save_figure(cdf_figure(engine, sim), path)


def cdf_figure(engine: list[RequestRecord], sim: list[RequestRecord]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)")):
        for recs, name, style in ((engine, "engine", "-"), (sim, "simulator", "--")):
            vals = [request_latencies(r)[key] for r in recs if r.status == "finished" and r.token_times]
            vals = np.sort([v * 1000 for v in vals if v is not None])
            if len(vals):
                ax.plot(vals, np.arange(1, len(vals) + 1) / len(vals), style, label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def validation_files(
    payload: dict[str, Any],
    engine_recs: list[RequestRecord],
    sim_recs: list[RequestRecord],
    engine_ops: list[OpRecord],
    sim_ops: list[OpRecord],
    steps: list[dict[str, Any]] | None = None,
) -> dict[str, str | bytes]:
    """validation.json, the CDF plot, the combined trace and step_costs.csv (one row per engine stage
    compute: measured and predicted seconds), name -> content."""
    return {
        "latency_cdf.png": figure_png(cdf_figure(engine_recs, sim_recs)),
        "step_costs.csv": steps_csv(steps or []),
        "trace_combined.json": json.dumps(combined_trace(engine_ops, sim_ops)),
        "validation.json": dumps(payload),
    }


def steps_csv(steps: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, STEP_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(steps)
    return buf.getvalue()


def write_validation(
    out: Path,
    payload: dict[str, Any],
    engine_recs: list[RequestRecord],
    sim_recs: list[RequestRecord],
    engine_ops: list[OpRecord],
    sim_ops: list[OpRecord],
    steps: list[dict[str, Any]] | None = None,
) -> None:
    """The validation files alone, as one result set in ``out``."""
    from ppsim.outputs import write_result_set

    write_result_set(out, validation_files(payload, engine_recs, sim_recs, engine_ops, sim_ops, steps))
