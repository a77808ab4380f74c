"""The dashboard of one run (``dashboard.png``), drawn from the files of its run directory.

Panels: per-stage busy fraction over time and KV blocks in use over time (from ``timeseries.csv``),
the TTFT/TPOT/E2EL CDFs of the finished requests (``requests.csv``, at most ``CDF_POINTS`` quantiles
drawn), and a short window of the per-stage timeline (``timeline.csv``: compute, sends, engine-core
steps; a gap is idle time). Every panel is drawn from a bounded number of points, so drawing costs
the same for 200 requests as for a million; only reading ``requests.csv`` grows with the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ppsim.metrics.io import atomic_write, figure_png, save_figure
from ppsim.metrics.series import SeriesRecorder, series_csv, timeline_csv
from ppsim.report.runfiles import RunFiles, load_run, run_label

CDF_POINTS = 400  # quantiles drawn per latency CDF
SHOWN_BINS = 160  # at most this many time bins drawn: neighbouring bins are merged for display
BUSY_BINS = 48  # busy fractions swing 0..1 at the scale of one step: fewer, wider bins read better
COLORS = {"compute": "tab:blue", "send": "tab:orange", "broadcast": "tab:purple"}
CORE_COLOR = "0.55"


def series_files(series: SeriesRecorder | None) -> dict[str, str | bytes]:
    """``timeseries.csv`` and ``timeline.csv`` of a run (nothing when it recorded no series)."""
    if series is None:
        return {}
    return {"timeseries.csv": series_csv(series), "timeline.csv": timeline_csv(series)}


def dashboard_png(run_dir: str | Path) -> bytes:
    """The dashboard of the run whose files are in ``run_dir``, as PNG bytes."""
    return figure_png(draw_dashboard(load_run(run_dir)), dpi=100)


def drawn_dashboards(*subdirs: str) -> Any:
    """For :func:`ppsim.outputs.write_result_set`'s ``derived``: a dashboard for each run directory
    ``subdirs`` of the staged set ("" for the set itself), drawn from its staged files."""

    def draw(staged: Path) -> dict[str, str | bytes]:
        return {str(Path(sub) / "dashboard.png"): dashboard_png(staged / sub) for sub in subdirs}

    return draw


def write_dashboard(out_dir: str | Path, series: SeriesRecorder | None, draw: bool = True) -> Path | None:
    """Write ``timeseries.csv`` and ``timeline.csv`` of ``series`` into an existing run directory, then
    draw ``dashboard.png`` from its files (``draw=False``: the CSV files only). Returns the PNG's path."""
    out = Path(out_dir)
    for name, text in series_files(series).items():
        atomic_write(out / name, str(text))
    if not draw:
        return None
    return plot_run(out)


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Redraw a run's dashboard from its files; ``output`` defaults to ``RUN_DIR/dashboard.png``."""
    run = load_run(run_dir)
    path = Path(output) if output is not None else run.path / "dashboard.png"
    save_figure(draw_dashboard(run), path, dpi=100)
    return path


