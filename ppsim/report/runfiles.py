"""Reading a run directory back: summary, scenario, latencies and the down-sampled series.

A run directory is what ``ppsim simulate``/``ppsim engine`` write (and the ``sim/`` and ``engine-*/``
sub-directories of ``ppsim validate``). Only small files are read: ``summary.json``, ``config.json``,
three columns of ``requests.csv``, ``timeseries.csv`` and ``timeline.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError
from ppsim.fileio import os_error, permission_fix
from ppsim.metrics.series import SERIES_FIELDS_HEAD, TIMELINE_FIELDS, WINDOW_AFTER, SeriesRecorder, series_csv
from ppsim.units import MIB

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
    if not str(path).strip():
        raise PPSimError("run directory: empty path; pass a directory written by ppsim simulate, engine or validate")
    p = Path(path)
    try:
        if (p / "summary.json").is_file():
            return [p]
        if (p / "validation.json").is_file():
            subs = sorted(d for d in p.glob("engine-*") if (d / "summary.json").is_file())
            subs += [d for d in (p / "sim",) if (d / "summary.json").is_file()]
            if subs:
                return subs
        what = "does not exist" if not p.exists() else "holds no summary.json"
    except OSError as err:  # a directory on the way that cannot be searched
        raise os_error("run directory", "read", p, err) from None
    raise PPSimError(f"{p}: {what}; pass a directory written by ppsim simulate, engine or validate")


REWRITE = "re-run ppsim simulate (or ppsim engine) to rewrite it"
# summary fields the dashboard draws and compare lists: numbers in range where present
DRAWN_NUMBERS = (
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{stat}_{key}_ms" for key in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")),
    "pipeline_bubble_fraction",
    "kv_num_blocks",
    "kv_replicas",
    "kv_peak_blocks_used",
    "num_preemptions",
)
TEXT_LIMIT = 64 * MIB  # bytes of summary.json / config.json / timeseries.csv read whole
# Every number drawn is within [0, MAX_VALUE] (fractions within [0, 1]): far past any run (its inputs are
# bounded: 1e7 requests of 1e7 tokens on a 1 GFLOP/s device last ~1e19 s), and far enough below a float's
# limit (1.8e308) that axis limits, tick steps and bar heights computed from it stay finite.
MAX_VALUE = 1e30
ROUNDING = 1e-9  # a value may land this far past its range (relative): 1 - busy / window, a time rounded to ns


def damaged(run: Path, name: str, why: str) -> PPSimError:
    """The one-line error for a damaged file of a run directory."""
    return PPSimError(f"{run}/{name}: {why}; {REWRITE}")


def unreadable(run: Path, name: str, err: OSError) -> PPSimError:
    """A run file that cannot be read: the permissions' fix if that is why, else :func:`damaged`'s."""
    fix = permission_fix(err)
    return (
        PPSimError(f"{run}/{name}: unreadable ({err.strerror or err}){fix}")
        if fix
        else damaged(run, name, f"unreadable ({err.strerror or err})")
    )


def _number(v: Any) -> bool:
    """A finite int or float (not a bool; an int past a float's range is not finite)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _shown(v: Any) -> str:
    """``v`` in an error line: an int too long to read by its length, anything else cut at 40 characters."""
    if isinstance(v, int) and not isinstance(v, bool) and not _number(v):
        return f"an integer of {len(str(abs(v)))} digits"
    return f"{v!r:.40}"


def _range(name: str) -> tuple[float, float, str]:
    """(low, high, as an error line says it) of the values of a summary field or CSV column ``name``."""
    if name.endswith(("_fraction", "_busy")):
        return -ROUNDING, 1 + ROUNDING, "within [0, 1]"
    return 0.0, MAX_VALUE * (1 + ROUNDING), f"within [0, {MAX_VALUE:g}]"


def _out_of_range(name: str, v: Any) -> str | None:
    """Why ``v`` cannot be the value of ``name`` (None if it can)."""
    if not _number(v):
        return "not a finite number"
    lo, hi, want = _range(name)
    return None if lo <= v <= hi else f"not {want}"


def _read_text(run: Path, name: str) -> str:
    path = run / name
    try:
        if path.stat().st_size > TEXT_LIMIT:
            raise damaged(run, name, f"larger than {TEXT_LIMIT // MIB} MiB, not a file ppsim writes")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise damaged(run, name, f"not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise unreadable(run, name, err) from None


def _read_object(run: Path, name: str) -> dict[str, Any]:
    text = _read_text(run, name)
    try:
        data = json.loads(text)
    except ValueError as err:
        raise damaged(run, name, f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise damaged(run, name, f"a JSON {type(data).__name__}, not an object")
    return data


def read_summary(run: Path) -> dict[str, Any]:
    s = _read_object(run, "summary.json")
    busy = s.get("stage_busy_fraction")
    if busy is not None and not isinstance(busy, list):
        raise damaged(run, "summary.json", f"stage_busy_fraction is {_shown(busy)}, not a list of numbers")
    fields = [(k, s[k]) for k in DRAWN_NUMBERS if k in s]
    for k, v in fields + [(f"stage_busy_fraction[{i}]", x) for i, x in enumerate(busy or [])]:
        why = _out_of_range(k.partition("[")[0], v)
        if why is not None:
            raise damaged(run, "summary.json", f"{k} is {_shown(v)}, {why}")
    return s


def read_config(run: Path) -> dict[str, Any]:
    """The run's scenario (``config.json``; empty if absent); the fields its label shows are checked."""
    if not (run / "config.json").is_file():
        return {}
    c = _read_object(run, "config.json")
    for k in ("workload", "cluster", "engine"):
        if not isinstance(c.get(k, {}), dict):
            raise damaged(run, "config.json", f"{k} is {c[k]!r:.40}, not a table")
    rate = (c.get("workload") or {}).get("request_rate")
    if rate is not None and rate != "inf" and not (_number(rate) or rate == math.inf):
        raise damaged(run, "config.json", f"workload.request_rate is {_shown(rate)}, not a finite number or inf")
    return c


def _table(run: Path, name: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a CSV file of the run, the header first as line 1; damage is one PPSimError."""
    try:
        with (run / name).open(newline="", encoding="utf-8") as f:
            yield from enumerate(csv.reader(f), start=1)
    except UnicodeDecodeError as err:
        raise damaged(run, name, f"not UTF-8 text (byte {err.start})") from None
    except csv.Error as err:
        raise damaged(run, name, f"not CSV ({err})") from None
    except OSError as err:
        raise unreadable(run, name, err) from None


def _float(run: Path, name: str, line: int, col: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise damaged(run, name, f"line {line}: {col} is {text!r:.40}, not a number") from None
    why = _out_of_range(col, v)
    if why is not None:
        raise damaged(run, name, f"line {line}: {col} is {text!r:.40}, {why}")
    return v


def _header(run: Path, name: str, rows: Iterator[tuple[int, list[str]]], need: Sequence[str]) -> list[str]:
    head = next(rows, (1, []))[1]
    missing = [c for c in need if c not in head]
    if not head:
        raise damaged(run, name, "empty")
    if missing:
        raise damaged(run, name, f"no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}")
    return head


def _fields(run: Path, name: str, line: int, row: list[str], head: list[str]) -> None:
    if len(row) != len(head):
        raise damaged(run, name, f"line {line} has {len(row)} fields, the header {len(head)}")


def read_latencies(run: Path) -> dict[str, array]:
    """TTFT/TPOT/E2EL in ms of the finished requests of ``requests.csv`` (empty if it is absent)."""
    out = {k: array("d") for k in LATENCIES}
    name = "requests.csv"
    if not (run / name).is_file():
        return out
    rows = _table(run, name)
    head = _header(run, name, rows, ("status", *(f"{k}_ms" for k in LATENCIES)))
    status = head.index("status")
    cols = [(out[k], head.index(f"{k}_ms"), f"{k}_ms") for k in LATENCIES]
    for line, row in rows:
        _fields(run, name, line, row, head)
        if row[status] != "finished":
            continue
        for arr, i, col in cols:
            if row[i]:
                arr.append(_float(run, name, line, col, row[i]))
    return out


def read_series(run: Path) -> dict[str, list[float]] | None:
    if not (run / "timeseries.csv").is_file():
        return None
    return _parse(_read_text(run, "timeseries.csv"), run)


def _ops(run: Path, name: str) -> list[tuple[str, str, float, float]]:
    """(track, kind, start_s, end_s) rows of ``timeline.csv`` or ``stage_ops.csv``."""
    rows = _table(run, name)
    head = _header(run, name, rows, TIMELINE_FIELDS)
    at = [head.index(c) for c in TIMELINE_FIELDS]
    ops = []
    for line, row in rows:
        _fields(run, name, line, row, head)
        track, kind, a, b = (row[i] for i in at)
        ops.append((track, kind, _float(run, name, line, "start_s", a), _float(run, name, line, "end_s", b)))
    return ops


def read_timeline(run: Path) -> tuple[tuple[float, float] | None, list[tuple[str, str, float, float]]]:
    if not (run / "timeline.csv").is_file():
        return None, []
    window = None
    ops = []
    for item in _ops(run, "timeline.csv"):
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
    ops = _ops(run, "stage_ops.csv")
    ops.sort(key=lambda o: o[2])
    last = max((o[3] for o in ops), default=0.0)
    rec = SeriesRecorder(num_stages, window_start_s=WINDOW_AFTER * last, window_steps=max(8, 4 * num_stages))
    for op in ops:
        rec.add_op(*op)
    rec.close(last)
    return rec


def _parse(text: str, run: Path | None = None) -> dict[str, list[float]]:
    """The columns of a ``timeseries.csv`` (none when it has no rows); damage names the file of ``run``."""
    name = "timeseries.csv"
    where = run if run is not None else Path(".")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as err:
        raise damaged(where, name, f"not CSV ({err})") from None
    head = rows[0] if rows else []
    if not head:
        raise damaged(where, name, "empty")
    missing = [c for c in SERIES_FIELDS_HEAD if c not in head]
    if missing or len(set(head)) < len(head):
        raise damaged(where, name, f"header {','.join(head)[:80]!r} lacks t_start_s/t_end_s or repeats a name")
    bad = next((c for c in head if c.startswith("stage") and c.endswith("_busy") and not c[5:-5].isdigit()), None)
    if bad is not None:
        raise damaged(where, name, f"column {bad!r:.40} is not stageN_busy")
    if ("kv_blocks_mean" in head) != ("kv_blocks_max" in head):
        raise damaged(where, name, "kv_blocks_mean and kv_blocks_max come together; one is missing")
    cols: list[list[float]] = [[] for _ in head]
    for line, row in enumerate(rows[1:], start=2):
        _fields(where, name, line, row, head)
        for c, col, v in zip(cols, head, row, strict=True):
            c.append(_float(where, name, line, col, v))
    if not rows[1:]:
        return {}
    out = dict(zip(head, cols, strict=True))
    _bins_in_order(where, out["t_start_s"], out["t_end_s"])
    return out


def _bins_in_order(where: Path, starts: list[float], ends: list[float]) -> None:
    """Each bin of ``timeseries.csv`` ends after it starts and starts where (or after) the one before ends."""
    prev = 0.0
    for line, (a, b) in enumerate(zip(starts, ends, strict=True), start=2):
        if not prev <= a < b:
            why = f"the bin [{a:g}, {b:g}) s is empty or starts before {prev:g} s, where the one before ends"
            raise damaged(where, "timeseries.csv", f"line {line}: {why}")
        prev = b


def load_run(path: str | Path, latencies: bool = True, series: bool = True) -> RunFiles:
    """The files of one run; ``latencies``/``series`` False skip requests.csv / the series files."""
    run = Path(path)
    if not (run / "summary.json").is_file():
        run_dirs(run)  # raises with the message for a missing or non-run directory
        raise PPSimError(f"{run}: a ppsim validate directory; pass one of its runs (engine-0, sim)")
    config = read_config(run)
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
