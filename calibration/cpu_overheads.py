"""Per-step CPU of the engine core: ppsim's own scheduler, timed in a steady decode state.

The live engine runs :class:`ppsim.policy.scheduler.Scheduler` itself, so its CPU per step is what
``Scheduler.schedule()`` and ``Scheduler.update_from_output()`` cost with ``n`` running requests.
Every request has finished its prompt and decodes one token per step (none finishes during timing).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ppsim.policy.kv import BlockPool
from ppsim.policy.requests import Request
from ppsim.policy.scheduler import Scheduler, SchedulerLimits


def _steady(n: int) -> Scheduler:
    out_len = 100_000  # more steps than any timing loop runs, so nothing finishes
    sched = Scheduler(
        SchedulerLimits(max_num_seqs=n, max_num_batched_tokens=max(16 * n, 64)),
        BlockPool(num_blocks=n * (out_len // 16 + 2), block_size=16),
    )
    for i in range(n):
        if not sched.add_request(Request(i, 0.0, prompt_len=16, output_len=out_len)):
            raise RuntimeError("cpu overheads: request rejected; the block pool is too small")
    for _ in range(3):  # prefill everything, then a couple of decode steps
        sched.update_from_output(sched.schedule())
    return sched


def time_scheduler(n: int, steps: int, repeats: int, clock: str = "wall") -> dict[str, tuple[float, float, float]]:
    """{"schedule"|"update": (median, p10, p90) seconds per step} with ``n`` decoding requests."""
    sched = _steady(n)
    now = time.thread_time if clock == "thread" else time.perf_counter
    out: dict[str, list[float]] = {"schedule": [], "update": []}
    for _ in range(repeats):
        ts = tu = 0.0
        for _ in range(steps):
            t0 = now()
            plan = sched.schedule()
            t1 = now()
            sched.update_from_output(plan)
            t2 = now()
            ts, tu = ts + t1 - t0, tu + t2 - t1
        out["schedule"].append(ts / steps)
        out["update"].append(tu / steps)
    return {k: (float(np.median(v)), float(np.percentile(v, 10)), float(np.percentile(v, 90))) for k, v in out.items()}


def profile_cpu(ns: tuple[int, ...], repeats: int = 7, clock: str = "wall") -> list[dict[str, Any]]:
    rows = []
    for n in ns:
        steps = max(5, 2000 // n)
        for kind, (med, p10, p90) in time_scheduler(n, steps, repeats, clock).items():
            rows.append(
                {
                    "op": kind,
                    "split": "fit",
                    "n": n,
                    "median_s": med,
                    "p10_s": p10,
                    "p90_s": p90,
                    "repeats": repeats,
                    "inner": steps,
                }
            )
    return rows
