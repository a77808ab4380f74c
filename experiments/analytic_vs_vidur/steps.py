"""Stage step times: the analytic model against the imported Vidur profile, by component.

For every (device, model, TP size) in Vidur's data that ppsim can model, the profile
``ppsim import-vidur`` writes (``--network dgx`` on A100/H100: NCCL inside one NVSwitch node, the
topology of the analytic model's NVLink ``tp_link``; ``pairwise_nvlink`` on A40, which has no
all-reduce data) and the analytic model time the same whole-model stage (PP=1: embedding, every
layer, final norm, lm_head, sampler) over a grid of decode batches (batch x context) and prefill
chunks (chunk x prefix). Both are split into components: gemm, elementwise, attention, allreduce,
step (input preparation), first (embedding), last (final norm, lm_head, sampler).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from calibration.vidur_import import import_vidur
from experiments.analytic_vs_vidur.data import VIDUR_ROOT, cases, rows
from ppsim.config import CostConfig, CpuOverheads
from ppsim.cost.analytic import AnalyticCost
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import TOKEN_OPS, ProfiledCost, read_profile
from ppsim.hardware.presets import DEVICES, LINKS
from ppsim.models.shape import load_model
from ppsim.policy.plan import PlanItem, StepPlan, make_plan

TRAIN_MODELS = ("llama-2-7b", "llama-2-70b", "codellama-34b")  # the GEMM and elementwise fit's models (fit.py)
NETWORK = {"a100": "dgx", "h100": "dgx", "a40": "pairwise_nvlink"}
TP_LINK = {"a100": "nvlink3", "h100": "nvlink", "a40": "pcie"}
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4000)
PREFILL_CHUNKS = (64, 128, 256, 512, 1024, 2048, 4096)
PREFILL_PREFIXES = (0, 1024, 2048)
PARTS = ("gemm", "elementwise", "attention", "allreduce", "step", "first", "last")
GEMMS = ("attn_qkv", "attn_o_proj", "mlp_gate_up", "mlp_down")


def grid() -> list[tuple[str, int, int, StepPlan]]:
    """(kind, batch or chunk, context or prefix, plan) over the comparison grid."""
    out = []
    for B in DECODE_BATCHES:
        for C in DECODE_CONTEXTS:
            out.append(("decode", B, C, make_plan(0, [PlanItem(i, C, 1, False, True) for i in range(B)])))
    for c in PREFILL_CHUNKS:
        for p in PREFILL_PREFIXES:
            if c + p <= 4096:
                out.append(("prefill", c, p, make_plan(0, [PlanItem(0, p, c, True, True)])))
    return out


def tp_sizes(dev: str, vidur_model: str) -> list[int]:
    return sorted(
        {int(r["num_tensor_parallel_workers"]) for r in rows(VIDUR_ROOT / "compute" / dev / vidur_model / "mlp.csv")}
    )


def allreduce_table(dev: str, tp: int) -> list[tuple[float, float]] | None:
    """(bytes, median seconds) of Vidur's all-reduce at ``tp`` GPUs inside one node, as the import keeps them."""
    path = VIDUR_ROOT / "network" / f"{dev}_{NETWORK[dev]}" / "all_reduce.csv"
    if tp < 2 or not path.is_file():
        return None
    pts = sorted(
        (float(r["size"]), float(r["time_stats.all_reduce.median"]) * 1e-3)
        for r in rows(path)
        if int(r["num_workers"]) == tp and r["devices_per_node"] == r["num_workers"]
    )
    return pts or None


def local_scatter(table: list[tuple[float, float]], nbytes: float) -> tuple[float, float]:
    """(min, max) seconds the table measured at sizes near ``nbytes``: within a factor 2, and the two
    measured sizes on either side. Where this range is wide, neighbouring sizes disagree (the table
    is bimodal at small messages, 20 or 60 us on A100), and the profile's value at ``nbytes`` is
    one draw of that noise, not a curve a model can follow."""
    sizes = [x for x, _ in table]
    i = next((k for k, x in enumerate(sizes) if x >= nbytes), len(sizes))
    near = {k for k in range(max(0, i - 2), min(len(sizes), i + 2))}
    near |= {k for k, x in enumerate(sizes) if nbytes / 2 <= x <= 2 * nbytes}
    ys = [table[k][1] for k in near]
    return min(ys), max(ys)


