"""Request streams, as ``vllm bench serve`` sends them (random dataset, Poisson/gamma arrivals).

Arrivals: the first request at t = 0, then gaps drawn from a gamma distribution with shape
``burstiness`` and mean ``1 / request_rate`` (burstiness 1 = Poisson); ``request_rate = inf``
sends everything at t = 0. Lengths: uniform integers in
[len x (1 - range_ratio), len x (1 + range_ratio)]. A CSV trace replays given requests.
One seeded ``numpy.random.Generator``: the same seed gives the same requests.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from typing import Any

import numpy as np

from ppsim.config import WorkloadConfig
from ppsim.errors import PPSimError
from ppsim.policy.requests import Request

TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


def _lengths(rng: np.random.Generator, mean: int, ratio: float, n: int) -> np.ndarray:
    lo = max(1, int(mean * (1 - ratio)))
    hi = max(lo, int(mean * (1 + ratio)))
    return rng.integers(lo, hi + 1, size=n)


def arrival_times(rng: np.random.Generator, n: int, rate: float, burstiness: float) -> np.ndarray:
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def synthetic(cfg: WorkloadConfig, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    n = cfg.num_prompts
    ins = _lengths(rng, cfg.random_input_len, cfg.random_range_ratio, n)
    outs = _lengths(rng, cfg.random_output_len, cfg.random_range_ratio, n)
    times = arrival_times(rng, n, cfg.request_rate, cfg.burstiness)
    return [Request(i, float(times[i]), int(ins[i]), int(outs[i])) for i in range(n)]


def _optional(row: dict, key: str, kind: type) -> Any:
    v = row.get(key)
    return kind(v) if v not in (None, "") else None


def read_trace(path: str) -> list[Request]:
    """CSV with a header ``arrival_s,input_tokens,output_tokens``, optionally ``abort_after_tokens``
    (the client cancels after that many output tokens) and ``abort_after_s`` (after that long)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise PPSimError(f"workload.trace: cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise PPSimError(f"workload.trace: {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    if not rows or any(c not in rows[0] for c in TRACE_COLUMNS):
        raise PPSimError(f"workload.trace: {path} needs a header with columns {', '.join(TRACE_COLUMNS)}")
    reqs = []
    for i, row in enumerate(rows):
        where = f"workload.trace: {path} row {i + 2}"
        try:
            t, n_in, n_out = float(row["arrival_s"]), int(row["input_tokens"]), int(row["output_tokens"])
            abort_n = _optional(row, "abort_after_tokens", int)
            abort_s = _optional(row, "abort_after_s", float)
        except (TypeError, ValueError):
            raise PPSimError(f"{where} has a non-numeric value") from None
        if not math.isfinite(t) or t < 0 or n_in < 1 or n_out < 1:
            raise PPSimError(f"{where}: arrival_s must be finite and >= 0, token counts >= 1")
        if abort_n is not None and not 1 <= abort_n < n_out:
            raise PPSimError(f"{where}: abort_after_tokens must be in [1, output_tokens - 1]")
        if abort_s is not None and not (math.isfinite(abort_s) and abort_s >= 0):
            raise PPSimError(f"{where}: abort_after_s must be finite and >= 0")
        reqs.append(Request(i, t, n_in, n_out, abort_n, abort_s))
    reqs.sort(key=lambda r: (r.arrival_s, r.req_id))
    return reqs


def apply_aborts(reqs: list[Request], rate: float, window_s: float, seed: int) -> list[Request]:
    """Mark a ``rate`` fraction of requests as cancelled by the client, deterministically from ``seed``.

    Half of them (those with more than one output token) cancel mid-decode after a uniform number
    of tokens in [1, output - 1]; the rest cancel at a uniform time in [0, ``window_s``) after
    being sent, wherever they are then (waiting, mid-prefill or decoding). Its own random stream, so
    the request lengths and arrivals do not change with the rate.
    """
    if rate <= 0 or not reqs:
        return reqs
    rng = np.random.default_rng([seed, 0xAB0])
    n = len(reqs)
    pick, kind, frac, delay = rng.random(n), rng.random(n), rng.random(n), rng.random(n) * window_s
    out = []
    for i, r in enumerate(reqs):
        if pick[i] >= rate:
            out.append(r)
        elif kind[i] < 0.5 and r.output_len > 1:
            out.append(replace(r, abort_after_tokens=1 + int(frac[i] * (r.output_len - 1))))
        else:
            out.append(replace(r, abort_after_s=float(delay[i])))
    return out


def build_workload(cfg: WorkloadConfig, seed: int) -> list[Request]:
    reqs = read_trace(cfg.trace) if cfg.trace else synthetic(cfg, seed)
    return apply_aborts(reqs, cfg.abort_rate, cfg.abort_window_s, seed)
