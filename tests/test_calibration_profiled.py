"""The profiled cost model: artifact round trip, schema/shape/TP errors, stage-time composition."""

from __future__ import annotations

import json

import pytest

from calibration.artifact import base_meta, read_samples, write_artifact
from ppsim.config import build_scenario
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import REQUIRED_OPS, SCHEMA_VERSION, TOKEN_OPS, load_profiled_cost
from ppsim.errors import PPSimError
from ppsim.hardware.presets import resolve_link
from ppsim.models.shape import load_model
from ppsim.policy.plan import PlanItem, make_plan


def _fits() -> dict:
    lin = lambda c0, c1, x="tokens": {"form": "linear", "x": x, "coef": {"c0": c0, "c1": c1}}  # noqa: E731
    f = {op: lin(1e-6, 1e-8) for op in TOKEN_OPS}
    f["attn_qkv"] = {"form": "linear_floor", "x": "tokens", "coef": {"floor": 5e-5, "c0": 0.0, "c1": 1e-7}}
    f["attn_prefill"] = {"form": "prefill_attn", "x": "", "coef": {"call": 2e-6, "tok": 1e-8, "cp": 1e-10, "cc": 2e-10}}
    f["attn_decode"] = {"form": "decode_attn", "x": "", "coef": {"call": 3e-6, "req": 1e-6, "ctx": 1e-9}}
    f.update(
        embedding=lin(1e-6, 0.0),
        final_norm=lin(2e-6, 0.0),
        lm_head=lin(1e-5, 1e-6, "reqs"),
        sampling=lin(4e-6, 1e-7, "reqs"),
        prepare_inputs=lin(7e-6, 1e-7, "reqs"),
        schedule=lin(2e-5, 1e-6, "n"),
        update=lin(1e-5, 5e-7, "n"),
        send_recv=lin(5e-5, 1e-9, "bytes"),
        layer_glue=lin(1e-5, 0.0),
    )
    return f


def _write(tmp_path, model="tiny", tp=1, fits=None):
    meta = base_meta(load_model(model), "test", "cpu", "float32", 1, tp, None)
    write_artifact(tmp_path, meta, fits or _fits(), [{"op": "add", "split": "fit", "tokens": 8, "median_s": 1.1e-6}])
    return tmp_path


def _scenario(d, model="tiny", tp=1):
    return build_scenario(
        None,
        {
            "model": model,
            "cost": {"kind": "profile", "profile_dir": str(d)},
            "cluster": {"pipeline_parallel_size": 2, "tensor_parallel_size": tp},
        },
    )


def _load(d, model="tiny", tp=1):
    s = _scenario(d, model, tp)
    return load_profiled_cost(str(d), load_model(model), s, resolve_link("nvlink", "link"))


PLAN = make_plan(
    0, [PlanItem(0, 100, 1, False, True), PlanItem(1, 30, 1, False, True), PlanItem(2, 64, 32, True, False)]
)


def test_round_trip_predictions(tmp_path):
    d = _write(tmp_path)
    cost = _load(d)
    assert set(REQUIRED_OPS) <= set(cost.f)
    T = PLAN.num_tokens  # 34
    layer = (
        sum(1e-6 + 1e-8 * T for op in TOKEN_OPS if op != "attn_qkv")
        + 1e-6
        + 1e-8 * T  # second add
        + max(5e-5, 1e-7 * T)
        + 2e-6
        + 1e-8 * 32
        + 1e-10 * 32 * 64
        + 2e-10 * 32 * 32  # the prefill chunk
        + 3e-6
        + 1e-6 * 2
        + 1e-9 * (101 + 31)  # two decodes
        + 1e-5
    )  # glue
    assert cost.layer_time(PLAN) == pytest.approx(layer, rel=1e-12)
    first = StageSpec(0, 0, 4, True, False)
    last = StageSpec(1, 4, 8, False, True)
    prep = 7e-6 + 1e-7 * 3
    assert cost.stage_time(first, PLAN) == pytest.approx(4 * layer + prep + 1e-6, rel=1e-12)
    assert cost.stage_time(last, PLAN) == pytest.approx(4 * layer + prep + 2e-6 + (1e-5 + 3e-6) + (4e-6 + 3e-7))
    assert cost.link_time(1000) == pytest.approx(5e-5 + 1e-6)
    assert cost.cpu_time("schedule", 10) == pytest.approx(3e-5)
    assert cost.return_time(4) == pytest.approx(5e-5 + 32e-9)
    assert cost.stage_time(first, make_plan(1, [])) == 0.0
    assert read_samples(d)[0] == {"op": "add", "split": "fit", "tokens": 8, "median_s": 1.1e-6}