def profile_parts(pc: ProfiledCost, st: StageSpec, plan: StepPlan) -> dict[str, float]:
    """The profiled stage time by component (seconds); the values sum to ``pc.stage_time``."""
    f, L, T, R = pc.f, st.num_layers, plan.num_tokens, plan.num_reqs
    layer = pc.layer_time(plan)
    gemm = sum(f[op].at(T) for op in GEMMS)
    elem = sum(f[op].at(T) for op in TOKEN_OPS if op not in GEMMS) + f["add"].at(T)
    attn = sum(f["attn_prefill"].prefill(it.num_tokens, it.start) for it in plan.items if it.is_prefill)
    if plan.num_decode_tokens:
        attn += f["attn_decode"].decode(plan.num_decode_tokens, plan.decode_ctx_tokens)
    last = sum(f[op].at(T if f[op].x == "tokens" else R) for op in ("final_norm", "lm_head", "sampling"))
    return {
        "gemm": L * gemm,
        "elementwise": L * elem,
        "attention": L * attn,
        "allreduce": L * (layer - gemm - elem - attn),
        "step": f["prepare_inputs"].at(R) if "prepare_inputs" in f else 0.0,
        "first": f["embedding"].at(T),
        "last": last,
    }


def analytic_parts(ac: AnalyticCost, st: StageSpec, plan: StepPlan) -> dict[str, float]:
    p = ac.stage_parts(st, plan)
    return {
        "gemm": p["gemm"],
        "elementwise": p["elementwise"],
        "attention": p["attention"],
        "allreduce": p["allreduce"],
        "step": p["step"] + p["overhead"],
        "first": p["first"],
        "last": p["final_norm"] + p["lm_head"] + p["sampler"],
    }


def compare_case(
    dev: str, preset_dev: str, vidur_model: str, preset: str, tp: int, cost: CostConfig | None = None
) -> tuple[list[dict], list[str]]:
    """One (device, model, TP) over the grid: rows of per-component times (ms) and the import's notes."""
    shape = load_model(preset)
    with tempfile.TemporaryDirectory() as tmp:
        meta, _ = import_vidur(str(VIDUR_ROOT), dev, preset, str(Path(tmp) / "p"), tp=tp, network=NETWORK[dev])
        prof = read_profile(Path(tmp) / "p")
    tp_link = LINKS[TP_LINK[dev]]
    ac = AnalyticCost(shape, DEVICES[preset_dev], tp_link, tp_link, tp, cost or CostConfig(), CpuOverheads())
    pc = ProfiledCost(prof, shape, tp_link, tp, 0.0, tp_link)
    notes = list(meta["missing"])
    if tp > 1 and "all_reduce" not in prof.fits:
        pc.allreduce_time = ac.collective_time  # not measured: both sides use the analytic all-reduce
        notes.append("all-reduce: not measured; the analytic model's on both sides")
    st = StageSpec(0, 0, shape.num_layers, True, True, tp)
    table = allreduce_table(dev, tp) if "all_reduce" in prof.fits else None
    out = []
    for kind, a, b, plan in grid():
        pp, ap = profile_parts(pc, st, plan), analytic_parts(ac, st, plan)
        prof_ms, ana_ms = pc.stage_time(st, plan) * 1e3, ac.stage_time(st, plan) * 1e3
        lo_ms = hi_ms = prof_ms  # the reference with its all-reduce at the lowest / highest nearby measurement
        if table is not None:
            lo, hi = local_scatter(table, plan.num_tokens * shape.hidden_size * shape.dtype_bytes)
            calls = 2 * shape.num_layers * 1e3
            lo_ms, hi_ms = prof_ms + lo * calls - pp["allreduce"] * 1e3, prof_ms + hi * calls - pp["allreduce"] * 1e3
        beyond = max(0.0, ana_ms - hi_ms) + min(0.0, ana_ms - lo_ms)
        split = "train" if preset in TRAIN_MODELS else "held-out"
        row = {
            "device": preset_dev,
            "model": preset,
            "tp": tp,
            "split": split,
            "kind": kind,
            "batch_or_chunk": a,
            "context_or_prefix": b,
            "tokens": plan.num_tokens,
            "profile_ms": round(prof_ms, 4),
            "analytic_ms": round(ana_ms, 4),
            "error": round((ana_ms - prof_ms) / prof_ms, 4),
            "profile_ar_scatter_lo_ms": round(lo_ms, 4),
            "profile_ar_scatter_hi_ms": round(hi_ms, 4),
            "error_beyond_ar_scatter": round(beyond / prof_ms, 4),
        }
        for k in PARTS:
            row[f"profile_{k}_ms"] = round(pp[k] * 1e3, 4)
            row[f"analytic_{k}_ms"] = round(ap[k] * 1e3, 4)
        out.append(row)
    return out, notes


def all_cases() -> list[tuple[str, str, str, str, int]]:
    return [(d, pd, vm, m, tp) for d, pd, vm, m in cases() for tp in tp_sizes(d, vm)]
