"""Expert reads of MoE steps, MLA attention and dtype peaks in the analytic cost model."""

from __future__ import annotations

import numpy as np
import pytest

from ppsim.config import CostConfig, CpuOverheads
from ppsim.cost.analytic import AnalyticCost
from ppsim.cost.base import StageSpec
from ppsim.hardware.presets import DEVICES, LINKS
from ppsim.models.moe import expected_experts_touched
from ppsim.models.shape import ModelShape, load_model
from ppsim.policy.plan import PlanItem, StepPlan, make_plan


def monte_carlo_touched(rng: np.random.Generator, E: int, k: int, T: int, skew: int, trials: int) -> np.ndarray:
    """Distinct experts per trial: T tokens in groups of ``skew`` sharing one top-k draw."""
    out = np.empty(trials)
    draws = T // skew
    for n in range(trials):
        picks = np.argpartition(rng.random((draws, E)), k, axis=1)[:, :k]
        out[n] = np.unique(picks).size
    return out


@pytest.mark.parametrize(
    ("E", "k", "T", "skew"),
    [(256, 8, 1, 1), (256, 8, 8, 1), (256, 8, 64, 1), (8, 2, 3, 1), (128, 8, 16, 1), (256, 8, 32, 4)],
)
def test_expected_experts_matches_monte_carlo(E: int, k: int, T: int, skew: int) -> None:
    rng = np.random.default_rng(1234)
    counts = monte_carlo_touched(rng, E, k, T, skew, trials=1500)
    se = counts.std(ddof=1) / np.sqrt(len(counts)) + 1e-9
    assert abs(expected_experts_touched(E, k, T, skew) - counts.mean()) < 4 * se + 1e-6


def test_expected_experts_limits() -> None:
    assert expected_experts_touched(256, 8, 0) == 0.0
    assert expected_experts_touched(256, 8, 1) == pytest.approx(8.0)
    assert expected_experts_touched(256, 8, 100_000) == pytest.approx(256.0)
    assert expected_experts_touched(256, 8, 2, skew=8) == 8.0  # never fewer than top-k
    assert expected_experts_touched(8, 8, 5) == 8.0


def decode(n: int, ctx: int = 1000) -> StepPlan:
    return make_plan(n, [PlanItem(i, ctx, 1, False, True) for i in range(n)])


def cost(shape: ModelShape, device: str = "h200", tp: int = 8, **cfg: float) -> AnalyticCost:
    return AnalyticCost(shape, DEVICES[device], LINKS["nvlink"], LINKS["nvlink"], tp, CostConfig(**cfg), CpuOverheads())


def test_decode_cost_grows_with_experts_touched() -> None:
    r1 = load_model("deepseek-r1")
    c = cost(r1)
    no_spread = cost(r1, moe_routing_skew=1e9)  # every step touches exactly k experts
    t1, t8 = c.moe_layer_time(decode(1)), c.moe_layer_time(decode(8))
    base = no_spread.moe_layer_time(decode(8)) - no_spread.moe_layer_time(decode(1))
    w_expert, _, _ = c.expert
    expect = (expected_experts_touched(256, 8, 8) - 8) * w_expert / c.bw  # memory-bound expert reads
    # the smooth roofline adds the GEMMs' small compute share on top of the weight reads (0.1% here)
    assert (t8 - t1) - base == pytest.approx(expect, rel=2e-3)
    assert c.experts_touched(8) / c.experts_touched(1) == pytest.approx(57.42 / 8, rel=1e-3)
    # A whole MoE stage: 8 requests cost far more than 1; a dense model's decode barely notices.
    st = StageSpec(1, 31, 61, False, True, 8)
    assert c.stage_time(st, decode(8)) / c.stage_time(st, decode(1)) > 1.3
    llama = cost(load_model("llama-3-70b"))
    st70 = StageSpec(1, 40, 80, False, True, 8)
    assert llama.stage_time(st70, decode(8)) / llama.stage_time(st70, decode(1)) < 1.05


def test_stage_with_dense_and_moe_layers() -> None:
    c = cost(load_model("deepseek-v3"))
    st = StageSpec(0, 0, 8, True, False, 8)
    assert c.layer_split(st) == (3, 5)
    p = decode(4)
    expect = c.step_time(p) + 3 * c.layer_time(p) + 5 * c.moe_layer_time(p) + c.first_extra(p)
    assert c.stage_time(st, p) == pytest.approx(expect, rel=1e-12)
    assert c.moe_layer_time(p) > c.layer_time(p)  # 31 experts' weights vs one 18432-wide MLP


def test_mla_decode_reads_latent_once_for_all_heads() -> None:
    r1 = load_model("deepseek-r1")
    c, c_fp8 = cost(r1), cost(r1.with_dtypes(kv_cache_dtype="fp8"))
    long, short = decode(64, ctx=32_000), decode(64, ctx=100)
    attn = c.moe_layer_time(long) - c.moe_layer_time(short)
    ctx = long.decode_ctx_tokens - short.decode_ctx_tokens
    # memory-bound absorbed MQA: 576 latent values per context token, shared by the 16 heads per GPU
    assert attn == pytest.approx(576 * 2 * ctx / c.attn_bw, rel=0.02)
    attn8 = c_fp8.moe_layer_time(long) - c_fp8.moe_layer_time(short)
    assert attn8 == pytest.approx(attn / 2, rel=0.02)


def test_gemms_use_the_dtype_peak() -> None:
    b200, h100 = DEVICES["b200"], DEVICES["h100-sxm"]
    assert b200.gemm_tflops("fp4") == 9000 and b200.gemm_tflops("fp8") == 4500
    assert h100.gemm_tflops("fp8") == 1979 and h100.gemm_tflops("fp4") == h100.peak_tflops
    assert DEVICES["a100-80gb"].gemm_tflops("fp8") == 312
    assert DEVICES["rtx-pro-6000"].gemm_tflops("fp4") > DEVICES["rtx-pro-6000"].gemm_tflops("fp8")
    # A compute-bound prefill of an FP8 model runs its GEMMs twice as fast as BF16 on H200.
    shape = load_model("llama-3-70b")
    pre = make_plan(0, [PlanItem(0, 0, 8192, True, True)])
    bf16, fp8 = cost(shape, tp=1), cost(shape.with_dtypes(weight_dtype="fp8"), tp=1)
    g_bf16 = sum(bf16._groof(f * 8192, w + a * 8192 * 2) for w, f, a in bf16.gemms)
    g_fp8 = sum(fp8._groof(f * 8192, w + a * 8192 * 2) for w, f, a in fp8.gemms)
    assert g_fp8 == pytest.approx(g_bf16 / 2, rel=0.02)  # compute-bound: the FP8 peak is twice BF16 (+ memory share)
    assert fp8.layer_time(pre) < bf16.layer_time(pre)
