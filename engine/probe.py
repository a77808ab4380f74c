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

:func:`model_probe` is the same reading at the validated model's own footprint: the whole model of
``shape`` as one stage (all its layers, the embedding and the lm_head, as the engine runs it at PP = 1)
on the same decode micro-batch. The fixed stage above holds 12 MB of weights and fits this VM's 32 MiB
L3 whatever the neighbours do; ``tiny``'s whole model (24 MB) sits at that cache's edge, and right after
its validation draws it ran 10-18% dearer than its profile while the fixed probe held (docs/validation.md,
"What is left out"). ``ppsim calibrate`` records it as ``host_model_probe_s`` with the name of what it
timed (``host_model_probe``, :func:`model_probe_kind`); ``validate`` reads it around every repeat of the
same model. A model past :data:`MODEL_PROBE_MAX_BYTES` of weights is not probed (a 70B model on a CPU
host): :func:`model_probe_fits` says which. :func:`model_price` is what the profile itself charges for
the probe's step (its stage model at PP = 1, the live level not charged: a step alone, as the probe runs
it): the probe over that price is the host's speed on this model against the profile's, with no single
calibration reading (which moves by 20% from one to the next on this VM) in between.
"""

from __future__ import annotations

import time
from typing import Any

PROBE_DURATION_S = 1.5
PROBE_LAYERS, PROBE_BATCH, PROBE_CTX, BLOCK = 4, 4, 134, 16
MODEL_PROBE_DURATION_S = 1.0
MODEL_PROBE_MAX_BYTES = 256 * 1024**2  # weights of the whole model beyond this: not probed
_models: dict[tuple[str, int, bool], Any] = {}  # one stage per (model, layers, last), whatever step it probes
_steps: dict[tuple[str, int, bool, int, int], dict[str, Any]] = {}


def _stage(s: Any, layers: int, last: bool, batch: int = PROBE_BATCH, ctx: int = PROBE_CTX) -> dict[str, Any]:
    """The first ``layers`` layers of ``s`` as a first stage (with the lm_head if ``last``), its KV cache and
    a decode micro-batch of ``batch`` requests at ``ctx`` tokens of context (one distinct token each); the
    stage built once per process, the same for every step probed on it."""
    import torch

    from engine.kvcache import PagedKVCache
    from engine.model import build_stage, torch_dtype
    from engine.transport import StepItem

    dt = torch_dtype(s.dtype)
    if (s.name, layers, last) not in _models:
        _models[(s.name, layers, last)] = build_stage(s, 0, layers, True, last, 0, dt)
    key = (s.name, layers, last, batch, ctx)
    if key not in _steps:
        for k in [k for k in _steps if k[3:] != (PROBE_BATCH, PROBE_CTX)]:  # one shaped step's KV kept at a time
            del _steps[k]
        per = -(-(ctx + 1) // BLOCK)
        _steps[key] = dict(
            model=_models[(s.name, layers, last)],
            kv=PagedKVCache(layers, per * batch, BLOCK, s.num_kv_heads, s.head_dim, dt, "cpu"),
            items=tuple(StepItem(i, ctx, 1, True, tuple(range(i * per, (i + 1) * per))) for i in range(batch)),
            # one distinct token per request: identical inputs would take one MoE route, k experts, where the
            # cost model prices the distinct experts B tokens touch (the first version fed token 0 to all four:
            # a MoE whole-model probe ran 13-25% under its profile's price while the engine's own steps ran over it)
            tokens=tuple(1 + i % max(1, s.vocab_size - 1) for i in range(batch)),
            dev=torch.device("cpu"),
        )
    return _steps[key]


def stage_probe(duration_s: float = PROBE_DURATION_S) -> float:
    """Mean thread CPU seconds of one probe step over ``duration_s`` (one torch thread meanwhile)."""
    from ppsim.models.shape import load_model

    return _timed(_stage(load_model("tiny"), PROBE_LAYERS, False), duration_s)


def model_probe_kind(s: Any) -> str:
    """What :func:`model_probe` times for ``s``: a calibration's reading is compared only with the same."""
    return f"{s.name}:whole:D{PROBE_BATCH}@{PROBE_CTX}"


def model_probe_fits(s: Any) -> bool:
    """Whether ``s``'s whole model is small enough to be probed (:data:`MODEL_PROBE_MAX_BYTES`)."""
    return s.total_weight_bytes() <= MODEL_PROBE_MAX_BYTES


def probe_plan(batch: int = PROBE_BATCH, ctx: int = PROBE_CTX) -> Any:
    """The probe's micro-batch as the cost model sees it: ``batch`` decodes at ``ctx`` of context."""
    from ppsim.policy.plan import PlanItem, make_plan

    return make_plan(0, [PlanItem(i, ctx, 1, False, True) for i in range(batch)])


def model_price(profile_dir: str, s: Any, batch: int = PROBE_BATCH, ctx: int = PROBE_CTX) -> float:
    """Seconds the profile in ``profile_dir`` charges for :func:`model_probe`'s step of ``s``."""
    from ppsim.cost.base import StageSpec
    from ppsim.cost.profiled import ProfiledCost, read_profile

    cost = ProfiledCost(read_profile(profile_dir), s, None, 1, pp=1)
    return cost.stage_time(StageSpec(0, 0, s.num_layers, True, True), probe_plan(batch, ctx))


def model_probe(
    s: Any, duration_s: float = MODEL_PROBE_DURATION_S, batch: int = PROBE_BATCH, ctx: int = PROBE_CTX
) -> float:
    """Mean thread CPU seconds of one whole-model decode step of ``s`` (PP = 1) of ``batch`` requests at
    ``ctx`` tokens of context over ``duration_s`` (by default the fixed step; the shaped probe of
    ``ppsim validate`` passes the predicted run's own decode step: ``ppsim.validate.run.shaped_step``)."""
    return _timed(_stage(s, s.num_layers, True, batch, ctx), duration_s)


def _timed(st: dict[str, Any], duration_s: float) -> float:
    import torch

    from engine.step import forward_step

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = lambda: forward_step(  # noqa: E731
            st["model"], st["kv"], st["items"], st["tokens"], None, None, BLOCK, st["dev"]
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
