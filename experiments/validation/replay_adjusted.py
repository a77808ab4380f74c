"""The speed-adjusted replay of finished ``ppsim validate`` runs, from their output dirs.

``ppsim validate`` reports, beside the prediction's error, a replay of the simulator with the host's
compute speed during the engine runs (:func:`ppsim.validate.run.speed_adjusted`): the engine's stage
time over the profile's prediction for the same plans, summed over every micro-batch. What is left
is the scheduling, pipeline and control-path error. This script recomputes it for validation dirs
written before the replay existed (or with another profile of the same host) and prints, per
scenario and as medians over them, the prediction's error beside the replay's. Not a prediction:
``factor`` comes from the runs it is compared with.

Run: python experiments/validation/replay_adjusted.py VALIDATION_DIR [VALIDATION_DIR ...]
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ppsim.config import build_scenario
from ppsim.deployment import prepare
from ppsim.validate.run import speed_adjusted

METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_e2el_ms", "p99_e2el_ms")


def replay(d: Path) -> dict[str, dict[str, float]]:
    """``{"predicted": {metric: error}, "adjusted": {metric: error}, "factor": ...}`` for one dir."""
    v = json.loads((d / "validation.json").read_text())
    s = build_scenario(None, v["scenario"])
    prep = dataclasses.replace(prepare(s), num_blocks=int(v["engine_summaries"][0]["kv_num_blocks"]))
    steps = [
        {"measured_s": float(r["measured_s"]), "predicted_s": float(r["predicted_s"])}
        for r in csv.DictReader((d / "step_costs.csv").open())
    ]
    adj = speed_adjusted(prep, steps, v["engine_summaries"])
    pick = lambda rows: {r["metric"]: r["error"] for r in rows if r["metric"] in METRICS}  # noqa: E731
    return {"predicted": pick(v["rows"]), "adjusted": pick(adj["rows"]), "factor": adj["factor"]}


def main(dirs: list[str]) -> None:
    res = {Path(d).name: replay(Path(d)) for d in dirs}
    head = "".join(f"{m[:14]:>16s}" for m in METRICS)
    print(f"{'scenario':40s} {'factor':>7s} {head}")
    for name, r in res.items():
        print(f"{name:40s} {r['factor']:7.3f} " + "".join(f"{r['predicted'][m]:+16.1%}" for m in METRICS))
        print(f"{'  speed-adjusted':40s} {'':7s} " + "".join(f"{r['adjusted'][m]:+16.1%}" for m in METRICS))
    for kind in ("predicted", "adjusted"):
        med = "".join(f"{statistics.median(abs(r[kind][m]) for r in res.values()):16.1%}" for m in METRICS)
        print(f"{'median |error| ' + kind:40s} {'':>7s} {med}")


if __name__ == "__main__":
    main(sys.argv[1:])
