"""Requests a deployment can never serve, said out loud.

The scheduler rejects a request at arrival when prompt + output tokens exceed ``max_model_len``
(vLLM: "longer than the maximum model length") or need more KV blocks than the whole cache holds
(it could never be admitted). Such a request ends with status ``rejected`` in ``requests.csv``;
:func:`rejection_message` turns the rejected ones of a run into one line with the count, the
reason and the fix, and a run whose every request was rejected exits non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ppsim.policy.requests import Request


def rejection_message(
    requests: Iterable[Request], rejected_ids: set[int], max_model_len: int | None, num_blocks: int, block_size: int
) -> str | None:
    """One line saying how many requests were rejected and why, or None if none was."""
    if not rejected_ids:
        return None
    reqs = list(requests)
    too_long, too_big = [], []
    for r in reqs:
        if r.req_id not in rejected_ids:
            continue
        total = r.prompt_len + r.output_len
        (too_long if max_model_len is not None and total > max_model_len else too_big).append(total)
    parts = []
    if too_long:
        parts.append(
            f"{len(too_long)} longer than max_model_len {max_model_len} (prompt + output up to "
            f"{max(too_long)} tokens; raise --max-model-len or shorten the requests)"
        )
    if too_big:
        need = -(-max(too_big) // block_size)
        parts.append(
            f"{len(too_big)} need up to {need} KV blocks, the cache has {num_blocks} (shorten the "
            "requests, or add memory: --gpu-memory-utilization, -pp, -tp)"
        )
    return f"{len(rejected_ids)} of {len(reqs)} requests rejected: {'; '.join(parts)}"


def rejections_of(prep: Any, requests: Sequence[Any] | Any, summary: dict[str, Any]) -> tuple[str | None, bool]:
    """The line about rejected requests of a run (its records, or its ledger), and whether every
    request was rejected. ``prep``: the run's :class:`~ppsim.deployment.Prepared`."""
    from ppsim.metrics.ledger import REJECTED, Ledger

    if isinstance(requests, Ledger):
        rejected = {int(prep.requests.req_id[row]) for row, st in enumerate(requests.status) if st == REJECTED}
    else:
        rejected = {r.req_id for r in requests if r.status == "rejected"}
    msg = rejection_message(
        prep.requests, rejected, prep.max_model_len, summary["kv_num_blocks"], summary["kv_block_size"]
    )
    return msg, bool(len(prep.requests)) and len(rejected) == len(prep.requests)
