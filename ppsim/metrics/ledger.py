"""Per-request results of a run as columns, and the one token-recording rule of both executors.

A :class:`Ledger` has one row per request (the workload's rows) in typed arrays: a million requests
take ~60 MB. Every output token updates the request's first/last token time and count; the gaps
between its tokens (the inter-token latencies of ``vllm bench serve``) are buffered while the
request runs and kept only if it finishes, so a run holds 8 bytes per finished output token plus
the live requests' buffers. Every token time is kept as well with ``keep_tokens`` (``tokens.csv``,
validation, tests); :meth:`Ledger.records` then builds :class:`RequestRecord` objects.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppsim.metrics.records import RequestRecord

STATUSES = ("pending", "finished", "aborted", "rejected", "unfinished")
PENDING, FINISHED, ABORTED, REJECTED, UNFINISHED = range(len(STATUSES))
_CODE = {s: i for i, s in enumerate(STATUSES)}


def _nan(n: int) -> array:
    return array("d", [math.nan]) * n


class Ledger:
    def __init__(self, workload: object, keep_tokens: bool = True) -> None:
        wl = workload
        n = len(wl)  # type: ignore[arg-type]
        self.wl = wl
        self.sent, self.scheduled, self.first, self.last, self.finish = (_nan(n) for _ in range(5))
        self.ntok = array("q", [0]) * n
        self.preemptions = array("q", [0]) * n
        self.status = bytearray(n)
        self.times: list[list[float]] | None = [[] for _ in range(n)] if keep_tokens else None
        self.gaps: dict[int, list[float]] = {}  # running requests' inter-token gaps (without keep_tokens)
        self.live_times: dict[int, list[float]] = {}  # token times of requests in the engine (on_sent)
        self.itl = array("d")  # the gaps of every finished request

    def __len__(self) -> int:
        return len(self.status)

    # --- events ----------------------------------------------------------------------------------
    def on_sent(self, row: int, now: float) -> list[float]:
        """The request was sent: returns the list its token times are buffered in while it is in the
        engine (:meth:`on_tokens` without ``keep_tokens``; the caller keeps it with the request)."""
        self.sent[row] = now
        buf = self.live_times[row] = []
        return buf

    def on_launch(self, row: int, now: float) -> None:
        """A micro-batch including the request was launched; the first one sets ``scheduled_s``."""
        if self.scheduled[row] != self.scheduled[row]:  # NaN: not scheduled before
            self.scheduled[row] = now

    def on_token(
        self,
        row: int,
        req_id: int,
        index: int,
        finished: bool,
        now: float,
        abort_after: int | None,
        abort: Callable[[int], bool],
    ) -> bool:
        """Timestamp the request's ``index``-th output token; True if the request ended with it: it
        finished, or the client cancels it having received ``abort_after`` tokens (``abort`` frees it
        in the engine core)."""
        n = self.ntok[row]
        if n:
            if self.times is None:
                buf = self.gaps.get(row)
                if buf is None:
                    buf = self.gaps[row] = []
                buf.append(now - self.last[row])
        else:
            self.first[row] = now
        self.last[row] = now
        self.ntok[row] = n + 1
        if self.times is not None:
            self.times[row].append(now)
        if finished:
            self._end(row, now, FINISHED)
            return True
        if abort_after is not None and index >= abort_after and abort(req_id):
            self._end(row, now, ABORTED)
            return True
        return False

    def on_tokens(
        self, outputs: Sequence, now: float, live: dict, abort: Callable[[int], bool], ended: Callable[[int], None]
    ) -> None:
        """:meth:`on_token` for every output of one engine-core step (``(req_id, index, finished)``
        tuples) reaching the client at ``now``, the same rule in one loop. ``live`` maps a request id
        to its ``(row, Request, token-time buffer)`` while it is in the engine; ``ended(req_id)`` is called at once for
        each that ended. An output of a request no longer live (cancelled while the output was on its
        way) is still recorded, and ends nothing."""
        ntok, first, last, times = self.ntok, self.first, self.last, self.times
        if times is None:
            self._on_tokens_gaps(outputs, now, live, abort, ended)
            return
        for req_id, index, finished in outputs:
            entry = live.get(req_id)
            if entry is None:
                row, abort_after = self.wl.row_of(req_id), None
            else:
                row, req, _buf = entry
                abort_after = req.abort_after_tokens
            n = ntok[row]
            if not n:
                first[row] = now
            last[row] = now
            ntok[row] = n + 1
            times[row].append(now)
            if finished:
                self._end(row, now, FINISHED)
            elif abort_after is not None and index >= abort_after and abort(req_id):
                self._end(row, now, ABORTED)
            else:
                continue
            if entry is not None:
                ended(req_id)

    def _on_tokens_gaps(
        self, outputs: Sequence, now: float, live: dict, abort: Callable[[int], bool], ended: Callable[[int], None]
    ) -> None:
        """:meth:`on_tokens` without ``keep_tokens`` (the default). A request in the engine (``live``)
        buffers its token times in the list :meth:`on_sent` gave it (one append per token); its count, first and last
        token times and, if it finished, its gaps go into the columns when it ends (:meth:`_flush`),
        the values :meth:`on_token` would have written one token at a time. An output of a request no
        longer live takes :meth:`on_token` (its buffer was flushed when it ended)."""
        for req_id, index, finished in outputs:
            entry = live.get(req_id)
            if entry is None:
                self.on_token(self.wl.row_of(req_id), req_id, index, finished, now, None, abort)
                continue
            row, req, buf = entry
            buf.append(now)
            if finished:
                self._end(row, now, FINISHED)
            else:
                abort_after = req.abort_after_tokens
                if abort_after is not None and index >= abort_after and abort(req_id):
                    self._end(row, now, ABORTED)
                else:
                    continue
            ended(req_id)

    def _flush(self, row: int, status: int) -> None:
        """A request with buffered token times ended (``status``) or the run is over (PENDING): its
        count, first and last token times into the columns, its gaps into ``itl`` if it finished."""
        t = self.live_times.pop(row)
        if not t:  # no token (or recorded one at a time, by on_token)
            return
        n = self.ntok[row]
        if not n:
            self.first[row] = t[0]
        elif status == FINISHED:  # tokens recorded before the buffer (not while a request is live)
            self.gaps.setdefault(row, []).append(t[0] - self.last[row])
        self.last[row] = t[-1]
        self.ntok[row] = n + len(t)
        if status == FINISHED:
            earlier = self.gaps.pop(row, None)
            if earlier:
                self.itl.extend(earlier)
            if len(t) > 1:  # the gaps t[i+1] - t[i] (the same subtractions), in token order, as bytes
                self.itl.frombytes(np.diff(np.array(t)).tobytes())

    def on_aborted(self, row: int, now: float) -> None:
        """The client cancelled the request (after a time) and the engine core dropped it."""
        self._end(row, now, ABORTED)

    def on_rejected(self, row: int) -> None:
        self.status[row] = REJECTED
        self.live_times.pop(row, None)

    def _end(self, row: int, now: float, status: int) -> None:
        self.finish[row] = now
        self.status[row] = status
        if row in self.live_times:
            self._flush(row, status)
        if self.times is None:
            buf = self.gaps.pop(row, None)
            if status == FINISHED and buf:
                self.itl.extend(buf)
        elif status == FINISHED:
            t = self.times[row]
            self.itl.extend([b - a for a, b in zip(t, t[1:], strict=False)])

    def close(self) -> None:
        """The run is over: requests still pending are ``unfinished``."""
        for row in list(self.live_times):  # requests still in the engine
            self._flush(row, PENDING)
        st = self.status
        for row in range(len(st)):
            if st[row] == PENDING:
                st[row] = UNFINISHED
        self.gaps.clear()

    # --- views -----------------------------------------------------------------------------------
    def columns(self) -> RequestColumns:
        wl = self.wl
        return RequestColumns(
            np.asarray(wl.req_id),
            np.asarray(wl.arrival_s),
            np.frombuffer(self.sent),
            np.frombuffer(self.scheduled),
            np.frombuffer(self.first),
            np.frombuffer(self.last),
            np.frombuffer(self.finish),
            np.asarray(wl.prompt_len),
            np.asarray(wl.output_len),
            np.frombuffer(self.ntok, dtype=np.int64),
            np.frombuffer(self.preemptions, dtype=np.int64),
            np.frombuffer(bytes(self.status), dtype=np.uint8),
            np.frombuffer(self.itl),
        )

    def records(self) -> list[RequestRecord]:
        """One :class:`RequestRecord` per row (needs ``keep_tokens``)."""
        if self.times is None:
            raise ValueError("token times were not kept (keep_tokens=False); use columns()")
        wl, out = self.wl, []
        for row in range(len(self)):
            out.append(
                RequestRecord(
                    int(wl.req_id[row]),
                    float(wl.arrival_s[row]),
                    int(wl.prompt_len[row]),
                    int(wl.output_len[row]),
                    _opt(self.sent[row]),
                    _opt(self.scheduled[row]),
                    self.times[row],
                    _opt(self.finish[row]),
                    self.preemptions[row],
                    STATUSES[self.status[row]],
                )
            )
        return out


def _opt(v: float) -> float | None:
    return None if v != v else v


@dataclass(frozen=True)
class RequestColumns:
    """Per-request results as numpy columns (NaN: never happened), plus every finished request's
    inter-token gaps (``itl_s``, in any order)."""

    req_id: np.ndarray
    arrival_s: np.ndarray
    sent_s: np.ndarray
    scheduled_s: np.ndarray
    first_token_s: np.ndarray
    last_token_s: np.ndarray
    finish_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray  # requested
    num_tokens: np.ndarray  # produced
    preemptions: np.ndarray
    status: np.ndarray  # codes into STATUSES
    itl_s: np.ndarray

    @classmethod
    def from_records(cls, recs: Sequence[RequestRecord]) -> RequestColumns:
        def col(f: Callable[[RequestRecord], float | None]) -> np.ndarray:
            return np.array([math.nan if (v := f(r)) is None else v for r in recs], dtype=np.float64)

        itl = [
            b - a
            for r in recs
            if r.status == "finished"
            for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        ]
        return cls(
            np.array([r.req_id for r in recs], dtype=np.int64),
            col(lambda r: r.arrival_s),
            col(lambda r: r.sent_s),
            col(lambda r: r.scheduled_s),
            col(lambda r: r.token_times[0] if r.token_times else None),
            col(lambda r: r.token_times[-1] if r.token_times else None),
            col(lambda r: r.finish_s),
            np.array([r.input_tokens for r in recs], dtype=np.int64),
            np.array([r.output_tokens for r in recs], dtype=np.int64),
            np.array([len(r.token_times) for r in recs], dtype=np.int64),
            np.array([r.preemptions for r in recs], dtype=np.int64),
            np.array([_CODE[r.status] for r in recs], dtype=np.uint8),
            np.array(itl, dtype=np.float64),
        )
