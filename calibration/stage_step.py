"""Whole engine stage steps, timed on the live engine's own code (:func:`engine.step.forward_step`).

The operator timings of :mod:`calibration.profile_ops` run on :class:`calibration.layer.Layer`, a
functional copy of the layer. A stage process runs more: ``nn.Module`` calls, the paged KV cache's
attention closure, ``build_batch``, and at the ends the embedding module, the norm of the sampled
rows, lm_head, argmax and the tokens' copy to Python. Measured on a 2-vCPU EPYC VM (tiny model, 8
layers, decode 1-16 requests at context 134), the engine's layers alone were 4-10% slower than the
functional stack, and the stage ends 0.3-0.7 ms slower than the sum of their operators: a cost
model fitted to operators alone under-predicted a PP=1 engine step by 10-15% (issue 14).

A stage that waited for its micro-batch also computes it more slowly than one that runs back to back
(:meth:`EngineStages.idle_penalty_fn`): calibration times the middle stage after idle gaps of 1-100 ms
against the back-to-back step just before, in pairs (thread clock only), and fits ``stage_idle``, the
extra seconds per step as a function of the gap.

So calibration also times, on the same grid of plans, a middle stage of ``stack`` layers as the
engine builds it, and the first and last stage ends alone, and a whole-model stage (first and last:
PP=1) on the held-out plans. The fits in :mod:`calibration.calibrate` then take ``layer_glue`` from
the middle stage and ``first_glue`` / ``last_glue`` from the ends, so a stage's predicted time is
the engine's.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from calibration.layer import BLOCK_SIZE, Seq, block_tables, step_items
from calibration.samples import KINDS
from calibration.timer import Timer, summarize
from engine.kvcache import PagedKVCache
from engine.model import StageModel, build_stage
from engine.step import forward_step
from ppsim.models.shape import ModelShape


def layer_range(shape: ModelShape, stack: int) -> tuple[int, int]:
    """Global layers [start, end) of the timed stages: ``stack`` layers from the first of the model's
    heaviest kind (a MoE layer in a MoE model), as the operator profiles are of that kind."""
    start = next((i for i in range(shape.num_layers) if shape.layer_is_moe(i) == shape.is_moe), 0)
    start = max(0, min(start, shape.num_layers - stack))
    return start, start + stack


class EngineStages:
    """Engine stages as calibration times them: the middle and the whole-model stage over ``stack``
    layers (one set of weights, two views), and the two stage ends alone (no layers: the first
    stage's input preparation and embedding; the last stage's preparation, norm of the sampled rows,
    lm_head, argmax and copy to Python), which are timed apart because as the difference of two
    ``stack``-layer stages they would carry the noise of all those layers."""

    def __init__(
        self,
        shape: ModelShape,
        dtype: torch.dtype,
        device: torch.device,
        stack: int,
        seed: int = 0,
        router_zipf: float = 0.0,
    ) -> None:
        self.s, self.dt, self.dev = shape, dtype, device
        self.seed, self.router_zipf = seed, router_zipf
        self._layouts: dict[tuple[int, int, bool, bool], StageModel] = {}  # live runs' stages (layout_step_fn)
        self.start, self.end = layer_range(shape, stack)
        full = build_stage(shape, self.start, self.end, True, True, seed, dtype, device, router_zipf)
        ends = build_stage(shape, self.start, self.start, True, True, seed, dtype, device, router_zipf)
        self.models: dict[str, StageModel] = {}
        for kind, (first, last) in KINDS.items():
            view = copy.copy(ends if kind in ("stage_first", "stage_last") else full)  # shares modules and weights
            view.is_first, view.is_last = first, last
            self.models[kind] = view

    def layers(self, kind: str) -> int:
        return self.models[kind].num_layers

    def step_fn(self, kind: str, seqs: list[Seq]) -> Callable[[], object]:
        """One micro-batch of ``seqs`` through the ``kind`` stage, exactly as ``Stage.compute`` runs it."""
        return self._step(self.models[kind], seqs)

    def layout_step_fn(self, start: int, end: int, first: bool, last: bool, seqs: list[Seq]) -> Callable[[], object]:
        """:meth:`step_fn` on a stage of global layers [start, end) with these ends, as a live engine run
        built it (same seed: the same weights), built once per layout."""
        key = (start, end, first, last)
        m = self._layouts.get(key)
        if m is None:
            m = build_stage(self.s, start, end, first, last, self.seed, self.dt, self.dev, self.router_zipf)
            m = self._layouts[key] = m
        return self._step(m, seqs)

    def _step(self, m: StageModel, seqs: list[Seq]) -> Callable[[], object]:
        s = self.s
        tables = block_tables(seqs)
        nb = sum(map(len, tables))
        kv = PagedKVCache(m.num_layers, nb, BLOCK_SIZE, s.num_kv_heads, s.head_dim, self.dt, self.dev)
        items = step_items(seqs, tables)
        T = sum(q.n for q in seqs)
        ids = tuple(int(x) for x in torch.randint(0, s.vocab_size, (T,))) if m.is_first else None
        x = None if m.is_first else torch.randn(T, s.hidden_size, device=self.dev).to(self.dt)
        res = None if m.is_first else torch.randn(T, s.hidden_size, device=self.dev).to(self.dt)
        return lambda: forward_step(m, kv, items, ids, x, res, BLOCK_SIZE, self.dev)

    def idle_penalty_fn(self, seqs: list[Seq], gap_s: float) -> Callable[[], float]:
        """One paired sample: the thread CPU seconds of a middle-stage step after ``gap_s`` idle, as a
        stage waits for its next micro-batch, minus those of the back-to-back step just before it.

        The sleep itself costs nothing on this clock: what grows with the gap is the step after it,
        whose weights and KV the caches lost while the core idled (on a VM, to a neighbour). Paired
        and adjacent in time, so the host's drift between samples cancels; separately timed
        back-to-back and idle tasks did not (one slow back-to-back sample made the fitted penalty
        zero). Four layers of the tiny model on this project's 2-vCPU VM, medians of six rounds:
        +0.3-0.5 ms after 1 ms idle for decodes of 1-4 requests, +0.5-0.7 ms after 3 ms and
        +0.9-1.4 ms after 10 ms for every plan (decodes of 1-16, a 64-token prefill), on steps of
        2.7-8.6 ms."""
        step = self.step_fn("stage_mid", seqs)

        def run() -> float:
            step()  # the reference runs back to back, after a step as the next one does
            t0 = time.thread_time()
            step()
            hot = time.thread_time() - t0
            time.sleep(gap_s)
            t0 = time.thread_time()
            step()
            return time.thread_time() - t0 - hot

        return run


def time_live_alone(stages: EngineStages, timer: Timer, rows: list[dict], every: int = 3) -> None:
    """Time every ``every``-th live-engine stage compute (``calibration.core_path.live_steps`` rows) again
    in a hot loop, on the same stage layout and plan, and set its ``alone_s`` (the timer's mean, or
    median on a wall clock): ``live_fits.fit_live`` compares the two. Called right after each live
    run, on that run's rows, so that both see the host in the same state."""
    with torch.inference_mode():
        for r in [r for r in rows if str(r.get("split", "")).startswith("live") and "items" in r][::every]:
            first, last = KINDS[r["op"]]
            seqs = [Seq(*(int(v) for v in part.split(":"))) for part in r["items"].split(";")]
            start = int(r["start_layer"])
            xs, inner = timer.samples(stages.layout_step_fn(start, start + int(r["layers"]), first, last, seqs))
            t = summarize(xs, inner)
            r["alone_s"] = t.mean_s if timer.clock == "thread" or timer.device == "cuda" else t.median_s
