"""The host guard's engine-step probe: the host's speed measured on the engine's own compute.

The CPU probe of :mod:`ppsim.validate.host` times a pure-Python loop. On this project's 2-vCPU VM
the engine's compute and that loop do not slow down together: one engine decode step timed for
1.5 s every 5 s for two minutes took 3.9 to 7.0 ms of CPU while the loop moved between 1.7 and
3.1 ms, and the loop's drift did not track the step-level error of validation runs. This probe
runs the engine's own stage code (:func:`engine.step.forward_step`: a first stage of ``tiny``'s
shape, 4 layers, a decode micro-batch of 4 requests at 134 tokens of context, random weights, one
torch thread) for ``duration_s`` and returns the mean thread CPU seconds per step. ``ppsim
calibrate`` records it beside the CPU probe (``meta.json`` ``host_stage_probe_s``) and ``validate``
reads it around every engine repeat. The stage is built once per process.
"""

from __future__ import annotations

import time
from typing import Any

PROBE_DURATION_S = 1.5
PROBE_LAYERS, PROBE_BATCH, PROBE_CTX, BLOCK = 4, 4, 134, 16
_built: dict[str, Any] = {}


def _stage() -> dict[str, Any]:
    if not _built:
        import torch

        from engine.kvcache import PagedKVCache
        from engine.model import build_stage, torch_dtype
        from engine.transport import StepItem
        from ppsim.models.shape import load_model

        s = load_model("tiny")
        dt = torch_dtype(s.dtype)
        per = -(-(PROBE_CTX + 1) // BLOCK)
        _built.update(
            model=build_stage(s, 0, PROBE_LAYERS, True, False, 0, dt),
            kv=PagedKVCache(PROBE_LAYERS, per * PROBE_BATCH, BLOCK, s.num_kv_heads, s.head_dim, dt, "cpu"),
            items=tuple(
                StepItem(i, PROBE_CTX, 1, True, tuple(range(i * per, (i + 1) * per))) for i in range(PROBE_BATCH)
            ),
            dev=torch.device("cpu"),
        )
    return _built


def stage_probe(duration_s: float = PROBE_DURATION_S) -> float:
    """Mean thread CPU seconds of one probe step over ``duration_s`` (one torch thread meanwhile)."""
    import torch

    from engine.step import forward_step

    st = _stage()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = lambda: forward_step(  # noqa: E731
            st["model"], st["kv"], st["items"], (0,) * PROBE_BATCH, None, None, BLOCK, st["dev"]
        )
        with torch.inference_mode():
            for _ in range(3):  # warm
                step()
            cpu, n, end = 0.0, 0, time.perf_counter() + duration_s
            while time.perf_counter() < end or n == 0:
                c0 = time.thread_time()
                step()
                cpu += time.thread_time() - c0
                n += 1
                time.sleep(0.002)  # the engine's steps come with gaps too
    finally:
        torch.set_num_threads(threads)
    return cpu / n
