"""The engine core's queue waits around the next arrival (``engine/executor.py``): a poll's timeout is
rounded up to whole milliseconds, so the core blocks only until ``POLL_GRAIN_S`` before an arrival
and covers the rest in short sleeps. A fake clock: no timing of this host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from engine import executor  # noqa: E402
from engine.executor import FINE_SLEEP_S, POLL_GRAIN_S, WAIT_SLICE_S, EngineExecutor  # noqa: E402


def _core(now: float, due: float | None) -> SimpleNamespace:
    return SimpleNamespace(now=lambda: now, _next_due_s=lambda: due)


def test_waits_block_until_shortly_before_the_next_arrival(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(executor.time, "sleep", slept.append)
    wait = EngineExecutor._wait_slice
    assert wait(_core(1.0, None)) == WAIT_SLICE_S  # nothing due: the longest slice
    assert wait(_core(1.0, 5.0)) == WAIT_SLICE_S
    assert wait(_core(1.0, 1.0105)) == pytest.approx(0.0105 - POLL_GRAIN_S)  # wakes before it, never after
    assert slept == []
    assert wait(_core(1.0, 1.001)) == 0.0  # the last stretch: a short sleep, then a non-blocking check
    assert wait(_core(1.0, 1.00005)) == 0.0
    assert slept == [FINE_SLEEP_S, pytest.approx(0.00005)]
    assert wait(_core(1.0, 0.999)) == 0.0 and len(slept) == 2  # due already: no sleep at all
