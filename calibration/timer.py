"""Timing one callable robustly: warm-up, an inner loop long enough to beat clock resolution, repeats.

CPU: ``time.perf_counter`` around ``inner`` calls (torch CPU ops are synchronous). CUDA: CUDA events
recorded on the current stream around the same inner loop, with ``torch.cuda.synchronize()`` before
the start and after the end event, as kernels are asynchronous. Each repeat yields one per-call time;
the median, the mean and the 10th/90th percentiles are kept (a shared machine adds one-sided noise
to wall-clock samples, hence the median there; thread CPU time and CUDA events exclude other
processes, and their mean is the expected cost the simulator sums: see ``calibration.calibrate``).
The inner count comes from the *fastest* warm-up call, so one slow warm-up does not shrink it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    median_s: float
    mean_s: float
    p10_s: float
    p90_s: float
    repeats: int
    inner: int


@dataclass(frozen=True)
class Timer:
    """``device`` is "cpu" or "cuda"; each repeat lasts at least ``min_repeat_s``.

    ``clock`` "thread" (CPU only) reads ``time.thread_time``: the CPU time of the calling thread,
    which with one torch thread is the operator's compute, excluding time the OS gave to other
    processes. On a shared host this removes the one-sided contention noise that wall-clock medians
    keep; "wall" (``perf_counter``) is what a quiet machine would also show.
    """

    device: str = "cpu"
    clock: str = "wall"
    repeats: int = 7
    warmup: int = 2
    min_repeat_s: float = 0.002

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _run(self, fn: Callable[[], object], inner: int) -> float:
        """Seconds per call over ``inner`` back-to-back calls."""
        if self.device == "cuda":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / inner
        now = time.thread_time if self.clock == "thread" else time.perf_counter
        t0 = now()
        for _ in range(inner):
            fn()
        return (now() - t0) / inner

    def samples(self, fn: Callable[[], object]) -> tuple[list[float], int]:
        """``repeats`` per-call times and the inner count (set from the fastest warm-up call)."""
        warm = []
        for _ in range(max(1, self.warmup)):
            warm.append(self._run(fn, 1))
        one = max(min(warm), 1e-7)
        inner = max(1, min(10_000, int(self.min_repeat_s / one)))
        return [self._run(fn, inner) for _ in range(self.repeats)], inner

    def time(self, fn: Callable[[], object]) -> Timing:
        xs, inner = self.samples(fn)
        return summarize(xs, inner)


def summarize(xs: list[float], inner: int) -> Timing:
    a = np.asarray(xs)
    return Timing(
        float(np.median(a)), float(a.mean()), float(np.percentile(a, 10)), float(np.percentile(a, 90)), len(xs), inner
    )
