"""Analytic vs imported-Vidur-profile stage step times over the grid, for every device, model and TP size.

Writes steps.csv (one row per grid point, with both sides' components), steps.md (per case: median
and worst |error| before and after the kernel-level model, and the component that moves most) and
steps.png (predicted vs profile). "Before" is the analytic model of commit BASELINE (a roofline
without per-kernel costs), run on the same grid against the same profiles.
Run: PPSIM_VIDUR_ROOT=/path/to/vidur-profiling python experiments/analytic_vs_vidur/run_steps.py
"""

from __future__ import annotations

import csv
import importlib.util
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.analytic_vs_vidur.data import FIX, VIDUR_ROOT, main_of, skipped  # noqa: E402
from experiments.analytic_vs_vidur.steps import PARTS, TP_LINK, all_cases, compare_case, grid  # noqa: E402
from ppsim.config import CostConfig, CpuOverheads  # noqa: E402
from ppsim.cost.base import StageSpec  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.hardware.presets import DEVICES, LINKS  # noqa: E402
from ppsim.metrics.io import atomic_write, atomic_write_bytes  # noqa: E402
from ppsim.models.shape import load_model  # noqa: E402

OUT = Path(__file__).parent
REPO = OUT.parents[1]
BASELINE = "5d9da80"  # ppsim/cost/analytic.py before this change
OLD_COST = {"compute_efficiency": 0.7, "memory_efficiency": 0.8, "layer_overhead_us": 20.0, "step_overhead_us": 100.0}


