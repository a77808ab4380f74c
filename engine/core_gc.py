"""The engine core's heap through a run: frozen, as vLLM's engine core freezes its start-up heap, and its
garbage-collector pauses recorded.

The live engine's core runs in the calling process (``ppsim validate``, an experiment's loop of runs),
whose heap holds everything the caller built before the run: torch's modules, earlier runs' records,
simulations. A full (generation 2) collection walks all of it, and the core stops scheduling meanwhile:
in MoE rounds 79-81 the sixth engine run of a round (B = 32, repeat 1) stalled 160-234 ms with the
core's CPU 0.23-0.32 s against 0.07-0.09 s in repeat 0, its bubble 10-12 points up and TPOT 17-27%.
Recorded on round 82 (heap not frozen): a generation-2 collection of 226 ms 1.05 s into that run, stage 0
idle 227 ms from there, TPOT 33.8 against repeat 0's 27.5 ms; round 83 (frozen): no collection of 1 ms
or more in any of the six runs, B = 32's repeats 25.1 / 25.0 ms (docs/engine.md, "The engine core's
heap"). A vLLM engine core is a process of its own that calls
``vllm/utils/gc_utils.py::freeze_gc_heap`` (``gc.collect()`` of every generation, then ``gc.freeze()``)
after start-up, so that serving-time collections skip the static objects; :func:`core_heap` does the
same around a run, and unfreezes after it so the caller's objects are collected again as before.

Every collection during the run is recorded (``engine.json`` ``core_gc``): counts by generation, the
pauses' sum and longest, and each pause of :data:`PAUSE_S` or more with its start (seconds since the
engine start, as every engine time).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PAUSE_S = 0.001  # collections listed one by one from this long
LISTED = 20  # at most this many of them


class GcWatch:
    """``gc.callbacks`` entry: each collection's generation, start (``perf_counter``) and length."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float, float]] = []
        self._start: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
        elif self._start is not None:
            self.pauses.append((int(info["generation"]), self._start, now - self._start))
            self._start = None

    def summary(self, origin_s: float, frozen: int, freeze_s: float = 0.0) -> dict[str, Any]:
        """What ``engine.json`` records: collections by generation, their pauses, the heap frozen and what
        freezing it took (before the run's start: outside every engine time, inside the caller's CPU)."""
        long = [(g, t - origin_s, d) for g, t, d in self.pauses if d >= PAUSE_S]
        return {
            "collections_by_generation": [sum(1 for g, _, _ in self.pauses if g == i) for i in range(3)],
            "pause_s": sum(d for _, _, d in self.pauses),
            "longest_pause_s": max((d for _, _, d in self.pauses), default=0.0),
            "pauses_over_1ms": [{"generation": g, "start_s": t, "pause_s": d} for g, t, d in long[:LISTED]],
            "frozen_objects": frozen,
            "freeze_s": freeze_s,
        }


@contextmanager
def core_heap(info: dict[str, Any], origin: Callable[[], float], freeze: bool = True) -> Iterator[None]:
    """Around a run: the caller's heap collected and frozen (``freeze``), every collection recorded in
    ``info["core_gc"]`` (times from ``origin()``, the engine's start), the heap unfrozen after."""
    frozen, start = 0, time.perf_counter()
    if freeze:
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    freeze_s = time.perf_counter() - start
    watch = GcWatch()
    gc.callbacks.append(watch)
    try:
        yield
    finally:
        gc.callbacks.remove(watch)
        if freeze:
            gc.unfreeze()
        info["core_gc"] = watch.summary(origin(), frozen, freeze_s)
