"""Records -> the ``vllm bench serve`` summary, plus pipeline and KV figures.

Definitions follow ``vllm/benchmarks/serve.py::calculate_metrics``: TTFT = first token - send;
TPOT = (E2EL - TTFT) / (output tokens - 1) for requests with more than one output token; ITL =
every gap between consecutive tokens of a request; E2EL = last token - send. ``duration`` runs
from the first send to the last finish. Percentiles use numpy's linear interpolation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ppsim.metrics.ledger import ABORTED, FINISHED, REJECTED, UNFINISHED, Ledger, RequestColumns
from ppsim.metrics.oplog import OpLog
from ppsim.metrics.records import OpRecord, RequestRecord

METRICS = ("ttft", "tpot", "itl", "e2el")


def _stats(name: str, values_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(values_s, dtype=float) * 1000.0 if len(values_s) else np.zeros(1)
    return {
        f"mean_{name}_ms": float(np.mean(a)),
        f"median_{name}_ms": float(np.median(a)),
        f"std_{name}_ms": float(np.std(a)),
        f"p99_{name}_ms": float(np.percentile(a, 99)),
    }


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's linear interpolation (``numpy.lib.function_base._lerp``)."""
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def sorted_stats(name: str, x: np.ndarray, chunk: int = 1 << 20) -> dict[str, float]:
    """``_stats`` of an already sorted array of seconds, with no copy of it: order statistics read
    off the sorted values (numpy's median and linear percentile), the variance summed in chunks."""
    n = len(x)
    if not n:
        return _stats(name, [])
    mean = float(np.mean(x))
    sq = sum(float(np.sum(np.square(x[i : i + chunk] - mean))) for i in range(0, n, chunk))
    median = float(x[n // 2]) if n % 2 else (float(x[n // 2 - 1]) + float(x[n // 2])) / 2
    k = (n - 1) * 0.99
    lo = int(k)
    p99 = _lerp(float(x[lo]), float(x[min(lo + 1, n - 1)]), k - lo)
    return {
        f"mean_{name}_ms": mean * 1000.0,
        f"median_{name}_ms": median * 1000.0,
        f"std_{name}_ms": (sq / n) ** 0.5 * 1000.0,
        f"p99_{name}_ms": p99 * 1000.0,
    }


def request_latencies(r: RequestRecord) -> dict[str, Any]:
    sent = r.sent_s if r.sent_s is not None else r.arrival_s
    t = r.token_times
    ttft = t[0] - sent
    e2el = t[-1] - sent
    n = len(t)
    return {
        "ttft": ttft,
        "e2el": e2el,
        "tpot": (e2el - ttft) / (n - 1) if n > 1 else None,
        "itl": [b - a for a, b in zip(t, t[1:], strict=False)],
    }


def busy_fractions(ops: list[OpRecord] | OpLog, num_stages: int) -> tuple[list[float], float, float]:
    """Per-stage busy fraction over the pipeline window, and the pipeline bubble.

    The window runs from the first stage operation's start to the last one's end. The pipeline
    bubble is 1 - (total stage busy time) / (stages x window): (P-1)/(M+P-1) for M equal
    micro-batches on P equal stages.
    """
    if isinstance(ops, OpLog):  # running totals (every compute, whether or not its record is kept)
        if not ops.busy:
            return [0.0] * num_stages, 1.0, 0.0
        busy, window = defaultdict(float, ops.busy), ops.t1 - ops.t0
    else:
        compute = [o for o in ops if o.kind == "compute"]
        if not compute:
            return [0.0] * num_stages, 1.0, 0.0
        busy = defaultdict(float)
        for o in compute:
            busy[o.track] += o.end_s - o.start_s
        window = max(o.end_s for o in compute) - min(o.start_s for o in compute)
    fr = [busy[f"stage{i}"] / window if window > 0 else 0.0 for i in range(num_stages)]
    return fr, 1.0 - sum(fr) / num_stages, window


def _columns(requests: Sequence[RequestRecord] | RequestColumns | Ledger) -> RequestColumns:
    if isinstance(requests, RequestColumns):
        return requests
    if isinstance(requests, Ledger):
        return requests.columns()
    return RequestColumns.from_records(list(requests))


def summarize(
    requests: Sequence[RequestRecord] | RequestColumns | Ledger,
    ops: list[OpRecord] | OpLog,
    num_stages: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of a run from its records (or their columns). Inter-token latencies are taken in
    sorted order (sorted in place), so the figures do not depend on the order requests finished in."""
    c = _columns(requests)
    done = (c.status == FINISHED) & (c.num_tokens > 0)
    sent = np.where(np.isnan(c.sent_s), c.arrival_s, c.sent_s)[done]
    ttft = c.first_token_s[done] - sent
    e2el = c.last_token_s[done] - sent
    n = c.num_tokens[done]
    multi = n > 1
    tpot = (e2el[multi] - ttft[multi]) / (n[multi] - 1)
    sends = c.sent_s[~np.isnan(c.sent_s)]
    ends = c.finish_s[done]
    ends = ends[~np.isnan(ends)]
    duration = float(ends.max() - sends.min()) if len(ends) and len(sends) else 0.0
    n_in = int(c.input_tokens[done].sum())
    n_out = int(n.sum())
    completed = int(done.sum())
    s: dict[str, Any] = {
        "completed": completed,
        "failed": int(np.isin(c.status, (REJECTED, UNFINISHED)).sum()),
        "aborted": int((c.status == ABORTED).sum()),
        "duration": duration,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": completed / duration if duration else 0.0,
        "output_throughput": n_out / duration if duration else 0.0,
        "total_token_throughput": (n_in + n_out) / duration if duration else 0.0,
    }
    s.update(_stats("ttft", ttft))
    s.update(_stats("tpot", tpot))
    itl = c.itl_s if c.itl_s.flags.writeable else c.itl_s.copy()
    itl.sort()  # in place: the gaps of a long run are its largest array
    s.update(sorted_stats("itl", itl))
    s.update(_stats("e2el", e2el))
    fr, bubble, window = busy_fractions(ops, num_stages)
    s["stage_busy_fraction"] = fr
    s["stage_bubble_fraction"] = [1.0 - f for f in fr]
    s["pipeline_bubble_fraction"] = bubble
    s["pipeline_window_s"] = window
    s["num_preemptions"] = int(c.preemptions.sum())
    if extra:
        s.update(extra)
    return s


def format_summary(s: dict[str, Any], title: str = "Serving Benchmark Result") -> str:
    """The terminal table of ``vllm bench serve``, plus ppsim's pipeline section."""
    w = 50
    lines = [f"{' ' + title + ' ':=^{w}}"]

    def row(label: str, value: Any, fmt: str = "{:.2f}") -> None:
        v = fmt.format(value) if isinstance(value, float) else str(value)
        lines.append(f"{label:<40}{v:<10}")

    row("Successful requests:", s["completed"])
    if s.get("failed"):
        row("Failed requests:", s["failed"])
    if s.get("aborted"):
        row("Aborted requests:", s["aborted"])
    row("Benchmark duration (s):", s["duration"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total Token throughput (tok/s):", s["total_token_throughput"])
    for key, head, label in (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    ):
        lines.append(f"{head:-^{w}}")
        row(f"Mean {label} (ms):", s[f"mean_{key}_ms"])
        row(f"Median {label} (ms):", s[f"median_{key}_ms"])
        row(f"P99 {label} (ms):", s[f"p99_{key}_ms"])
    lines.append(f"{'Pipeline':-^{w}}")
    row("Stage busy fraction:", " ".join(f"{f:.3f}" for f in s["stage_busy_fraction"]))
    row("Pipeline bubble fraction:", s["pipeline_bubble_fraction"], "{:.3f}")
    if "kv_capacity_tokens" in s:
        row("KV capacity (tokens):", s["kv_capacity_tokens"])
        row("KV concurrency at mean length:", s["kv_concurrency_at_mean_len"])
        row("Peak KV blocks used:", f"{s['kv_peak_blocks_used']}/{s['kv_num_blocks']}")
        row("Preemptions:", s["num_preemptions"])
    lines.append("=" * w)
    return "\n".join(lines)
