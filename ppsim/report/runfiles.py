"""Reading a run directory back: summary, scenario, latencies and the down-sampled series.

A run directory is what ``ppsim simulate``/``ppsim engine`` write (and the ``sim/`` and ``engine-*/``
sub-directories of ``ppsim validate``). Only small files are read: ``summary.json``, ``config.json``,
three columns of ``requests.csv``, ``timeseries.csv`` and ``timeline.csv``.
"""

from __future__ import annotations

import csv
import io
import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError
from ppsim.metrics.series import WINDOW_AFTER, SeriesRecorder, series_csv

LATENCIES = ("ttft", "tpot", "e2el")


@dataclass
class RunFiles:
    path: Path
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    executor: str = "simulate"  # simulate | engine
    latencies_ms: dict[str, array] = field(default_factory=dict)  # finished requests only
    series: dict[str, list[float]] | None = None  # timeseries.csv columns
    window: tuple[float, float] | None = None
    timeline: list[tuple[str, str, float, float]] = field(default_factory=list)


def run_dirs(path: str | Path) -> list[Path]:
    """``path`` if it holds a run, else the runs of a ``ppsim validate`` directory (engine-*, sim)."""
    p = Path(path)
    if (p / "summary.json").is_file():
        return [p]
    if (p / "validation.json").is_file():
        subs = sorted(d for d in p.glob("engine-*") if (d / "summary.json").is_file())
        subs += [d for d in (p / "sim",) if (d / "summary.json").is_file()]
        if subs:
            return subs
    what = "does not exist" if not p.exists() else "holds no summary.json"
    raise PPSimError(f"{p}: {what}; pass a directory written by ppsim simulate, engine or validate")


def read_summary(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "summary.json").read_text())
    except (OSError, ValueError) as err:
        raise PPSimError(f"{run}/summary.json: unreadable ({err}); re-run to rewrite it") from None


def read_latencies(run: Path) -> dict[str, array]:
    """TTFT/TPOT/E2EL in ms of the finished requests of ``requests.csv`` (empty if it is absent)."""
    out = {k: array("d") for k in LATENCIES}
    path = run / "requests.csv"
    if not path.is_file():
        return out
    with path.open(newline="") as f:
        rows = csv.reader(f)
        head = next(rows, [])
        try:
            status = head.index("status")
            cols = [(out[k], head.index(f"{k}_ms")) for k in LATENCIES]
        except ValueError:
            raise PPSimError(f"{path}: no status/ttft_ms/tpot_ms/e2el_ms columns; re-run to rewrite it") from None
        for row in rows:
            if row[status] != "finished":
                continue
            for arr, i in cols:
                if row[i]:
                    arr.append(float(row[i]))
    return out


def read_series(run: Path) -> dict[str, list[float]] | None:
    path = run / "timeseries.csv"
    if not path.is_file():
        return None
    return _parse(path.read_text())


def read_timeline(run: Path) -> tuple[tuple[float, float] | None, list[tuple[str, str, float, float]]]:
    path = run / "timeline.csv"
    if not path.is_file():
        return None, []
    window = None
    ops = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            item = (row["track"], row["kind"], float(row["start_s"]), float(row["end_s"]))
            if item[0] == "window":
                window = (item[2], item[3])
            else:
                ops.append(item)
    return window, ops


def series_from_ops(run: Path, num_stages: int) -> SeriesRecorder | None:
    """A run written without ``timeseries.csv`` (older versions) but with ``stage_ops.csv``: its busy
    series and timeline window rebuilt from the ops (no KV series: ops do not hold it)."""
    path = run / "stage_ops.csv"
    if not path.is_file() or num_stages < 1:
        return None
    with path.open(newline="") as f:
        ops = [(r["track"], r["kind"], float(r["start_s"]), float(r["end_s"])) for r in csv.DictReader(f)]
    ops.sort(key=lambda o: o[2])
    last = max((o[3] for o in ops), default=0.0)
    rec = SeriesRecorder(num_stages, window_start_s=WINDOW_AFTER * last, window_steps=max(8, 4 * num_stages))
    for op in ops:
        rec.add_op(*op)
    rec.close(last)
    return rec


def _parse(text: str) -> dict[str, list[float]]:
    rows = csv.reader(io.StringIO(text))
    head = next(rows)
    cols: list[list[float]] = [[] for _ in head]
    for row in rows:
        for c, v in zip(cols, row, strict=True):
            c.append(float(v))
    return dict(zip(head, cols, strict=True))


def load_run(path: str | Path, latencies: bool = True, series: bool = True) -> RunFiles:
    """The files of one run; ``latencies``/``series`` False skip requests.csv / the series files."""
    run = Path(path)
    if not (run / "summary.json").is_file():
        run_dirs(run)  # raises with the message for a missing or non-run directory
        raise PPSimError(f"{run}: a ppsim validate directory; pass one of its runs (engine-0, sim)")
    config: dict[str, Any] = {}
    if (run / "config.json").is_file():
        try:
            config = json.loads((run / "config.json").read_text())
        except ValueError:
            config = {}
    summary = read_summary(run)
    window, ops, cols = None, [], None
    if series:
        window, ops = read_timeline(run)
        cols = read_series(run)
        rec = None if cols is not None else series_from_ops(run, len(summary.get("stage_busy_fraction") or []))
        if rec is not None:
            cols = {k: v for k, v in _parse(series_csv(rec)).items() if not k.startswith("kv_")}
            start, end, ops = rec.timeline()
            window = (start, end)
    return RunFiles(
        run,
        summary,
        config,
        "engine" if (run / "engine.json").is_file() else "simulate",
        read_latencies(run) if latencies else {},
        cols,
        window,
        ops,
    )


def run_label(run: RunFiles) -> str:
    """``model PP=n policy rate`` from the run's scenario, or the directory name."""
    c = run.config
    if not c:
        return run.path.name
    w, cl, e = c.get("workload", {}), c.get("cluster", {}), c.get("engine", {})
    rate = w.get("request_rate")
    rate_s = "trace" if w.get("trace") else f"{float(rate):g} req/s" if rate is not None else "?"
    hw = c.get("hardware")
    hw = hw.get("name") if isinstance(hw, dict) else hw
    model = c.get("model")
    model = Path(model).parent.name if isinstance(model, str) and model.endswith(".json") else model
    where = hw if run.executor == "simulate" else "engine"
    return (
        f"{model} PP={cl.get('pipeline_parallel_size')} TP={cl.get('tensor_parallel_size')} {where}, "
        f"{e.get('policy')}, {rate_s}"
    )
