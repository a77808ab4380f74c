"""Requests as columns: rows in the order given, sent in arrival order, built one at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppsim.errors import PPSimError
from ppsim.metrics.ledger import FINISHED, Ledger
from ppsim.policy.requests import Request
from ppsim.workload import Workload, read_trace


def test_rows_keep_the_given_order_and_arrival_order_is_by_time_then_id():
    reqs = [Request(7, 0.5, 10, 3), Request(2, 0.1, 20, 4, abort_after_tokens=2), Request(5, 0.1, 30, 5, None, 0.25)]
    wl = Workload.from_requests(reqs)
    assert list(wl) == reqs  # row order, Request objects rebuilt field for field
    assert [r.req_id for _, r in wl.in_arrival_order()] == [2, 5, 7]
    assert [wl.row_of(i) for i in (7, 2, 5)] == [0, 1, 2]
    assert wl[1].abort_after_tokens == 2 and wl[2].abort_after_s == 0.25 and wl[0].abort_after_s is None
    assert wl.max_prompt_len() == 30 and wl.mean_total_len() == pytest.approx((13 + 24 + 35) / 3)
    assert wl == Workload.from_requests(reqs) and wl != Workload.from_requests(reqs[:2])
    with pytest.raises(PPSimError, match="unique"):
        Workload.from_requests([Request(1, 0.0, 1, 1), Request(1, 0.0, 1, 1)])


def test_a_trace_is_parsed_into_typed_columns(tmp_path):
    p = tmp_path / "t.csv"
    rows = "".join(f"{(i * 7919) % 1000 / 100},{1 + i % 50},{1 + i % 9}\n" for i in range(3000))
    p.write_text("arrival_s,input_tokens,output_tokens\n" + rows)
    wl = read_trace(str(p))
    assert wl.arrival_s.dtype == np.float64 and wl.prompt_len.dtype == np.int64 and len(wl) == 3000
    assert np.all(np.diff(wl.arrival_s) >= 0)  # sorted by arrival; ids are the rows of the file
    first = wl[0]
    assert first.arrival_s == 0.0 and first.req_id == 0 and math.isnan(wl.abort_s[0])


def test_ledger_keeps_gaps_only_of_finished_requests():
    wl = Workload.from_requests([Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3, abort_after_tokens=2)])
    lean = Ledger(wl, keep_tokens=False)
    accept = lambda _r: True  # noqa: E731 - the core accepts the cancellation
    for i, t in enumerate((1.0, 1.5, 2.5), start=1):
        lean.on_token(0, 0, i, i == 3, t, None, accept)
    assert lean.on_token(1, 1, 1, False, 1.0, 2, accept) is False
    assert lean.on_token(1, 1, 2, False, 1.2, 2, accept) is True  # cancelled after 2 tokens
    lean.close()
    assert list(lean.itl) == [0.5, 1.0] and lean.status[0] == FINISHED and lean.gaps == {}
    assert (lean.first[0], lean.last[0], lean.ntok[0]) == (1.0, 2.5, 3)
    with pytest.raises(ValueError, match="keep_tokens"):
        lean.records()
