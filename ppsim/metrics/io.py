"""Writing results: every file goes to a temporary name first, then is renamed into place."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ppsim.metrics.records import OP_FIELDS, OpRecord, RequestRecord

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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write a matplotlib figure as PNG, atomically, and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v * 1000:.6f}"


def requests_csv(requests: Iterable[RequestRecord]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_FIELDS)
    rows = []
    for r in requests:
        t = r.token_times
        ttft = tpot = e2el = None
        if t:
            sent = r.sent_s if r.sent_s is not None else r.arrival_s
            ttft, e2el = t[0] - sent, t[-1] - sent
            tpot = (e2el - ttft) / (len(t) - 1) if len(t) > 1 else None
        rows.append((r.req_id, r.status, r.arrival_s, r.sent_s, r.scheduled_s, t[0] if t else None, r.finish_s,
                     r.input_tokens, len(t), _ms(ttft), _ms(tpot), _ms(e2el), r.preemptions))
        if len(rows) >= 4096:
            w.writerows(rows)
            rows.clear()
    w.writerows(rows)
    return buf.getvalue()


def ops_csv(ops: Iterable[OpRecord]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(OP_FIELDS)
    w.writerows((o.track, o.kind, o.step_id, o.start_s, o.end_s, o.num_tokens, o.num_reqs, o.num_prefill_tokens,
                 o.num_decode_tokens, o.nbytes) for o in ops)
    return buf.getvalue()


def tokens_csv(requests: Iterable[RequestRecord]) -> str:
    """Every output token's time: one row per (request, token index)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["request_id", "index", "time_s"])
    for r in requests:
        w.writerows((r.req_id, i, t) for i, t in enumerate(r.token_times, start=1))
    return buf.getvalue()


DEFAULT_FILES = ("summary.json", "requests.csv", "config.json")
DETAILED_FILES = ("tokens.csv", "stage_ops.csv", "trace.json")


def write_run(out_dir: str | Path, config_json: str, summary: dict[str, Any], requests: list[RequestRecord],
              ops: Iterable[OpRecord] | None = None, trace: dict[str, Any] | None = None) -> Path:
    """The files of a run: ``summary.json``, ``requests.csv`` and ``config.json`` always; with ``ops``
    and ``trace`` (``--save-detailed``) also ``tokens.csv``, ``stage_ops.csv`` and ``trace.json``.
    Every text is built before the first file is written."""
    out = Path(out_dir)
    files = {"config.json": config_json + "\n", "requests.csv": requests_csv(requests)}
    if ops is not None and trace is not None:
        files["tokens.csv"] = tokens_csv(requests)
        files["stage_ops.csv"] = ops_csv(ops)
        files["trace.json"] = json.dumps(trace, allow_nan=False)
    files["summary.json"] = dumps(summary)
    for name, text in files.items():
        atomic_write(out / name, text)
    return out
