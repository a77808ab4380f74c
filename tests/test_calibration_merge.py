"""Pooling calibrations (calibration/merge.py): a profile pooled with itself fits what it fitted alone,
live runs and co-run readings of two calibrations stay apart, and calibrations of different things
are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calibration.artifact import read_samples, samples_csv
from calibration.calibrate import refit
from calibration.merge import merge, pooled_rows
from ppsim.errors import PPSimError

SHIPPED = Path(__file__).resolve().parents[1] / "profiles" / "tiny-cpu"


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-15)
    return a == b


def test_a_profile_pooled_with_itself_fits_the_same_operators(tmp_path: Path) -> None:
    shutil.copytree(SHIPPED, tmp_path / "alone")
    refit(str(tmp_path / "alone"))  # the shipped profile fitted by today's code
    meta = merge([str(SHIPPED), str(SHIPPED)], str(tmp_path / "pooled"))
    alone = json.loads((tmp_path / "alone" / "fits.json").read_text())
    pooled = json.loads((tmp_path / "pooled" / "fits.json").read_text())
    assert alone.keys() == pooled.keys()
    for op in alone:
        assert _close(alone[op]["coef"], pooled[op]["coef"]), op
    assert meta["merged_from"] == [str(SHIPPED), str(SHIPPED)]
    grid = [r for r in read_samples(SHIPPED) if r["split"] in ("fit", "heldout")]
    assert len(read_samples(tmp_path / "pooled")) == 2 * len(read_samples(SHIPPED)) - len(grid)


def test_the_grid_timings_of_one_shape_are_averaged_over_calibrations(tmp_path: Path) -> None:
    row = {"op": "qkv_proj", "split": "fit", "tokens": 4, "median_s": 1.0, "mean_s": 2.0, "repeats": 3}
    a = _profile(tmp_path / "a", [row, {**row, "tokens": 8}])
    b = _profile(tmp_path / "b", [{**row, "median_s": 3.0, "mean_s": 4.0}])
    pooled = pooled_rows([a, b])
    assert [(r["tokens"], r["median_s"], r["mean_s"]) for r in pooled] == [(4, 2.0, 3.0), (8, 1.0, 2.0)]


def _profile(d: Path, rows: list[dict]) -> str:
    d.mkdir()
    (d / "samples.csv").write_text(samples_csv(rows))
    return str(d)


def test_live_runs_and_corun_readings_of_two_calibrations_stay_apart(tmp_path: Path) -> None:
    rows = [
        {"op": "stage", "split": "live1", "run": 0, "median_s": 1.0},
        {"op": "stage", "split": "live1", "run": 1, "median_s": 1.0},
        {"op": "stage_corun", "split": "corun", "reading": 0, "median_s": 1.0},
        {"op": "stage_corun", "split": "corun", "reading": 2, "median_s": 1.0},
    ]
    pooled = pooled_rows([_profile(tmp_path / "a", rows), _profile(tmp_path / "b", rows)])
    assert [r["run"] for r in pooled if "run" in r] == [0, 1, 2, 3]
    assert [r["reading"] for r in pooled if "reading" in r] == [0, 2, 3, 5]


def test_calibrations_of_different_models_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(SHIPPED, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["model"]["hidden_size"] = 2 * meta["model"]["hidden_size"]
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PPSimError, match="differs from .* in model"):
        merge([str(SHIPPED), str(other)], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(PPSimError, match=r"is also --profile #2; the results would replace it"):
        merge([str(SHIPPED), str(other)], str(other))  # the pooled profile written over one of its parts
    with pytest.raises(PPSimError, match="two or more"):
        merge([str(SHIPPED)], str(tmp_path / "out"))
    with pytest.raises(PPSimError, match="pass a directory written by `ppsim calibrate`"):
        (tmp_path / "empty").mkdir()
        merge([str(SHIPPED), str(tmp_path / "empty")], str(tmp_path / "out"))


def test_bracket_splits_development_from_held_out_and_refuses_an_empty_runs_dir(tmp_path: Path, capsys) -> None:
    from experiments.validation.bracket import main, run_dirs

    for name in ("pp2-sync-offline", "h0-vllm-sync-pp1-load0.20", "h12-llamacpp-pp2-offline", "hosts"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "validation.json").write_text("{}")
    (tmp_path / "runs" / "unfinished").mkdir()
    sets = run_dirs(tmp_path / "runs")
    assert {k: [d.name for d in v] for k, v in sets.items()} == {
        "development": ["hosts", "pp2-sync-offline"],
        "held-out": ["h0-vllm-sync-pp1-load0.20", "h12-llamacpp-pp2-offline"],
    }
    assert main(["--runs", str(tmp_path / "runs" / "unfinished"), "--out", str(tmp_path / "out")]) == 2
    assert "no finished validation" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_host_readings_are_pooled_with_what_they_timed() -> None:
    """Means of the means, lists joined, and the whole-model probe keeps the name of what it timed
    (validate compares a reading only with one of the same kind)."""
    from calibration.merge import merged_meta

    base = {"model": {"name": "tiny"}, "device": "cpu", "dtype": "float32", "threads": 1, "clock": "thread"}
    a = {**base, "host_model_probe_s": 0.004, "host_model_probes_s": [0.004, 0.004], "host_model_probe": "tiny:x"}
    b = {**base, "host_model_probe_s": 0.006, "host_model_probes_s": [0.006]}  # a part from before the probe's kind
    c = {**base}  # a part from before the probe
    meta = merged_meta([c, a, b], ["c", "a", "b"])
    assert meta["host_model_probe_s"] == 0.005 and meta["host_model_probes_s"] == [0.004, 0.004, 0.006]
    assert meta["host_model_probe"] == "tiny:x"
    assert "host_model_probe" not in merged_meta([c, c], ["c", "d"])
