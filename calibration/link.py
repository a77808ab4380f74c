"""The link profiler: ping-pong between two spawned processes over torch.distributed.

Rank 0 sends a ``size``-byte tensor, rank 1 receives it and sends it back; one-way time is half the
round trip (the median over repeats). Backend gloo over TCP on this host (tensors on CPU); NCCL
when ``device == "cuda"`` and two GPUs exist (tensors on ``cuda:rank``, synchronised before the clock
stops). This is the path a stage-to-stage send takes in the live engine (``dist.send``/``recv`` of the
hidden states and residual). Every wait is bounded: process-group timeout, queue get and join.
"""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta
from typing import Any

import numpy as np

from ppsim.errors import PPSimError

WARMUP = 10  # round trips before timing (TCP buffers, first-use allocations)


def _worker(rank: int, port: int, sizes: list[int], repeats: int, backend: str, q: Any) -> None:
    import torch
    import torch.distributed as dist

    from engine.lifetime import die_with_parent

    die_with_parent()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    peer = 1 - rank
    bufs = [torch.zeros(size, dtype=torch.uint8, device=dev) for size in sizes]
    times: list[list[float]] = [[] for _ in sizes]
    try:
        for i in range(repeats + WARMUP):  # sizes interleaved: load bursts spread over all sizes
            for j, buf in enumerate(bufs):
                sync()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
                sync()
                if i >= WARMUP:
                    times[j].append((time.perf_counter() - t0) / 2)
        out = [
            (s, float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90)))
            for s, t in zip(sizes, times, strict=True)
        ]
        if rank == 0:
            q.put(out)
    finally:
        dist.destroy_process_group()


def profile_link(
    sizes: tuple[int, ...], repeats: int, device: str = "cpu", timeout_s: float = 120.0
) -> list[dict[str, Any]]:
    """One row per payload size: one-way send/recv seconds (median, p10, p90)."""
    import torch
    import torch.multiprocessing as mp

    from engine.launcher import free_port

    backend = "nccl" if device == "cuda" and torch.cuda.device_count() >= 2 else "gloo"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, port, list(sizes), repeats, backend, q), daemon=True) for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        res = q.get(timeout=timeout_s)
    except queue.Empty:
        msg = f"link profiler: no result within {timeout_s:.0f} s ({backend}); retry or use --no-link"
        raise PPSimError(msg) from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [
        {
            "op": "send_recv",
            "split": "fit",
            "bytes": s,
            "median_s": m,
            "p10_s": lo,
            "p90_s": hi,
            "repeats": repeats,
            "inner": 1,
            "backend": backend,
        }
        for s, m, lo, hi in res
    ]
