"""The operator profiler: a grid of shapes, one timed closure per (operator, shape).

Each task builds its inputs once, then :class:`calibration.timer.Timer` times the operator of
:class:`calibration.layer.Layer` on them. Token operators run over ``tokens``; prefill attention
over (chunk, prefix); decode attention over (batch, per-request contexts, ragged where the task
says so); ``lm_head`` and ``sampling`` over requests; ``prepare_inputs`` over requests; ``layer``
times a whole decoder-layer forward of a mixed step to measure the gap between the sum of operators
and the real layer; a mixture-of-experts model adds the MoE operators of :mod:`calibration.moe_ops`
(router and shared experts over tokens, grouped experts over (pairs, distinct experts)). ``split``
marks samples used for fitting ("fit"), for the stage glue fits ("stage") and for the held-out
check ("heldout"), which never enter a fit.

Operators with weights (:data:`STACKED_OPS`, ``lm_head``, the MoE operators) and attention (each
layer its own KV) run on every layer of the profiler's stack in turn and report the time per
layer: an engine stage reads each layer's weights once per step, so by the next step the caches
have lost them. Timed on one layer over and over, the GEMMs ran from the CPU's caches: a 256 x 704
projection of one token (tiny) took 19 us there against 88 us cycling through distinct weights,
1024 x 2816 (dense-1024) 225 against 684 us; at 64 tokens, compute-bound, 4.4 against 4.7 ms (2-vCPU
EPYC, one thread, ``benchmarks/bench_gemm_cache.py``). The stage glue, linear in tokens and
requests, could not absorb a gap that large at one token and gone at a hundred: dense-1024's decode
steps of few requests came out 5-34% short on held-out runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from calibration.layer import BLOCK_SIZE, Layer, Seq, block_tables, step_items
from calibration.moe_ops import experts_fn, experts_points, moe_fns
from calibration.stage_step import EngineStages
from calibration.timer import Timer, summarize
from engine.kvcache import build_batch
from ppsim.cost.profiled import REQ_OPS
from ppsim.cost.profiled import TOKEN_OPS as LAYER_TOKEN_OPS

TOKEN_OPS = (*LAYER_TOKEN_OPS, "embedding")  # timed per token
STACKED_OPS = ("attn_qkv", "attn_o_proj", "mlp_gate_up", "mlp_down")  # token operators that read weights


def _in_turn(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """One call runs every function once, in order (one operator on each layer of a stack)."""
    return lambda: [f() for f in fns]


@dataclass(frozen=True)
class Grid:
    tokens: tuple[int, ...]
    prefill: tuple[tuple[int, int], ...]  # (chunk, prefix)
    decode: tuple[tuple[int, int], ...]  # (batch, context per request)
    reqs: tuple[int, ...]
    layer_plans: tuple[str, ...]  # plan specs, see parse_plan
    heldout_tokens: tuple[int, ...]
    heldout_prefill: tuple[tuple[int, int], ...]
    heldout_decode: tuple[tuple[int, int], ...]
    heldout_plans: tuple[str, ...]


def _prod(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((x, y) for x in a for y in b)


# Plan spec: "+"-joined items; "P<chunk>@<prefix>" a prefill chunk ("P<chunk>@<prefix>x<n>": n such chunks, each
# its own request), "D<batch>x<ctx>" that many decodes with contexts spread ragged over [ctx/2, 3ctx/2]. Held-out
# points sit between grid points. The stage plans of many prefill items (``P16@0x32``, ``P128@0x4``) are MoE B = 32's
# prefill micro-batches: one item of 512 tokens costs more beyond its operators than 32 of 16 (docs/validation.md,
# part 22), which plans of one item each could not tell apart from a cost per token.
# Every token count up to 16 (decode steps of few requests): a CPU GEMM handles rows in blocks of 4
# and the rest on a slower path, so 3 rows cost more than 4 (1024 x 2816 on the project's VM, cycling
# weights: 1.64 ms at 3 rows, 1.20 ms at 4), which no interpolation between powers of two shows.
FULL = Grid(
    tokens=(*range(1, 17), 20, 24, 28, 32, 64, 128, 256, 512, 1024),
    prefill=_prod((8, 32, 128, 256, 512), (0, 128, 512, 1536)),
    decode=_prod((1, 4, 16, 32, 64), (16, 128, 512, 1536)),
    reqs=(1, 4, 16, 64, 256),
    layer_plans=(
        "D1x256",
        "D4x128",
        "D8x256",
        "D16x512",
        "D64x256",
        "P64@0",
        "P256@0",
        "P128@512",
        "P256@0+D16x256",
        "P32@128+D32x512",
        "P512@0",
        "P16@0x32",
        "P128@0x4",
    ),
    heldout_tokens=(23, 48, 384, 768),
    heldout_prefill=((96, 384), (384, 64), (24, 1024)),
    heldout_decode=((8, 384), (48, 96), (24, 1024)),
    heldout_plans=("D8x384", "D48x128", "P96@0", "P384@256", "P128@0+D24x384", "P64@64+D8x1024", "P32@0x8"),
)
QUICK = Grid(
    tokens=(1, 2, 3, 4, 8, 32, 128, 512),
    prefill=_prod((16, 128, 512), (0, 512)),
    decode=_prod((1, 8, 32), (32, 512)),
    reqs=(1, 16, 64),
    layer_plans=("D1x256", "D4x128", "D32x256", "P128@0", "P256@256+D8x256", "P64@0+D16x128"),
    heldout_tokens=(48, 256),
    heldout_prefill=((64, 256),),
    heldout_decode=((16, 128),),
    heldout_plans=("D16x384", "P96@0+D8x128"),
)


# A middle-stage step after an idle gap (seconds) against the back-to-back step just before it, in
# pairs (:meth:`calibration.stage_step.EngineStages.idle_penalty_fn`): the ``stage_idle`` fit.
IDLE_PLANS = ("D1x128", "D4x128", "P64@0")
IDLE_GAPS_S = (0.001, 0.003, 0.01, 0.03, 0.1)
IDLE_SAMPLES = 6  # paired samples per plan, gap and round: one step's difference is noisy, the steps are short


def parse_plan(spec: str, rng: np.random.Generator) -> list[Seq]:
    """A plan spec -> requests (see the grid comment); ragged decode contexts from ``rng``."""
    seqs: list[Seq] = []
    for part in spec.split("+"):
        if part[0] == "P":
            c, p = part[1:].split("@")
            p, _, n = p.partition("x")
            seqs += [Seq(int(p), int(c)) for _ in range(int(n or 1))]
        elif part[0] == "D":
            b, ctx = (int(v) for v in part[1:].split("x"))
            for L in rng.integers(max(2, ctx // 2), ctx + ctx // 2 + 1, size=b):
                seqs.append(Seq(int(L) - 1, 1))
        else:
            raise ValueError(f"bad plan spec {spec!r}")
    return seqs


def plan_features(seqs: list[Seq]) -> dict[str, Any]:
    dec = [s for s in seqs if not s.is_prefill]
    return {
        "tokens": sum(s.n for s in seqs),
        "reqs": len(seqs),
        "batch": len(dec),
        "ctx_tokens": sum(s.start + 1 for s in dec),
    }


@dataclass
class Task:
    op: str
    split: str
    feats: dict[str, Any]
    make: Callable[[], Callable[[], object]]
    plan: str = ""
    seqs: list[Seq] = field(default_factory=list)
    paired: bool = False  # ``make()`` returns a function that measures one sample itself (seconds)
    layers: int = 1  # ``make()``'s function runs the operator on this many distinct layers in turn


class OpProfiler:
    """Times operators on ``layer`` and whole engine stages of ``stack`` distinct layers.

    A stage runs its layers back to back, each with its own weights, so the caches hold none of the
    next layer's weights; timing one layer over and over would find them warm. Stage samples therefore
    run ``stack`` layers (as many as fit ``STACK_BYTES``), as do the MoE operators.
    """

    def __init__(self, layer: Layer, timer: Timer, seed: int = 0, stack: int = 1) -> None:
        self.L, self.timer, self.rng = layer, timer, np.random.default_rng(seed)
        self.dev = layer.dev
        self.stack = [layer] + [layer.sibling(seed + 1 + i) for i in range(stack - 1)]
        self.stages = EngineStages(layer.s, layer.dt, layer.dev, stack, seed, layer.router_zipf)

    def _x(self, *dims: int) -> torch.Tensor:
        return torch.randn(*dims, device=self.dev).to(self.L.dt)

    def token_fn(self, op: str, T: int) -> Callable[[], object]:
        if op in STACKED_OPS:
            return _in_turn([self._layer_token_fn(layer, op, T) for layer in self.stack])
        return self._layer_token_fn(self.L, op, T)

    def _layer_token_fn(self, L: Layer, op: str, T: int) -> Callable[[], object]:
        s = L.s
        x = self._x(T, s.hidden_size)
        pos = torch.arange(T, device=self.dev) % 4096
        fns: dict[str, Callable[[], Callable[[], object]]] = {
            "input_layernorm": lambda: lambda: L.rms_norm(x, L.ln1),
            "post_attention_layernorm": lambda: lambda: L.rms_norm(x, L.ln2),
            "attn_qkv": lambda: lambda: L.qkv(x),
            "attn_o_proj": lambda: (lambda a: lambda: L.o_proj(a))(self._x(T, s.num_heads, s.head_dim)),
            "mlp_gate_up": lambda: lambda: L.gate_up(x),
            "mlp_act": lambda: (lambda gu: lambda: L.act(gu))(
                (self._x(T, s.intermediate_size), self._x(T, s.intermediate_size))
            ),
            "mlp_down": lambda: (lambda a: lambda: L.down(a))(self._x(T, s.intermediate_size)),
            "add": lambda: (lambda y: lambda: x + y)(self._x(T, s.hidden_size)),
            "embedding": lambda: (lambda ids: lambda: L.embed(ids))(
                torch.randint(0, s.vocab_size, (T,), device=self.dev)
            ),
            "attn_rope": lambda: (lambda q, k: lambda: L.rope(q, k, pos))(
                self._x(T, s.num_heads, s.head_dim), self._x(T, s.num_kv_heads, s.head_dim)
            ),
        }
        return fns[op]()

    def req_fn(self, op: str, R: int) -> Callable[[], object]:
        L, s = self.L, self.L.s
        x = self._x(R, s.hidden_size)
        if op == "final_norm":
            return lambda: L.rms_norm(x, L.ln1)
        if op == "lm_head":  # after a stage's layers streamed through the caches: cold, as STACKED_OPS
            return _in_turn([lambda layer=layer: layer.lm_head(x) for layer in self.stack])
        if op == "sampling":
            logits = self._x(R, s.vocab_size)
            return lambda: L.sample(logits)
        seqs = [Seq(100 + i, 1) for i in range(R)]
        tables = block_tables(seqs)
        items = step_items(seqs, tables)  # as a stage receives them
        return lambda: build_batch(items, BLOCK_SIZE, self.dev)

    def attn_fn(self, seqs: list[Seq]) -> Callable[[], object]:
        s, T = self.L.s, sum(sq.n for sq in seqs)
        q = self._x(T, s.num_heads, s.head_dim)
        k, v = self._x(T, s.num_kv_heads, s.head_dim), self._x(T, s.num_kv_heads, s.head_dim)
        kvs = [layer.kv(seqs) for layer in self.stack]  # each layer its own KV, as in a stage's cache
        return _in_turn([lambda kv=kv: self.L.attend(q, k, v, kv) for kv in kvs])

    # --- the task list -----------------------------------------------------------------------
    def tasks(self, g: Grid) -> list[Task]:
        out: list[Task] = []
        for split, toks, pre, dec, plans in (
            ("fit", g.tokens, g.prefill, g.decode, ()),
            ("heldout", g.heldout_tokens, g.heldout_prefill, g.heldout_decode, g.heldout_plans),
        ):
            for op in TOKEN_OPS:
                n = len(self.stack) if op in STACKED_OPS else 1
                for T in toks:
                    out.append(Task(op, split, {"tokens": T}, lambda op=op, T=T: self.token_fn(op, T), layers=n))
            for c, p in pre:
                seqs = [Seq(p, c)]
                out.append(
                    Task(
                        "attn_prefill",
                        split,
                        {"chunk": c, "prefix": p, "tokens": c},
                        lambda seqs=seqs: self.attn_fn(seqs),
                        layers=len(self.stack),
                    )
                )
            for b, ctx in dec:
                seqs = parse_plan(f"D{b}x{ctx}", self.rng) if split == "heldout" else [Seq(ctx - 1, 1)] * b
                attn = lambda seqs=seqs: self.attn_fn(seqs)  # noqa: E731
                out.append(Task("attn_decode", split, plan_features(seqs), attn, layers=len(self.stack)))
            for spec in plans:  # held-out: whole-model stages (PP=1), predicted from every fit
                out.append(self._stage_task("stage_full", spec, split))
            out += self.moe_tasks(split, toks)
        for op in REQ_OPS:
            n = len(self.stack) if op == "lm_head" else 1
            for R in g.reqs:
                out.append(Task(op, "fit", {"reqs": R}, lambda op=op, R=R: self.req_fn(op, R), layers=n))
        for spec in g.layer_plans:
            out.extend(self._stage_task(kind, spec, "stage") for kind in ("stage_first", "stage_mid", "stage_last"))
        if self.timer.clock == "thread":  # idle gaps cost nothing on this clock; the step after them does
            out.extend(self._idle_task(spec, gap) for spec in IDLE_PLANS for gap in IDLE_GAPS_S)
        return out

    def _idle_task(self, spec: str, gap_s: float) -> Task:
        seqs = parse_plan(spec, self.rng)
        st = self.stages
        feats = {**plan_features(seqs), "layers": st.layers("stage_mid"), "start_layer": st.start, "gap_s": gap_s}
        make = lambda: st.idle_penalty_fn(seqs, gap_s)  # noqa: E731
        return Task("stage_idle", "idle_paired", feats, make, plan=spec, seqs=seqs, paired=True)

    def _paired_samples(self, sample: Callable[[], float]) -> list[float]:
        """``IDLE_SAMPLES`` samples of a self-timing task, after one discarded (first-use allocations)."""
        sample()
        return [sample() for _ in range(IDLE_SAMPLES)]

    def moe_tasks(self, split: str, tokens: tuple[int, ...]) -> list[Task]:
        """The MoE operators over ``tokens`` (none for a dense model), each run on every layer of the
        stack in turn: a stage reads each layer's experts once per step, so their weights are not in
        cache the way they are when one layer's operator repeats."""
        if self.L.moe is None:
            return []
        h = self.L.s.hidden_size
        moes = [layer.moe for layer in self.stack]

        out = [
            Task(
                op,
                split,
                {"tokens": T},
                lambda op=op, T=T: _in_turn(
                    [moe_fns(m, x)[op] for m, x in zip(moes, [self._x(T, h)] * len(moes), strict=True)]
                ),
                layers=len(moes),
            )
            for op in moe_fns(moes[0], self._x(1, h))
            for T in tokens
        ]
        for pt in experts_points(self.L.s, tokens):
            out.append(
                Task(
                    "moe_experts",
                    split,
                    pt,
                    lambda pt=pt: _in_turn([experts_fn(m, self._x(pt["tokens"], h), pt["experts"]) for m in moes]),
                    layers=len(moes),
                )
            )
        return out

    def _stage_task(self, kind: str, spec: str, split: str) -> Task:
        seqs = parse_plan(spec, self.rng)
        st = self.stages
        feats = {**plan_features(seqs), "layers": st.layers(kind), "start_layer": st.start}
        return Task(kind, split, feats, lambda: st.step_fn(kind, seqs), plan=spec, seqs=seqs)

    def run(
        self, tasks: list[Task], progress: Callable[[int, int, Task], None], rounds: int = 1
    ) -> list[dict[str, Any]]:
        """Time every task ``rounds`` times, round-robin, so a burst of load on a shared machine hits one
        round of many tasks rather than every repeat of one; inputs are rebuilt each round."""
        raw: list[list[float]] = [[] for _ in tasks]
        inner = [1] * len(tasks)
        n = len(tasks) * rounds
        with torch.inference_mode():
            for r in range(rounds):
                for i, t in enumerate(tasks):
                    progress(r * len(tasks) + i, n, t)
                    if t.paired:
                        xs, inner[i] = self._paired_samples(t.make()), 1
                    else:
                        xs, inner[i] = self.timer.samples(t.make())
                    raw[i] += xs
        rows = []
        for t, xs, k in zip(tasks, raw, inner, strict=True):
            if t.layers > 1:  # a stack of layers ran; report per layer (stage steps: per step)
                xs = [x / t.layers for x in xs]
            tm = summarize(xs, k)
            rows.append(
                {
                    "op": t.op,
                    "split": t.split,
                    "plan": t.plan,
                    **t.feats,
                    "median_s": tm.median_s,
                    "mean_s": tm.mean_s,
                    "p10_s": tm.p10_s,
                    "p90_s": tm.p90_s,
                    "repeats": tm.repeats,
                    "inner": tm.inner,
                    "items": ";".join(f"{s.start}:{s.n}" for s in t.seqs),
                }
            )
        return rows
