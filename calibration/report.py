"""The calibration report the CLI prints: per-operator errors, the glue's gap, held-out errors, the live fits."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppsim.cost.profile_check import live_charged
from ppsim.cost.profiled import corun_ratio, depth_charged, fit_from_json, live_level


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_report(meta: dict[str, Any], fits: dict[str, Any]) -> str:
    """Per-operator leave-one-out error, the whole-layer gap and held-out errors, as printed by the CLI."""
    lines = [f"{'operator':<26}{'form':<14}{'n':>4}{'cv med |err|':>14}{'cv max |err|':>14}"]
    for op, f in sorted(fits.items()):
        cv, mx = f.get("cv_median_abs_rel_err"), f.get("cv_max_abs_rel_err")
        lines.append(f"{op:<26}{f['form']:<14}{f.get('n_samples', 0):>4}{pct(cv):>14}{pct(mx):>14}")
    gap = meta.get("layer_gap", {})
    if gap.get("median_abs_rel") is not None:
        lines.append(
            f"engine stage steps vs sum of operators: median |gap| {100 * gap['median_abs_rel']:.1f}% "
            f"over {len(gap['plans'])} samples (absorbed by the glue fits)"
        )
    h = meta.get("heldout", {})
    for k, name in (
        ("median_abs_rel_err_ops", "operators"),
        ("median_abs_rel_err_layer", "whole stages"),
        ("median_abs_rel_err_all", "all"),
    ):
        if h.get(k) is not None:
            lines.append(f"held-out {name}: median |err| {100 * h[k]:.1f}%")
    per_layer = fits.get("stage_layers", {}).get("coef") or meta.get("stage_layers")
    if per_layer:
        at = ", ".join(f"{x:.0f} layers x{y:.3f}" for x, y in zip(per_layer["xs"], per_layer["ys"], strict=True))
        how = "charged" if "stage_layers" in fits else "recorded, not charged"
        lines.append(f"a layer in a stage of n layers over one in the stack (stage_layers, {how}): {at}")
    live = fits.get("live_stage", {}).get("coef")
    if live:
        at = ", ".join(
            f"{x:.0f} stage{'s' if x > 1 else ''} x{y:.3f}" for x, y in zip(live["xs"], live["ys"], strict=True)
        )
        shifted = meta.get("live_stage_host_shifted") or {}
        if shifted.get("ys"):
            at += " (host-shifted, recorded only: " + ", ".join(f"x{y:.3f}" for y in shifted["ys"]) + ")"
        lines.append(f"live engine's stage compute over the same steps alone (live_stage): {at}")
        fit = fit_from_json("live_stage", fits["live_stage"])
        verb = "charged" if live_charged(meta) else "recorded, not charged (part 25)"
        charged = f"{verb}: its level x{live_level(fit):.3f} at every depth"  # ProfiledCost.level_factor
        if len(live["xs"]) > 1:
            read = {k: fit_from_json(k, fits[k]) for k in ("live_stage", "live_depth") if k in fits}
            ratio = depth_charged(read, True)
            over = "over the model, live_depth" if "live_depth" in fits else "live_stage"
            charged += f", its depth ratio x{ratio:.3f} at PP > 1 ({over})"  # ProfiledCost.depth_factor
        lines.append(charged + " (each held at 1 or more)")
    spread = fits.get("stage_spread", {}).get("coef")
    if spread:
        ys = spread["ys"]
        lines.append(
            f"live engine's step-to-step spread at two stages (stage_spread, charged at PP > 1): "
            f"sd {float(np.std(ys)):.3f}, from {ys[0]:.2f} to {ys[-1]:.2f}"
            + (f" after gaps up to {spread['gap_s'] * 1e3:.0f} ms" if "ys_idle" in spread else "")
        )
        if "ys_idle" in spread:
            ys = spread["ys_idle"]
            lines.append(f"  after longer gaps: sd {float(np.std(ys)):.3f}, from {ys[0]:.2f} to {ys[-1]:.2f}")
    scale = meta.get("stage_idle_live_scale")
    if scale is not None and scale < 1.0:
        lines.append(
            f"idle charge (stage_idle) checked on the live runs: the two-stage runs bear out x{scale:.3f} of the "
            "paired table (reported, not charged)"
        )
    if "stage_corun" in fits:
        fit = fit_from_json("stage_corun", fits["stage_corun"])
        lines.append(
            f"a stage's step with another stage computing on the host (stage_corun): x{fit.coef['c0']:.3f}; "
            f"{'charged' if live_charged(meta) else 'recorded, not charged'} x{corun_ratio(fit):.3f} at PP > 1 to a "
            "micro-batch that starts with another in the pipeline"
        )
    return "\n".join(lines)
