"""The error table of the H200 runs (``gpu_h200.py``), from their committed ``validation.json`` and
``step_costs.csv``: bench-metric errors, the engine's run-to-run spread, the step-level cost error, and
decode steps split into the first and the second wave of requests (the same batch shape, run early
and late in the engine process). Writes ``gpu_results.md`` here. Run: ``python experiments/validation/gpu_table.py``.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = [  # (folder, what the engine's attention did)
    ("gpu-looped", "decodes looped per request"),
    ("gpu", "decodes in one call"),
    ("gpu-clocks", "decodes in one call, SM clocks logged"),
    ("gpu-nocudnn", "decodes in one call, cuDNN attention off"),  # not run yet: the next GPU session's
]
METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_e2el_ms", "p99_e2el_ms")


def waves(step_costs: Path) -> list[tuple[float, float, float]]:
    """Per engine run: (first-half, second-half median measured ms, predicted ms) of its decode-only steps."""
    rows = list(csv.DictReader(step_costs.open()))
    out = []
    for run in sorted({r["run"] for r in rows}):
        dec = [r for r in rows if r["run"] == run and int(r["num_prefill_tokens"]) == 0]
        half = len(dec) // 2

        def ms(xs: list[dict], key: str = "measured_s") -> float:
            return 1e3 * statistics.median(float(r[key]) for r in xs)

        out.append((ms(dec[:half]), ms(dec[half:]), ms(dec, "predicted_s")))
    return out


VARIANTS = {"-cudnn": ", cuDNN attention on (torch default)", "-expandable": ", expandable allocator segments"}


def one(folder: str, what: str, name: str) -> list[str]:
    d = HERE / folder / name
    what += next((v for k, v in VARIANTS.items() if name.endswith(k)), "")
    v = json.loads((d / "validation.json").read_text())
    rows = {r["metric"]: r for r in v["rows"]}
    cells = [f"{100 * rows[m]['error']:+.1f}% ({100 * rows[m]['engine_spread']:.0f}%)" for m in METRICS]
    step = f"{100 * v['step_cost']['median_error']:+.1f}%"
    wv = "; ".join(f"{a:.0f} / {b:.0f} (pred {p:.0f})" for a, b, p in waves(d / "step_costs.csv"))
    return [
        f"| {folder} | {name.removeprefix('validate-')} | {what} | "
        + " | ".join(cells)
        + f" | {100 * v['verdict']['median_abs_error']:.1f}% | {step} | x{v['speed_adjusted']['factor']:.2f} | {wv} |"
    ]


def main() -> int:
    head = (
        "| run | model | attention | "
        + " | ".join(METRICS)
        + " | median abs | step cost | stage speed | decode steps ms, 1st / 2nd half per engine run |"
    )
    lines = [
        "# ppsim validate on one H200 (PP = 1, profiled cost model calibrated on the same GPU)",
        "",
        "Error = (simulated - engine) / engine; the engine's run-to-run spread (max - min over mean, 2 runs) in",
        "brackets. 'step cost': median error of the cost model's prediction for each micro-batch the engine ran.",
        "'stage speed': the engine's stage time over the profile's for the same plans. Made by",
        "`python experiments/validation/gpu_table.py` from the committed run folders.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for folder, what in RUNS:
        for d in sorted(p for p in (HERE / folder).glob("validate-*") if p.is_dir()):
            lines += one(folder, what, d.name)
    text = "\n".join(lines) + "\n"
    (HERE / "gpu_results.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
