"""Fitting SGLang's dynamic-chunking model from a cost model, as SGLang profiles it at start-up.

``scheduler_pp_mixin.py::profile_and_init_predictor`` times single-request prefills (no prefix) of
128 lengths from 1.25 C downwards on PP rank 0 and fits f(l) = a l^2 + b l + c. Here the timings
are the cost model's ``stage_time`` of stage 0 for the same plans (analytic or profiled: both go
through the same interface). The refined form samples chunks after a prefix as well; either form
drives ``sglang-ring`` in ``simulate`` and ``validate`` (``engine.dynamic_chunking_form``).
"""

from __future__ import annotations

from ppsim.cost.base import CostModel, StageSpec
from ppsim.policy.chunking import ChunkModel, chunk_budget_fn, fit_quadratic, fit_refined, profile_lengths
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.policy.sglang import SGLangKnobs


def prefill_time(cost: CostModel, stage: StageSpec, prefix: int, n: int) -> float:
    """Seconds for ``stage`` to prefill ``n`` tokens of one request after ``prefix`` cached tokens."""
    return cost.stage_time(stage, make_plan(0, [PlanItem(0, prefix, n, True, False)]))


def fit_from_cost(cost: CostModel, stage: StageSpec, initial_chunk: int) -> ChunkModel:
    """SGLang's fit over its profiling lengths (milliseconds, like SGLang's log)."""
    lengths = profile_lengths(initial_chunk)
    times = [prefill_time(cost, stage, 0, n) * 1e3 for n in lengths]
    return fit_quadratic(lengths, times)


def fit_refined_from_cost(cost: CostModel, stage: StageSpec, initial_chunk: int, max_prefix: int) -> ChunkModel:
    """The refined t(L, x) over a grid of prefixes (0 .. max_prefix) and chunk lengths (C/8 .. C)."""
    prefixes, chunks, times = [], [], []
    for i in range(8):
        p = max_prefix * i // 7
        for j in range(1, 9):
            x = max(1, initial_chunk * j // 8)
            prefixes.append(p)
            chunks.append(x)
            times.append(prefill_time(cost, stage, p, x) * 1e3)
    return fit_refined(prefixes, chunks, times)


def chunk_model(engine, cost: CostModel, stage0: StageSpec, max_prefix: int) -> ChunkModel:  # noqa: ANN001
    """The dynamic-chunking model of a :class:`~ppsim.policies.SglangRing`: its coefficients, else fitted
    from the cost model in its form (SGLang's quadratic, or the refined form over prefixes up to ``max_prefix``)."""
    coeff = engine.dynamic_chunking_coefficients
    if coeff is not None:
        return ChunkModel(*coeff)
    c = engine.chunked_prefill_size
    if engine.dynamic_chunking_form == "refined":
        return fit_refined_from_cost(cost, stage0, c, max(max_prefix, c))
    return fit_from_cost(cost, stage0, c)


def sglang_knobs(engine, cost: CostModel, stage0: StageSpec, max_prefix: int = 0) -> SGLangKnobs:  # noqa: ANN001
    """Resolve the knobs of a :class:`~ppsim.policies.SglangRing` (``engine``) for the pure core.

    ``max_prefix``: the longest prompt of the workload (the refined fit samples prefixes up to it).
    """
    budget = None
    if engine.enable_dynamic_chunking:
        model = chunk_model(engine, cost, stage0, max_prefix)
        budget = chunk_budget_fn(
            engine.chunked_prefill_size, model, engine.smooth_factor, engine.page_size, engine.max_prefill_tokens
        )
    return SGLangKnobs(
        async_batch_depth=engine.pp_async_batch_depth,
        max_micro_batch_size=engine.pp_max_micro_batch_size,
        chunked_prefill_size=engine.chunked_prefill_size,
        max_prefill_tokens=engine.max_prefill_tokens,
        page_size=engine.page_size,
        chunk_budget=budget,
    )
