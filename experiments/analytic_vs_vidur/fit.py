"""Fit the analytic model's kernel efficiencies once, on Vidur's measurements (training split: TRAIN_MODELS).

The ``mlp.csv`` of the training models (every device, TP size, 1-4096 tokens) fit the GEMM curve
(sharpness and launch cost shared, compute and memory efficiency per device) and the elementwise
kernels' achieved bandwidths (shared); the other models are held out. ``attention.csv``
(Llama-2-70B TP2 on A100, the only one) gives the attention constants, through the importer's own
fits (in-sample). ``network/<dev>_dgx/all_reduce.csv`` (inside one NVSwitch node) the all-reduce per
device, ``cpu_overheads/<dev>.csv`` input preparation and the sampler per device (in-sample).
Writes ``fit.json`` beside this file; the numbers are copied, rounded, into ``ppsim/cost/kernels.py``
(``KernelFit``, ``DEVICE_FITS``).
Run: PPSIM_VIDUR_ROOT=/path/to/vidur-profiling python experiments/analytic_vs_vidur/fit.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from calibration.vidur_import import DEVICE_PRESET, import_vidur  # noqa: E402
from experiments.analytic_vs_vidur.data import (  # noqa: E402
    FIX,
    VIDUR_ROOT,
    cases,
    gemm_table,
    int_cell,
    main_of,
    num_cell,
    rows,
)
from experiments.analytic_vs_vidur.steps import TP_LINK, TRAIN_MODELS  # noqa: E402
from ppsim.cost.kernels import FIT, SHARPNESS_REF_S, gemm_rows  # noqa: E402
from ppsim.cost.layers import attention_gemms, kv_heads_per_gpu, mlp_gemms  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.hardware.presets import DEVICES, LINKS  # noqa: E402
from ppsim.metrics.io import atomic_write  # noqa: E402
from ppsim.models.shape import load_model  # noqa: E402

DEVS = ("a100", "h100", "a40")

OUT = Path(__file__).parent
# Training split (TRAIN_MODELS): GEMM and elementwise curves are fitted on these models (every device) and
# checked on the others; all-reduce and host costs are per device and in-sample (not model-dependent).
NETWORK = {"a100": "a100_dgx", "h100": "h100_dgx"}
CPU = {"a100": "a100", "h100": "a100", "a40": "a40"}  # Vidur has no H100 host data: A100's
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEM_OPS = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "act",
    "add": "add",
    "emb": "emb",
}


def tile_rows(T: np.ndarray, small_eff: float) -> np.ndarray:
    """:func:`ppsim.cost.kernels.gemm_rows` over an array, with the small tile's efficiency as a parameter."""
    big, small = FIT.gemm_tile_rows, FIT.gemm_small_tile_rows
    padded = np.minimum(np.ceil(T / big) * big, np.ceil(T / small) * small / small_eff)
    return np.where(T <= big, T, padded)


def training_cases() -> list[tuple[str, str, str, str]]:
    """:func:`cases` of the training models whose ``mlp.csv`` has rows; refused if none has (nothing to fit)."""
    out = [c for c in cases() if c[3] in TRAIN_MODELS and rows(VIDUR_ROOT / "compute" / c[0] / c[2] / "mlp.csv")]
    if not out:
        raise PPSimError(f"{VIDUR_ROOT} has no mlp.csv rows of the training models {', '.join(TRAIN_MODELS)}; {FIX}")
    return out


def _gemm_samples() -> list[tuple[float, ...]]:
    """(device index, FLOPs per token, tokens, bytes, peak flop/s, peak bytes/s, measured s) per GEMM
    measurement of a training model."""
    out = []
    for dev, preset_dev, vidur_model, preset in training_cases():
        shape, d = load_model(preset), DEVICES[preset_dev]
        for tp, T, r in gemm_table(VIDUR_ROOT / "compute" / dev / vidur_model / "mlp.csv"):
            gemms = attention_gemms(shape, tp) + mlp_gemms(shape, shape.intermediate_size, tp)
            for op, (w, fl, act) in zip(GEMM_OPS, gemms, strict=True):
                out.append(
                    (
                        DEVS.index(dev),
                        fl,
                        T,
                        w + act * T * shape.dtype_bytes,
                        d.peak_tflops * 1e12,
                        d.hbm_bandwidth_gbps * 1e9,
                        r[op],
                    )
                )
    return out


