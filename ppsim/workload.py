"""Request streams, as ``vllm bench serve`` sends them (random dataset, Poisson/gamma arrivals).

Arrivals: the first request at t = 0, then gaps drawn from a gamma distribution with shape
``burstiness`` and mean ``1 / request_rate`` (burstiness 1 = Poisson); ``request_rate = inf``
sends everything at t = 0. Lengths: uniform integers in
[len x (1 - range_ratio), len x (1 + range_ratio)]. A CSV trace replays given requests.
One seeded ``numpy.random.Generator``: the same seed gives the same requests.

A :class:`Workload` holds the requests as numpy columns (a million requests take ~40 MB) and hands
out :class:`~ppsim.policy.requests.Request` objects one at a time, in arrival order, as a client
sends them; a CSV trace is parsed row by row into those columns.
"""

from __future__ import annotations

import csv
import difflib
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ppsim.config import MAX_ARRIVAL_S, WorkloadConfig
from ppsim.errors import PPSimError
from ppsim.fileio import MAX_TRACE_BYTES, check_regular_file, os_error, short_repr
from ppsim.policy.requests import Request

TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("abort_after_tokens", "abort_after_s")
NO_ABORT = -1  # abort_tokens column: the client does not cancel after a token count


class Workload:
    """Requests as columns. Rows keep the order given (results are reported in it); iteration and
    :meth:`in_arrival_order` yield rows by (arrival, id). ``abort_tokens`` is ``NO_ABORT`` and
    ``abort_s`` NaN where the client does not cancel."""

    __slots__ = ("req_id", "arrival_s", "prompt_len", "output_len", "abort_tokens", "abort_s", "_order", "_rows")

    def __init__(
        self,
        req_id: Any,
        arrival_s: Any,
        prompt_len: Any,
        output_len: Any,
        abort_tokens: Any = None,
        abort_s: Any = None,
    ) -> None:
        n = len(arrival_s)
        self.req_id = np.asarray(req_id, dtype=np.int64)
        self.arrival_s = np.asarray(arrival_s, dtype=np.float64)
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.output_len = np.asarray(output_len, dtype=np.int64)
        self.abort_tokens = (
            np.full(n, NO_ABORT, dtype=np.int64) if abort_tokens is None else np.asarray(abort_tokens, dtype=np.int64)
        )
        self.abort_s = np.full(n, np.nan) if abort_s is None else np.asarray(abort_s, dtype=np.float64)
        order = np.lexsort((self.req_id, self.arrival_s))
        self._order = None if np.array_equal(order, np.arange(n)) else order
        ids = self.req_id
        self._rows = None if np.array_equal(ids, np.arange(n)) else {int(r): i for i, r in enumerate(ids.tolist())}
        if self._rows is not None and len(self._rows) != n:
            raise PPSimError("workload: request ids must be unique")

    @classmethod
    def from_requests(cls, reqs: Iterable[Request]) -> Workload:
        reqs = list(reqs)
        return cls(
            [r.req_id for r in reqs],
            [r.arrival_s for r in reqs],
            [r.prompt_len for r in reqs],
            [r.output_len for r in reqs],
            [NO_ABORT if r.abort_after_tokens is None else r.abort_after_tokens for r in reqs],
            [math.nan if r.abort_after_s is None else r.abort_after_s for r in reqs],
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    def row_of(self, req_id: int) -> int:
        """The row of request ``req_id``."""
        return req_id if self._rows is None else self._rows[req_id]

    def request(self, row: int) -> Request:
        a, s = int(self.abort_tokens[row]), float(self.abort_s[row])
        return Request(
            int(self.req_id[row]),
            float(self.arrival_s[row]),
            int(self.prompt_len[row]),
            int(self.output_len[row]),
            None if a == NO_ABORT else a,
            None if math.isnan(s) else s,
        )

    def __getitem__(self, row: int) -> Request:
        if not -len(self) <= row < len(self):
            raise IndexError(row)
        return self.request(row % len(self))

    def rows_in_arrival_order(self) -> Iterator[int]:
        if self._order is None:
            yield from range(len(self))
        else:
            for i in range(0, len(self), 4096):
                yield from self._order[i : i + 4096].tolist()

    def in_arrival_order(self) -> Iterator[tuple[int, Request]]:
        """(row, request) in the order a client sends them, built one at a time."""
        for row in self.rows_in_arrival_order():
            yield row, self.request(row)

    def __iter__(self) -> Iterator[Request]:
        """Every request, in row order, built one at a time."""
        for row in range(len(self)):
            yield self.request(row)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, c), getattr(other, c), equal_nan=c == "abort_s")
            for c in ("req_id", "arrival_s", "prompt_len", "output_len", "abort_tokens", "abort_s")
        )

    __hash__ = None  # type: ignore[assignment]

    def max_prompt_len(self) -> int:
        return int(self.prompt_len.max()) if len(self) else 0

    def mean_total_len(self) -> float:
        return float((self.prompt_len + self.output_len).sum()) / max(1, len(self))