def test_schema_version_mismatch(tmp_path):
    d = _write(tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    meta["schema_version"] = SCHEMA_VERSION + 1
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PPSimError, match="schema version") as e:
        _load(d)
    assert "\n" not in str(e.value)


def test_model_shape_mismatch(tmp_path):
    d = _write(tmp_path, model="tiny")
    msg = r"measured for 'tiny'\) does not match model 'llama-3-8b'.*hidden_size=256"
    with pytest.raises(PPSimError, match=msg) as e:
        _load(d, model="llama-3-8b")
    assert "\n" not in str(e.value)


def test_tp_mismatch_and_missing_dir(tmp_path):
    d = _write(tmp_path)
    with pytest.raises(PPSimError, match="tensor parallel size 1"):
        _load(d, tp=2)
    with pytest.raises(PPSimError, match="not a directory"):
        _load(tmp_path / "nope")


def test_missing_operator(tmp_path):
    f = _fits()
    del f["attn_decode"]
    with pytest.raises(PPSimError, match="lacks operators attn_decode"):
        _load(_write(tmp_path, fits=f))


def test_cpu_falls_back_to_scenario(tmp_path):
    f = _fits()
    del f["schedule"], f["update"]
    cost = _load(_write(tmp_path, fits=f))
    assert cost.cpu_time("schedule", 10) == pytest.approx((150 + 4 * 10) * 1e-6)  # CpuOverheads defaults


def test_simulate_with_profile(tmp_path):
    from ppsim.run import run_scenario

    d = _write(tmp_path / "prof")
    s = build_scenario(
        None,
        {
            "model": "tiny",
            "cost": {"kind": "profile", "profile_dir": str(d)},
            "cluster": {"pipeline_parallel_size": 2},
            "workload": {"num_prompts": 8, "random_input_len": 64, "random_output_len": 8},
        },
    )
    out = run_scenario(s, str(tmp_path / "out"))
    assert out.summary["completed"] == 8


def _tp_scenario(d, tp_link=None):
    c = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}
    if tp_link is not None:
        c["tp_link"] = tp_link
    return build_scenario(None, {"model": "tiny", "cost": {"kind": "profile", "profile_dir": str(d)}, "cluster": c})


def test_missing_all_reduce_falls_back_to_ring_over_tp_link(tmp_path):
    d = _write(tmp_path / "tp2", tp=2)
    shape = load_model("tiny")
    link = resolve_link("nvlink", "link")
    base = _load(_write(tmp_path / "tp1")).layer_time(PLAN)
    T, h, b = PLAN.num_tokens, shape.hidden_size, shape.dtype_bytes
    for name in ("nvlink", "pcie"):
        tl = resolve_link(name, "tp_link")
        cost = load_profiled_cost(str(d), shape, _tp_scenario(d, name), link)
        # two ring all-reduces per layer: 2 (N-1) latency + 2 (N-1)/N bytes / bandwidth each, N = 2
        ring = 2 * tl.latency_us * 1e-6 + T * h * b / (tl.bandwidth_gbps * 1e9)
        assert cost.allreduce_time(T * h * b) == pytest.approx(ring, rel=1e-12)
        assert cost.layer_time(PLAN) == pytest.approx(base + 2 * ring, rel=1e-12)
    assert load_profiled_cost(str(d), shape, _tp_scenario(d), link).tp_link == resolve_link("nvlink", "tp_link")
    # a measured all_reduce fit wins over the fallback
    f = _fits()
    f["all_reduce"] = {"form": "linear", "x": "bytes", "coef": {"c0": 1e-3, "c1": 0.0}}
    d2 = _write(tmp_path / "ar", tp=2, fits=f)
    cost = load_profiled_cost(str(d2), shape, _tp_scenario(d2, "pcie"), link)
    assert cost.layer_time(PLAN) == pytest.approx(base + 2e-3, rel=1e-12)


