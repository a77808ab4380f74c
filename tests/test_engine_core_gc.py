"""engine/core_gc.py: the caller's heap frozen around an engine run and every collection recorded."""

from __future__ import annotations

import gc

import pytest

from engine.core_gc import PAUSE_S, GcWatch, core_heap


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_heap_is_frozen_inside_and_given_back_after_with_each_collection_recorded():
    keep = [_Cycle() for _ in range(1000)]  # the caller's live objects: frozen, never collected inside
    info: dict = {}
    with core_heap(info, lambda: 0.0):
        assert gc.get_freeze_count() >= len(keep)
        for _ in range(100):
            _Cycle()  # garbage of the run itself: still collected
        gc.collect()
    assert gc.get_freeze_count() == 0
    core = info["core_gc"]
    assert core["frozen_objects"] >= len(keep) and core["collections_by_generation"][2] >= 1 and core["freeze_s"] > 0
    assert 0 < core["longest_pause_s"] <= core["pause_s"]
    assert all(p["pause_s"] >= PAUSE_S for p in core["pauses_over_1ms"])


def test_not_frozen_on_request_and_recorded_even_when_the_run_fails():
    info: dict = {}
    with pytest.raises(RuntimeError), core_heap(info, lambda: 0.0, freeze=False):
        assert gc.get_freeze_count() == 0
        gc.collect(1)
        raise RuntimeError("a stage died")
    assert info["core_gc"]["frozen_objects"] == 0 and info["core_gc"]["collections_by_generation"][1] >= 1


def test_a_pause_is_listed_from_its_start_since_the_engine_start():
    w = GcWatch()
    w.pauses = [(2, 10.5, 0.160), (0, 10.6, 0.0001)]  # a 160 ms full collection 0.5 s into the run
    got = w.summary(origin_s=10.0, frozen=7)
    assert got["collections_by_generation"] == [1, 0, 1] and got["longest_pause_s"] == 0.160
    assert got["pauses_over_1ms"] == [{"generation": 2, "start_s": pytest.approx(0.5), "pause_s": 0.160}]
    assert got["pause_s"] == pytest.approx(0.1601) and got["frozen_objects"] == 7
