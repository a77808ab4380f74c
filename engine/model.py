"""A Llama-style decoder in torch, built one pipeline stage at a time.

Layers follow HF ``LlamaForCausalLM`` (RMSNorm, RoPE, GQA attention, SwiGLU MLP; or a
mixture-of-experts MLP in the layers a MoE model routes, :mod:`engine.moe`) with vLLM's
fused-residual convention (``vllm/model_executor/models/llama.py::LlamaDecoderLayer``): each layer
takes and returns ``(hidden_states, residual)``, and exactly that pair crosses a stage boundary
(vLLM's ``IntermediateTensors``). A stage builds only its own layers but keeps *global* layer
indices in its parameter names (the ``PPMissingLayer`` idea), so ``state_dict`` keys are the HF
checkpoint keys (``model.layers.17.self_attn.q_proj.weight``) on every stage.

Random weights are drawn per parameter from a generator seeded by (seed, parameter name), so a
model split over any number of stages holds exactly the same weights as the unsplit one.

Shapes: T = tokens in the step (all requests concatenated), H = hidden, Hq/Hkv = heads, D = head dim.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.moe import MoE
from ppsim.models.shape import ModelShape

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# attn(local_layer, q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, Hq, D]
AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES.get(name, torch.float32)


class RMSNorm(nn.Module):
    """``norm(x + residual)``; returns the normed tensor and the new residual (vLLM fused add)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        var = x.float().pow(2).mean(-1, keepdim=True)
        normed = (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)
        return self.weight * normed, x


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, HF ``rotate_half`` layout. x: [T, heads, D], positions: [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.q_dim, bias=s.attention_bias)
        self.k_proj = nn.Linear(s.hidden_size, s.kv_dim, bias=s.attention_bias)
        self.v_proj = nn.Linear(s.hidden_size, s.kv_dim, bias=s.attention_bias)
        self.o_proj = nn.Linear(s.q_dim, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttnFn, local: int) -> torch.Tensor:
        s, t = self.s, x.shape[0]
        q = rope(self.q_proj(x).view(t, s.num_heads, s.head_dim), positions, s.rope_theta)
        k = rope(self.k_proj(x).view(t, s.num_kv_heads, s.head_dim), positions, s.rope_theta)
        v = self.v_proj(x).view(t, s.num_kv_heads, s.head_dim)
        return self.o_proj(attn(local, q, k, v).reshape(t, s.q_dim))


class MLP(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Attention and an MLP: dense, or a mixture of experts where ``s.layer_is_moe(layer)`` (engine/moe.py)."""

    def __init__(self, s: ModelShape, layer: int = 0, router_zipf: float = 0.0) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp: nn.Module = MoE(s, router_zipf) if s.layer_is_moe(layer) else MLP(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, attn: AttnFn, local: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, positions, attn, local)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class _Body(nn.Module):
    """Holds ``embed_tokens`` / ``layers`` / ``norm`` so that parameter names read ``model.*``."""


class StageModel(nn.Module):
    """Global layers ``[start, end)``; the embedding on the first stage, norm + lm_head on the last."""

    def __init__(
        self, s: ModelShape, start: int, end: int, is_first: bool, is_last: bool, router_zipf: float = 0.0
    ) -> None:
        super().__init__()
        self.shape, self.start, self.end = s, start, end
        self.is_first, self.is_last = is_first, is_last
        self.model = _Body()
        if is_first:
            self.model.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.model.layers = nn.ModuleDict({str(i): DecoderLayer(s, i, router_zipf) for i in range(start, end)})
        if is_last:
            self.model.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
            self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    def experts_touched(self) -> dict[int, int]:
        """Global MoE layer -> distinct routed experts its last forward ran."""
        return {int(i): layer.mlp.touched for i, layer in self.model.layers.items() if isinstance(layer.mlp, MoE)}

    def forward(
        self,
        positions: torch.Tensor,
        attn: AttnFn,
        input_ids: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run this stage's layers; returns ``(hidden [T, H], residual [T, H])``."""
        if self.is_first:
            hidden, residual = self.model.embed_tokens(input_ids), None
        for local, layer in enumerate(self.model.layers.values()):
            hidden, residual = layer(hidden, residual, positions, attn, local)
        return hidden, residual

    def sample(self, hidden: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Greedy tokens for the given rows (last stage only). Returns [len(rows)] int64."""
        h, _ = self.model.norm(hidden[rows], residual[rows])
        return self.lm_head(h).argmax(dim=-1)


def _param_generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


@torch.no_grad()
def init_random(m: StageModel, seed: int) -> None:
    """Deterministic weights per global parameter name: norms 1, linears N(0, 1/fan_in), embedding N(0, 1).

    These scales keep activations O(1) through the layers and logits O(1), so greedy choices are
    not decided by float rounding. A tied lm_head copies the embedding, as HF does. The numbers are
    drawn on the parameters' device (CPU weights are the reference; a CUDA generator draws other,
    equally seeded, numbers).
    """
    for name, p in m.named_parameters():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            p.fill_(1.0)
            continue
        key = "model.embed_tokens.weight" if name == "lm_head.weight" and m.shape.tie_word_embeddings else name
        g = _param_generator(seed, key, p.device)
        std = 1.0 if key == "model.embed_tokens.weight" else (0.02 if name.endswith("bias") else p.shape[-1] ** -0.5)
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32, device=p.device) * std)


def build_stage(
    s: ModelShape,
    start: int,
    end: int,
    is_first: bool,
    is_last: bool,
    seed: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    router_zipf: float = 0.0,
) -> StageModel:
    """A stage with seeded random weights, in ``dtype`` on ``device``, in eval mode.

    ``router_zipf``: MoE router popularity skew (:func:`engine.moe.zipf_bias`); ignored by dense layers.
    """
    dev = torch.device(device)
    if dev.type == "cpu":
        m = StageModel(s, start, end, is_first, is_last, router_zipf)
        init_random(m, seed)
        return m.to(dtype=dtype).eval()
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype on the GPU: no fp32 copy of the whole stage
    try:
        with dev:  # an 8B stage built and drawn on the GPU: seconds, where fp32 on the host takes minutes
            m = StageModel(s, start, end, is_first, is_last, router_zipf).to(dtype=dtype)
    finally:
        torch.set_default_dtype(before)
    init_random(m, seed)
    return m.eval()


# --- reference: one request, whole sequence, no KV cache ------------------------------------------


def causal_attn(_local: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention over one whole sequence (the reference path, no cache)."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


@torch.no_grad()
def reference_generate(m: StageModel, prompt: list[int], num_new: int) -> list[int]:
    """Greedy tokens from a full (single-stage) model, recomputing the whole sequence each step."""
    if not (m.is_first and m.is_last):
        raise ValueError("reference_generate needs the whole model on one stage")
    seq = list(prompt)
    dev = next(m.parameters()).device
    for _ in range(num_new):
        ids = torch.tensor(seq, dtype=torch.long, device=dev)
        pos = torch.arange(len(seq), device=dev)
        hidden, residual = m(pos, causal_attn, input_ids=ids)
        seq.append(int(m.sample(hidden, residual, torch.tensor([len(seq) - 1], device=dev))[0]))
    return seq[len(prompt) :]
