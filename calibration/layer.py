"""A Llama decoder layer written as separately callable operators, mirroring the live engine.

Each operator does what ``engine/model.py`` and ``engine/kvcache.py`` run, so operator timings sum to
an engine forward: RMSNorm (the residual add is the separate ``add``) -> q/k/v projections (three
``nn.Linear``) -> RoPE computed from the positions on each call (HF rotate-half, q and k) -> paged KV:
``index_copy_`` of the step's K/V into a slot array, then per request ``index_select`` of its context
slots and ``F.scaled_dot_product_attention`` (GQA via ``enable_gqa``; a ``[n, ctx]`` causal mask
offset by the prefix when ``n > 1``) -> o_proj -> add + RMSNorm -> gate and up projections ->
SiLU(gate) * up -> down; in a mixture-of-experts model the MLP is the engine's own ``engine.moe.MoE``
(:mod:`calibration.moe_ops`), routed for real in whole-layer timings. The first stage embeds token
ids; the last normalises the sampled rows, runs lm_head on them and takes a greedy argmax. Input
preparation is ``engine/kvcache.py::build_batch``: positions, slots from block tables, per-request
context slots, sample rows. Shapes in comments; ``T`` = tokens in the step, ``S`` = KV slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibration.moe_ops import build_moe
from engine.kvcache import DecodeGroup, StepBatch, build_batch, paged_attention, set_attention_backends
from engine.transport import StepItem
from ppsim.models.shape import ModelShape

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BLOCK_SIZE = 16  # tokens per KV block (vLLM and ppsim default)


@dataclass(frozen=True)
class Seq:
    """One request's share of a step: ``n`` new tokens at positions [start, start + n)."""

    start: int
    n: int

    @property
    def is_prefill(self) -> bool:
        return self.n > 1 or self.start == 0


@dataclass
class KV:
    """A stage's paged K/V slot arrays for one layer and the step's addressing."""

    k: torch.Tensor  # [S, Hkv, D]
    v: torch.Tensor
    slots: torch.Tensor  # [T] slot of each new token
    segments: list[tuple[int, int, int, torch.Tensor]]  # (row offset, n, ctx, ctx slots [ctx])
    group: DecodeGroup | None = None  # CUDA: the decodes attended in one call


