"""The analytic roofline: per operator, max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth).

Per decoder layer on one GPU of a TP group (:mod:`ppsim.cost.layers` gives the GEMMs): attention
projections (GQA: QKV, O; MLA: q_a, q_b, kv_a, kv_b, o), then either the dense MLP (gate+up, down)
or the MoE block (router, shared experts, routed experts); GEMM weights are read once per step.
Then attention itself, elementwise work (norms, RoPE, residual adds, SiLU) and two ring
all-reduces when tp > 1. The first stage adds the embedding gather, the last the final norm,
lm_head (one row per request in the step, as vLLM computes logits only at sampled positions) and
sampling. Every stage pays ``step_overhead_us`` per step and ``layer_overhead_us`` per layer.

MoE: the routed experts read the weights of the experts the step's tokens touch,
``E x (1 - (1 - k/E)^T)`` in expectation (:func:`ppsim.models.moe.expected_experts_touched`, with
``moe_routing_skew``), and compute ``T x k`` expert MLPs. So a decode micro-batch of 8 requests
reads far more expert bytes than one of 1, and the cost depends on how micro-batches are formed.

MLA (vLLM ``MLACommonImpl``, vllm/v1/attention/backends/mla/common.py): decode runs the absorbed
form, MQA over the cached latent: per context token and head 2 x (kv_lora_rank + rope) FLOPs for
scores and 2 x kv_lora_rank for the weighted sum, reading the latent once for all heads; the
absorption of W_UK / W_UV costs what ``kv_b_proj`` costs per token. Prefill up-projects the context's
latents with ``kv_b_proj`` and runs ordinary attention with qk dim nope + rope and v dim v_head_dim.

GEMMs run at the device's peak for the weight dtype (FP8 / FP4 tensor cores where present);
attention runs at the BF16 peak.
"""

from __future__ import annotations

from ppsim.config import CostConfig, CpuOverheads
from ppsim.cost.base import StageSpec
from ppsim.cost.layers import (
    attention_gemms,
    expert_gemm,
    heads_per_gpu,
    kv_heads_per_gpu,
    mlp_gemms,
    router_gemm,
)
from ppsim.hardware.presets import DeviceSpec, LinkSpec
from ppsim.models.moe import expected_experts_touched
from ppsim.models.shape import ModelShape
from ppsim.policy.plan import StepPlan

