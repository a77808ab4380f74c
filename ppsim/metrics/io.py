"""Writing results: a run's files are built in memory, then written as one set
(:func:`ppsim.outputs.write_result_set`); a single file goes to a temporary name first, then is
renamed into place."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ppsim.metrics.records import OP_FIELDS, OpRecord, RequestRecord
from ppsim.metrics.summary import request_latencies

REQUEST_FIELDS = [
    "request_id", "status", "arrival_s", "sent_s", "scheduled_s", "first_token_s", "finish_s",
    "input_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2el_ms", "preemptions",
]


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place; if the write
    or the rename fails the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def requests_csv(requests: list[RequestRecord]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_FIELDS)
    for r in requests:
        lat = request_latencies(r) if r.token_times else None
        w.writerow([
            r.req_id, r.status, r.arrival_s, r.sent_s, r.scheduled_s, r.first_token_s, r.finish_s,
            r.input_tokens, len(r.token_times), _ms(lat and lat["ttft"]), _ms(lat and lat["tpot"]),
            _ms(lat and lat["e2el"]), r.preemptions,
        ])
    return buf.getvalue()


def ops_csv(ops: list[OpRecord]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, OP_FIELDS, lineterminator="\n")
    w.writeheader()
    for o in ops:
        w.writerow(asdict(o))
    return buf.getvalue()


def tokens_csv(requests: list[RequestRecord]) -> str:
    """Every output token's time: one row per (request, token index)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["request_id", "index", "time_s"])
    for r in requests:
        w.writerows((r.req_id, i, t) for i, t in enumerate(r.token_times, start=1))
    return buf.getvalue()


def run_files(config_json: str, summary: dict[str, Any], requests: list[RequestRecord], ops: list[OpRecord],
              trace: dict[str, Any]) -> dict[str, str]:
    """The files of one run, name -> text."""
    return {
        "config.json": config_json + "\n",
        "requests.csv": requests_csv(requests),
        "tokens.csv": tokens_csv(requests),
        "stage_ops.csv": ops_csv(ops),
        "trace.json": json.dumps(trace, allow_nan=False),
        "summary.json": dumps(summary),
    }


def write_run(out_dir: str | Path, config_json: str, summary: dict[str, Any], requests: list[RequestRecord],
              ops: list[OpRecord], trace: dict[str, Any], extra: dict[str, str | bytes] | None = None,
              derived: Any = None) -> Path:
    """All files of a run (plus ``extra``, and ``derived``'s files drawn from the staged set: the dashboard)
    as one set: every text is built before anything is written, and the directory is replaced whole or
    not at all."""
    from ppsim.outputs import write_result_set

    return write_result_set(out_dir, {**run_files(config_json, summary, requests, ops, trace), **(extra or {})},
                            derived=derived)
