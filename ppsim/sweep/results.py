"""The sweep's results folder, ranked table (terminal and CSV) and Pareto plot.

``OUT/results/<key>.json`` holds one configuration's result, keyed by a hash of its resolved
scenario, SLOs and search settings, and written atomically, so an interrupted sweep resumes by
skipping every key already on disk (errors excepted: they are retried; a damaged file, one that
:class:`StoredResult` does not validate, is evaluated again and named). Ranking: configurations
that meet the SLOs by requests/s per GPU (highest first), then those that meet them at no tested
rate, then those that do not fit in memory, then errors.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from ppsim.config import format_validation_error
from ppsim.fileio import short_repr
from ppsim.metrics.io import atomic_write, dumps, save_figure
from ppsim.sweep.evaluate import RESULT_VERSION
from ppsim.typed import Model

STATUS_ORDER = {"ok": 0, "slo-unmet": 1, "no-fit": 2, "error": 3}
METRIC_COLUMNS = [
    "status",
    "num_gpus",
    "max_rate_rps",
    "rate_per_gpu",
    "output_tok_s_per_gpu",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "limit",
    "saturation_rps",
    "kv_capacity_tokens",
    "runs",
    "message",
]


class _Stored(Model):
    # as written by save_result: JSON types exactly (no "abc" for a number), finite; other fields kept as saved
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class AtMaxRate(_Stored):
    p99_ttft_ms: float
    p99_tpot_ms: float


class StoredResult(_Stored):
    """The fields of a saved result that the table, ``sweep.csv`` and the plot read (evaluate.py writes them)."""

    version: int
    key: str
    status: Literal["ok", "slo-unmet", "no-fit", "error"]
    labels: dict[str, str]
    num_gpus: int = Field(ge=1)
    runs: int = Field(ge=0)
    max_rate_rps: float = Field(ge=0)
    rate_per_gpu: float = Field(default=0.0, ge=0)
    output_tok_s_per_gpu: float | None = Field(default=None, ge=0)
    saturation_rps: float | None = Field(default=None, ge=0)
    kv_capacity_tokens: int | None = Field(default=None, ge=0)
    limit: str | None = None
    message: str | None = None
    at_max_rate: AtMaxRate | None = None

    @model_validator(mode="after")
    def _ok_has_its_figures(self) -> StoredResult:
        if self.status == "ok" and (self.at_max_rate is None or self.output_tok_s_per_gpu is None):
            raise ValueError("status ok without at_max_rate and output_tok_s_per_gpu")
        return self


def result_path(out_dir: Path, key: str) -> Path:
    return out_dir / "results" / f"{key}.json"


def save_result(out_dir: Path, result: dict[str, Any]) -> None:
    atomic_write(result_path(out_dir, result["key"]), dumps(result))


def load_done(out_dir: Path, keys: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Results already on disk for ``keys``, and the damaged files among them (``KEY.json: why``). Damaged
    files are redone, as are older-version files and errors (an error may come from a bug since fixed or
    a worker that died)."""
    done, damaged = {}, []
    for k in keys:
        p = result_path(out_dir, k)
        if not p.exists():
            continue
        r, why = _read_result(p, k)
        if why:
            damaged.append(f"{p.name}: {why}")
        elif r is not None:
            done[k] = r
    return done, damaged


def _read_result(p: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The result saved at ``p`` if it can be reused, else None and why it is damaged (None for an older
    version or an error: not damage, only redone)."""
    try:
        r = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        return None, f"unreadable ({type(err).__name__})"
    if not isinstance(r, dict):
        return None, f"a JSON {type(r).__name__}, not an object"
    v = r.get("version")
    if (type(v) is int and v != RESULT_VERSION) or r.get("status") == "error":  # no version: damage (below)
        return None, None
    try:
        StoredResult.model_validate(r)
    except ValidationError as err:
        return None, format_validation_error(err).removeprefix("scenario: ")  # "scenario": no field named
    return (r, None) if r["key"] == key else (None, f"holds the result of {short_repr(r['key'])}")


def rank(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def order(r: dict[str, Any]) -> tuple:
        at = r.get("at_max_rate") or {}
        return (
            STATUS_ORDER.get(r["status"], 9),
            -r.get("rate_per_gpu", 0.0),
            at.get("p99_tpot_ms", 0.0),
            r["num_gpus"],
            r["key"],
        )

    return sorted(results, key=order)


def row(r: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    at = r.get("at_max_rate") or {}
    out: dict[str, Any] = {a: r["labels"].get(a, "") for a in axes}
    for c in METRIC_COLUMNS:
        v = at.get(c) if c in ("p99_ttft_ms", "p99_tpot_ms") else r.get(c)
        out[c] = "" if v is None else v
    out["key"] = r["key"]
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def to_csv(results: list[dict[str, Any]], axes: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, ["rank", *axes, *METRIC_COLUMNS, "key"], lineterminator="\n")
    w.writeheader()
    for i, r in enumerate(rank(results), 1):
        w.writerow({"rank": i, **{k: _fmt(v) for k, v in row(r, axes).items()}})
    return buf.getvalue()


def format_table(results: list[dict[str, Any]], axes: list[str], top: int = 20) -> str:
    cols = ["rank", *axes, "status", "gpus", "rate/s", "rate/s/GPU", "tok/s/GPU", "p99 TTFT", "p99 TPOT", "limit"]
    rows = []
    ranked = rank(results)
    for i, r in enumerate(ranked[:top], 1):
        x = row(r, axes)
        lim = x["limit"] if r["status"] in ("ok", "slo-unmet") else (x["message"] or "")[:40]
        rows.append(
            [
                str(i),
                *(str(x[a]) for a in axes),
                r["status"],
                str(r["num_gpus"]),
                _fmt(x["max_rate_rps"]),
                _fmt(x["rate_per_gpu"]),
                _fmt(x["output_tok_s_per_gpu"]),
                _fmt(x["p99_ttft_ms"]),
                _fmt(x["p99_tpot_ms"]),
                str(lim),
            ]
        )
    widths = [max(len(c), *(len(rw[j]) for rw in rows)) if rows else len(c) for j, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(rw, widths, strict=True)) for rw in rows]
    counts = {s: sum(r["status"] == s for r in results) for s in STATUS_ORDER}
    lines.append(
        f"{len(results)} configurations: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + (f" (top {top} shown)" if len(ranked) > top else "")
    )
    return "\n".join(lines)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower latency x, higher throughput y), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def plot_pareto(results: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Output tokens/s per GPU against p99 TTFT and p99 TPOT at each configuration's highest rate."""
    ok = [r for r in results if r["status"] == "ok"]
    if not ok:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 2, figsize=(11, 4.2))
    y = [r["output_tok_s_per_gpu"] for r in ok]
    for ax, metric, name in ((axs[0], "p99_ttft_ms", "p99 TTFT (ms)"), (axs[1], "p99_tpot_ms", "p99 TPOT (ms)")):
        x = [r["at_max_rate"][metric] for r in ok]
        ax.scatter(x, y, s=14, alpha=0.5, label="configuration")
        front = pareto_front(list(zip(x, y, strict=True)))
        ax.plot([x[i] for i in front], [y[i] for i in front], "r.-", label="Pareto front")
        for i in front[-3:]:
            ax.annotate(" ".join(f"{k}={v}" for k, v in ok[i]["labels"].items()), (x[i], y[i]), fontsize=6)
        ax.set_xlabel(name + " at the highest rate meeting the SLOs")
        ax.set_ylabel("output tokens/s per GPU")
        ax.grid(alpha=0.3)
    axs[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    return True
