"""Runs side by side: the ``vllm bench serve`` metrics of each run with ratios to the first, and one
PNG overlaying their latency CDFs and throughputs. Works on any run directory (simulated or engine;
a ``ppsim validate`` directory stands for its ``engine-*`` and ``sim`` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ppsim.metrics.io import save_figure
from ppsim.report.dashboard import cdf_points, empty_panel, new_figure
from ppsim.report.runfiles import RunFiles, load_run, run_dirs, run_label

# (summary key, label) in the order of the ``vllm bench serve`` table, then ppsim's pipeline figures
ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "Successful requests"),
    ("duration", "Benchmark duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output token throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    *(
        (f"{stat}_{key}_ms", f"{stat.capitalize() if stat != 'p99' else 'P99'} {key.upper()} (ms)")
        for key in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p99")
    ),
    ("pipeline_bubble_fraction", "Pipeline bubble fraction"),
    ("kv_peak_blocks_used", "Peak KV blocks used"),
    ("num_preemptions", "Preemptions"),
)


def expand(paths: list[str]) -> list[Path]:
    """Every run directory named (a validate directory gives its runs); a non-run is a PPSimError."""
    out: list[Path] = []
    for p in paths:
        out.extend(run_dirs(p))
    return out


def short_names(runs: list[Path]) -> list[str]:
    """The directory names, with parents added where two would read the same."""
    names = [r.name for r in runs]
    if len(set(names)) < len(names):
        names = [f"{r.parent.name}/{r.name}" for r in runs]
    if len(set(names)) < len(names):
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return names


def ratio(value: Any, base: Any) -> float | None:
    if not isinstance(value, int | float) or not isinstance(base, int | float) or base == 0:
        return None
    return float(value) / float(base)


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"
    return str(v)


def compare_runs(paths: list[str]) -> tuple[list[str], list[RunFiles]]:
    runs = [load_run(p, series=False) for p in expand(paths)]
    return short_names([r.path for r in runs]), runs


def format_comparison(names: list[str], runs: list[RunFiles]) -> str:
    summaries = [r.summary for r in runs]
    w = max(12, *(len(n) + 2 for n in names))
    head = f"{'metric':<34}{names[0]:>{w}}" + "".join(f"{n:>{w}}{'ratio':>8}" for n in names[1:])
    lines = [f"{' ppsim compare (ratio = run / ' + names[0] + ') ':=^{len(head)}}", head, "-" * len(head)]
    for key, label in ROWS:
        if not any(key in s for s in summaries):
            continue
        base = summaries[0].get(key)
        line = f"{label:<34}{_fmt(base):>{w}}"
        for s in summaries[1:]:
            r = ratio(s.get(key), base)
            line += f"{_fmt(s.get(key)):>{w}}{'-' if r is None else f'{r:.2f}x':>8}"
        lines.append(line)
    lines.append("=" * len(head))
    lines.extend(f"{n}: {run.executor} {run_label(run)} ({run.path})" for n, run in zip(names, runs, strict=True))
    return "\n".join(lines)


def draw_comparison(names: list[str], runs: list[RunFiles]) -> Any:
    fig = new_figure((13, 8))
    gs = fig.add_gridspec(2, 3, hspace=0.45, wspace=0.3, left=0.06, right=0.98, top=0.9, bottom=0.08)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    fig.suptitle("ppsim compare: " + "  vs  ".join(names), fontsize=11)
    for k, (key, name) in enumerate((("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))):
        ax = fig.add_subplot(gs[0, k])
        drawn = [(run.latencies_ms.get(key), label, c) for run, label, c in zip(runs, names, colors, strict=True)]
        drawn = [(vals, label, c) for vals, label, c in drawn if vals is not None and len(vals)]
        if not drawn:  # no legend either: matplotlib warns on one without labelled lines
            empty_panel(ax, f"{name} CDF", "no finished requests with this latency in these runs")
            continue
        for vals, label, c in drawn:
            x, y = cdf_points(vals)
            median = np.median(np.asarray(vals))
            ax.step(x, y, where="post", color=c, lw=1.4, label=f"{label} (median {median:.0f})")
        ax.set_title(f"{name} CDF", fontsize=10)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    bars = (
        ("request_throughput", "request throughput (req/s)"),
        ("output_throughput", "output token throughput (tok/s)"),
        ("pipeline_bubble_fraction", "pipeline bubble fraction"),
    )
    for k, (key, title) in enumerate(bars):
        ax = fig.add_subplot(gs[1, k])
        vals = [float(r.summary.get(key) or 0.0) for r in runs]
        pos = np.arange(len(runs))
        ax.bar(pos, vals, color=colors)
        for x, v in zip(pos, vals, strict=True):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(pos, names, fontsize=8, rotation=15 if len(runs) > 2 else 0)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, max(vals + [1e-9]) * 1.15)
    return fig


def write_comparison(names: list[str], runs: list[RunFiles], path: str | Path) -> Path:
    out = Path(path)
    save_figure(draw_comparison(names, runs), out, dpi=100)
    return out