def as_workload(reqs: Workload | Iterable[Request]) -> Workload:
    return reqs if isinstance(reqs, Workload) else Workload.from_requests(reqs)


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


def synthetic(cfg: WorkloadConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    n = cfg.num_prompts
    ins = _lengths(rng, cfg.random_input_len, cfg.random_range_ratio, n)
    outs = _lengths(rng, cfg.random_output_len, cfg.random_range_ratio, n)
    times = arrival_times(rng, n, cfg.request_rate, cfg.burstiness)
    return Workload(np.arange(n), times, ins, outs)


def _optional(v: str | None, kind: type) -> Any:
    return kind(v) if v not in (None, "") else None


NUMBER_FORMS = {float: "a number of seconds such as 0.5", int: "a whole number such as 16"}


def _bad_cell(row: list[str], at: list[int], opt: list[int | None], where: str) -> PPSimError:
    """The error for a row whose cells did not parse: the first cell that is missing or not a number."""
    kinds = (float, int, int, int, float)
    for n, (i, name, kind) in enumerate(zip([*at, *opt], TRACE_COLUMNS + OPTIONAL_COLUMNS, kinds, strict=True)):
        text = row[i] if i is not None and i < len(row) else ""
        if not text and n < len(at):
            return PPSimError(f"{where}: no {name} value; give {', '.join(TRACE_COLUMNS)} on every line")
        try:
            _optional(text, kind)
        except ValueError:
            return PPSimError(f"{where}: {name} is {short_repr(text)}, not {NUMBER_FORMS[kind]}; fix the cell")
    return PPSimError(f"{where} has a non-numeric value")


def read_trace(path: str) -> Workload:
    """CSV with a header ``arrival_s,input_tokens,output_tokens``, optionally ``abort_after_tokens``
    (the client cancels after that many output tokens) and ``abort_after_s`` (after that long).
    Parsed row by row into columns; sorted by arrival (ties by row)."""
    cols = (array("d"), array("q"), array("q"), array("q"), array("d"))  # 8 bytes a value, as parsed
    check_regular_file(path, "workload.trace", MAX_TRACE_BYTES)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            try:
                at, opt = _columns(next(reader, None), path)
                for row in reader:
                    if row:  # blank lines skipped, as csv.DictReader does; errors name the file's line
                        _trace_row(row, at, opt, f"workload.trace: {path} line {reader.line_num}", cols)
            except csv.Error as err:  # a cell over the csv module's limit (128 KiB), a NUL in a quoted cell
                raise PPSimError(f"workload.trace: {path} line {reader.line_num}: {err}; fix the CSV") from None
    except OSError as err:
        raise os_error("workload.trace", "read", path, err) from None
    except UnicodeDecodeError as err:
        raise PPSimError(f"workload.trace: {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    if not cols[0]:
        raise PPSimError(f"workload.trace: {path} has a header but no requests; add a line per request, e.g. 0,16,4")
    t, n_in, n_out, ab_n, ab_s = (np.frombuffer(c, dtype=np.float64 if c.typecode == "d" else np.int64) for c in cols)
    order = np.lexsort((np.arange(len(t)), t))
    return Workload(order, t[order], n_in[order], n_out[order], ab_n[order], ab_s[order])


def _columns(header: list[str] | None, path: str) -> tuple[list[int], list[int | None]]:
    """The positions of the required and optional columns. Other columns (a production trace's request
    ids, timestamps, ...) are ignored, but one that is a near miss of a column ppsim reads (``abort_after_token``)
    is refused, as is a repeated column."""
    if header is None or any(c not in header for c in TRACE_COLUMNS):
        raise PPSimError(f"workload.trace: {path} needs a header with columns {', '.join(TRACE_COLUMNS)}")
    named = [c for c in header if c]  # an empty name (a trailing comma) holds nothing to misspell
    known = TRACE_COLUMNS + OPTIONAL_COLUMNS
    for c in named:
        near = difflib.get_close_matches(c.strip().lower(), known, n=1, cutoff=0.8) if c not in known else []
        if near:
            raise PPSimError(
                f"workload.trace: {path} has the column {short_repr(c)}, not {near[0]}; rename it "
                f"(the columns are {', '.join(TRACE_COLUMNS)} and optionally {', '.join(OPTIONAL_COLUMNS)})"
            )
    twice = next((c for c, n in Counter(named).items() if n > 1), None)
    if twice:
        raise PPSimError(f"workload.trace: {path} has the column {twice} twice; keep one")
    at = [header.index(c) for c in TRACE_COLUMNS]
    return at, [header.index(c) if c in header else None for c in OPTIONAL_COLUMNS]


def _trace_row(row: list[str], at: list[int], opt: list[int | None], where: str, cols: tuple[array, ...]) -> None:
    def cell(i: int | None) -> str | None:
        return row[i] if i is not None and i < len(row) else None

    try:
        t, n_in, n_out = float(cell(at[0])), int(cell(at[1])), int(cell(at[2]))  # type: ignore[arg-type]
        abort_n = _optional(cell(opt[0]), int)
        abort_s = _optional(cell(opt[1]), float)
    except (TypeError, ValueError):
        raise _bad_cell(row, at, opt, where) from None
    if not math.isfinite(t) or t < 0 or n_in < 1 or n_out < 1:
        raise PPSimError(f"{where}: arrival_s must be finite and >= 0, token counts >= 1")
    if t > MAX_ARRIVAL_S:
        raise PPSimError(
            f"{where}: arrival_s {t:g} is more than {MAX_ARRIVAL_S:g}; it is seconds since the trace start: "
            "was it in ms or epoch time?"
        )
    if abort_n is not None and not 1 <= abort_n < n_out:
        raise PPSimError(f"{where}: abort_after_tokens must be in [1, output_tokens - 1]")
    if abort_s is not None and not (math.isfinite(abort_s) and 0 <= abort_s <= MAX_ARRIVAL_S):
        raise PPSimError(f"{where}: abort_after_s must be finite and in [0, {MAX_ARRIVAL_S:g}] s after arrival")
    try:
        for c, v in zip(
            cols,
            (t, n_in, n_out, NO_ABORT if abort_n is None else abort_n, math.nan if abort_s is None else abort_s),
            strict=True,
        ):
            c.append(v)
    except OverflowError:
        raise PPSimError(f"{where}: a token count is too large") from None


def apply_aborts(wl: Workload, rate: float, window_s: float, seed: int) -> Workload:
    """Mark a ``rate`` fraction of requests as cancelled by the client, deterministically from ``seed``.

    Half of them (those with more than one output token) cancel mid-decode after a uniform number
    of tokens in [1, output - 1]; the rest cancel at a uniform time in [0, ``window_s``) after
    being sent, wherever they are then (waiting, mid-prefill or decoding). Its own random stream, so
    the request lengths and arrivals do not change with the rate.
    """
    n = len(wl)
    if rate <= 0 or not n:
        return wl
    rng = np.random.default_rng([seed, 0xAB0])
    pick, kind, frac, delay = rng.random(n), rng.random(n), rng.random(n), rng.random(n) * window_s
    chosen = pick < rate
    by_tok = chosen & (kind < 0.5) & (wl.output_len > 1)
    by_time = chosen & ~by_tok
    ab_n = np.where(by_tok, 1 + (frac * (wl.output_len - 1)).astype(np.int64), wl.abort_tokens)
    ab_s = np.where(by_time, delay, wl.abort_s)
    return Workload(wl.req_id, wl.arrival_s, wl.prompt_len, wl.output_len, ab_n, ab_s)


def build_workload(cfg: WorkloadConfig, seed: int) -> Workload:
    wl = read_trace(cfg.trace) if cfg.trace else synthetic(cfg, seed)
    return apply_aborts(wl, cfg.abort_rate, cfg.abort_window_s, seed)
