"""Several calibrations of one model on one host pooled into one profile.

A host whose speed moves over tens of minutes (a shared VM) gives a profile the level of the minutes it
was calibrated in. Calibrating before and after a long experiment and pooling the two brackets it: every
operator's fit is then over both sets of samples (the median of the pooled timings), the live factors
over both sets of live runs, the co-run factor over every reading. Nothing of the experiment's own runs
goes in, only calibration's timings; a profile pooled with one calibrated after the runs is still not a
prediction made before them, and a report that uses it says so.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calibration.artifact import ARTIFACT_FILES, read_samples
from ppsim import outputs
from ppsim.errors import PPSimError
from ppsim.models.shape import ModelShape

# what must agree for two calibrations to describe one thing
SAME = ("model", "device", "dtype", "threads", "clock", "statistic", "tp")
MEANS = ("host_probe_s", "host_stage_probe_s", "host_model_probe_s", "host_sampler_s")  # the mean over the parts
LISTS = ("host_probes_s", "host_stage_probes_s", "host_model_probes_s")
KINDS = ("host_model_probe",)  # what a reading timed (one model: the same in every part that has it)
COLLAPSED = ("fit", "heldout")  # the operator grid: one row per shape and calibration
TIMES = ("median_s", "mean_s", "p10_s", "p90_s")


def _meta(d: str) -> dict[str, Any]:
    p = Path(d) / "meta.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise PPSimError(f"{d}: cannot read {p} ({e}); pass a directory written by `ppsim calibrate`") from e


def _collapse(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator grid's rows (splits ``fit`` and ``heldout``) of one shape, one from each calibration,
    as one row of their mean times: the form selection's leave-one-out would otherwise predict a left-out
    row from its twin and pick the table form for every operator."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["split"] not in COLLAPSED:
            out.append(r)
            continue
        key = tuple(sorted((k, v) for k, v in r.items() if k not in (*TIMES, "repeats", "inner")))
        if key not in groups:
            groups[key] = []
            out.append(r)  # a placeholder in the first one's place, filled in below
        groups[key].append(r)
    for sel in groups.values():
        for k in TIMES:
            xs = [float(r[k]) for r in sel if k in r]
            if len(xs) == len(sel):
                sel[0][k] = sum(xs) / len(xs)
    return out


def pooled_rows(dirs: list[str]) -> list[dict[str, Any]]:
    """Every profile's samples, their live-run and co-run reading numbers shifted so that no two
    calibrations share one (``fit_live`` groups by run, ``fit_corun`` by reading), the operator grid's
    timings of one shape averaged over the calibrations."""
    rows: list[dict[str, Any]] = []
    for d in dirs:
        if not (Path(d) / "samples.csv").is_file():
            raise PPSimError(f"{d}: no samples.csv; pass a directory written by `ppsim calibrate`")
        run0 = 1 + max((int(r["run"]) for r in rows if "run" in r), default=-1)
        reading0 = 1 + max((int(r["reading"]) for r in rows if "reading" in r), default=-1)
        for r in read_samples(d):
            if "run" in r:
                r["run"] = int(r["run"]) + run0
            if "reading" in r:
                r["reading"] = int(r["reading"]) + reading0
            rows.append(r)
    return _collapse(rows)


def merged_meta(metas: list[dict[str, Any]], dirs: list[str]) -> dict[str, Any]:
    """The first profile's meta, checked against the others, with the host readings of all of them."""
    first = metas[0]
    for d, m in zip(dirs[1:], metas[1:], strict=True):
        for k in SAME:
            if m.get(k) != first.get(k):
                raise PPSimError(
                    f"{d}: differs from {dirs[0]} in {k}; pool only calibrations of one model, device and settings"
                )
    meta = {**first, "date": datetime.now(UTC).isoformat(timespec="seconds"), "merged_from": list(dirs)}
    for k in MEANS:
        xs = [float(m[k]) for m in metas if m.get(k)]
        if xs:
            meta[k] = sum(xs) / len(xs)
    for k in KINDS:
        kinds = [m[k] for m in metas if m.get(k)]
        if kinds:
            meta[k] = kinds[0]
    for k in LISTS:
        if any(k in m for m in metas):
            meta[k] = [x for m in metas for x in m.get(k, [])]
    meta["wall_s"] = round(sum(float(m.get("wall_s", 0.0)) for m in metas), 1)
    return meta


def merge(dirs: list[str], out: str, names: tuple[str, ...] = (), out_flag: str = "--output") -> dict[str, Any]:
    """Pool the calibrations in ``dirs`` into one artifact in ``out`` (fitted afresh); returns its meta.
    ``names``: the flag that gave each of ``dirs`` and ``out_flag`` the one that gave ``out``, for the
    messages (default ``--profile #1``, ...)."""
    if len(dirs) < 2:
        raise PPSimError("calibrations: give two or more to pool")
    parts = {(names[i] if i < len(names) else f"--profile #{i + 1}"): d for i, d in enumerate(dirs)}
    outputs.check_output_dir(out, out_flag, ARTIFACT_FILES, inputs=parts)
    from calibration.calibrate import analyse_and_write

    metas = [_meta(d) for d in dirs]
    meta = merged_meta(metas, dirs)
    return analyse_and_write(pooled_rows(dirs), ModelShape(**meta["model"]), meta, out)
