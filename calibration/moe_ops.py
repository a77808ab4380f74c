"""Profiling the mixture-of-experts MLP as the live engine runs it (``engine/moe.py``).

Three operators, each the engine's own code on the calibration layer's weights:

- ``moe_router`` over tokens: the gate GEMM [T, H] x [H, E], softmax and top-k (``engine.moe.route``).
- ``moe_experts`` over (pairs P = T x k, distinct experts N): ``engine.moe.grouped_experts`` on a
  routing forced to touch exactly N experts with the P (token, expert) rows spread evenly, so the
  cost's two drivers are measured apart: rows through the expert GEMMs, and per-expert work (a
  gather, three GEMM calls and an ``index_add_`` per expert; on a GPU, one expert's weights read).
- ``moe_shared`` over tokens: the shared experts' MLP.

:func:`router_load` measures the router's expert load (the probability that a token picks expert
``e``; the loads sum to k): routers drawn as the engine draws them (N(0, 1/H) weights, the
``router_zipf`` bias) applied to unit-RMS hidden states (the engine routes the output of an RMSNorm).
The profiled cost model turns it into expected distinct experts per step
(:func:`ppsim.models.moe.expected_experts_touched_load`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.moe import MoE, grouped_experts, route, zipf_bias
from ppsim.models.shape import ModelShape

ROUTER_LOAD_TOKENS = 4096  # tokens per drawn router
ROUTER_LOAD_DRAWS = 16  # routers drawn (one per layer of a model, as many as this)


def build_moe(shape: ModelShape, router_zipf: float, seed: int, dtype: torch.dtype, device: torch.device) -> MoE:
    """A MoE block with the engine's init (N(0, 1/fan_in)) from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    moe = MoE(shape, router_zipf)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return moe.to(device=device, dtype=dtype).eval()


def expert_counts(num_experts: int, top_k: int) -> tuple[int, ...]:
    """Distinct-expert counts to profile: k, E/4, E/2, 3E/4, E (those >= k)."""
    return tuple(
        sorted(
            {
                n
                for n in (top_k, num_experts // 4, num_experts // 2, 3 * num_experts // 4, num_experts)
                if top_k <= n <= num_experts
            }
        )
    )


def forced_routing(
    T: int, k: int, n: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] touching exactly ``n`` experts (k <= n <= T k), rows spread evenly; weights 1/k."""
    ids = (torch.arange(T)[:, None] * k + torch.arange(k)[None, :]) % n  # k distinct per token since n >= k
    return ids.to(device), torch.full((T, k), 1.0 / k, device=device, dtype=dtype)


def moe_fns(moe: MoE, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Closures of the token operators over ``x`` [T, H]."""
    fns: dict[str, Callable[[], object]] = {"moe_router": lambda: route(moe.gate(x), moe.router_bias, moe.top_k)}
    if hasattr(moe, "shared_experts"):
        fns["moe_shared"] = lambda: moe.shared_experts(x)
    return fns


def experts_fn(moe: MoE, x: torch.Tensor, n: int) -> Callable[[], object]:
    ids, w = forced_routing(x.shape[0], moe.top_k, n, x.device, x.dtype)
    return lambda: grouped_experts(x, ids, w, moe.experts)


def experts_points(shape: ModelShape, tokens: tuple[int, ...]) -> list[dict[str, Any]]:
    """(tokens, pairs, experts) points: each token count with every feasible distinct-expert count."""
    k, E = shape.num_experts_per_tok, shape.n_routed_experts
    return [{"tokens": T, "pairs": T * k, "experts": n} for T in tokens for n in expert_counts(E, k) if n <= T * k]


@torch.no_grad()
def router_load(shape: ModelShape, router_zipf: float, seed: int = 0) -> list[float]:
    """Probability that a token picks each expert (sums to k), averaged over ``ROUTER_LOAD_DRAWS`` routers."""
    E, H, k = shape.n_routed_experts, shape.hidden_size, shape.num_experts_per_tok
    g = torch.Generator().manual_seed(seed)
    bias = zipf_bias(E, router_zipf)
    counts = torch.zeros(E)
    for _ in range(ROUTER_LOAD_DRAWS):
        w = torch.randn(E, H, generator=g) * H**-0.5
        x = torch.randn(ROUTER_LOAD_TOKENS, H, generator=g)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))  # unit RMS, as after the engine's RMSNorm
        ids, _ = route(x @ w.T, bias, k)
        counts += torch.bincount(ids.reshape(-1), minlength=E).float()
    return [float(c) for c in counts / (ROUTER_LOAD_DRAWS * ROUTER_LOAD_TOKENS)]
