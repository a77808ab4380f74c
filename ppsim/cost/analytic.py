"""The analytic roofline: per operator, max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth).

Per decoder layer on one GPU of a TP group: QKV, output projection, gate+up, down (GEMMs over the
step's tokens; weights read once per step), prefill attention (causal query-key pairs), decode
attention (reads the KV of each context), elementwise work (norms, RoPE, residual adds, SiLU),
and two ring all-reduces when tp > 1. The first stage adds the embedding gather, the last the
final norm, lm_head (one row per request in the step, as vLLM computes logits only at sampled
positions) and sampling. Every stage pays ``step_overhead_us`` per step and ``layer_overhead_us``
per layer (kernel launches).
"""

from __future__ import annotations

import math

from ppsim.config import CostConfig, CpuOverheads
from ppsim.cost.base import StageSpec
from ppsim.hardware.presets import DeviceSpec, LinkSpec
from ppsim.models.shape import ModelShape
from ppsim.policy.plan import StepPlan


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads split across TP ranks; replicated (one per rank) once tp exceeds their count."""
    return max(1, math.ceil(num_kv_heads / tp))


class AnalyticCost:
    def __init__(
        self,
        shape: ModelShape,
        device: DeviceSpec,
        link: LinkSpec,
        tp_link: LinkSpec,
        tp: int,
        cost: CostConfig,
        cpu: CpuOverheads,
    ) -> None:
        self.shape, self.tp, self.cpu = shape, tp, cpu
        self.flops = device.peak_tflops * 1e12 * cost.compute_efficiency
        self.bw = device.hbm_bandwidth_gbps * 1e9 * cost.memory_efficiency
        self.link = link
        self.tp_link = tp_link
        self.layer_overhead = cost.layer_overhead_us * 1e-6
        self.step_overhead = cost.step_overhead_us * 1e-6
        h, b = shape.hidden_size, shape.dtype_bytes
        self.q_gpu = shape.q_dim // tp if shape.num_heads >= tp else shape.head_dim
        self.kv_gpu = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
        self.i_gpu = shape.intermediate_size / tp
        # Weight bytes per GPU per layer of each GEMM; FLOPs per token of each GEMM.
        self.gemms = [
            (h * (self.q_gpu + 2 * self.kv_gpu) * b, 2 * h * (self.q_gpu + 2 * self.kv_gpu), h + self.q_gpu + 2 * self.kv_gpu),
            (self.q_gpu * h * b, 2 * self.q_gpu * h, self.q_gpu + h),
            (2 * h * self.i_gpu * b, 4 * h * self.i_gpu, h + 2 * self.i_gpu),
            (self.i_gpu * h * b, 2 * self.i_gpu * h, self.i_gpu + h),
        ]
        self.elem_bytes_per_token = b * (10 * h + 2 * (self.q_gpu + self.kv_gpu) + 3 * self.i_gpu)

    def _roof(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops, nbytes / self.bw)

    def layer_time(self, plan: StepPlan) -> float:
        """Seconds for one decoder layer on one GPU."""
        T = plan.num_tokens
        b = self.shape.dtype_bytes
        t = 0.0
        for w_bytes, flops_per_tok, act_per_tok in self.gemms:
            t += self._roof(flops_per_tok * T, w_bytes + act_per_tok * T * b)
        hd_q = 2 * self.q_gpu  # QK^T and PV: 2 FLOPs x 2 matmuls per query head dim per pair
        if plan.num_prefill_tokens:
            t += self._roof(2 * hd_q * plan.prefill_attn_pairs, 2 * self.kv_gpu * b * plan.prefill_kv_tokens)
        if plan.num_decode_tokens:
            t += self._roof(2 * hd_q * plan.decode_ctx_tokens, 2 * self.kv_gpu * b * plan.decode_ctx_tokens)
        t += self.elem_bytes_per_token * T / self.bw
        if self.tp > 1:
            t += 2 * self.allreduce_time(T * self.shape.hidden_size * b)
        return t + self.layer_overhead

    def allreduce_time(self, nbytes: float) -> float:
        """Ring all-reduce: 2 (N - 1) / N x bytes per rank over the intra-stage link."""
        n = self.tp
        return 2 * (n - 1) * self.tp_link.latency_us * 1e-6 + 2 * (n - 1) / n * nbytes / (
            self.tp_link.bandwidth_gbps * 1e9
        )

    def first_extra(self, plan: StepPlan) -> float:
        return 2 * plan.num_tokens * self.shape.hidden_size * self.shape.dtype_bytes / self.bw

    def last_extra(self, plan: StepPlan) -> float:
        s, R = self.shape, plan.num_reqs
        v_gpu = s.vocab_size / self.tp
        lm = self._roof(2 * R * s.hidden_size * v_gpu, (s.hidden_size * v_gpu + R * v_gpu) * s.dtype_bytes)
        sampling = 3 * R * s.vocab_size * 4 / self.bw  # fp32 logits read by softmax/argmax
        return lm + sampling + 2 * plan.num_tokens * s.hidden_size * s.dtype_bytes / self.bw

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        t = self.step_overhead + stage.num_layers * self.layer_time(plan)
        if stage.is_first:
            t += self.first_extra(plan)
        if stage.is_last:
            t += self.last_extra(plan)
        return t

    def link_time(self, nbytes: float) -> float:
        return self.link.latency_us * 1e-6 + nbytes / (self.link.bandwidth_gbps * 1e9)

    def cpu_time(self, kind: str, n: int) -> float:
        c = self.cpu
        if kind == "schedule":
            return (c.schedule_us + c.schedule_per_req_us * n) * 1e-6
        if kind == "update":
            return (c.update_us + c.update_per_req_us * n) * 1e-6
        raise ValueError(f"unknown cpu kind {kind!r}")

    def return_time(self, n: int) -> float:
        return (self.cpu.return_latency_us + self.cpu.relay_per_req_us * n) * 1e-6
