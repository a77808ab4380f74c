"""Per-kernel time of the analytic model: GEMMs, elementwise kernels, attention, collectives, host work.

Each operator of a step is one GPU kernel (or a host call). The curves below were fitted once to
public measured GPU data, Vidur's profiles (``experiments/analytic_vs_vidur/fit.py``; the numbers
are in ``fit.json`` beside it). GEMM and elementwise curves are fitted on the training models
(Llama-2-7B, Llama-2-70B, CodeLlama-34B) and checked on the held-out ones (Llama-3-8B/70B,
InternLM-20B, Qwen-72B); the rest has a single source each and is in-sample:

- GEMM (``mlp.csv`` ``attn_pre_proj``, ``attn_post_proj``, ``mlp_up_proj``, ``mlp_down_proj``):
  ``gemm_launch_us`` plus a smooth roofline ``(c^p + m^p)^(1/p)`` of the compute time ``c`` (FLOPs
  / (peak x compute_eff)) and the memory time ``m`` (bytes / (bandwidth x memory_eff)), the two
  efficiencies per device. A plain ``max(c, m)`` (p = inf) is 25-40% fast where both are close
  (64-256 tokens on a 70B layer): kernels neither reach both roofs at once nor overlap them fully.
  The rounding narrows as the kernel grows (``gemm_sharpness_growth``): long GEMMs hide their
  weight stream under the math better than short ones.
  ``c`` counts the token dimension in whole tiles (:func:`gemm_rows`): Vidur's tables step up
  right after 128, 256, ... tokens.
- Elementwise kernels (``input_layernorm``, ``attn_rope``, ``mlp_act``, ``add``, ``emb``): bytes
  moved over an achieved share of the HBM peak per kernel kind, at least ``floor_us`` plus one row
  (token) streamed by one thread block (vLLM's norm, RoPE and SiLU kernels run a block per token).
- Attention (``attention.csv``, FlashInfer, Llama-2-70B TP2 on A100, the only attention file Vidur
  ships: in-sample, no held-out check): prefill at ``attn_compute_eff`` of the peak over the causal
  query-key pairs, fitted to the chunk's own c^2 term (Vidur's FlashInfer takes no time off for the
  mask, so its prefix term is then over-predicted up to 2x; modern kernels skip masked tiles, and a
  rectangle would make chunking cut attention work, which it does not), plus the KV reshapes;
  decode reads the context's KV at ``attn_memory_eff`` of the bandwidth; each call costs
  ``attn_call_us``.
- All-reduce (``network/<dev>_dgx/all_reduce.csv``, NCCL inside one NVSwitch node, 2-8 GPUs):
  a call cost plus the ring's 2 (N - 1) / N x bytes over the TP link at a bus efficiency, both
  fitted per group size N (each octave of message size weighted alike). The fixed part is an
  eagerly launched NCCL call (no CUDA graphs, no custom all-reduce in Vidur's runs), and it
  dominates decode at TP > 1.
- Host work per step (``cpu_overheads/<dev>.csv``): input preparation and the sampler, each
  ``c0 + c1 x requests``.

``CostConfig.compute_efficiency`` / ``memory_efficiency`` / ``step_overhead_us`` override the
device's fitted numbers when set.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KernelFit:
    """Fitted shares and fixed costs common to every device (see the module docstring)."""

    gemm_sharpness: float = 1.87
    # the sharpness grows with the kernel: p = gemm_sharpness x (max(c, m) / 100 us) ^ gemm_sharpness_growth
    gemm_sharpness_growth: float = 0.117
    gemm_launch_us: float = 4.61
    gemm_tile_rows: int = 128
    gemm_small_tile_rows: int = 64
    gemm_small_tile_eff: float = 0.896
    floor_us: float = 2.34
    norm_eff: float = 0.426
    rope_eff: float = 0.532
    act_eff: float = 0.569
    add_eff: float = 0.935
    emb_eff: float = 0.229
    # one row (token) streamed by one thread block, ns per KB of the row: 1 / the block's bandwidth
    norm_row_ns_per_kb: float = 138.0
    rope_row_ns_per_kb: float = 120.0
    act_row_ns_per_kb: float = 73.2
    add_row_ns_per_kb: float = 0.0
    emb_row_ns_per_kb: float = 133.0
    attn_compute_eff: float = 0.217
    attn_memory_eff: float = 0.767
    attn_call_us: float = 15.9
    reshape_eff: float = 0.245

    def elementwise(self, kind: str) -> tuple[float, float]:
        """(share of the HBM peak, row ns per KB) of an elementwise kernel kind: norm, rope, act, add, emb."""
        return getattr(self, f"{kind}_eff"), getattr(self, f"{kind}_row_ns_per_kb")


@dataclass(frozen=True, slots=True)
class DeviceFit:
    """Fitted per device: GEMM efficiencies, the NCCL all-reduce inside a node, the host's per-step work."""

    compute_eff: float
    memory_eff: float
    allreduce: tuple[tuple[int, float, float], ...]  # (GPUs, call us, bus efficiency), GPUs ascending
    prepare_us: float
    prepare_per_req_us: float
    sampler_us: float
    sampler_per_req_us: float

    def allreduce_fit(self, gpus: int) -> tuple[float, float]:
        """(call us, bus efficiency) of the largest fitted group size at most ``gpus`` (else the smallest)."""
        best = self.allreduce[0]
        for entry in self.allreduce:
            if entry[0] <= gpus:
                best = entry
        return best[1], best[2]