class Layer:
    """Random weights of one decoder layer (plus embedding / lm_head) for ``shape`` on ``device``."""

    def __init__(self, shape: ModelShape, dtype: str, device: str, seed: int = 0, router_zipf: float = 0.0) -> None:
        self.s, self.dt, self.dev = shape, TORCH_DTYPES[dtype], torch.device(device)
        set_attention_backends(self.dev)  # the engine's attention kernels
        g = torch.Generator(device=self.dev).manual_seed(seed)  # drawn where the layer lives (fast on a GPU)
        h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size

        def w(*dims: int) -> torch.Tensor:
            return (torch.randn(*dims, generator=g, device=self.dev) * 0.02).to(self.dt)

        self.w_q, self.w_k, self.w_v = w(q, h), w(kv, h), w(kv, h)  # nn.Linear layout [out, in]
        self.b_q, self.b_k, self.b_v = (w(q), w(kv), w(kv)) if shape.attention_bias else (None, None, None)
        self.w_o, self.w_g, self.w_u, self.w_d = w(h, q), w(i, h), w(i, h), w(h, i)
        self.ln1 = torch.ones(h, device=self.dev, dtype=self.dt)
        self.ln2 = torch.ones(h, device=self.dev, dtype=self.dt)
        self.emb, self.lm = w(shape.vocab_size, h), w(shape.vocab_size, h)
        self.router_zipf = router_zipf
        self.moe = build_moe(shape, router_zipf, seed, self.dt, self.dev) if shape.is_moe else None

    def sibling(self, seed: int) -> Layer:
        """Another layer of the same shape, dtype and device with its own weights."""
        name = next(k for k, v in TORCH_DTYPES.items() if v == self.dt)
        return Layer(self.s, name, str(self.dev), seed, self.router_zipf)

    def weight_bytes(self) -> int:
        ws = (self.w_q, self.w_k, self.w_v, self.w_o, self.w_g, self.w_u, self.w_d)
        moe = [] if self.moe is None else list(self.moe.parameters())
        return sum(w.numel() * w.element_size() for w in (*ws, *moe))

    # --- operators ---------------------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return w * (x.float() * torch.rsqrt(var + self.s.rms_norm_eps)).to(x.dtype)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s, T = self.s, x.shape[0]
        q = F.linear(x, self.w_q, self.b_q).view(T, s.num_heads, s.head_dim)
        k = F.linear(x, self.w_k, self.b_k).view(T, s.num_kv_heads, s.head_dim)
        return q, k, F.linear(x, self.w_v, self.b_v).view(T, s.num_kv_heads, s.head_dim)

    def _rope1(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        inv = 1.0 / (self.s.rope_theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        freqs = pos.to(torch.float32)[:, None] * inv[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        return x * cos + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1) * sin

    def rope(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rope1(q, pos), self._rope1(k, pos)

    @staticmethod
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KV) -> torch.Tensor:
        """The engine's own paged attention (``engine/kvcache.py``): the very code a stage runs."""
        return paged_attention(kv.k, kv.v, kv.slots, kv.segments, q, k, v, kv.group)  # [T, H, D]

    def o_proj(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a.reshape(a.shape[0], -1), self.w_o)

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(x, self.w_g), F.linear(x, self.w_u)  # [T, I] each

    @staticmethod
    def act(gu: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.silu(gu[0]) * gu[1]

    def down(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a, self.w_d)

    # --- whole layer and stage ends ---------------------------------------------------------
    def forward(
        self, x: torch.Tensor, res: torch.Tensor, pos: torch.Tensor, kv: KV
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer as ``engine/model.py::DecoderLayer.forward`` (fused add into the norms)."""
        res = x + res
        q, k, v = self.qkv(self.rms_norm(res, self.ln1))
        q, k = self.rope(q, k, pos)
        x = self.o_proj(self.attend(q, k, v, kv))
        res = x + res
        x = self.rms_norm(res, self.ln2)
        return (self.moe(x) if self.moe is not None else self.down(self.act(self.gate_up(x)))), res

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.emb)

    def lm_head(self, x_rows: torch.Tensor) -> torch.Tensor:
        return F.linear(x_rows, self.lm)  # [R, V]

    @staticmethod
    def sample(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def kv(self, seqs: list[Seq]) -> KV:
        """Slot arrays holding every request's context (blocks laid out request after request)."""
        s = self.s
        tables = block_tables(seqs)
        S = sum(len(t) for t in tables) * BLOCK_SIZE
        b = prepare_inputs(seqs, tables, self.dev)
        k = torch.randn(S, s.num_kv_heads, s.head_dim, device=self.dev).to(self.dt)
        v = torch.randn(S, s.num_kv_heads, s.head_dim, device=self.dev).to(self.dt)
        return KV(k, v, b.slots, b.segments, b.group)


def block_tables(seqs: list[Seq]) -> list[list[int]]:
    """Consecutive KV blocks per request, enough for its context."""
    tables, base = [], 0
    for sq in seqs:
        nb = -(-(sq.start + sq.n) // BLOCK_SIZE)
        tables.append(list(range(base, base + nb)))
        base += nb
    return tables


def step_items(seqs: list[Seq], tables: list[list[int]]) -> tuple[StepItem, ...]:
    """The plan items a stage would receive for ``seqs`` (every one sampling)."""
    return tuple(StepItem(i, q.start, q.n, True, tuple(t)) for i, (q, t) in enumerate(zip(seqs, tables, strict=True)))


def prepare_inputs(seqs: list[Seq], tables: list[list[int]], device: torch.device) -> StepBatch:
    """The engine's own ``build_batch`` (``engine/kvcache.py``) for ``seqs``: what a stage prepares per step."""
    return build_batch(step_items(seqs, tables), BLOCK_SIZE, device)
