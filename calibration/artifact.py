"""Writing a calibration artifact (the format is documented in :mod:`ppsim.cost.profiled`).

Three files, each written atomically: ``meta.json``, ``fits.json`` and ``samples.csv`` (one row per
timed shape; empty cells for features an operator does not have). Reading is the simulator's job
(:func:`ppsim.cost.profiled.read_profile`); :func:`read_samples` is for tests and re-fitting.
"""

from __future__ import annotations

import csv
import io
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ppsim import outputs
from ppsim.cost.profiled import SCHEMA_VERSION
from ppsim.metrics.io import dumps
from ppsim.models.shape import ModelShape

ARTIFACT_FILES = ("meta.json", "fits.json", "samples.csv")
SAMPLE_FIELDS = [
    "op",
    "split",
    "plan",
    "tokens",
    "reqs",
    "chunk",
    "prefix",
    "batch",
    "ctx_tokens",
    "bytes",
    "n",
    "pairs",
    "experts",
    "layers",
    "start_layer",
    "gap_s",
    "median_s",
    "mean_s",
    "p10_s",
    "p90_s",
    "repeats",
    "inner",
    "items",
    "alone_s",
    "run",
    "corun",
    "host_shift",
    "reading",
    "step_id",
    "prev_s",
    "prev_prefill",
    "core_lag_s",
    "at_s",
    "prev_step_id",
    "after_handover",
    "out_s",
    "out_switched",
    "ctrl_s",
    "recv_wait_s",
]


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check_output_dir(out: str | Path, flag: str = "--output-dir", inputs: dict[str, str | Path] | None = None) -> None:
    """Raise unless ``out`` can become the artifact directory (checked before any work); ``inputs`` (flag ->
    path read): the artifact replaces the directory whole, so it may not be, hold or lie inside one."""
    outputs.check_output_dir(out, flag, ARTIFACT_FILES, inputs=inputs)


def base_meta(
    shape: ModelShape, source: str, device: str, dtype: str, threads: int | None, tp: int, torch_version: str | None
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "device": device,
        "torch_version": torch_version,
        "dtype": dtype,
        "threads": threads,
        "tp": tp,
        "model": shape.model_dump(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
    }


def samples_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, SAMPLE_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def write_artifact(out: str | Path, meta: dict[str, Any], fits: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """The three files as one set: an earlier artifact in ``out`` is replaced whole or kept whole."""
    files = {"samples.csv": samples_csv(rows), "fits.json": dumps(fits), "meta.json": dumps(meta)}
    return outputs.write_result_set(out, files, "--output-dir")


def read_samples(d: str | Path) -> list[dict[str, Any]]:
    """Rows of ``samples.csv`` with numbers parsed (empty cells dropped)."""
    out = []
    with open(Path(d) / "samples.csv", newline="") as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in r.items():
                if v == "":
                    continue
                if k in ("op", "split", "plan", "items"):
                    row[k] = v
                else:
                    row[k] = float(v) if ("." in v or "e" in v) else int(v)
            out.append(row)
    return out
