"""Vidur CSV import: imported times equal the CSV medians at every profiled point."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from calibration.vidur_import import MLP_OPS, import_vidur
from ppsim.config import build_scenario
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import load_profiled_cost, read_profile
from ppsim.errors import PPSimError
from ppsim.hardware.presets import resolve_link
from ppsim.models.shape import load_model
from ppsim.policy.plan import PlanItem, make_plan
from tests.vidur_data import PRESENT, SKIP_REASON, VIDUR_ROOT

ROOT = VIDUR_ROOT
pytestmark = pytest.mark.skipif(not PRESENT, reason=SKIP_REASON)


def _medians(path: Path, col: str, key: str, **where: int) -> dict[float, list[float]]:
    out: dict[float, list[float]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if all(int(r[k]) == v for k, v in where.items()) and r[col]:
                out.setdefault(float(r[key]), []).append(float(r[col]) / 1000)
    return out


@pytest.mark.parametrize("device,model,tp", [("h100", "llama-2-7b", 1), ("a100", "llama-2-70b", 2)])
def test_mlp_ops_equal_csv_medians(tmp_path, device, model, tp):
    import_vidur(str(ROOT), device, model, str(tmp_path), tp=tp)
    prof = read_profile(tmp_path)
    vm = {"llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-2-70b": "meta-llama/Llama-2-70b-hf"}[model]
    csv_path = ROOT / "compute" / device / vm / "mlp.csv"
    checked = 0
    for vidur_op, op in MLP_OPS.items():
        med = _medians(csv_path, f"time_stats.{vidur_op}.median", "num_tokens", num_tensor_parallel_workers=tp)
        assert len(med) > 100
        for tokens, vals in med.items():
            assert prof.fits[op].at(tokens) == pytest.approx(sum(vals) / len(vals), rel=1e-12, abs=1e-15)
            checked += 1
    assert checked > 1000
    send = _medians(
        ROOT / "network" / f"{device}_pairwise_nvlink" / "send_recv.csv", "time_stats.send_recv.median", "size"
    )
    for size, vals in list(send.items())[::50]:
        assert prof.fits["send_recv"].at(size) == pytest.approx(sum(vals) / len(vals), rel=1e-12)
    assert prof.meta["tp"] == tp and prof.meta["missing"]


def test_attention_fitted_where_measured(tmp_path):
    meta, fits = import_vidur(str(ROOT), "a100", "llama-2-70b", str(tmp_path), tp=2)
    assert "fitted" in fits["attn_prefill"]["source"] and fits["attn_prefill"]["cv_median_abs_rel_err"] < 0.2
    assert "fitted" in fits["attn_decode"]["source"] and fits["attn_decode"]["cv_median_abs_rel_err"] < 0.2
    assert not any(m.startswith("attention") for m in meta["missing"])
    s = build_scenario(
        None,
        {
            "model": "llama-2-70b",
            "hardware": "a100-80gb",
            "cost": {"kind": "profile", "profile_dir": str(tmp_path)},
            "cluster": {"pipeline_parallel_size": 4, "tensor_parallel_size": 2},
        },
    )
    cost = load_profiled_cost(str(tmp_path), load_model("llama-2-70b"), s, resolve_link("nvlink", "link"))
    plan = make_plan(0, [PlanItem(0, 0, 512, True, True)] + [PlanItem(i, 700, 1, False, True) for i in range(1, 33)])
    t = cost.stage_time(StageSpec(1, 20, 40, False, False, 2), plan)
    assert 0.005 < t < 0.5  # 20 layers of a 70B model at TP 2 for 544 tokens: milliseconds to tens of ms


def test_wrong_model_is_rejected(tmp_path):
    with pytest.raises(PPSimError, match="not model llama-3-8b"):
        import_vidur(str(ROOT), "h100", "llama-3-8b", str(tmp_path), vidur_model="meta-llama/Llama-2-7b-hf")
    with pytest.raises(PPSimError, match="no mlp.csv"):
        import_vidur(str(ROOT), "h100", "llama-3-8b", str(tmp_path))


def test_tp_without_all_reduce_data_uses_ring_over_tp_link(tmp_path):
    meta, fits = import_vidur(str(ROOT), "h100", "llama-2-7b", str(tmp_path), tp=8)  # network data: 2, 4 workers
    assert "all_reduce" not in fits and any("cluster.tp_link" in m for m in meta["missing"])
    shape = load_model("llama-2-7b")
    plan = make_plan(0, [PlanItem(i, 500, 1, False, True) for i in range(16)])
    times = {}
    for tl in ("nvlink", "pcie"):
        s = build_scenario(
            None,
            {
                "model": "llama-2-7b",
                "hardware": "h100-sxm",
                "cost": {"kind": "profile", "profile_dir": str(tmp_path)},
                "cluster": {"pipeline_parallel_size": 2, "tensor_parallel_size": 8, "tp_link": tl},
            },
        )
        cost = load_profiled_cost(str(tmp_path), shape, s, resolve_link("nvlink", "link"))
        link = resolve_link(tl, "tp_link")
        nbytes = 16 * shape.hidden_size * shape.dtype_bytes
        ring = 2 * 7 * link.latency_us * 1e-6 + 2 * 7 / 8 * nbytes / (link.bandwidth_gbps * 1e9)
        assert cost.allreduce_time(nbytes) == pytest.approx(ring, rel=1e-12)
        times[tl] = (cost.layer_time(plan), ring)
    (t_nv, r_nv), (t_pc, r_pc) = times["nvlink"], times["pcie"]
    assert r_nv > 0 and t_pc - t_nv == pytest.approx(2 * (r_pc - r_nv), rel=1e-9)


def test_unknown_network_is_rejected(tmp_path, capsys):
    from ppsim.cli import main

    with pytest.raises(PPSimError, match=r"--network: unknown network 'nvswitch'.*available: dgx, pairwise_nvlink"):
        import_vidur(str(ROOT), "h100", "llama-2-7b", str(tmp_path / "a"), network="nvswitch")
    rc = main(
        [
            "import-vidur",
            "--root",
            str(ROOT),
            "--model",
            "llama-2-7b",
            "--network",
            "nvswitch",
            "--output-dir",
            str(tmp_path / "b"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "available: dgx, pairwise_nvlink" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    import_vidur(str(ROOT), "h100", "llama-2-7b", str(tmp_path / "c"), network="dgx")
    assert read_profile(tmp_path / "c").meta["network"] == "h100_dgx"
