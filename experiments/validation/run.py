"""Validation matrix: the live CPU engine vs the simulator (profiled tiny model) on 9 scenarios.

PP 1 and 2; vllm-sync, vllm-batch-queue (throttled and not), sglang-ring; light, near-saturation and
offline load; one long prompt with chunked pipeline prefill. Writes results.md, results.csv and
errors.png here, and each scenario's full validation under runs/ (not committed).
Run: .venv/bin/python experiments/validation/run.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

import numpy as np

from ppsim.config import build_scenario, step_budget_fields
from ppsim.metrics.io import atomic_write, save_figure
from ppsim.validate.run import validate

HERE = Path(__file__).parent
SHIPPED_PROFILE = str(HERE.parents[1] / "profiles" / "tiny-cpu")
BASE_WL = {"num_prompts": 24, "random_input_len": 128, "random_output_len": 32, "random_range_ratio": 0.25}
SCENARIOS = {
    "pp1-sync-offline": ({"policy": "vllm-sync"}, 1, {"request_rate": "inf"}),
    "pp1-batchq-light": ({"policy": "vllm-batch-queue"}, 1, {"request_rate": 8.0}),
    "pp2-sync-offline": ({"policy": "vllm-sync"}, 2, {"request_rate": "inf"}),
    "pp2-batchq-throttle-offline": ({"policy": "vllm-batch-queue", "pp_throttle": True}, 2, {"request_rate": "inf"}),
    "pp2-batchq-nothrottle-offline": ({"policy": "vllm-batch-queue", "pp_throttle": False}, 2,
                                      {"request_rate": "inf"}),
    "pp2-batchq-light": ({"policy": "vllm-batch-queue"}, 2, {"request_rate": 8.0}),
    "pp2-batchq-near-saturation": ({"policy": "vllm-batch-queue"}, 2, {"request_rate": 25.0}),
    "pp2-sglang-ring-offline": ({"policy": "sglang-ring"}, 2, {"request_rate": "inf"}),
    "pp2-long-prompt-chunked": ({"policy": "vllm-batch-queue", "max_num_batched_tokens": 256}, 2,
                                {"request_rate": "inf", "num_prompts": 2, "random_input_len": 2048,
                                 "random_output_len": 8, "random_range_ratio": 0.0}),
}
SHOWN = ["output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms",
         "pipeline_bubble_fraction"]


def scenario(engine: dict, pp: int, wl: dict, profile: str):
    eng = {"max_num_seqs": 16, **step_budget_fields(engine["policy"], 512), **engine}
    return build_scenario(overrides={"model": "tiny", "cluster": {"pipeline_parallel_size": pp}, "engine": eng,
                                     "workload": {**BASE_WL, **wl}, "cost": {"kind": "profile",
                                                                             "profile_dir": profile}})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--profile", default=None,
                    help="calibration artifact; default: calibrate this machine now (the host's speed drifts)")
    args = ap.parse_args()
    profile = args.profile
    if profile is None:
        from calibration.calibrate import calibrate

        profile = str(HERE / "runs" / "profile")
        print("== calibrating tiny on this CPU first", flush=True)
        calibrate("tiny", "cpu", profile, log=lambda m: None)
    rows = []
    for name, (engine, pp, wl) in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        payload = validate(scenario(engine, pp, wl, profile), HERE / "runs" / name, args.repeats, log=lambda m: None)
        by = {r["metric"]: r for r in payload["rows"]}
        row = {"scenario": name}
        for m in SHOWN:
            row[f"{m}_engine"] = round(by[m]["engine"], 4)
            row[f"{m}_sim"] = round(by[m]["simulated"], 4)
            row[f"{m}_error"] = round(by[m]["error"], 4)
            row[f"{m}_spread"] = round(by[m]["engine_spread"], 4)
        row["ttft_ks_p"] = round(payload["per_request"].get("ttft", {}).get("ks_pvalue", float("nan")), 4)
        rows.append(row)
        print({m: f"{by[m]['error']:+.3f}" for m in SHOWN}, flush=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(HERE / "results.csv", buf.getvalue())
    md = ["# Validation matrix: CPU engine vs simulator (tiny model)", "",
          f"Profile: {'calibrated just before the runs' if args.profile is None else args.profile}. "
          f"Engine repeats per scenario: {args.repeats}. Error = (sim - engine) / engine; bubble in fraction "
          "points. Spread = engine run-to-run (max - min) / mean.", "",
          "| scenario | " + " | ".join(SHOWN) + " |", "|---" * (len(SHOWN) + 1) + "|"]
    for r in rows:
        cells = []
        for m in SHOWN:
            fmt = "{:+.3f}" if m == "pipeline_bubble_fraction" else "{:+.1%}"
            cells.append(fmt.format(r[f"{m}_error"]) + f" (±{r[f'{m}_spread']:.0%})")
        md.append(f"| {r['scenario']} | " + " | ".join(cells) + " |")
    med = {m: float(np.median([abs(r[f"{m}_error"]) for r in rows])) for m in SHOWN}
    md += ["", "Median absolute error per metric: " + ", ".join(f"{m} {v:.1%}" for m, v in med.items())]
    atomic_write(HERE / "results.md", "\n".join(md) + "\n")
    print("\n".join(md))
    plot(rows)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in SHOWN if m != "pipeline_bubble_fraction"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    x = np.arange(len(rows))
    for i, m in enumerate(metrics):
        ax.bar(x + (i - len(metrics) / 2) * 0.13, [r[f"{m}_error"] * 100 for r in rows], 0.13, label=m)
    ax.axhline(10, color="k", ls=":", lw=0.8)
    ax.axhline(-10, color="k", ls=":", lw=0.8)
    ax.set_xticks(x, [r["scenario"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("simulator error vs engine (%)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    save_figure(fig, HERE / "errors.png")


if __name__ == "__main__":
    main()
