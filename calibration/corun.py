"""What a stage's compute costs while another stage computes on the same host's cores (``stage_corun``).

The CPU engine's stages are processes on one host. With one micro-batch in flight they take turns;
with two or more in flight they compute at the same time, and each runs slower: on this project's
2-vCPU VM the held-out draws' PP=2 engine computes that overlapped another stage's compute ran a median
5.4% longer against the model than those of the same scenario, stage and token count that did not (91
pairs, docs/validation.md, "Stages computing at once"). A mean factor on every compute at PP > 1 cannot
show it: a light load has one micro-batch in flight and no overlap, a saturated one overlaps nearly always.

So calibration times it, paired and adjacent in time (the host's speed moves within seconds): a second
process runs middle-stage steps of the same model in a loop and is stopped (SIGSTOP) and continued
(SIGCONT) between samples, while this process times its own middle-stage steps on its thread clock,
alternating "with" and "alone" in mirrored order each round. What two busy vCPUs cost each other moves
within minutes on this VM, so one reading is a snapshot: calibration keeps the other stage's process
(:class:`CoRunner`) stopped through its whole timing and takes a one-round reading at the start of
every round of the operator grid and one after the live engine's runs. ``stage_corun`` is, per reading,
the median over plans of (median with) / (median alone), and the mean over the readings
(:func:`calibration.live_fits.fit_corun`); the pipelines multiply every compute of a
micro-batch that starts on the first stage while an earlier one is still in the pipeline by it
(:mod:`ppsim.sim.fast`). CPU only: a GPU's stages each have their own device.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from typing import Any

import numpy as np

from ppsim.errors import PPSimError
from ppsim.models.shape import ModelShape

PLANS = ("D1x128", "D8x128", "P64@0")  # a GEMV-bound decode, a batched decode, a prefill
LOAD_PLAN = "D8x128"  # what the other stage computes meanwhile
SETTLE_S = 0.02  # after a stop or continue, before the next sample
READY_TIMEOUT_S = 120.0


def _co_runner(shape: ModelShape, dtype: str, stack: int, ready: Any) -> None:
    """The other stage: middle-stage steps of the same model, back to back, until killed (or its parent dies:
    stopped between readings, it would otherwise outlive a calibration ended by a signal)."""
    from engine.lifetime import die_with_parent

    die_with_parent()
    import torch

    from calibration.layer import TORCH_DTYPES
    from calibration.profile_ops import parse_plan
    from calibration.stage_step import EngineStages

    torch.set_num_threads(1)
    stages = EngineStages(shape, TORCH_DTYPES[dtype], torch.device("cpu"), stack, seed=1)
    step = stages.step_fn("stage_mid", parse_plan(LOAD_PLAN, np.random.default_rng(1)))
    with torch.inference_mode():
        step()
        ready.set()
        while True:
            step()


def _sample(step: Any, calls: int) -> float:
    t0 = time.thread_time()
    for _ in range(calls):
        step()
    return (time.thread_time() - t0) / calls


class CoRunner:
    """The other stage, spawned once and stopped (SIGSTOP) between readings, so that a calibration can
    take its co-run readings spread over its whole timing (the host's co-running cost moves within
    minutes: one calibration read 1.455 and the same reading a quarter of an hour later 1.04-1.06,
    docs/validation.md) instead of one snapshot. A context manager: the process is killed on exit."""

    def __init__(self, stages: Any, shape: ModelShape, dtype: str) -> None:
        self.stages, self.shape, self.dtype = stages, shape, dtype
        self.proc: Any = None
        self.steps: dict[str, Any] = {}
        self.readings = 0

    def __enter__(self) -> CoRunner:
        import torch
        import torch.multiprocessing as mp

        from calibration.profile_ops import parse_plan

        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        layers = self.stages.layers("stage_mid")
        self.proc = ctx.Process(target=_co_runner, args=(self.shape, self.dtype, layers, ready), daemon=True)
        self.proc.start()
        try:
            t0 = time.monotonic()
            while not ready.wait(0.2):
                if not self.proc.is_alive() or time.monotonic() - t0 > READY_TIMEOUT_S:
                    why = f"exited with status {self.proc.exitcode}" if not self.proc.is_alive() else "is not ready"
                    raise PPSimError(
                        f"calibrate: the co-running stage process {why} after {time.monotonic() - t0:.0f} s; "
                        "check that torch runs in a subprocess here (the live engine needs it too)"
                    )
            os.kill(self.proc.pid, signal.SIGSTOP)
            rng = np.random.default_rng(0)
            self.steps = {p: self.stages.step_fn("stage_mid", parse_plan(p, rng)) for p in PLANS}
            with torch.inference_mode():
                for step in self.steps.values():
                    step()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process takes its SIGKILL as well, but be plain
            proc.kill()
        proc.join(10.0)

    def reading(self, rounds: int, calls: int = 2) -> list[dict[str, Any]]:
        """Rows (op ``stage_corun``, split ``corun``, ``reading`` numbering this runner's readings), one per
        plan: ``median_s`` with the other stage computing, ``alone_s`` without, over ``rounds`` mirrored
        rounds of two samples each way; the other stage is stopped again at the end."""
        import torch

        if self.proc is None:
            raise RuntimeError("CoRunner.reading outside its with block")
        got: dict[tuple[str, bool], list[float]] = {}
        try:
            with torch.inference_mode():
                for r in range(rounds):
                    order = (True, False, False, True) if r % 2 == 0 else (False, True, True, False)
                    for co in order:
                        os.kill(self.proc.pid, signal.SIGCONT if co else signal.SIGSTOP)
                        time.sleep(SETTLE_S)
                        for p, step in self.steps.items():
                            got.setdefault((p, co), []).append(_sample(step, calls))
        finally:
            os.kill(self.proc.pid, signal.SIGSTOP)
        self.readings += 1
        return [
            {
                "op": "stage_corun",
                "split": "corun",
                "plan": p,
                "reading": self.readings - 1,
                "median_s": statistics.median(got[(p, True)]),
                "alone_s": statistics.median(got[(p, False)]),
                "repeats": len(got[(p, True)]),
                "inner": calls,
            }
            for p in PLANS
        ]


def profile_corun(stages: Any, shape: ModelShape, dtype: str, rounds: int, calls: int = 2) -> list[dict[str, Any]]:
    """One co-run reading (:meth:`CoRunner.reading`) with its own other-stage process."""
    with CoRunner(stages, shape, dtype) as co:
        return co.reading(rounds, calls)
