"""How many distinct experts a step's tokens touch, which sets the expert bytes a MoE layer reads.

Each token picks ``k`` of ``E`` routed experts. Under uniform, independent routing an expert is
missed by one token with probability ``1 - k/E``, so the expected number of distinct experts
touched by ``T`` tokens is ``E x (1 - (1 - k/E)^T)``: one decode token reads ``k`` experts, a
micro-batch of 8 reads almost ``8k`` (DeepSeek-V3: 8 -> 57.4 of 256), a long prefill reads all of them.

Routing is not uniform in practice: tokens of one sequence, and similar prompts, tend to pick the
same experts. ``skew`` >= 1 models this as correlation: the step's tokens behave as ``T / skew``
independent routing draws (groups of ``skew`` tokens that share their experts), so
``E x (1 - (1 - k/E)^(T/skew))``, never fewer than ``k`` experts for a non-empty step.
``skew = 1`` is the uniform formula.

Routers are also *unbalanced*: expert ``e`` is picked by a token with probability ``p_e`` (the expert
load; the ``p_e`` sum to ``k``). For independent tokens the expectation is then exactly
``sum_e 1 - (1 - p_e)^T`` (:func:`expected_experts_touched_load`), which is the uniform formula when
every ``p_e = k/E``, and fewer experts otherwise: popular experts are shared by many tokens. The
profiled cost model takes ``p_e`` measured from the router at calibration (``engine/moe.py``).
The fused-MoE kernels (vLLM ``fused_moe``,
``moe_align_block_size``) read exactly the weights of the experts that received tokens.
"""

from __future__ import annotations

import math


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: float, skew: float = 1.0) -> float:
    """Expected distinct experts of ``num_experts`` (top-``top_k`` routing) touched by ``num_tokens`` tokens."""
    if num_tokens <= 0 or num_experts <= 0:
        return 0.0
    if top_k >= num_experts:
        return float(num_experts)
    draws = num_tokens / skew
    touched = num_experts * -math.expm1(draws * math.log1p(-top_k / num_experts))
    return max(float(top_k), touched)


def expected_experts_touched_load(load: list[float], num_tokens: float, skew: float = 1.0) -> float:
    """Expected distinct experts touched by ``num_tokens`` tokens when expert ``e`` is picked by a token
    with probability ``load[e]`` (sum = top-k), tokens independent up to ``skew`` (as above)."""
    if num_tokens <= 0 or not load:
        return 0.0
    draws = num_tokens / skew
    touched = sum(-math.expm1(draws * math.log1p(-min(p, 1.0 - 1e-12))) for p in load if p > 0)
    return max(float(round(sum(load))), touched)  # a non-empty step runs at least k experts
