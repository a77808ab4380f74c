"""Where Vidur's profiling data is, and which (device, model) folders of it ppsim can model.

The data root is ``$PPSIM_VIDUR_ROOT`` when set, else ``../shared/data/vidur-profiling`` beside the
repository (the layout of a checkout next to the shared data).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

from calibration.vidur_import import DEVICE_PRESET, PRESET_TO_VIDUR

VIDUR_ROOT = Path(
    os.environ.get("PPSIM_VIDUR_ROOT") or Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur-profiling"
)
VIDUR_TO_PRESET = {v: k for k, v in PRESET_TO_VIDUR.items()}
# Folders left out, and why (each is reported in results.md).
SKIPPED = {
    "microsoft/phi-2": "GELU MLP without a gate and a parallel attention/MLP block: ppsim models gated (SwiGLU) "
    "MLPs only, and Vidur profiled it at TP 1 only",
}
MAX_TOKENS = 4096  # Vidur's tables reach 4096 tokens for every model (32768 for Llama-3)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cases() -> list[tuple[str, str, str, str]]:
    """(vidur device, ppsim device preset, vidur model, ppsim model preset) for every usable mlp.csv."""
    out = []
    for path in sorted((VIDUR_ROOT / "compute").glob("*/*/*/mlp.csv")):
        dev = path.parents[2].name
        vm = str(path.parent.relative_to(path.parents[2]))
        if vm in VIDUR_TO_PRESET and dev in DEVICE_PRESET:
            out.append((dev, DEVICE_PRESET[dev], vm, VIDUR_TO_PRESET[vm]))
    return out


def skipped() -> list[tuple[str, str]]:
    """(folder, reason) for every mlp.csv the comparison leaves out."""
    out = []
    for path in sorted((VIDUR_ROOT / "compute").glob("*/*/*/mlp.csv")):
        dev, vm = path.parents[2].name, str(path.parent.relative_to(path.parents[2]))
        if vm not in VIDUR_TO_PRESET:
            out.append((f"{dev}/{vm}", SKIPPED.get(vm, "no ppsim model preset")))
        elif dev not in DEVICE_PRESET:
            out.append((f"{dev}/{vm}", "no ppsim device preset"))
    return out


def gemm_table(path: Path) -> Iterator[tuple[int, int, dict[str, float]]]:
    """(tp, tokens, {vidur op: median seconds}) per row of an mlp.csv, up to MAX_TOKENS tokens."""
    for r in rows(path):
        T = int(r["num_tokens"])
        if T <= MAX_TOKENS:
            ops = {
                k.split(".")[1]: float(v) * 1e-3
                for k, v in r.items()
                if k.startswith("time_stats.") and k.endswith(".median") and v != ""
            }
            yield int(r["num_tensor_parallel_workers"]), T, ops
