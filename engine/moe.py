"""A mixture-of-experts MLP in torch: softmax top-k router, grouped routed experts, shared experts.

Layout and names follow HF ``DeepseekForCausalLM`` (deepseek-moe-16b, vLLM
``vllm/model_executor/models/deepseek.py::DeepseekMoE``): ``mlp.gate.weight`` [E, H] is the router,
``mlp.experts.{e}.{gate,up,down}_proj.weight`` the routed experts, ``mlp.shared_experts.*`` one MLP of
``n_shared_experts x moe_intermediate_size`` that every token runs. Scoring is softmax, selection is
greedy top-k, and the combine weights are the selected softmax probabilities (``norm_topk_prob``
false, as deepseek-moe-16b).

Grouped computation (what vLLM's ``fused_moe`` does in one kernel, here a loop): sort the step's
``T x k`` (token, expert) pairs by expert, and for each expert that received tokens gather its rows,
run its MLP, scale by the combine weight and ``index_add_`` back. Experts no token picked are not
touched at all, so a step's cost grows with the distinct experts it touches (see
:mod:`ppsim.models.moe`).

Router skew (``router_zipf`` = s >= 0): a fixed bias ``-s ln(e + 1)`` on expert ``e``'s logit
multiplies its softmax odds by ``(e + 1)^-s``, a Zipf-like popularity on top of the learned router
(s = 0: the router alone). It is a buffer, not a checkpoint tensor.

Shapes: T = tokens, H = hidden, E = routed experts, k = experts per token, I = expert width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ppsim.models.shape import ModelShape


class ExpertMLP(nn.Module):
    """SwiGLU MLP of width ``inter`` (one routed expert, or the shared experts fused)."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def zipf_bias(num_experts: int, s: float) -> torch.Tensor:
    """Router logit bias [E]: ``-s ln(e + 1)``."""
    return torch.tensor([-s * math.log(e + 1) for e in range(num_experts)], dtype=torch.float32)


def route(logits: torch.Tensor, bias: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k over ``logits + bias`` [T, E] -> (expert ids [T, k] int64, combine weights [T, k])."""
    probs = torch.softmax(logits.float() + bias, dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return ids, weights.to(logits.dtype)


def grouped_experts(
    x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: nn.ModuleList
) -> tuple[torch.Tensor, int]:
    """Sum over each token's experts of ``weight x expert(x)``; returns (out [T, H], distinct experts run)."""
    k = ids.shape[1]
    flat = ids.reshape(-1)  # [T k]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=len(experts)).tolist()
    rows = order // k  # token of each sorted pair
    w = weights.reshape(-1)[order][:, None]
    out = torch.zeros_like(x)
    off = touched = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        r = rows[off : off + c]
        out.index_add_(0, r, experts[e](x[r]) * w[off : off + c])
        off += c
        touched += 1
    return out, touched


class MoE(nn.Module):
    """Router + routed experts + shared experts; ``touched`` holds the last step's distinct experts."""

    def __init__(self, s: ModelShape, router_zipf: float = 0.0) -> None:
        super().__init__()
        self.top_k = s.num_experts_per_tok
        self.gate = nn.Linear(s.hidden_size, s.n_routed_experts, bias=False)
        self.experts = nn.ModuleList(
            ExpertMLP(s.hidden_size, s.moe_intermediate_size) for _ in range(s.n_routed_experts)
        )
        if s.shared_expert_intermediate_size:
            self.shared_experts = ExpertMLP(s.hidden_size, s.shared_expert_intermediate_size)
        self.register_buffer("router_bias", zipf_bias(s.n_routed_experts, router_zipf), persistent=False)
        self.touched = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = route(self.gate(x), self.router_bias, self.top_k)
        out, self.touched = grouped_experts(x, ids, weights, self.experts)
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(x)
        return out