def baseline_model() -> type | None:
    """The AnalyticCost class of BASELINE, or None outside a git checkout that has it."""
    try:
        src = subprocess.run(
            ["git", "show", f"{BASELINE}:ppsim/cost/analytic.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline_analytic.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("baseline_analytic", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod.AnalyticCost


def baseline_ms(cls: type, dev: str, preset_dev: str, preset: str, tp: int) -> list[float]:
    shape, link = load_model(preset), LINKS[TP_LINK[dev]]
    ac = cls(shape, DEVICES[preset_dev], link, link, tp, CostConfig(**OLD_COST), CpuOverheads())
    st = StageSpec(0, 0, shape.num_layers, True, True, tp)
    return [ac.stage_time(st, plan) * 1e3 for _, _, _, plan in grid()]


def summarize(rows: list[dict]) -> list[dict]:
    out = []

    def key(r: dict) -> tuple:
        return r["split"], r["device"], r["model"], r["tp"], r["kind"]

    for split, dev, model, tp, kind in sorted({key(r) for r in rows}):
        rs = [r for r in rows if key(r) == (split, dev, model, tp, kind)]
        e = np.array([r["error"] for r in rs])
        shift = {
            k: np.median([(r[f"analytic_{k}_ms"] - r[f"profile_{k}_ms"]) / r["profile_ms"] for r in rs]) for k in PARTS
        }
        big = max(shift, key=lambda k: abs(shift[k]))
        before = [abs(r["error_before"]) for r in rs if r.get("error_before") is not None]
        out.append(
            {
                "split": split,
                "device": dev,
                "model": model,
                "tp": tp,
                "kind": kind,
                "n": len(rs),
                "median_before": float(np.median(before)) if before else None,
                "median": float(np.median(np.abs(e))),
                "worst": float(np.max(np.abs(e))),
                "median_beyond": float(np.median(np.abs([r["error_beyond_ar_scatter"] for r in rs]))),
                "worst_beyond": float(np.max(np.abs([r["error_beyond_ar_scatter"] for r in rs]))),
                "largest_part": f"{big} {shift[big]:+.1%}",
            }
        )
    return out


def target_lines(summary: list[dict], rows: list[dict]) -> list[str]:
    """The issue's target (every case: median within 10%, worst within 20%) and how the misses split."""
    n = len(summary)
    med = [s for s in summary if s["median"] > 0.10]
    worst = [s for s in summary if s["worst"] > 0.20]
    far = [r for r in rows if abs(r["error"]) > 0.20]
    noise = [r for r in far if abs(r["error_beyond_ar_scatter"]) <= 0.20]
    misses = ", ".join(f"{case(s)} {s['median']:.1%} ({s['median_beyond']:.1%} beyond the scatter)" for s in med)
    out = [
        f"Target: {n - len(med)} of {n} cases have a median within 10%"
        + (f" (misses: {misses})" if med else "")
        + f"; {n - len(worst)} of {n} have every point within 20%.",
        f"- {len(far)} of {len(rows)} points are beyond 20%; {len(noise)} of them are within 20% of a reference "
        "whose all-reduce takes another value the table measured nearby (the all-reduce scatter), "
        f"{len(far) - len(noise)} are not.",
    ]
    for s in worst:
        out.append(f"- beyond 20%: {case(s)}, worst {s['worst']:.1%}, {s['worst_beyond']:.1%} beyond the scatter")
    return out


def case(s: dict) -> str:
    return f"{s['device']} {s['model']} TP{s['tp']} {s['kind']}"


def markdown(summary: list[dict], rows: list[dict], notes: dict[str, list[str]]) -> str:
    def values(col: str, kind: str) -> str:
        return "/".join(map(str, sorted({r[col] for r in rows if r["kind"] == kind})))

    md = [
        "# Analytic model vs imported Vidur profile: stage step times (PP=1, whole model)",
        "",
        f"Grid: decode batch {values('batch_or_chunk', 'decode')} x context {values('context_or_prefix', 'decode')}"
        f"; prefill chunk {values('batch_or_chunk', 'prefill')} x prefix 0/1024/2048 (chunk + prefix <= 4096).",
        "",
        "Split: GEMM and elementwise curves fitted on Llama-2-7B, Llama-2-70B, CodeLlama-34B (train) and "
        "checked on Llama-3-8B, Llama-3-70B, InternLM-20B, Qwen-72B (held-out); attention, all-reduce and host "
        "costs are in-sample everywhere (one source each).",
        "",
        "Beyond scatter: the error once the reference's all-reduce may be any value Vidur's "
        "all-reduce table measured at sizes near the step's message (within a factor 2, and the two "
        "measured sizes either side); the reference itself is unchanged in every other column.",
        "",
        "| split | device | model | TP | kind | points | median \\|err\\| before | median \\|err\\| "
        "| worst \\|err\\| | median / worst beyond all-reduce scatter | largest component shift (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        before = f"{s['median_before']:.1%}" if s["median_before"] is not None else "n/a"
        md.append(
            f"| {s['split']} | {s['device']} | {s['model']} | {s['tp']} | {s['kind']} | {s['n']} | {before} | "
            f"{s['median']:.1%} | {s['worst']:.1%} | {s['median_beyond']:.1%} / {s['worst_beyond']:.1%} | "
            f"{s['largest_part']} |"
        )
    md.append("")
    for split in ("train", "held-out"):
        e = np.abs([r["error"] for r in rows if r["split"] == split])
        b = np.abs([r["error_before"] for r in rows if r["split"] == split and r.get("error_before") is not None])
        before = f"{np.median(b):.1%} median, {np.max(b):.1%} worst before; " if len(b) else ""
        md.append(
            f"- {split}: {len(e)} points, {before}{np.median(e):.1%} median, {np.percentile(e, 90):.1%} p90, "
            f"{np.max(e):.1%} worst after."
        )
    md += ["", *target_lines(summary, rows)]
    md += ["", "Left out:"] + [f"- {folder}: {why}" for folder, why in skipped()]
    md += ["", "What the imported profiles do not measure (both sides then use the analytic model's own curve):"]
    for what, word in (
        ("lm_head", "lm_head"),
        ("attention", "attention:"),
        ("all-reduce", "all-reduce: not measured"),
        ("host costs (A100's used)", "cpu overheads"),
    ):
        hit = [case for case, n in notes.items() if any(m.startswith(word) for m in n)]
        md.append(f"- {what}: {len(hit)} of {len(notes)} cases" + (f" ({', '.join(hit)})" if len(hit) < 25 else ""))
    md += ["", "Generated by experiments/analytic_vs_vidur/run_steps.py."]
    return "\n".join(md) + "\n"


def plot(rows: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for dev, color in (("a100-80gb", "tab:blue"), ("h100-sxm", "tab:orange"), ("a40", "tab:green")):
        for kind, marker in (("decode", "o"), ("prefill", "^")):
            rs = [r for r in rows if r["device"] == dev and r["kind"] == kind]
            ax.scatter(
                [r["profile_ms"] for r in rs],
                [r["analytic_ms"] for r in rs],
                s=6,
                c=color,
                marker=marker,
                alpha=0.5,
                label=f"{dev} {kind}",
            )
    lo, hi = min(r["profile_ms"] for r in rows), max(r["profile_ms"] for r in rows)
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot(xs, xs * f, "k:", lw=0.6)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="imported Vidur profile, stage step ms",
        ylabel="analytic model, stage step ms",
        title="Stage step time, PP=1 (dotted: +-10%)",
    )
    ax.legend(fontsize=7, markerscale=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def main() -> None:
    old = baseline_model()
    rows: list[dict] = []
    notes: dict[str, list[str]] = {}
    for dev, preset_dev, vm, preset, tp in all_cases():
        rs, n = compare_case(dev, preset_dev, vm, preset, tp)
        before = baseline_ms(old, dev, preset_dev, preset, tp) if old else [None] * len(rs)
        for r, b in zip(rs, before, strict=True):
            r["error_before"] = round((b - r["profile_ms"]) / r["profile_ms"], 4) if b is not None else None
        rows += rs
        notes[f"{dev} {preset} TP{tp}"] = [m for m in n if not m.startswith("final_norm")]
        print(f"{dev} {preset} tp{tp}: {len(rs)} points", file=sys.stderr)
    if not rows:
        raise PPSimError(f"{VIDUR_ROOT}: no mlp.csv there has a row at any tensor parallel size; {FIX}")
    buf = io.StringIO()
    w = csv.DictWriter(buf, list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(OUT / "steps.csv", buf.getvalue())
    summary = summarize(rows)
    atomic_write(OUT / "steps.md", markdown(summary, rows, notes))
    atomic_write_bytes(OUT / "steps.png", plot(rows))
    print((OUT / "steps.md").read_text())


if __name__ == "__main__":
    sys.exit(main_of(__doc__, main))
