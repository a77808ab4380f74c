"""Writing results: a run's files are staged and written as one set
(:func:`ppsim.outputs.write_result_set`), the CSV files that grow with the run streamed in chunks of
rows; a single file goes to a temporary name first, then is renamed into place."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppsim.metrics.ledger import STATUSES, Ledger, RequestColumns
from ppsim.metrics.records import OP_FIELDS, OpRecord, RequestRecord

REQUEST_FIELDS = [
    "request_id",
    "status",
    "arrival_s",
    "sent_s",
    "scheduled_s",
    "first_token_s",
    "finish_s",
    "input_tokens",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "preemptions",
]


def atomic_write(path: Path, content: str | bytes) -> None:
    """Write ``content`` to a temporary file beside ``path``, then rename it into place; if the write
    or the rename fails the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            tmp.write_text(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, data)


def figure_png(fig: Any, dpi: int = 110) -> bytes:
    """A matplotlib figure as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write a matplotlib figure as PNG, atomically, and close it."""
    atomic_write_bytes(Path(path), figure_png(fig, dpi))


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v * 1000:.6f}"


CHUNK_ROWS = 4096  # rows formatted per chunk: files are streamed, never held whole


def _csv_chunks(header: list[str], rows: Iterable[Sequence[Any]]) -> Iterator[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    batch: list[Sequence[Any]] = []
    for r in rows:
        batch.append(r)
        if len(batch) >= CHUNK_ROWS:
            w.writerows(batch)
            batch.clear()
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    w.writerows(batch)
    yield buf.getvalue()


def _none(v: float) -> float | None:
    return None if v != v else v


def _request_rows(c: RequestColumns) -> Iterator[tuple]:
    sent_eff = np.where(np.isnan(c.sent_s), c.arrival_s, c.sent_s)
    for lo in range(0, len(c.req_id), CHUNK_ROWS):
        sl = slice(lo, lo + CHUNK_ROWS)
        ttft = (c.first_token_s[sl] - sent_eff[sl]).tolist()
        e2el = (c.last_token_s[sl] - sent_eff[sl]).tolist()
        cols = (
            c.req_id[sl].tolist(),
            c.status[sl].tolist(),
            c.arrival_s[sl].tolist(),
            c.sent_s[sl].tolist(),
            c.scheduled_s[sl].tolist(),
            c.first_token_s[sl].tolist(),
            c.finish_s[sl].tolist(),
            c.input_tokens[sl].tolist(),
            c.num_tokens[sl].tolist(),
            c.preemptions[sl].tolist(),
        )
        for i, (rid, st, arr, sent, sch, first, fin, n_in, n, pre) in enumerate(zip(*cols, strict=True)):
            if n:
                a, b = ttft[i], e2el[i]
                lat = (_ms(a), _ms((b - a) / (n - 1) if n > 1 else None), _ms(b))
            else:
                lat = ("", "", "")
            yield (rid, STATUSES[st], arr, _none(sent), _none(sch), _none(first), _none(fin), n_in, n, *lat, pre)


def _request_columns(requests: Sequence[RequestRecord] | RequestColumns | Ledger) -> RequestColumns:
    if isinstance(requests, RequestColumns):
        return requests
    return requests.columns() if isinstance(requests, Ledger) else RequestColumns.from_records(list(requests))


def requests_chunks(requests: Sequence[RequestRecord] | RequestColumns | Ledger) -> Iterator[str]:
    return _csv_chunks(REQUEST_FIELDS, _request_rows(_request_columns(requests)))


def requests_csv(requests: Sequence[RequestRecord] | RequestColumns | Ledger) -> str:
    return "".join(requests_chunks(requests))


def csv_chunks(header: list[str], rows: Iterable[Sequence[Any]]) -> Iterator[str]:
    """A CSV file of ``header`` and ``rows``, as text chunks formatted while they are written."""
    return _csv_chunks(header, rows)


def ops_chunks(ops: Iterable[OpRecord]) -> Iterator[str]:
    return _csv_chunks(OP_FIELDS, (o.row() for o in ops))


def ops_csv(ops: Iterable[OpRecord]) -> str:
    return "".join(ops_chunks(ops))


def _token_rows(requests: Sequence[RequestRecord] | Ledger) -> Iterator[tuple]:
    if isinstance(requests, Ledger):
        if requests.times is None:
            raise ValueError("tokens.csv needs the token times (keep_tokens)")
        ids = requests.wl.req_id
        for row, times in enumerate(requests.times):
            rid = int(ids[row])
            yield from ((rid, i, t) for i, t in enumerate(times, start=1))
    else:
        for r in requests:
            yield from ((r.req_id, i, t) for i, t in enumerate(r.token_times, start=1))


def tokens_chunks(requests: Sequence[RequestRecord] | Ledger) -> Iterator[str]:
    """Every output token's time: one row per (request, token index)."""
    return _csv_chunks(["request_id", "index", "time_s"], _token_rows(requests))


def tokens_csv(requests: Sequence[RequestRecord] | Ledger) -> str:
    return "".join(tokens_chunks(requests))


DEFAULT_FILES = ("summary.json", "requests.csv", "config.json")
DETAILED_FILES = ("tokens.csv", "stage_ops.csv", "trace.json", "actions.csv")
DASHBOARD_FILES = ("timeseries.csv", "timeline.csv", "dashboard.png")  # ppsim.report.dashboard (png last)


ACTION_FIELDS = ["step", "stage", "kind", "requests", "tokens"]


def plan_kind(plan: Any) -> str:
    """prefill, decode or mixed: what a launched plan holds."""
    if not plan.num_decode_tokens:
        return "prefill"
    return "decode" if not plan.num_prefill_tokens else "mixed"


def plan_requests(plan: Any) -> str:
    """A plan's items as ``request:start:tokens``, space-separated, in plan order."""
    return " ".join(f"{it.req_id}:{it.start}:{it.num_tokens}" for it in plan.items)


def action_rows(actions: Iterable[tuple[int, Any]]) -> Iterator[tuple]:
    for stage, plan in actions:
        yield plan.step_id, stage, plan_kind(plan), plan_requests(plan), plan.num_tokens


def actions_chunks(actions: Iterable[tuple[int, Any]]) -> Iterator[str]:
    """``actions.csv``: every non-empty plan the engine core launched, in launch order (``stage``: the
    stage it enters, 0; for ``no-pp`` the replica's GPU group, named as in ``stage_ops.csv``)."""
    return _csv_chunks(ACTION_FIELDS, action_rows(actions))


def run_files(
    config_json: str,
    summary: dict[str, Any],
    requests: Sequence[RequestRecord] | Ledger,
    ops: Iterable[OpRecord] | None = None,
    trace: dict[str, Any] | None = None,
    actions: Iterable[tuple[int, Any]] | None = None,
) -> dict[str, Any]:
    """The files of one run, name -> text, or text chunks for the CSV files that grow with the run
    (formatted while they are written, never held whole): ``summary.json``, ``requests.csv`` and
    ``config.json`` always; with ``ops`` and ``trace`` (``--save-detailed``) also ``tokens.csv``,
    ``stage_ops.csv``, ``trace.json`` and (given ``actions``: (stage, plan) pairs) ``actions.csv``."""
    files: dict[str, Any] = {"config.json": config_json + "\n", "requests.csv": requests_chunks(requests)}
    if ops is not None and trace is not None:
        files["tokens.csv"] = tokens_chunks(requests)
        files["stage_ops.csv"] = ops_chunks(ops)
        files["trace.json"] = json.dumps(trace, allow_nan=False)
        if actions is not None:
            files["actions.csv"] = actions_chunks(actions)
    files["summary.json"] = dumps(summary)
    return files


def write_run(
    out_dir: str | Path,
    config_json: str,
    summary: dict[str, Any],
    requests: Sequence[RequestRecord] | Ledger,
    ops: Iterable[OpRecord] | None = None,
    trace: dict[str, Any] | None = None,
    extra: dict[str, str | bytes] | None = None,
    derived: Any = None,
    actions: Iterable[tuple[int, Any]] | None = None,
) -> Path:
    """All files of a run (plus ``extra``, and ``derived``'s files drawn from the staged set: the dashboard)
    as one set: staged in a temporary directory, which replaces the result directory whole or not at
    all (:func:`ppsim.outputs.write_result_set`)."""
    from ppsim.outputs import write_result_set

    return write_result_set(
        out_dir, {**run_files(config_json, summary, requests, ops, trace, actions), **(extra or {})}, derived=derived
    )