def fit_gemm() -> dict[str, object]:
    """Shared sharpness, launch cost and small-tile efficiency; compute and memory efficiency per device."""
    s = np.array(_gemm_samples())
    k, fl, T, by, pf, pb, y = s.T
    k = k.astype(int)
    n = len(DEVS)

    def pred(x: np.ndarray) -> np.ndarray:
        p0, a0, small_eff, growth = x[0], x[1], x[2], x[3]
        ce, me = x[4 : 4 + n][k], x[4 + n :][k]
        c, m = fl * tile_rows(T, small_eff) / (pf * ce), by / (pb * me)
        hi, lo = np.maximum(c, m), np.minimum(c, m)
        p = p0 * (hi / SHARPNESS_REF_S) ** growth  # ppsim.cost.kernels.smooth_roof
        return a0 * 1e-6 + hi * (1 + (lo / hi) ** p) ** (1 / p)

    r = least_squares(
        lambda x: np.log(pred(x) / y),
        [2.0, 5.0, 0.85, 0.0] + [0.7] * n + [0.8] * n,
        bounds=([1.0, 0.0, 0.3, -1.0] + [0.2] * 2 * n, [20.0, 50.0, 1.0, 1.0] + [1.2] * 2 * n),
        loss="soft_l1",
    )
    grid = np.arange(1, 4097, dtype=float)
    mirror = [gemm_rows(t, replace(FIT, gemm_small_tile_eff=r.x[2])) for t in grid]
    assert np.allclose(tile_rows(grid, r.x[2]), mirror), "tile_rows and ppsim.cost.kernels.gemm_rows disagree"
    err = np.abs(pred(r.x) / y - 1)
    return {
        "gemm_sharpness": r.x[0],
        "gemm_launch_us": r.x[1],
        "gemm_small_tile_eff": r.x[2],
        "gemm_sharpness_growth": r.x[3],
        "tile_rows": [FIT.gemm_tile_rows, FIT.gemm_small_tile_rows],
        "per_device": {
            DEVICE_PRESET[d]: {"compute_eff": r.x[4 + i], "memory_eff": r.x[4 + n + i]} for i, d in enumerate(DEVS)
        },
        "n": len(y),
        "median_abs_err": float(np.median(err)),
        "p90_abs_err": float(np.percentile(err, 90)),
    }


def fit_elementwise() -> dict[str, float]:
    """Launch floor; per kernel kind, the achieved share of the HBM peak and the time one thread block takes
    to stream one row (token), ns per KB (bytes as the model counts them)."""
    kinds = sorted(set(ELEM_OPS.values()))
    pts: list[tuple[int, float, float, float]] = []
    for dev, preset_dev, vidur_model, preset in training_cases():
        shape, d = load_model(preset), DEVICES[preset_dev]
        h, b = shape.hidden_size, shape.dtype_bytes
        for tp, T, r in gemm_table(VIDUR_ROOT / "compute" / dev / vidur_model / "mlp.csv"):
            q = shape.q_dim // tp
            kv = kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim
            per_tok = {
                "norm": 2 * h * b,
                "rope": 2 * (q + kv) * b,
                "act": 3 * shape.intermediate_size / tp * b,
                "add": 3 * h * b,
                "emb": 2 * h * b,
            }
            for op, kind in ELEM_OPS.items():
                pts.append((kinds.index(kind), per_tok[kind], per_tok[kind] * T / (d.hbm_bandwidth_gbps * 1e9), r[op]))
    k, row, t_peak, y = np.array(pts).T
    k = k.astype(int)
    n = len(kinds)

    def resid(x: np.ndarray) -> np.ndarray:
        one_row = x[0] * 1e-6 + row / 1024 * x[1 + n :][k] * 1e-9
        return np.log(np.maximum(one_row, t_peak / x[1 : 1 + n][k]) / y)

    lo, hi = [0.0] + [0.05] * n + [0.0] * n, [50.0] + [1.0] * n + [1e4] * n
    r = least_squares(resid, [2.0] + [0.5] * n + [100.0] * n, bounds=(lo, hi), loss="soft_l1")
    err = np.abs(np.expm1(resid(r.x)))
    return {
        "floor_us": r.x[0],
        **{f"{kind}_eff": r.x[1 + i] for i, kind in enumerate(kinds)},
        **{f"{kind}_row_ns_per_kb": r.x[1 + n + i] for i, kind in enumerate(kinds)},
        "n": len(y),
        "median_abs_err": float(np.median(err)),
    }