def new_figure(figsize: tuple[float, float]) -> Any:
    """A figure outside pyplot: no global backend switch, nothing left open (PNG through Agg)."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def draw_dashboard(run: RunFiles) -> Any:
    fig = new_figure((13, 9.5))
    gs = fig.add_gridspec(
        3, 6, height_ratios=[1, 1, 1.1], hspace=0.5, wspace=0.9, left=0.06, right=0.98, top=0.9, bottom=0.06
    )
    s = run.summary
    fig.suptitle(f"ppsim {run.executor}: {run_label(run)}\n{headline(s)}", fontsize=11)
    busy_panel(fig.add_subplot(gs[0, :3]), run)
    kv_panel(fig.add_subplot(gs[0, 3:]), run)
    for k, (key, name) in enumerate((("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))):
        cdf_panel(fig.add_subplot(gs[1, 2 * k : 2 * k + 2]), run.latencies_ms.get(key), name)
    timeline_panel(fig.add_subplot(gs[2, :]), run)
    return fig


def headline(s: dict[str, Any]) -> str:
    return (
        f"{s.get('completed', 0)} requests, {s.get('request_throughput', 0.0):.2f} req/s, "
        f"{s.get('output_throughput', 0.0):.0f} output tok/s, "
        f"median TTFT {s.get('median_ttft_ms', 0.0):.0f} ms, median TPOT {s.get('median_tpot_ms', 0.0):.1f} ms, "
        f"pipeline bubble {s.get('pipeline_bubble_fraction', 0.0):.3f}"
    )


def empty_panel(ax: Any, title: str, why: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def display_bins(
    t0: np.ndarray, t1: np.ndarray, values: list[np.ndarray], limit: int = SHOWN_BINS
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Merge neighbouring bins (time-weighted) until at most ``limit`` remain; returns the merged
    bins' mid times and values."""
    n = len(t0)
    g = max(1, -(-n // limit))
    edges = np.arange(0, n, g)
    span = t1 - t0
    width = np.add.reduceat(span, edges)
    width[width == 0] = 1.0
    mids = (t0[edges] + t1[np.minimum(edges + g, n) - 1]) / 2
    return mids, [np.add.reduceat(v * span, edges) / width for v in values]


def busy_panel(ax: Any, run: RunFiles) -> None:
    title = "stage busy fraction over time"
    ser = run.series
    stages = sorted((k for k in ser or {} if k.startswith("stage") and k.endswith("_busy")), key=lambda k: int(k[5:-5]))
    if not ser or not stages:
        empty_panel(ax, title, "no timeseries.csv in this run directory")
        return
    t0, t1 = np.asarray(ser["t_start_s"]), np.asarray(ser["t_end_s"])
    mids, vals = display_bins(t0, t1, [np.asarray(ser[k]) for k in stages], BUSY_BINS)
    cmap = _stage_colors(len(stages))
    means = run.summary.get("stage_busy_fraction") or []
    for i, (k, v) in enumerate(zip(stages, vals, strict=True)):
        label = f"stage {k[5:-5]}" + (f" (mean {means[i]:.2f})" if i < len(means) else "")
        ax.plot(mids, v, color=cmap[i], lw=0.9, alpha=0.8, label=label)
    ax.plot(mids, np.mean(vals, axis=0), color="black", lw=1.8, label="all stages")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(float(t0[0]), float(t1[-1]))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("busy fraction")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(stages) > 4 else 1, loc="lower right")


def _stage_colors(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    return [cmap(0.85 * i / max(1, n - 1)) for i in range(n)]


def kv_panel(ax: Any, run: RunFiles) -> None:
    title = "KV blocks in use over time"
    ser = run.series
    if not ser or "kv_blocks_mean" not in ser:
        empty_panel(ax, title, "no KV series: the run directory has no timeseries.csv (re-run to record it)")
        return
    t0, t1 = np.asarray(ser["t_start_s"]), np.asarray(ser["t_end_s"])
    mean, peak = np.asarray(ser["kv_blocks_mean"]), np.asarray(ser["kv_blocks_max"])
    mids, (mean_d,) = display_bins(t0, t1, [mean])
    g = max(1, -(-len(t0) // SHOWN_BINS))
    peak_d = np.maximum.reduceat(peak, np.arange(0, len(peak), g))
    ax.fill_between(mids, 0, peak_d, step="mid", color="tab:green", alpha=0.2, label="max in bin")
    ax.plot(mids, mean_d, color="tab:green", lw=1.2, label="time average")
    s = run.summary
    cap = s.get("kv_num_blocks")
    if cap:
        cap = cap * s.get("kv_replicas", 1)
        ax.axhline(cap, color="tab:red", ls="--", lw=1, label=f"capacity {cap}")
    ax.set_xlim(float(t0[0]), float(t1[-1]))
    ax.set_ylim(0, None)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("blocks")
    peak_all = s.get("kv_peak_blocks_used")
    ax.set_title(title + (f" (peak {peak_all})" if peak_all is not None else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def cdf_points(values: Any, points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the empirical CDF, at most ``points`` quantiles for large samples."""
    a = np.sort(np.asarray(values, dtype=float))
    if len(a) <= points:
        return a, np.arange(1, len(a) + 1) / len(a)
    q = np.linspace(0, 1, points)
    return np.quantile(a, q), q


def cdf_panel(ax: Any, values: Any, name: str) -> None:
    title = f"{name} CDF"
    if values is None or len(values) == 0:
        empty_panel(ax, title, "no finished requests with this latency")
        return
    x, y = cdf_points(values)
    ax.step(x, y, where="post", color="tab:blue", lw=1.3)
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    for v, ls in ((p50, ":"), (p99, "--")):
        ax.axvline(v, color="0.4", ls=ls, lw=0.8)
    ax.set_title(f"{title}: median {p50:.0f} ms, P99 {p99:.0f} ms", fontsize=10)
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)


def _track_order(track: str) -> tuple[int, int, str]:
    """stage0, link0->1, stage1, ... then the engine core and other tracks."""
    if track.startswith("stage") and track[5:].isdigit():
        return (0, 2 * int(track[5:]), track)
    if track.startswith("link") and "->" in track and track[4:].split("->")[0].isdigit():
        return (0, 2 * int(track[4:].split("->")[0]) + 1, track)
    return (1, 0, track)


def timeline_panel(ax: Any, run: RunFiles) -> None:
    title = "timeline window"
    if run.window is None or not run.timeline:
        empty_panel(ax, title, "no timeline.csv (or no operation in its window) in this run directory")
        return
    start, end = run.window
    end = max(end, start + 1e-9)
    tracks = sorted({op[0] for op in run.timeline}, key=_track_order)
    row = {t: i for i, t in enumerate(tracks)}
    scale, unit = (1e3, "ms") if end - start < 10 else (1.0, "s")
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for track, kind, a, b in run.timeline:
        a, b = max(a, start), min(b, end)
        if b > a:
            bars.setdefault((row[track], kind), []).append(((a - start) * scale, (b - a) * scale))
    for (r, kind), spans in bars.items():
        ax.broken_barh(
            spans, (r - 0.38, 0.76), facecolors=COLORS.get(kind, CORE_COLOR), edgecolor="white", linewidth=0.4
        )  # the white edge separates back-to-back micro-batches
    ax.set_yticks(range(len(tracks)), tracks, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (end - start) * scale)
    ax.set_xlabel(f"time from t = {start:.3f} s ({unit})")
    ax.set_title(
        f"{title} [{start:.3f} s, {end:.3f} s): stage compute (blue), link sends (orange), "
        f"engine-core CPU (grey), broadcasts (purple); white = idle",
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
