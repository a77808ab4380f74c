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
SDPA (causal within its chunk, offset by the cached prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.transport import StepItem


@dataclass
class StepBatch:
    """Tensors for one micro-batch on one stage. T tokens in ``items`` order."""

    positions: torch.Tensor  # [T] int64 absolute positions
    slots: torch.Tensor  # [T] int64 KV slot of each new token
    segments: list[tuple[int, int, int, torch.Tensor]]  # (row offset, n, context length, ctx slots [ctx])
    sample_rows: torch.Tensor  # [S] row of the last token of each sampling item
    sample_req_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def build_batch(items: tuple[StepItem, ...], block_size: int, device: torch.device | str = "cpu") -> StepBatch:
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
        segments.append((offset, it.num_tokens, ctx, ctx_slots.to(device)))
        offset += it.num_tokens
        if it.samples:
            rows.append(offset - 1)
            req_ids.append(it.req_id)
    cat = (lambda xs: torch.cat(xs).to(device)) if items else (lambda _xs: torch.zeros(0, dtype=torch.long))
    return StepBatch(
        cat(pos_parts), cat(slot_parts), segments, torch.tensor(rows, dtype=torch.long, device=device), req_ids
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
            return paged_attention(self.k[local], self.v[local], batch.slots, batch.segments, q, k, v)

        return attn


def paged_attention(
    kc: torch.Tensor,
    vc: torch.Tensor,
    slots: torch.Tensor,
    segments: list,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """Write the step's K/V into their slots, then attend per request over its gathered context.

    ``kc``/``vc``: [S, Hkv, D] slot arrays of one layer; ``segments``: (row offset, new tokens, context
    length, context slots) per request; q: [T, Hq, D]. Returns [T, Hq, D].
    """
    kc.index_copy_(0, slots, k)
    vc.index_copy_(0, slots, v)
    out = torch.empty_like(q)
    for off, n, ctx, ctx_slots in segments:
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