def fit_attention() -> dict[str, float]:
    """Convert the importer's cross-validated attention fits (A100 Llama-2-70B TP2) to efficiencies."""
    shape, tp, d = load_model("llama-2-70b"), 2, DEVICES["a100-80gb"]
    with tempfile.TemporaryDirectory() as tmp:
        meta, fits = import_vidur(str(VIDUR_ROOT), "a100", "llama-2-70b", str(Path(tmp) / "p"), tp=tp)
    if any(m.startswith("attention:") for m in meta["missing"]):  # the analytic model's own, not a measurement
        where = VIDUR_ROOT / "compute" / "a100" / meta["vidur_model"] / "attention.csv"
        raise PPSimError(f"{where}: no attention at TP {tp}, the source of the attention constants; {FIX}")
    pre, dec = fits["attn_prefill"]["coef"], fits["attn_decode"]["coef"]
    q, kv, b = shape.q_dim // tp, kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim, shape.dtype_bytes
    peak, bw = d.peak_tflops * 1e12, d.hbm_bandwidth_gbps * 1e9
    reshape_bytes = 2 * b * (2 * q + 2 * kv)
    # causal pairs c p + c^2 / 2 at 4 q FLOPs each: the c^2 coefficient is 2 q / F
    return {
        "attn_compute_eff": 2 * q / (peak * pre["cc"]),
        "attn_memory_eff": 2 * kv * b / (bw * dec["ctx"]),
        "attn_call_us": (pre["call"] + dec["call"]) / 2 * 1e6,
        "reshape_eff": reshape_bytes / (bw * pre["tok"]),
    }


def fit_allreduce(dev: str) -> dict[str, dict[str, float]]:
    """Call cost and bus efficiency per TP size (2, 4, 8 GPUs in one node), each size octave weighted alike.

    The table's sizes are evenly spaced up to 64 MB, so 90% of its rows are above 4 MB, a size only
    large prefill chunks reach; weighting each octave of message size equally makes the fit cover the
    8 KB - 2 MB that decode steps send as much as the large messages.
    """
    link = LINKS[TP_LINK[dev]]
    path = VIDUR_ROOT / "network" / NETWORK[dev] / "all_reduce.csv"
    pts = [
        (int_cell(r, "num_workers"), num_cell(r, "size"), num_cell(r, "time_stats.all_reduce.median") * 1e-3)
        for r in rows(path)
        if int_cell(r, "num_workers") in (2, 4, 8) and r["num_workers"] == r.get("devices_per_node")
    ]
    out = {}
    for N in (2, 4, 8):
        if not any(n == N for n, _, _ in pts):
            raise PPSimError(f"{path} has no all-reduce of {N} GPUs inside one node; {FIX}")
        size, y = np.array([(s, t) for n, s, t in pts if n == N]).T
        octave = np.floor(np.log2(size))
        w = np.sqrt(1.0 / np.array([np.sum(octave == o) for o in octave]))

        ring = 2 * (N - 1) / N * size / (link.bandwidth_gbps * 1e9)

        def resid(x: np.ndarray, ring: np.ndarray = ring, y: np.ndarray = y, w: np.ndarray = w) -> np.ndarray:
            return w * np.log((x[0] * 1e-6 + ring / x[1]) / y)

        r = least_squares(resid, [30.0, 0.6], bounds=([0.0, 0.05], [500.0, 1.5]), loss="soft_l1")
        out[str(N)] = {"allreduce_call_us": r.x[0], "allreduce_bus_eff": r.x[1], "n": len(y)}
    return out


def fit_cpu(dev: str) -> dict[str, float]:
    path = VIDUR_ROOT / "cpu_overheads" / f"{CPU[dev]}.csv"
    rs = rows(path)
    if len({r.get("batch_size") for r in rs}) < 2:
        raise PPSimError(f"{path} has fewer than two batch sizes to fit a line to; {FIX}")
    B = np.array([num_cell(r, "batch_size") for r in rs])
    out = {}
    for name, col in (("prepare", "prepare_inputs_e2e_median"), ("sampler", "sampler_e2e_median")):
        c1, c0 = np.polyfit(B, [num_cell(r, col) * 1e3 for r in rs], 1)  # ms -> us
        out[f"{name}_us"], out[f"{name}_per_req_us"] = c0, c1
    return out


def main() -> None:
    g = fit_gemm()
    res = {
        "source": str(VIDUR_ROOT),
        "train_models": TRAIN_MODELS,
        "gemm": g,
        "elementwise": fit_elementwise(),
        "attention": fit_attention(),
        "all_reduce": {DEVICE_PRESET[d]: fit_allreduce(d) for d in DEVS if d in NETWORK},
        "cpu": {DEVICE_PRESET[d]: fit_cpu(d) for d in DEVS},
    }
    text = json.dumps(res, indent=1, default=float)
    atomic_write(OUT / "fit.json", text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main_of(__doc__, main))
