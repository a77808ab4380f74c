"""Paged KV cache of one stage, and the per-step attention metadata that addresses it.

The cache holds only this stage's layers: ``k[l]``/``v[l]`` are ``[num_blocks * block_size, Hkv, D]``
slot arrays; token ``p`` of a request lives in slot ``table[p // bs] * bs + p % bs``. Block tables
come from the engine core's :class:`ppsim.policy.kv.BlockPool` with every step (as vLLM's scheduler
sends ``block_ids`` in ``SchedulerOutput``), so the workers keep no per-request state: freeing a
request's blocks in the pool frees them on every stage. Stale writes by an aborted or preempted
request's in-flight step are harmless: stages run steps in order, and a request reads only slots
it has itself written in this or an earlier step.

One forward batches prefill chunks and decodes with ragged contexts: the GEMMs run over all T
tokens together; attention loops over the requests, each attending to its gathered context with
SDPA (causal within its chunk, offset by the cached prefix). On CUDA the decodes (one new token each)
attend in one batched SDPA call over their contexts padded to the longest (:class:`DecodeGroup`), as
a GPU engine's paged-attention kernel takes the whole batch: a loop of ~6 launches per request and
layer made a 16-request decode step of an 8B model launch-bound (3 ms of attention per layer on an
H200). On CPU the loop stays: there it costs no more than the batched call and is what the CPU
validation was measured on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.transport import StepItem

CUDNN_SDPA_ENV = "PPSIM_SDPA_CUDNN"  # "1": leave torch's cuDNN attention on (a diagnostic; see below)


def set_attention_backends(device: torch.device | str) -> bool:
    """Keep SDPA off cuDNN's attention on CUDA, for this process; whether cuDNN stays enabled.

    torch tries cuDNN first on Hopper and Blackwell with cuDNN > 9.15 (``sdp_utils.cpp``,
    ``priority_order``) for fp16/bf16 inputs, and cuDNN builds and plans a graph for every new shape
    (``MHA.cpp``, a thread-local cache keyed by shape): a grouped decode's padded context grows by one
    token a step, so each step of a first wave meets a new shape: a cost a GPU serving engine's
    paged-attention kernel never pays and the calibration's warmed timings never see, and the likely
    cause of the H200's slow first wave (docs/validation.md; not yet re-measured on a GPU). The
    flash, memory-efficient and math kernels need no per-shape plan. ``PPSIM_SDPA_CUDNN=1`` keeps
    torch's default, to show the difference. Called by each stage and by calibration (same kernels).
    """
    if torch.device(device).type != "cuda":
        return torch.backends.cuda.cudnn_sdp_enabled()
    keep = os.environ.get(CUDNN_SDPA_ENV, "") == "1"
    torch.backends.cuda.enable_cudnn_sdp(keep)
    return keep


@dataclass(frozen=True)
class DecodeGroup:
    """The decode requests of a step, attended together: rows of q, padded context slots, key mask."""

    rows: torch.Tensor  # [B] int64 query row of each decode request
    slots: torch.Tensor  # [B, L] int64 context slots, padded with slot 0 to the longest context L
    mask: torch.Tensor  # [B, 1, 1, L] bool: True where the key is in that request's context


def groups_decodes(items: tuple[StepItem, ...], device: torch.device | str, batched: bool | None = None) -> bool:
    """Whether a step's decodes attend as one group: two or more of them, and ``batched`` (default: on CUDA)."""
    wanted = torch.device(device).type == "cuda" if batched is None else batched
    return wanted and sum(it.num_tokens == 1 for it in items) >= 2


def decode_group(segments: list[tuple[int, int, int, torch.Tensor]], device: torch.device | str) -> DecodeGroup:
    """The step's decodes (``segments`` of one new token, their context slots on the host) as one
    :class:`DecodeGroup` on ``device``."""
    dev = torch.device(device)
    dec = [(off, ctx, cs) for off, n, ctx, cs in segments if n == 1]
    longest = max(ctx for _, ctx, _ in dec)
    slots = torch.zeros(len(dec), longest, dtype=torch.long)
    for i, (_, ctx, cs) in enumerate(dec):
        slots[i, :ctx] = cs
    ctxs = torch.tensor([ctx for _, ctx, _ in dec])
    mask = (torch.arange(longest)[None, :] < ctxs[:, None])[:, None, None, :]
    rows = torch.tensor([off for off, _, _ in dec], dtype=torch.long)
    return DecodeGroup(rows.to(dev), slots.to(dev), mask.to(dev))