def test_weight_and_kv_dtype_mismatch_refused(tmp_path):
    d = _write(tmp_path)
    s = _scenario(d)
    link = resolve_link("nvlink", "link")
    for shape, field, want in (
        (load_model("tiny").with_dtypes("fp8"), "weight_dtype", "fp8"),
        (load_model("tiny").with_dtypes(None, "fp8"), "kv_cache_dtype", "fp8"),
    ):
        with pytest.raises(PPSimError, match=rf"{field}='float32' \(model has '{want}'\)") as e:
            load_profiled_cost(str(d), shape, s, link)
        assert "\n" not in str(e.value)
    # a profile written before the storage dtypes were recorded: they are its activation dtype
    meta = json.loads((d / "meta.json").read_text())
    del meta["model"]["weight_dtype"], meta["model"]["kv_cache_dtype"]
    (d / "meta.json").write_text(json.dumps(meta))
    assert _load(d).tp == 1
    with pytest.raises(PPSimError, match="weight_dtype='float32'"):
        load_profiled_cost(str(d), load_model("tiny").with_dtypes("fp8"), s, link)


def test_simulate_cli_refuses_quantized_model_on_float32_profile(tmp_path, capsys):
    from ppsim.cli import main

    d = _write(tmp_path / "prof")
    rc = main(
        [
            "simulate",
            "--model",
            "tiny",
            "-pp",
            "2",
            "--profile",
            str(d),
            "-q",
            "fp8",
            "--num-prompts",
            "2",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "weight_dtype='float32' (model has 'fp8')" in err and len(err.strip().splitlines()) == 1


def test_live_engine_handoff_and_ring_paths(tmp_path):
    """``handoff`` adds to every stage transfer; a ring policy's return and launch are the live ring's
    (``ring_return``/``ring_launch``), its relay hop the wire alone; without them, the one link hop."""
    from ppsim.cost.ring import RingReturnCost

    f = _fits()
    base = _load(_write(tmp_path / "a", fits=f))
    lin = lambda c0, c1: {"form": "linear", "x": "n", "coef": {"c0": c0, "c1": c1}}  # noqa: E731
    f.update(
        handoff={"form": "linear", "x": "bytes", "coef": {"c0": 2.5e-4, "c1": 0.0}},
        ring_return=lin(7e-4, 1e-5),
        ring_launch=lin(6e-4, 2e-5),
        launch=lin(3e-4, 1e-5),
    )
    cost = _load(_write(tmp_path / "b", fits=f))
    wire = 5e-5 + 2048 * 1e-9
    assert base.link_time(2048) == pytest.approx(wire) and cost.link_time(2048) == pytest.approx(wire + 2.5e-4)
    assert cost.wire_time(2048) == pytest.approx(wire)
    ring, plain = RingReturnCost(cost, 0.0, 0.0, 1), RingReturnCost(base, 0.0, 0.0, 1)
    assert ring.return_time(4) == pytest.approx(7.4e-4) and ring.launch_time(4) == pytest.approx(6.8e-4)
    assert ring.relay_time(4) == pytest.approx(5e-5 + 32e-9)
    assert plain.return_time(4) == pytest.approx(5e-5 + 32e-9)
    assert plain.launch_time(4) == base.launch_time(4)
