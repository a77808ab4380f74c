"""The analytic model: every kernel of a step timed from FLOPs and bytes (:mod:`ppsim.cost.kernels`).

Per decoder layer on one GPU of a TP group (:mod:`ppsim.cost.layers` gives the GEMMs): attention
projections (GQA: QKV, O; MLA: q_a, q_b, kv_a, kv_b, o), then either the dense MLP (gate+up, down)
or the MoE block (router, shared experts, routed experts); GEMM weights are read once per step.
Each GEMM is a smooth roofline of its compute and memory times. Then attention itself with its KV
reshapes, the elementwise kernels (two RMSNorms, RoPE, SiLU, two residual adds) each at its
measured share of the HBM bandwidth, and two NCCL all-reduces when tp > 1 (a fixed call cost plus
the ring's bytes). Every kernel costs at least a launch floor. The first stage adds the embedding
gather, the last the final norm, lm_head (one row per request in the step, as vLLM computes logits
only at sampled positions) and the sampler. Every stage pays input preparation per step
(``step_overhead_us`` plus a part per request) and ``layer_overhead_us`` per layer (0 by default:
the kernel floors are the launches). The efficiencies and fixed costs are fitted once to Vidur's
measured A100 kernels and checked on H100 and A40 (docs/analytic-model.md).

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
from ppsim.cost.kernels import FIT, KernelFit, device_fit, gemm_rows, smooth_roof
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
        fit: KernelFit = FIT,
    ) -> None:
        self.shape, self.tp, self.cpu, self.fit = shape, tp, cpu, fit
        self.dev = dev = device_fit(device.name)
        self.ar_fit = dev.allreduce_fit(tp)
        ce = cost.compute_efficiency if cost.compute_efficiency is not None else dev.compute_eff
        me = cost.memory_efficiency if cost.memory_efficiency is not None else dev.memory_eff
        self.peak_bw = device.hbm_bandwidth_gbps * 1e9
        self.flops = device.peak_tflops * 1e12 * ce
        self.gemm_flops = device.gemm_tflops(shape.weight_dtype) * 1e12 * ce
        self.bw = self.peak_bw * me
        self.attn_flops = device.peak_tflops * 1e12 * fit.attn_compute_eff
        self.attn_bw = self.peak_bw * fit.attn_memory_eff
        self.p, self.p_growth = fit.gemm_sharpness, fit.gemm_sharpness_growth
        self.floor, self.gemm_launch = fit.floor_us * 1e-6, fit.gemm_launch_us * 1e-6
        self.elem_fit = {}  # kind -> (share of the HBM peak, seconds per byte of one row)
        for kind in ("norm", "rope", "act", "add", "emb"):
            eff, row_ns_per_kb = fit.elementwise(kind)
            self.elem_fit[kind] = (eff, row_ns_per_kb * 1e-9 / 1024)
        self.link = link
        self.tp_link = tp_link
        self.layer_overhead = cost.layer_overhead_us * 1e-6
        self.step_overhead = (cost.step_overhead_us if cost.step_overhead_us is not None else dev.prepare_us) * 1e-6
        self.skew = cost.moe_routing_skew
        h, b = shape.hidden_size, shape.dtype_bytes
        self.kv_b = shape.kv_dtype_bytes
        self.q_gpu = shape.q_dim // tp if shape.num_heads >= tp else shape.head_dim
        self.kv_gpu = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
        self.i_gpu = shape.intermediate_size / tp
        attn = attention_gemms(shape, tp)
        # Weight bytes per GPU per layer of each GEMM; FLOPs per token of each GEMM.
        self.gemms = attn + mlp_gemms(shape, shape.intermediate_size, tp)
        rope = self.q_gpu + self.kv_gpu
        norms = [h, h]
        if shape.attention == "mla":
            self.hg = heads_per_gpu(shape, tp)
            rope = (self.hg + 1) * shape.qk_rope_head_dim
            norms += [shape.kv_lora_rank] + ([shape.q_lora_rank] if shape.q_lora_rank else [])
        # Elementwise kernels of a layer: (bytes per token, kernel kind).
        common = [(2 * n * b, "norm") for n in norms] + [(2 * rope * b, "rope"), (3 * h * b, "add"), (3 * h * b, "add")]
        self.elementwise = common + [(3 * self.i_gpu * b, "act")]
        # KV reshapes around attention (Vidur's attn_input_reshape / attn_output_reshape), bytes per token
        self.reshape_bytes = 2 * b * (2 * self.q_gpu + 2 * self.kv_gpu)
        if shape.is_moe:
            k, E = shape.num_experts_per_tok, shape.n_routed_experts
            self.moe_gemms = attn + [router_gemm(shape)]
            if shape.shared_expert_intermediate_size:
                self.moe_gemms += mlp_gemms(shape, shape.shared_expert_intermediate_size, tp)
            self.expert = expert_gemm(shape, tp)
            moe_i = (k * shape.moe_intermediate_size + shape.shared_expert_intermediate_size) / tp
            self.moe_elementwise = common + [(3 * moe_i * b, "act"), (2 * E * 4, "act")]  # SiLU; router top-k, fp32
        self.has_dense = shape.num_moe_layers() < shape.num_layers
        self._touched: dict[int, float] = {}
        self._split: dict[tuple[int, int], tuple[int, int]] = {}
        self._memo: tuple[StepPlan | None, float, float] = (None, 0.0, 0.0)

    def _groof(self, flops: float, nbytes: float) -> float:
        """One GEMM kernel: a launch cost plus the smooth roofline of its compute and memory times."""
        return self.gemm_launch + smooth_roof(flops / self.gemm_flops, nbytes / self.bw, self.p, self.p_growth)

    def _elem(self, per_tok: float, tokens: int, kind: str) -> float:
        """One elementwise kernel of ``kind`` over ``tokens`` rows of ``per_tok`` bytes: the HBM time at the
        kind's achieved share of the peak, at least a launch floor plus one row streamed by one thread block
        (vLLM's norm, RoPE and SiLU kernels run a block per token, so a few tokens take one row's time)."""
        eff, row_s_per_byte = self.elem_fit[kind]
        return max(self.floor + per_tok * row_s_per_byte, per_tok * tokens / (self.peak_bw * eff))

    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct routed experts a step of ``num_tokens`` tokens reads, per MoE layer."""
        t = self._touched.get(num_tokens)
        if t is None:
            s = self.shape
            t = self._touched[num_tokens] = expected_experts_touched(
                s.n_routed_experts, s.num_experts_per_tok, num_tokens, self.skew
            )
        return t

    def _attention_time(self, plan: StepPlan) -> float:
        """Attention (QK^T, softmax, PV) of the step's prefill and decode tokens, with its KV reshapes."""
        b, kvb, call = self.shape.dtype_bytes, self.kv_b, self.fit.attn_call_us * 1e-6
        t = 0.0
        if self.shape.attention == "mla":
            s, hg = self.shape, self.hg
            lat = s.kv_dim  # kv_lora_rank + qk_rope_head_dim
            if plan.num_prefill_tokens:
                kv = plan.prefill_kv_tokens
                up = 2 * s.kv_lora_rank * hg * (s.qk_nope_head_dim + s.v_head_dim) * (kv - plan.num_prefill_tokens)
                fl = 2 * hg * (s.head_dim + s.v_head_dim) * plan.prefill_attn_pairs + up
                t += call + max(
                    fl / self.attn_flops,
                    (lat * kvb * kv + 2 * hg * (s.head_dim + s.v_head_dim) * b * kv) / self.attn_bw,
                )
            if plan.num_decode_tokens:
                ctx = plan.decode_ctx_tokens
                t += call + max(2 * hg * (lat + s.kv_lora_rank) * ctx / self.flops, lat * kvb * ctx / self.attn_bw)
            return t
        reshape = self.reshape_bytes / (self.peak_bw * self.fit.reshape_eff)
        if plan.num_prefill_tokens:
            t += call + 4 * self.q_gpu * plan.prefill_attn_pairs / self.attn_flops + reshape * plan.num_prefill_tokens
        if plan.num_decode_tokens:
            ctx = plan.decode_ctx_tokens
            t += call + 2 * self.kv_gpu * kvb * ctx / self.attn_bw + reshape * plan.num_decode_tokens
        return t

    def layer_parts(self, plan: StepPlan, moe: bool = False) -> dict[str, float]:
        """Seconds of one layer on one GPU by component: gemm, elementwise, attention, allreduce, overhead."""
        T = plan.num_tokens
        b = self.shape.dtype_bytes
        gemm, rows = 0.0, gemm_rows(T, self.fit)
        for w_bytes, flops_per_tok, act_per_tok in self.moe_gemms if moe else self.gemms:
            gemm += self._groof(flops_per_tok * rows, w_bytes + act_per_tok * T * b)
        if moe:
            w_exp, fl_exp, act_exp = self.expert
            routed = T * self.shape.num_experts_per_tok
            gemm += self._groof(fl_exp * routed, self.experts_touched(T) * w_exp + act_exp * routed * b)
        kernels = self.moe_elementwise if moe else self.elementwise
        elem = sum(self._elem(per_tok, T, kind) for per_tok, kind in kernels)
        ar = 2 * self.collective_time(T * self.shape.hidden_size * b) if self.tp > 1 else 0.0
        return {
            "gemm": gemm,
            "elementwise": elem,
            "attention": self._attention_time(plan),
            "allreduce": ar,
            "overhead": self.layer_overhead,
        }

    def layer_time(self, plan: StepPlan) -> float:
        """Seconds for one dense decoder layer on one GPU."""
        return sum(self.layer_parts(plan).values())

    def moe_layer_time(self, plan: StepPlan) -> float:
        """Seconds for one MoE decoder layer on one GPU: attention, router, shared and touched experts."""
        return sum(self.layer_parts(plan, moe=True).values())

    def allreduce_time(self, nbytes: float) -> float:
        """Ring all-reduce: 2 (N - 1) / N x bytes per rank over the intra-stage link."""
        n = self.tp
        return 2 * (n - 1) * self.tp_link.latency_us * 1e-6 + 2 * (n - 1) / n * nbytes / (
            self.tp_link.bandwidth_gbps * 1e9
        )

    def collective_time(self, nbytes: float) -> float:
        """One TP all-reduce as NCCL runs it: call cost plus the ring's bytes at a bus efficiency, per group size."""
        n, (call_us, bus_eff) = self.tp, self.ar_fit
        return call_us * 1e-6 + 2 * (n - 1) / n * nbytes / (self.tp_link.bandwidth_gbps * 1e9 * bus_eff)

    def step_time(self, plan: StepPlan) -> float:
        """Per stage per step: input preparation (host), fixed plus per request."""
        return self.step_overhead + self.dev.prepare_per_req_us * 1e-6 * plan.num_reqs

    def first_extra(self, plan: StepPlan) -> float:
        """The embedding gather."""
        return self._elem(2 * self.shape.hidden_size * self.shape.dtype_bytes, plan.num_tokens, "emb")

    def last_parts(self, plan: StepPlan) -> dict[str, float]:
        """Final norm over the step's tokens, lm_head over one row per request, and the sampler."""
        s, R, b, f = self.shape, plan.num_reqs, self.shape.dtype_bytes, self.dev
        v_gpu = s.vocab_size / self.tp
        return {
            "final_norm": self._elem(2 * s.hidden_size * b, plan.num_tokens, "norm"),
            "lm_head": self._groof(
                2 * gemm_rows(R, self.fit) * s.hidden_size * v_gpu,
                (s.hidden_size * v_gpu + R * (s.hidden_size + v_gpu)) * b,
            ),
            "sampler": (f.sampler_us + f.sampler_per_req_us * R) * 1e-6,
        }

    def last_extra(self, plan: StepPlan) -> float:
        return sum(self.last_parts(plan).values())

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
        t = self.step_time(plan) + n_dense * dense
        if n_moe:
            t += n_moe * moe
        if stage.is_first:
            t += self.first_extra(plan)
        if stage.is_last:
            t += self.last_extra(plan)
        return t

    def stage_parts(self, stage: StageSpec, plan: StepPlan) -> dict[str, float]:
        """:meth:`stage_time` by component (seconds); the values sum to it."""
        n_dense, n_moe = self.layer_split(stage)
        out = {"step": self.step_time(plan)}
        for n, moe in ((n_dense, False), (n_moe, True)):
            if n:
                for k, v in self.layer_parts(plan, moe).items():
                    out[k] = out.get(k, 0.0) + n * v
        out["first"] = self.first_extra(plan) if stage.is_first else 0.0
        out.update({k: v if stage.is_last else 0.0 for k, v in self.last_parts(plan).items()})
        return out

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