__all__ = ["AnalyticCost", "kv_heads_per_gpu"]


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
        self.gemm_flops = device.gemm_tflops(shape.weight_dtype) * 1e12 * cost.compute_efficiency
        self.bw = device.hbm_bandwidth_gbps * 1e9 * cost.memory_efficiency
        self.link = link
        self.tp_link = tp_link
        self.layer_overhead = cost.layer_overhead_us * 1e-6
        self.step_overhead = cost.step_overhead_us * 1e-6
        self.skew = cost.moe_routing_skew
        h, b = shape.hidden_size, shape.dtype_bytes
        self.kv_b = shape.kv_dtype_bytes
        self.q_gpu = shape.q_dim // tp if shape.num_heads >= tp else shape.head_dim
        self.kv_gpu = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
        self.i_gpu = shape.intermediate_size / tp
        attn = attention_gemms(shape, tp)
        # Weight bytes per GPU per layer of each GEMM; FLOPs per token of each GEMM.
        self.gemms = attn + mlp_gemms(shape, shape.intermediate_size, tp)
        self.elem_bytes_per_token = b * (10 * h + 2 * (self.q_gpu + self.kv_gpu) + 3 * self.i_gpu)
        if shape.attention == "mla":
            self.hg = heads_per_gpu(shape, tp)
            self.elem_bytes_per_token = b * (10 * h + 2 * self.hg * shape.head_dim + 2 * shape.kv_dim + 3 * self.i_gpu)
        if shape.is_moe:
            k, E = shape.num_experts_per_tok, shape.n_routed_experts
            self.moe_gemms = attn + [router_gemm(shape)]
            if shape.shared_expert_intermediate_size:
                self.moe_gemms += mlp_gemms(shape, shape.shared_expert_intermediate_size, tp)
            self.expert = expert_gemm(shape, tp)
            moe_i = (k * shape.moe_intermediate_size + shape.shared_expert_intermediate_size) / tp
            self.moe_elem_bytes_per_token = self.elem_bytes_per_token + b * (3 * (moe_i - self.i_gpu) + 2 * E)
        self.has_dense = shape.num_moe_layers() < shape.num_layers
        self._touched: dict[int, float] = {}
        self._split: dict[tuple[int, int], tuple[int, int]] = {}
        self._memo: tuple[StepPlan | None, float, float] = (None, 0.0, 0.0)

    def _roof(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops, nbytes / self.bw)

    def _groof(self, flops: float, nbytes: float) -> float:
        return max(flops / self.gemm_flops, nbytes / self.bw)

    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct routed experts a step of ``num_tokens`` tokens reads, per MoE layer."""
        t = self._touched.get(num_tokens)
        if t is None:
            s = self.shape
            t = self._touched[num_tokens] = expected_experts_touched(
                s.n_routed_experts, s.num_experts_per_tok, num_tokens, self.skew
            )
        return t

    def _attention_time(self, plan: StepPlan, t: float) -> float:
        """``t`` plus the attention (QK^T, softmax, PV) of the step's prefill and decode tokens."""
        b, kvb = self.shape.dtype_bytes, self.kv_b
        if self.shape.attention == "mla":
            s, hg = self.shape, self.hg
            lat = s.kv_dim  # kv_lora_rank + qk_rope_head_dim
            if plan.num_prefill_tokens:
                kv = plan.prefill_kv_tokens
                up = 2 * s.kv_lora_rank * hg * (s.qk_nope_head_dim + s.v_head_dim) * (kv - plan.num_prefill_tokens)
                fl = 2 * hg * (s.head_dim + s.v_head_dim) * plan.prefill_attn_pairs + up
                t += self._roof(fl, lat * kvb * kv + 2 * hg * (s.head_dim + s.v_head_dim) * b * kv)
            if plan.num_decode_tokens:
                ctx = plan.decode_ctx_tokens
                t += self._roof(2 * hg * (lat + s.kv_lora_rank) * ctx, lat * kvb * ctx)
            return t
        hd_q = 2 * self.q_gpu  # QK^T and PV: 2 FLOPs x 2 matmuls per query head dim per pair
        if plan.num_prefill_tokens:
            t += self._roof(2 * hd_q * plan.prefill_attn_pairs, 2 * self.kv_gpu * kvb * plan.prefill_kv_tokens)
        if plan.num_decode_tokens:
            t += self._roof(2 * hd_q * plan.decode_ctx_tokens, 2 * self.kv_gpu * kvb * plan.decode_ctx_tokens)
        return t

    def _layer(self, plan: StepPlan, gemms: list, elem_bytes_per_token: float, extra: float = 0.0) -> float:
        """One layer on one GPU: its GEMMs, attention, elementwise work, TP all-reduces and launches."""
        T = plan.num_tokens
        b = self.shape.dtype_bytes
        t = extra
        for w_bytes, flops_per_tok, act_per_tok in gemms:
            t += self._groof(flops_per_tok * T, w_bytes + act_per_tok * T * b)
        t = self._attention_time(plan, t)
        t += elem_bytes_per_token * T / self.bw
        if self.tp > 1:
            t += 2 * self.allreduce_time(T * self.shape.hidden_size * b)
        return t + self.layer_overhead

    def layer_time(self, plan: StepPlan) -> float:
        """Seconds for one dense decoder layer on one GPU."""
        return self._layer(plan, self.gemms, self.elem_bytes_per_token)

    def moe_layer_time(self, plan: StepPlan) -> float:
        """Seconds for one MoE decoder layer on one GPU: attention, router, shared and touched experts."""
        w_exp, fl_exp, act_exp = self.expert
        routed = plan.num_tokens * self.shape.num_experts_per_tok
        experts = self._groof(fl_exp * routed,
                              self.experts_touched(plan.num_tokens) * w_exp + act_exp * routed * self.shape.dtype_bytes)
        return self._layer(plan, self.moe_gemms, self.moe_elem_bytes_per_token, experts)

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

    def layer_split(self, stage: StageSpec) -> tuple[int, int]:
        """(dense layers, MoE layers) of a stage."""
        key = (stage.start_layer, stage.end_layer)
        split = self._split.get(key)
        if split is None:
            moe = self.shape.num_moe_layers(stage.start_layer, stage.end_layer)
            split = self._split[key] = (stage.num_layers - moe, moe)
        return split

    def _layer_times(self, plan: StepPlan) -> tuple[float, float]:
        """(dense, MoE) layer seconds of ``plan``; the last plan's are kept, as every stage times it."""
        last, dense, moe = self._memo
        if last is not plan:
            dense = self.layer_time(plan) if self.has_dense else 0.0
            moe = self.moe_layer_time(plan) if self.shape.is_moe else 0.0
            self._memo = (plan, dense, moe)
        return dense, moe

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        n_dense, n_moe = self.layer_split(stage)
        dense, moe = self._layer_times(plan)
        t = self.step_overhead + n_dense * dense
        if n_moe:
            t += n_moe * moe
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
        """Last stage -> engine core message with the sampled tokens."""
        return self.cpu.return_latency_us * 1e-6

    def launch_time(self, n: int) -> float:
        return self.cpu.launch_latency_us * 1e-6

    def relay_time(self, n: int) -> float:
        """Engine-core CPU to relay ``n`` new token ids to the first stage (see ppsim.policy.returnpath)."""
        return self.cpu.relay_per_req_us * n * 1e-6
