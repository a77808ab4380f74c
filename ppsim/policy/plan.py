"""The step plan: an immutable record of one micro-batch, all that is needed to time or run it."""

from __future__ import annotations

from typing import NamedTuple

_tuple_new = tuple.__new__  # StepPlan built without its Python-level __new__ (once per step)


class PlanItem(NamedTuple):
    """One request's share of a step: ``num_tokens`` tokens starting at position ``start``.

    ``start`` is also the context already in the KV cache (the prefix). ``samples`` is true when the
    step computes the request's last known token, so the last stage samples a new one. ``epoch``
    counts preemptions: an output whose epoch is stale is dropped. (A named tuple: immutable, and
    built once per request per step, several times faster than a frozen dataclass.)
    """

    req_id: int
    start: int
    num_tokens: int
    is_prefill: bool
    samples: bool
    epoch: int = 0


class StepPlan(NamedTuple):
    """One micro-batch. Aggregates are precomputed once for the cost models. (A named tuple:
    immutable, and built once per step without a Python-level constructor.)"""

    step_id: int
    items: tuple[PlanItem, ...]
    num_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_samples: int
    # sum over prefill items of query-key pairs under the causal mask: c * (p + (c + 1) / 2)
    prefill_attn_pairs: float
    # sum over prefill items of KV tokens read (p + c); sum over decodes of their context length
    prefill_kv_tokens: int
    decode_ctx_tokens: int
    # steps whose sampled tokens the first stage must hold before it can start this plan (async
    # scheduling: a decode scheduled before its previous token is back at the engine core)
    deps: tuple[int, ...] = ()

    @property
    def num_reqs(self) -> int:
        return len(self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items


def make_plan(
    step_id: int,
    items: list[PlanItem] | tuple[PlanItem, ...],
    deps: tuple[int, ...] = (),
    partial: tuple[int, int, int, int, float, int, int] | None = None,
) -> StepPlan:
    """The plan of ``items``. ``partial``: the sums ``(k, num_tokens, num_prefill_tokens, num_samples,
    prefill_attn_pairs, prefill_kv_tokens, decode_ctx_tokens)`` of the first ``k`` items, already
    taken by the caller in its own loop (the scheduler's); the rest are added here, in order."""
    if partial is None:
        k, n_tok, n_pre, n_samp, pairs, pre_kv = 0, 0, 0, 0, 0.0, 0
        dec_ctx = 0
    else:
        k, n_tok, n_pre, n_samp, pairs, pre_kv, dec_ctx = partial
    n_dec = n_tok - n_pre
    for _req_id, start, c, is_prefill, samples, _epoch in items[k:] if k else items:  # PlanItem fields
        n_tok += c
        n_samp += samples
        if is_prefill:
            n_pre += c
            pairs += c * (start + (c + 1) / 2)
            pre_kv += start + c
        else:
            n_dec += c
            dec_ctx += start + c
    return _tuple_new(StepPlan, (step_id, tuple(items), n_tok, n_pre, n_dec, n_samp, pairs, pre_kv, dec_ctx, deps))
