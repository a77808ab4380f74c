"""The host's speed *during* an engine run, at about 1.5% of one core: a sampler process.

Every reading of the host taken before a run (the CPU probe, the engine-step probe, a co-run reading,
the stage steps alone) failed to predict the run's step level on this project's 2-vCPU VM
(docs/validation.md, "A step's class, a reading before each run..."): a vCPU's speed flips within
seconds, so a reading outside the run samples other seconds than the run. This one samples the run's
own seconds: a process beside the engine that waits ``period_s``, then times one fixed matmul (4 rows
through the model's MLP up-projection, ``hidden_size`` x ``intermediate_size`` random fp32 weights,
numpy on one BLAS thread, a few ms of one core for ``dense-1024``) on its thread clock, until stopped.
Its mean over a run says how fast the host's cores ran meanwhile; it costs the engine about one sample
per ``period_s``.

It is a fresh interpreter (``python -m engine.host_sampler``) importing numpy alone, so it starts in
about half a second (a spawned torch process took 5 s, once per engine repeat): it says ``ready`` on
stdout, samples until its stdin is closed (or at EOF, when its parent dies: it never outlives it), then
writes its samples to stdout, each with its start on ``time.monotonic`` (one clock for every process of
the host), so that a window of the run (calibration's live runs and their steps timed alone) can be
read apart (:func:`window_mean`). ``SAMPLER_KIND`` names the work it times: a profile's ``meta.json``
``host_sampler_s`` is its reference only when ``host_sampler`` there names the same kind.

It also sees the engine's own load (its memory traffic, its processes on the other vCPU), so it is a
reading of the host *with* the engine on it, not of the neighbours alone. ``ppsim calibrate`` runs it
through the whole timing of a CPU calibration (``meta.json`` ``host_sampler_s``, the host's speed
while the profile was measured), ``ppsim validate`` through every engine repeat (``validation.json``
``host.sampler_s``): their ratio gives the host-conditioned prediction (docs/validation.md).
``experiments/validation/host_drift.py --sampler`` correlates it with each run's step level.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError

PERIOD_S = 0.25
ROWS = 4
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SAMPLER_KIND = "numpy-mm-4xHxI-fp32"  # what one sample times (a reference of another kind is not read)
ONE_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def sample_loop(hidden: int, inter: int, period_s: float, stdin: Any = sys.stdin, stdout: Any = sys.stdout) -> None:
    """The sampler's own process: ``ready``, then one timed matmul per ``period_s`` until ``stdin`` is
    readable (closed or written), then the samples, one per line."""
    import numpy as np

    rng = np.random.default_rng(2)
    w = rng.standard_normal((hidden, inter), dtype=np.float32)
    x = rng.standard_normal((ROWS, hidden), dtype=np.float32)
    for _ in range(3):
        x @ w
    print("ready", file=stdout, flush=True)
    out: list[str] = []
    while not select.select([stdin], [], [], period_s)[0]:
        t, c0 = time.monotonic(), time.thread_time()
        x @ w
        out.append(f"{t!r} {time.thread_time() - c0!r}\n")
    stdout.write("".join(out))
    stdout.flush()


def samples_of(text: str) -> list[tuple[float, float]]:
    """(monotonic start, thread CPU seconds) per sample of a sampler's output; a line of one number
    (an older file) has no time (nan)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if f:
            out.append((float(f[0]) if len(f) > 1 else float("nan"), float(f[-1])))
    return out


def sample_stats(text: str) -> dict[str, float]:
    """Mean and median thread CPU seconds per sample, and the count, of a sampler's file."""
    cpu = [c for _, c in samples_of(text)]
    if not cpu:
        return {"n": 0, "mean_s": float("nan"), "median_s": float("nan")}
    return {"n": len(cpu), "mean_s": statistics.fmean(cpu), "median_s": statistics.median(cpu)}


def window_mean(samples: list[tuple[float, float]], t0: float, t1: float, min_n: int = 2) -> float | None:
    """The mean sample started within [t0, t1] (``time.monotonic`` seconds, the same clock in every
    process of the host); None with fewer than ``min_n`` there."""
    cpu = [c for t, c in samples if t0 <= t <= t1]
    return statistics.fmean(cpu) if len(cpu) >= min_n else None


class HostSampler:
    """``with HostSampler(hidden, inter) as s: run()`` then ``s.stats()``; ``path``: the samples are
    also written there, one per line."""

    def __init__(self, hidden: int, inter: int, path: Path | None = None, period_s: float = PERIOD_S) -> None:
        self.args = [str(hidden), str(inter), "--period-s", repr(period_s)]
        self.path = Path(path) if path is not None else None
        self.proc: subprocess.Popen[str] | None = None
        self.text: str | None = None

    def __enter__(self) -> HostSampler:
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.host_sampler", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        ready = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)[0]
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self._kill()
            err = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()
            why = err[-1] if err else f"no answer in {READY_TIMEOUT_S:.0f} s"
            raise PPSimError(f"host sampler: did not start ({why}); check that numpy imports in a subprocess")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        try:
            self.text, _ = self.proc.communicate(input="stop\n", timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill()
        if self.path is not None and self.text is not None:
            self.path.write_text(self.text)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def stats(self) -> dict[str, float]:
        return sample_stats(self._text())

    def samples(self) -> list[tuple[float, float]]:
        """(monotonic start, thread CPU seconds) per sample."""
        return samples_of(self._text())

    def _text(self) -> str:
        if self.text is None:
            raise PPSimError("host sampler: it wrote no samples (stopped before it was read?)")
        return self.text


def model_sampler(shape: Any) -> HostSampler:
    """The sampler of ``shape``'s MLP up-projection (what calibrate and validate both run)."""
    return HostSampler(shape.hidden_size, shape.intermediate_size)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.host_sampler", description=__doc__.splitlines()[0])
    ap.add_argument("hidden", type=int)
    ap.add_argument("inter", type=int)
    ap.add_argument("--period-s", type=float, default=PERIOD_S)
    a = ap.parse_args(argv)
    sample_loop(a.hidden, a.inter, a.period_s)


if __name__ == "__main__":
    main()
