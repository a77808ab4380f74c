"""The host's speed *during* an engine run, at about 1.5% of one core: a sampler process.

Every reading of the host taken before a run (the CPU probe, the engine-step probe, a co-run reading,
the stage steps alone) failed to predict the run's step level on this project's 2-vCPU VM
(docs/validation.md, "A step's class, a reading before each run..."): a vCPU's speed flips within
seconds, so a reading outside the run samples other seconds than the run. This one samples the run's
own seconds: a process beside the engine that sleeps ``period_s``, then times one fixed matmul (4 rows
through the model's MLP up-projection, ``hidden_size`` x ``intermediate_size`` random fp32 weights,
about 3.5 ms of one core for ``dense-1024``) on its thread clock, until stopped. Its mean over a run
says how fast the host's cores ran meanwhile; it costs the engine about one sample per ``period_s``.

It also sees the engine's own load (its memory traffic, its processes on the other vCPU), so it is a
reading of the host *with* the engine on it, not of the neighbours alone. ``ppsim calibrate`` runs it
through the whole timing of a CPU calibration (``meta.json`` ``host_sampler_s``, the host's speed
while the profile was measured), ``ppsim validate`` through every engine repeat (``validation.json``
``host.sampler_s``): their ratio gives the host-conditioned prediction (docs/validation.md).
``experiments/validation/host_drift.py --sampler`` correlates it with each run's step level.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError

PERIOD_S = 0.25
ROWS = 4
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def _sample_loop(hidden: int, inter: int, period_s: float, path: str, ready: Any, stop: Any) -> None:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(hidden, inter, generator=g)
    x = torch.randn(ROWS, hidden, generator=g)
    cpu: list[float] = []
    with torch.inference_mode():
        for _ in range(3):
            torch.mm(x, w)
        ready.set()
        while not stop.is_set():
            time.sleep(period_s)
            c0 = time.thread_time()
            torch.mm(x, w)
            cpu.append(time.thread_time() - c0)
    Path(path).write_text("".join(f"{c!r}\n" for c in cpu))


def sample_stats(text: str) -> dict[str, float]:
    """Mean and median thread CPU seconds per sample, and the count, of a sampler's file."""
    cpu = [float(v) for v in text.split()]
    if not cpu:
        return {"n": 0, "mean_s": float("nan"), "median_s": float("nan")}
    return {"n": len(cpu), "mean_s": statistics.fmean(cpu), "median_s": statistics.median(cpu)}


class HostSampler:
    """``with HostSampler(hidden, inter) as s: run()`` then ``s.stats()`` (samples in ``path``; default:
    a temporary file, removed by :meth:`stats`)."""

    def __init__(self, hidden: int, inter: int, path: Path | None = None, period_s: float = PERIOD_S) -> None:
        import tempfile

        import torch.multiprocessing as mp

        if path is None:
            fd, name = tempfile.mkstemp(prefix="ppsim-sampler-", suffix=".txt")
            os.close(fd)
            os.unlink(name)  # the sampler writes it when stopped: its absence means no samples
            path, self.temporary = Path(name), True
        else:
            self.temporary = False
        ctx = mp.get_context("spawn")
        self.ready, self.stop, self.path = ctx.Event(), ctx.Event(), Path(path)
        self.proc = ctx.Process(
            target=_sample_loop, args=(hidden, inter, period_s, str(path), self.ready, self.stop), daemon=True
        )

    def __enter__(self) -> HostSampler:
        self.proc.start()
        t0 = time.monotonic()
        while not self.ready.wait(0.2):
            if not self.proc.is_alive() or time.monotonic() - t0 > READY_TIMEOUT_S:
                self._kill()
                waited = time.monotonic() - t0
                raise PPSimError(f"host sampler: not ready after {waited:.0f} s; check that torch runs in a subprocess")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.proc.join(STOP_TIMEOUT_S)
        self._kill()

    def _kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)

    def stats(self) -> dict[str, float]:
        if not self.path.exists():
            raise PPSimError(f"host sampler: it wrote no samples to {self.path}")
        text = self.path.read_text()
        if self.temporary:
            self.path.unlink()
        return sample_stats(text)


def model_sampler(shape: Any) -> HostSampler:
    """The sampler of ``shape``'s MLP up-projection (what calibrate and validate both run)."""
    return HostSampler(shape.hidden_size, shape.intermediate_size)