FIT = KernelFit()
# experiments/analytic_vs_vidur/fit.json, rounded. H100: A100's host costs (Vidur has no H100 host
# data); A40: no all-reduce data, A100's. A device without Vidur data uses A100's numbers.
A100_ALLREDUCE = ((2, 41.4, 0.554), (4, 31.1, 0.504), (8, 38.9, 0.502))
H100_ALLREDUCE = ((2, 19.4, 0.606), (4, 36.7, 0.898), (8, 29.1, 0.786))
DEVICE_FITS = {
    "a100-80gb": DeviceFit(0.738, 0.785, A100_ALLREDUCE, 148.0, 0.97, 599.0, 3.27),
    "h100-sxm": DeviceFit(0.717, 0.895, H100_ALLREDUCE, 148.0, 0.97, 599.0, 3.27),
    "a40": DeviceFit(0.772, 0.796, A100_ALLREDUCE, 949.0, 24.1, 5124.0, 1.36),
}


def device_fit(name: str) -> DeviceFit:
    return DEVICE_FITS.get(name, DEVICE_FITS["a100-80gb"])


def gemm_rows(tokens: float, fit: KernelFit = FIT) -> float:
    """Rows (tokens) a GEMM's compute costs: beyond one tile, the token dimension in whole tiles.

    cuBLAS splits the token dimension M into tiles and computes each tile whole; its heuristic picks
    among tile shapes, 128 rows (``gemm_tile_rows``) or 64 (``gemm_small_tile_rows``, which waste less
    padding but run at ``gemm_small_tile_eff`` of the large tile's rate). So 136 tokens cost what
    about 192 / 0.91 = 211 do, 256 cost 256 (Vidur's tables step up right after 128, 256, ...). Up to
    one large tile the GEMM is memory-bound or a single tile and is not padded.
    """
    big = fit.gemm_tile_rows
    if tokens <= big:
        return tokens
    small = fit.gemm_small_tile_rows
    return min(-(-tokens // big) * big, -(-tokens // small) * small / fit.gemm_small_tile_eff)


SHARPNESS_REF_S = 1e-4  # the kernel time at which the sharpness is ``gemm_sharpness``


def smooth_roof(compute_s: float, memory_s: float, p: float, growth: float = 0.0) -> float:
    """``(c^p + m^p)^(1/p)``: the roofline's max, rounded where the two limits meet.

    With ``growth`` the rounding narrows as the kernel grows, ``p x (max(c, m) / 100 us) ^ growth``: a
    long GEMM runs many k-loop iterations per tile and many tiles per SM, so its weight stream and its
    math overlap better than a short one's (Vidur's 70B GEMMs at 128-256 tokens come within 10-15% of
    ``max(c, m)`` where a 7B layer's are 30-40% above it)."""
    hi = max(compute_s, memory_s)
    if hi <= 0.0:
        return 0.0
    lo = min(compute_s, memory_s)
    if growth:
        p *= (hi / SHARPNESS_REF_S) ** growth
    return hi * (1.0 + (lo / hi) ** p) ** (1.0 / p)
