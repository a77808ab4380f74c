"""One stage's compute for one micro-batch: the code a stage process runs, and calibration times.

``Stage.compute`` (``engine/worker.py``) calls :func:`forward_step` for every micro-batch, and
``ppsim calibrate`` (:mod:`calibration.stage_step`) times the same function on the engine's own
modules, so the profiled cost model is fitted to exactly what a stage executes: input preparation
(``build_batch``), the embedding on the first stage, the layers as ``nn.Module`` calls over the paged
KV cache, and on the last stage the final norm, lm_head, greedy sampling and the tokens' copy to Python.
"""

from __future__ import annotations

import torch

from engine.kvcache import PagedKVCache, build_batch
from engine.model import StageModel
from engine.transport import StepItem


def forward_step(
    model: StageModel,
    kv: PagedKVCache,
    items: tuple[StepItem, ...],
    token_ids: tuple[int, ...] | None,
    hidden: torch.Tensor | None,
    residual: torch.Tensor | None,
    block_size: int,
    dev: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int] | None]:
    """``(hidden, residual, sampled request ids, tokens or None)`` of one micro-batch (call under
    ``torch.inference_mode``); on CUDA it returns after the stream has finished."""
    batch = build_batch(items, block_size, dev)
    ids = torch.tensor(token_ids, dtype=torch.long, device=dev) if model.is_first else None
    hidden, residual = model(batch.positions, kv.attention(batch), ids, hidden, residual)
    toks = model.sample(hidden, residual, batch.sample_rows).tolist() if model.is_last else None
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return hidden, residual, batch.sample_req_ids, toks
