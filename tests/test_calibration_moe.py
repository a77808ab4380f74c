"""MoE calibration and the profiled MoE cost: forced routings, the router's expert load, the
distinct-experts curve against the engine's own router counts (same seed, deterministic, no timing),
the ``tok_exp`` fit, and the MoE stage-time composition and its errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibration.artifact import base_meta, write_artifact  # noqa: E402
from calibration.fit import fit_op  # noqa: E402
from calibration.layer import Layer  # noqa: E402
from calibration.moe_ops import expert_counts, forced_routing, router_load  # noqa: E402
from calibration.profile_ops import OpProfiler  # noqa: E402
from calibration.timer import Timer  # noqa: E402
from engine.kvcache import PagedKVCache, build_batch  # noqa: E402
from engine.model import build_stage  # noqa: E402
from engine.transport import StepItem  # noqa: E402
from ppsim.config import build_scenario  # noqa: E402
from ppsim.cost.base import StageSpec  # noqa: E402
from ppsim.cost.profiled import Profile, ProfiledCost, fit_from_json, load_profiled_cost, read_profile  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.hardware.presets import resolve_link  # noqa: E402
from ppsim.models.shape import load_model  # noqa: E402
from ppsim.policy.plan import PlanItem, make_plan  # noqa: E402
from tests.test_calibration_profiled import _fits  # noqa: E402

SHAPE = load_model("tiny-moe")
K, E = SHAPE.num_experts_per_tok, SHAPE.n_routed_experts


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_forced_routing_touches_exactly_n_experts():
    assert expert_counts(8, 2) == (2, 4, 6, 8) and expert_counts(256, 8) == (8, 64, 128, 192, 256)
    for T, n in ((1, 2), (4, 6), (32, 8), (5, 3)):
        ids, w = forced_routing(T, K, n, torch.device("cpu"), torch.float32)
        assert len(set(ids.reshape(-1).tolist())) == n and (ids[:, 0] != ids[:, 1]).all()
        counts = torch.bincount(ids.reshape(-1), minlength=n)
        assert counts.max() - counts.min() <= 1 and torch.allclose(w.sum(1), torch.ones(T))


def test_router_load_sums_to_k_and_follows_the_zipf_knob():
    flat, skewed = router_load(SHAPE, 0.0), router_load(SHAPE, 1.0)
    assert sum(flat) == pytest.approx(K) and sum(skewed) == pytest.approx(K)
    assert max(flat) < 1.1 * min(flat)
    assert skewed == sorted(skewed, reverse=True) and skewed[0] > 5 * skewed[-1]


def _engine_touched(zipf: float, batch: int, rounds: int = 4) -> float:
    """Mean distinct experts per MoE layer of the engine's router over decode micro-batches of ``batch``
    requests (each after its own random prompt), seed 0, as the live engine routes them."""
    m = build_stage(SHAPE, 0, SHAPE.num_layers, True, True, 0, torch.float32, router_zipf=zipf)
    rng = np.random.default_rng(batch)
    seen = []
    with torch.inference_mode():
        for _ in range(rounds):
            kv = PagedKVCache(SHAPE.num_layers, 8 * batch, 4, SHAPE.num_kv_heads, SHAPE.head_dim, torch.float32)
            items = [
                StepItem(r, 0, int(rng.integers(8, 24)), True, tuple(range(8 * r, 8 * r + 8))) for r in range(batch)
            ]
            ids = rng.integers(0, SHAPE.vocab_size, sum(it.num_tokens for it in items)).tolist()
            b = build_batch(tuple(items), 4)
            m(b.positions, kv.attention(b), torch.tensor(ids))
            dec = tuple(StepItem(it.req_id, it.num_tokens, 1, True, it.block_table) for it in items)
            b = build_batch(dec, 4)
            m(b.positions, kv.attention(b), torch.tensor(rng.integers(0, SHAPE.vocab_size, batch).tolist()))
            seen += list(m.experts_touched().values())
    return float(np.mean(seen))


def _moe_fits() -> dict:
    f = _fits()
    lin = lambda c0, c1: {"form": "linear", "x": "tokens", "coef": {"c0": c0, "c1": c1}}  # noqa: E731
    f.update(
        moe_router=lin(2e-6, 1e-8),
        moe_shared=lin(5e-6, 1e-7),
        moe_experts={"form": "tok_exp", "x": "", "coef": {"c0": 1e-6, "pair": 1e-7, "exp": 1e-4}},
    )
    return f


def _cost(zipf: float) -> ProfiledCost:
    meta = {"moe": {"router_zipf": zipf, "expert_load": router_load(SHAPE, zipf)}}
    return ProfiledCost(Profile(meta, {k: fit_from_json(k, v) for k, v in _moe_fits().items()}), SHAPE, None, 1)


@pytest.mark.parametrize("zipf", [0.0, 1.0])
def test_distinct_experts_curve_matches_the_engine_router(zipf):
    """The cost model's expected distinct experts per step against the engine's router on seed 0:
    a decode of 1 request runs exactly k experts, 32 run (nearly) all of them under uniform routing."""
    cost = _cost(zipf)
    for batch in (1, 2, 4, 8, 16, 32):
        got, want = _engine_touched(zipf, batch), cost.experts_touched(batch)
        assert got == pytest.approx(want, rel=0.1), (batch, got, want)
    assert cost.experts_touched(1) == K and _engine_touched(zipf, 1) == K
    if zipf == 0:
        assert cost.experts_touched(32) > 0.99 * E and _engine_touched(0.0, 32) > 0.95 * E


def test_tok_exp_fit_recovers_pairs_and_experts():
    pairs = np.array([2.0, 16, 16, 16, 64, 64, 64, 256, 256])
    experts = np.array([2.0, 2, 4, 8, 2, 4, 8, 4, 8])
    y = 3e-6 + 2e-7 * pairs + 1e-4 * experts
    fit, stats = fit_op("moe_experts", "tok_exp", "", {"pairs": pairs, "experts": experts}, y)
    assert fit.coef == pytest.approx({"c0": 3e-6, "pair": 2e-7, "exp": 1e-4}, rel=1e-6)
    assert stats["cv_median_abs_rel_err"] < 1e-6


def _decode(n: int):
    return make_plan(0, [PlanItem(i, 100, 1, False, True) for i in range(n)])


def test_moe_stage_time_composition():
    cost = _cost(0.0)
    st = StageSpec(0, 0, 4, True, False)
    d1, d32 = cost.stage_time(st, _decode(1)), cost.stage_time(st, _decode(32))
    base = 4 * (cost.layer_base_time(_decode(32)) - cost.layer_base_time(_decode(1)))
    router_shared = 4 * 31 * (1e-8 + 1e-7)
    experts = 4 * (1e-7 * 31 * K + 1e-4 * (cost.experts_touched(32) - K))
    prep = cost.f["prepare_inputs"].at(32) - cost.f["prepare_inputs"].at(1)
    emb = cost.f["embedding"].at(32) - cost.f["embedding"].at(1)
    assert d32 - d1 == pytest.approx(base + router_shared + experts + prep + emb, rel=1e-9)
    # a MoE model with a dense first layer: that layer pays the mlp_* operators
    dense1 = SHAPE.model_copy(update={"first_k_dense_replace": 1})
    c2 = ProfiledCost(cost.p, dense1, None, 1)
    p = _decode(8)
    want = 4 * c2.layer_base_time(p) + c2.mlp_time(8, False) + 3 * c2.mlp_time(8, True)
    assert c2.stage_time(StageSpec(0, 0, 4, False, False), p) == pytest.approx(
        want + c2.f["prepare_inputs"].at(8), rel=1e-12
    )


def _write(tmp_path, fits: dict, zipf: float = 0.0):
    meta = base_meta(SHAPE, "test", "cpu", "float32", 1, 1, None)
    meta["moe"] = {"router_zipf": zipf, "expert_load": router_load(SHAPE, zipf)}
    write_artifact(tmp_path, meta, fits, [{"op": "add", "split": "fit", "tokens": 8, "median_s": 1e-6}])
    return tmp_path


def _scenario(d, zipf: float = 0.0):
    return build_scenario(
        None,
        {
            "model": "tiny-moe",
            "moe_router_zipf": zipf,
            "cluster": {"pipeline_parallel_size": 2},
            "cost": {"kind": "profile", "profile_dir": str(d)},
        },
    )


def test_profile_errors_name_the_fix(tmp_path):
    link = resolve_link("nvlink", "link")
    d = _write(tmp_path / "ok", _moe_fits(), zipf=1.0)
    assert load_profiled_cost(str(d), SHAPE, _scenario(d, 1.0), link).experts_touched(8) < 6.5
    with pytest.raises(PPSimError, match="--moe-router-zipf: 0, but .* at 1; pass --moe-router-zipf 1"):
        load_profiled_cost(str(d), SHAPE, _scenario(d, 0.0), link)
    fits = _moe_fits()
    del fits["moe_experts"]
    d2 = _write(tmp_path / "old", fits)
    with pytest.raises(PPSimError, match="lacks moe_experts; re-run ppsim calibrate"):
        load_profiled_cost(str(d2), SHAPE, _scenario(d2), link)
    assert read_profile(d2).has("moe_router")


def test_profiler_runs_every_moe_operator_on_the_engine_code():
    """Each MoE task's closure runs (no timing asserted); the grid covers every feasible expert count."""
    layer = Layer(SHAPE, "float32", "cpu", router_zipf=0.5)
    prof = OpProfiler(layer, Timer("cpu", clock="wall", repeats=1, warmup=0, min_repeat_s=0.0), stack=2)
    tasks = prof.moe_tasks("fit", (1, 4, 32))
    assert {t.op for t in tasks} == {"moe_router", "moe_shared", "moe_experts"}
    pts = sorted((t.feats["tokens"], t.feats["experts"]) for t in tasks if t.op == "moe_experts")
    assert pts == [(1, 2), (4, 2), (4, 4), (4, 6), (4, 8), (32, 2), (32, 4), (32, 6), (32, 8)]
    with torch.inference_mode():
        for t in tasks:
            out = t.make()()  # one result per layer of the stack, each layer its own weights
            assert len(out) == 2
            if t.op == "moe_experts":
                assert out[0][1] == out[1][1] == t.feats["experts"]
