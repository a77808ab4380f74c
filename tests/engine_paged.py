"""Greedy generation through engine stages in one process, batched as the engine batches (needs torch)."""

from __future__ import annotations

import torch

from engine.kvcache import PagedKVCache, build_batch
from engine.transport import StepItem
from ppsim.models.shape import ModelShape


def paged_generate(
    stages,
    shape: ModelShape,
    prompts: list[list[int]],
    num_new: int,
    chunk: int,
    bs: int = 4,
    expect_mixed: bool = False,
    batched: bool | None = None,
) -> list[list[int]]:
    """Drive float32 ``stages`` like the engine: chunked prefills and decodes of all requests in each step.
    ``expect_mixed``: assert that some step mixed prefill chunks and decodes; ``batched``: attend the
    decodes in one call as on CUDA (``engine.kvcache.DecodeGroup``)."""
    caches = [PagedKVCache(m.num_layers, 64, bs, shape.num_kv_heads, shape.head_dim, torch.float32) for m in stages]
    tables = {r: tuple(range(r * 16, r * 16 + 16)) for r in range(len(prompts))}
    seqs, done = [list(p) for p in prompts], [0] * len(prompts)
    outs: list[list[int]] = [[] for _ in prompts]
    mixed = grouped = False
    with torch.inference_mode():
        while any(len(o) < num_new for o in outs):
            items, ids = [], []
            for r in range(len(prompts)):
                if len(outs[r]) < num_new:
                    n = min(chunk, len(seqs[r]) - done[r])
                    items.append(StepItem(r, done[r], n, done[r] + n == len(seqs[r]), tables[r]))
                    ids += seqs[r][done[r] : done[r] + n]
                    done[r] += n
            mixed |= len({it.num_tokens == 1 for it in items}) == 2
            batch = build_batch(tuple(items), bs, batched=batched)
            grouped |= batch.group is not None
            hidden = residual = None
            for m, kv in zip(stages, caches, strict=True):
                x = torch.tensor(ids) if m.is_first else None
                hidden, residual = m(batch.positions, kv.attention(batch), x, hidden, residual)
            toks = stages[-1].sample(hidden, residual, batch.sample_rows).tolist()
            for rid, t in zip(batch.sample_req_ids, toks, strict=True):
                outs[rid].append(t)
                seqs[rid].append(t)
    assert mixed or not expect_mixed, "the schedule should mix prefill chunks and decodes"
    assert grouped or not batched, "some step should have attended its decodes as one group"
    return outs
