"""What ``import-vidur`` and ``calibrate`` refuse beyond the table of tests/bad_inputs_profiles.py, and the
legitimate neighbours they still accept: a Vidur root from the environment named as such, a full disk
named by ``--output-dir``, an imported profile tied to its hardware preset, a calibration too large for
the host's memory (with the memory monkeypatched: nothing large is allocated)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from calibration.vidur_import import import_vidur
from ppsim.cli import main
from ppsim.config import build_scenario
from ppsim.cost.profiled import load_profiled_cost, read_profile
from ppsim.errors import PPSimError
from ppsim.hardware.presets import resolve_link
from ppsim.models.shape import load_model
from tests.bad_inputs import _files
from tests.bad_inputs_profiles import ATT_CSV, MLP_CSV, SHIPPED, _attention, _mlp, _mlp_cell

UP = "time_stats.mlp_up_proj.median"


def _vidur(d: Path, **named: str) -> Path:
    """A synthetic Vidur data/profiling tree under ``d/vr`` (mlp.csv of llama-2-7b on h100, and ``named``)."""
    _files(**{MLP_CSV: _mlp(), **named})(d)
    return d / "vr"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_a_bad_root_from_the_environment_is_named_as_the_environment(tmp_path, monkeypatch, capsys):
    root = _vidur(tmp_path, **{MLP_CSV: _mlp_cell(UP, "0")})
    argv = ["import-vidur", "--model", "llama-2-7b", "--output-dir", str(tmp_path / "p")]
    monkeypatch.setenv("PPSIM_VIDUR_ROOT", str(root))
    rc, err = _run(argv, capsys)
    assert rc == 2 and err.startswith("error: PPSIM_VIDUR_ROOT: ") and "'0' ms is zero" in err, err
    rc, err = _run([*argv, "--root", str(root)], capsys)
    assert rc == 2 and err.startswith("error: --root: "), err
    rc, err = _run([*argv, "--root", ""], capsys)  # an empty --root used to fall back to the environment
    assert rc == 2 and err.startswith("error: --root: empty"), err
    assert not (tmp_path / "p").exists()


def test_a_full_disk_names_output_dir(tmp_path, monkeypatch, capsys):
    root = _vidur(tmp_path)
    real = Path.write_text

    def full_disk(self, text, *a, **k):
        if self.name == "fits.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "p"
    rc, err = _run(["import-vidur", "--root", str(root), "--model", "llama-2-7b", "--output-dir", str(out)], capsys)
    assert rc == 1 and err.startswith(f"error: --output-dir: cannot write {out}/fits.json: No space"), err
    assert not out.exists()


def test_a_synthetic_import_with_enough_attention_points_fits_with_an_error_figure(tmp_path):
    decode = [(1, 128), (2, 512), (4, 256), (8, 1024), (16, 64)]
    root = _vidur(tmp_path, **{ATT_CSV: _attention(decode)})
    meta, fits = import_vidur(str(root), "h100", "llama-2-7b", str(tmp_path / "p"))
    for op in ("attn_prefill", "attn_decode"):
        assert "fitted" in fits[op]["source"] and fits[op]["cv_median_abs_rel_err"] is not None
    assert meta["hardware"] == "h100-sxm" and read_profile(tmp_path / "p").meta["hardware"] == "h100-sxm"


def _scenario(d: Path, hardware: object, model: str = "llama-2-7b") -> object:
    return build_scenario(
        None, {"model": model, "hardware": hardware, "cost": {"kind": "profile", "profile_dir": str(d)}}
    )


def test_an_imported_profile_times_only_its_hardware(tmp_path):
    root = _vidur(tmp_path)
    import_vidur(str(root), "h100", "llama-2-7b", str(tmp_path / "p"))
    shape, link, d = load_model("llama-2-7b"), resolve_link("nvlink", "link"), tmp_path / "p"
    assert load_profiled_cost(str(d), shape, _scenario(d, "h100-sxm"), link)
    with pytest.raises(PPSimError, match="measured on h100-sxm .* runs on a100-80gb; pass --hardware h100-sxm"):
        load_profiled_cost(str(d), shape, _scenario(d, "a100-80gb"), link)
    custom = {"name": "my-h100", "peak_tflops": 900, "hbm_bandwidth_gbps": 3000, "memory_gib": 80}
    assert load_profiled_cost(str(d), shape, _scenario(d, custom), link)  # the user's own description: not compared


def test_a_calibrated_profile_records_no_preset_and_times_any_hardware(tmp_path):
    """``ppsim calibrate`` measures this host, which no preset names: ``validate`` runs it with any --hardware."""
    assert "hardware" not in read_profile(SHIPPED).meta
    s = _scenario(SHIPPED, "a100-80gb", "tiny")
    assert load_profiled_cost(str(SHIPPED), load_model("tiny"), s, resolve_link("nvlink", "link"))


def test_a_calibration_larger_than_the_memory_available_is_refused_before_allocating(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import calibration.host_memory as hm
    from calibration.calibrate import STACK_BYTES, calibrate

    need, layer, stack = hm.weight_bytes(load_model("tiny"), 4, STACK_BYTES, "cpu")
    assert 0 < layer <= need and stack >= 1
    monkeypatch.setattr(hm, "available_bytes", lambda device: need - 1)
    monkeypatch.setattr("calibration.layer.Layer.__init__", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(PPSimError, match=r"--model: calibrating tiny in float32 holds .* GiB the host has available"):
        calibrate("tiny", "cpu", str(tmp_path / "p"), quick=True, link=False, log=lambda m: None)
    assert not (tmp_path / "p").exists()
    monkeypatch.setattr(hm, "available_bytes", lambda device: need)
    hm.check_memory(load_model("tiny"), "float32", 4, STACK_BYTES, "cpu")  # fits exactly: accepted


def test_the_weights_estimate_covers_the_layers_the_profiler_builds():
    """The check counts at least what one :class:`calibration.layer.Layer` holds, before building it."""
    pytest.importorskip("torch")
    from calibration.calibrate import STACK_BYTES
    from calibration.host_memory import weight_bytes
    from calibration.layer import Layer

    for model in ("tiny", "tiny-moe"):
        shape = load_model(model)
        layer = Layer(shape, "float32", "cpu")
        _, est, stack = weight_bytes(shape, 4, STACK_BYTES, "cpu")
        assert layer.weight_bytes() <= est <= 1.01 * layer.weight_bytes() + 4 * 4 * shape.hidden_size
        assert stack == max(1, min(shape.num_layers, STACK_BYTES // layer.weight_bytes()))


def test_the_shipped_profile_is_within_the_coefficient_bound(tmp_path):
    """A neighbour of the absurd-time cases: a table whose tail is steep but below the bound still reads."""
    shutil.copytree(SHIPPED, tmp_path / "p")
    fits = json.loads((tmp_path / "p" / "fits.json").read_text())
    fits["add"]["coef"] = {"xs": [1, 2], "ys": [1e-6, 999.0]}
    (tmp_path / "p" / "fits.json").write_text(json.dumps(fits))
    assert read_profile(tmp_path / "p").fits["add"].at(3) == pytest.approx(999.0 + (999.0 - 1e-6))