@dataclass
class StepBatch:
    """Tensors for one micro-batch on one stage. T tokens in ``items`` order."""

    positions: torch.Tensor  # [T] int64 absolute positions
    slots: torch.Tensor  # [T] int64 KV slot of each new token
    segments: list[tuple[int, int, int, torch.Tensor]]  # (row offset, n, context length, ctx slots [ctx])
    # (a grouped decode's ctx slots stay on the host: only ``group`` carries them to the device)
    sample_rows: torch.Tensor  # [S] row of the last token of each sampling item
    sample_req_ids: list[int]
    group: DecodeGroup | None = None  # CUDA: the decodes attended in one call

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def build_batch(
    items: tuple[StepItem, ...], block_size: int, device: torch.device | str = "cpu", batched: bool | None = None
) -> StepBatch:
    """The step's tensors on ``device``; ``batched``: group the decodes (default: on CUDA)."""
    grouped = groups_decodes(items, device, batched)
    pos_parts, slot_parts, segments, rows, req_ids = [], [], [], [], []
    offset = 0
    for it in items:
        ctx = it.start + it.num_tokens
        table = torch.tensor(it.block_table, dtype=torch.long)
        ctx_slots = (table[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)[:ctx]
        if ctx_slots.shape[0] < ctx:
            raise ValueError(f"request {it.req_id}: block table holds {ctx_slots.shape[0]} tokens, needs {ctx}")
        pos_parts.append(torch.arange(it.start, ctx))
        slot_parts.append(ctx_slots[it.start :])
        in_group = grouped and it.num_tokens == 1
        segments.append((offset, it.num_tokens, ctx, ctx_slots if in_group else ctx_slots.to(device)))
        offset += it.num_tokens
        if it.samples:
            rows.append(offset - 1)
            req_ids.append(it.req_id)
    cat = (lambda xs: torch.cat(xs).to(device)) if items else (lambda _xs: torch.zeros(0, dtype=torch.long))
    return StepBatch(
        cat(pos_parts),
        cat(slot_parts),
        segments,
        torch.tensor(rows, dtype=torch.long, device=device),
        req_ids,
        decode_group(segments, device) if grouped else None,
    )


class PagedKVCache:
    """K and V slot arrays for ``num_layers`` local layers."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    @staticmethod
    def bytes_needed(num_layers: int, num_blocks: int, block_size: int, kv_dim: int, elem_bytes: int) -> int:
        return 2 * num_layers * num_blocks * block_size * kv_dim * elem_bytes

    def attention(self, batch: StepBatch):  # noqa: ANN201 - returns an AttnFn closure
        """The attention function a stage's layers call for ``batch``: write new K/V, then attend."""

        def attn(local: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return paged_attention(self.k[local], self.v[local], batch.slots, batch.segments, q, k, v, batch.group)

        return attn


def paged_attention(
    kc: torch.Tensor,
    vc: torch.Tensor,
    slots: torch.Tensor,
    segments: list,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: DecodeGroup | None = None,
) -> torch.Tensor:
    """Write the step's K/V into their slots, then attend per request over its gathered context.

    ``kc``/``vc``: [S, Hkv, D] slot arrays of one layer; ``segments``: (row offset, new tokens, context
    length, context slots) per request; q: [T, Hq, D]. Returns [T, Hq, D]. With a ``group``, its
    decodes attend in one batched call and only the other requests loop.
    """
    kc.index_copy_(0, slots, k)
    vc.index_copy_(0, slots, v)
    out = torch.empty_like(q)
    if group is not None:
        qg = q.index_select(0, group.rows)[:, :, None, :]  # [B, Hq, 1, D]
        kg = kc[group.slots].transpose(1, 2)  # [B, Hkv, L, D]
        vg = vc[group.slots].transpose(1, 2)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=group.mask, enable_gqa=True)
        out.index_copy_(0, group.rows, o[:, :, 0, :])
    for off, n, ctx, ctx_slots in segments:
        if group is not None and n == 1:
            continue
        qi = q[off : off + n].transpose(0, 1)  # [Hq, n, D]
        ki = kc.index_select(0, ctx_slots).transpose(0, 1)  # [Hkv, ctx, D]
        vi = vc.index_select(0, ctx_slots).transpose(0, 1)
        mask = None
        if n > 1:  # query i sits at position ctx - n + i and sees keys 0 .. ctx - n + i
            qpos = torch.arange(ctx - n, ctx, device=q.device)[:, None]
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos  # [n, ctx]
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)
        out[off : off + n] = o.transpose(0, 1)
    return out
