"""Every pipeline policy on the same scenarios: PP 2/4/8 x low/medium/saturating load x chat/32K prompts.

Llama-3.1-70B (the Llama-3-70B shape, 128K context; llama-3.1-70b.json here) on H200 with TP=2
per stage (so ``no-pp`` replicas of 2 GPUs hold the whole model),
analytic cost model. Saturating load sends every request at t=0; low and medium are 25% and 60% of
the request throughput vllm-batch-queue reaches under saturation for that PP size and workload.
Writes results.csv, results.md and policies.png next to this file. Runs in a few minutes on 2 cores:

    .venv/bin/python experiments/policies/run.py
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsim.cli import Parser  # noqa: E402
from ppsim.config import build_scenario  # noqa: E402
from ppsim.metrics.io import atomic_write, save_figure  # noqa: E402
from ppsim.policy.pipelines import BUILDERS  # noqa: E402
from ppsim.run import run_scenario  # noqa: E402

OUT = Path(__file__).resolve().parent
POLICIES = [
    "vllm-sync",
    "vllm-batch-queue",
    "vllm-batch-queue+throttle",
    "vllm-mrv2",
    "vllm-mrv2+cap",
    "sglang-ring",
    "trtllm-slots",
    "trtllm-slots+mbs",
    "llamacpp",
    "no-pp",
]
PP1_ONLY = {"vllm-async"}  # vLLM runs V1 async scheduling at PP=1 only: not in a PP comparison
# label -> (policy, engine knobs): the proposed V1 PP cap (--pp-throttle), the open MRV2 decode-cohort cap
# (vLLM PR #57433, --mrv2-decode-cap), TRT-LLM with max_batch_size = max_num_seqs / PP (set per PP in run_one)
VARIANTS = {
    "vllm-batch-queue+throttle": ("vllm-batch-queue", {"pp_throttle": True}),
    "vllm-mrv2+cap": ("vllm-mrv2", {"mrv2_decode_cap": True}),
    "trtllm-slots+mbs": ("trtllm-slots", {}),
}
PPS = (2, 4, 8)
WORKLOADS = {
    "chat": {"num_prompts": 200, "random_input_len": 512, "random_output_len": 128, "random_range_ratio": 0.5},
    "32k": {"num_prompts": 12, "random_input_len": 32768, "random_output_len": 32, "random_range_ratio": 0.0},
}
LOADS = (("low", 0.25), ("medium", 0.6), ("saturating", None))
FIELDS = [
    "workload",
    "pp",
    "load",
    "request_rate",
    "policy",
    "completed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "pipeline_bubble",
    "wall_s",
]


def run_one(label: str, pp: int, wl: str, rate: float) -> dict:
    policy, knobs = VARIANTS.get(label, (label, {}))
    if label == "trtllm-slots+mbs":
        knobs = {"max_batch_size": 128 // pp}
    if policy == "trtllm-slots" and wl == "32k":  # TRT-LLM chunks only when asked (enable_chunked_prefill)
        knobs = {**knobs, "enable_chunked_prefill": True}
    s = build_scenario(
        None,
        {
            "model": str(OUT / "llama-3.1-70b.json"),
            "hardware": "h200",
            "seed": 0,
            "cluster": {"pipeline_parallel_size": pp, "tensor_parallel_size": 2},
            "engine": {"policy": policy, "max_num_seqs": 128, **knobs},
            "workload": {**WORKLOADS[wl], "request_rate": rate},
        },
    )
    t0 = time.perf_counter()
    sm = run_scenario(s).summary
    return {
        "workload": wl,
        "pp": pp,
        "policy": label,
        "request_rate": rate,
        "completed": sm["completed"],
        "duration_s": round(sm["duration"], 3),
        "request_throughput": round(sm["request_throughput"], 3),
        "output_throughput": round(sm["output_throughput"], 1),
        "mean_ttft_ms": round(sm["mean_ttft_ms"], 1),
        "p99_ttft_ms": round(sm["p99_ttft_ms"], 1),
        "mean_tpot_ms": round(sm["mean_tpot_ms"], 2),
        "pipeline_bubble": round(sm["pipeline_bubble_fraction"], 3),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def sweep() -> list[dict]:
    assert set(BUILDERS) <= set(POLICIES) | PP1_ONLY, "a registered policy is missing from the experiment"
    rows = []
    for wl in WORKLOADS:
        for pp in PPS:
            ref = run_one("vllm-batch-queue", pp, wl, float("inf"))["request_throughput"]
            for load, frac in LOADS:
                rate = float("inf") if frac is None else float(f"{frac * ref:.4g}")
                for pol in POLICIES:
                    row = run_one(pol, pp, wl, rate)
                    row["load"] = load
                    rows.append(row)
                    print(
                        f"{wl:5s} pp={pp} {load:10s} {pol:17s} out={row['output_throughput']:8.1f} tok/s "
                        f"ttft={row['mean_ttft_ms']:9.1f} ms bubble={row['pipeline_bubble']:.3f}",
                        flush=True,
                    )
    return rows


def write_csv(rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("inf" if k == "request_rate" and r[k] == float("inf") else r[k]) for k in FIELDS})
    atomic_write(OUT / "results.csv", buf.getvalue())


def _table(rows: list[dict], wl: str, load: str, key: str, title: str) -> list[str]:
    sel = {(r["policy"], r["pp"]): r for r in rows if r["workload"] == wl and r["load"] == load}
    lines = [
        f"**{title}**",
        "",
        "| policy | " + " | ".join(f"PP={p}" for p in PPS) + " |",
        "|---|" + "---:|" * len(PPS),
    ]
    for pol in POLICIES:
        lines.append(f"| {pol} | " + " | ".join(str(sel[(pol, p)][key]) for p in PPS) + " |")
    return [*lines, ""]


def write_md(rows: list[dict]) -> None:
    lines = [
        "# Pipeline policies compared",
        "",
        "Llama-3.1-70B, H200, TP=2 per stage, analytic cost, max_num_seqs=128, seed 0. "
        "`chat`: 200 prompts, 512 +/- 50% in, 128 +/- 50% out. `32k`: 12 prompts of 32,768 tokens, 32 out. "
        "Low/medium load = 25%/60% of vllm-batch-queue's saturated request throughput; saturating = all at t=0. "
        "Generated by `experiments/policies/run.py` (full data in results.csv).",
        "",
    ]
    for wl in WORKLOADS:
        lines += [f"## {wl}", ""]
        lines += _table(rows, wl, "saturating", "output_throughput", "Output throughput, saturating (tok/s)")
        lines += _table(rows, wl, "saturating", "pipeline_bubble", "Pipeline bubble fraction, saturating")
        lines += _table(rows, wl, "low", "mean_ttft_ms", "Mean TTFT at low load (ms)")
        lines += _table(rows, wl, "medium", "mean_tpot_ms", "Mean TPOT at medium load (ms)")
    atomic_write(OUT / "results.md", "\n".join(lines))


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = [
        ("chat", "saturating", "output_throughput", "chat, saturating: output tok/s"),
        ("chat", "medium", "mean_tpot_ms", "chat, medium load: mean TPOT (ms)"),
        ("32k", "low", "mean_ttft_ms", "32K prompts, low load: mean TTFT (ms)"),
    ]
    for ax, (wl, load, key, title) in zip(axes, panels, strict=True):
        for pol in POLICIES:
            ys = [
                next(
                    r[key]
                    for r in rows
                    if r["workload"] == wl and r["load"] == load and r["policy"] == pol and r["pp"] == p
                )
                for p in PPS
            ]
            ax.plot(PPS, ys, marker="o", label=pol)
        ax.set_xticks(PPS)
        ax.set_xlabel("pipeline stages (GPUs = 2 x PP)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, OUT / "policies.png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """No flags: ``--help`` describes the sweep, anything else is refused before it starts."""
    p = Parser(
        prog="experiments/policies/run.py",
        description=__doc__.split("\n\n")[0],
        epilog=f"Overwrites results.csv, results.md and policies.png in {OUT}.",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parse_args(argv)
    t0 = time.perf_counter()
    rows = sweep()
    write_csv(rows)
    write_md(rows)
    plot(rows)
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.0f} s; wrote results.csv, results.md, policies.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
