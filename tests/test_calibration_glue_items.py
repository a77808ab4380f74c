"""Stage plans of many prefill items in the calibration grid and the glue's term on the prefill items' tokens
squared (docs/validation.md, part 22): the plan specs, the fit recovering a known term (and holding it at zero or
more), the cost model charging it per layer, and the fits without the many-item plans. Pure arithmetic: no torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.calibrate import analyse_and_write
from calibration.glue_fits import fit_stage_glue
from calibration.profile_ops import FULL, parse_plan
from calibration.samples import KINDS, multi_item, plan_of, prefill_sq
from ppsim.cost.base import StageSpec
from ppsim.cost.profile_check import fit_problem
from ppsim.cost.profiled import OpFit, Profile, ProfiledCost, read_profile
from tests.test_calibration_glue import PLANS, SHAPE, TRUE, base_fits, operator_rows
from tests.test_calibration_profiled import _write

MANY = [";".join(["0:16"] * 32), ";".join(["0:128"] * 4), "0:512", "0:256", ";".join(["0:64"] * 8)]


def test_a_plan_spec_of_many_prefill_items_gives_that_many_requests():
    rng = np.random.default_rng(0)
    seqs = parse_plan("P16@0x32", rng)
    assert len(seqs) == 32 and all((s.start, s.n) == (0, 16) for s in seqs)
    mixed = parse_plan("P128@64x4+D2x64", rng)
    assert [(s.start, s.n) for s in mixed[:4]] == [(64, 128)] * 4 and len(mixed) == 6 and mixed[4].n == 1
    assert parse_plan("P96@0", rng)[0].n == 96 and len(parse_plan("P96@0", rng)) == 1
    assert {"P16@0x32", "P128@0x4"} <= set(FULL.layer_plans)
    for spec in (*FULL.layer_plans, *FULL.heldout_plans):
        assert parse_plan(spec, rng)


def test_prefill_sq_sums_each_prefill_items_tokens_squared_and_skips_decodes():
    assert prefill_sq(plan_of(MANY[0])) == 32 * 256 and prefill_sq(plan_of("0:512")) == 512**2
    assert prefill_sq(plan_of("0:32;300:1;77:1")) == 32**2 and prefill_sq(plan_of("99:1;50:1")) == 0
    assert multi_item({"items": MANY[1]}) and not multi_item({"items": "0:256;99:1;50:1"})


def _glue(sq: float) -> dict[str, OpFit]:
    glue = {k: OpFit(k, "tok_req", "", dict(c)) for k, c in TRUE.items()}
    glue["layer_glue"].coef["sq"] = sq
    return glue


def _rows(sq: float, glue: dict[str, OpFit] | None = None) -> list[dict]:
    """Stage samples of three layers as a model whose ``layer_glue`` has ``sq`` predicts them (or ``glue``)."""
    cost = ProfiledCost(Profile({}, {**base_fits(), **(glue or _glue(sq))}), SHAPE, None, 1)
    rows = []
    for kind in ("stage_first", "stage_mid", "stage_last"):
        first, last = KINDS[kind]
        for items in PLANS + MANY:
            plan = plan_of(items)
            t = cost.stage_time(StageSpec(0, 0, 3, first, last), plan)
            row = {"op": kind, "split": "stage", "plan": items, "items": items, "layers": 3, "start_layer": 0}
            rows.append({**row, "tokens": plan.num_tokens, "reqs": plan.num_reqs, "mean_s": t, "median_s": t})
    return rows


def test_the_glue_fit_recovers_a_term_on_the_items_tokens_squared():
    """One 512-token item over its operators costs more than 32 of 16 tokens: the (1, tokens, requests) fit
    cannot follow it, the fit with ``sq`` gives the model back."""
    sq = 2e-9  # seconds a layer per squared token: 0.52 ms for one item of 512, 16 us for 32 of 16
    got = fit_stage_glue(base_fits(), {}, SHAPE, _rows(sq), "mean", sq=True)[0]
    assert got["layer_glue"].coef["sq"] == pytest.approx(sq, rel=1e-6)
    for k, v in TRUE["layer_glue"].items():
        assert got["layer_glue"].coef[k] == pytest.approx(v, abs=1e-9), k
    for name in ("first_glue", "last_glue"):
        assert "sq" not in got[name].coef and got[name].coef == pytest.approx(TRUE[name], abs=1e-9)
    linear = fit_stage_glue(base_fits(), {}, SHAPE, _rows(sq), "mean")[0]["layer_glue"]
    assert "sq" not in linear.coef and linear.coef["tok"] > TRUE["layer_glue"]["tok"] + 1e-7


def test_the_term_is_held_at_zero_or_more():
    """Items whose cost beyond the operators falls with their size: the term is dropped (0), not negative,
    and the rest is the fit without it."""
    got = fit_stage_glue(base_fits(), {}, SHAPE, _rows(-1e-9), "mean", sq=True)[0]["layer_glue"]
    linear = fit_stage_glue(base_fits(), {}, SHAPE, _rows(-1e-9), "mean")[0]["layer_glue"]
    assert got.coef["sq"] == 0.0
    assert {k: got.coef[k] for k in ("c0", "tok", "req")} == pytest.approx(linear.coef, rel=1e-9, abs=1e-15)


def test_the_cost_model_charges_the_term_per_layer_on_prefill_items_only():
    with_sq = ProfiledCost(Profile({}, {**base_fits(), **_glue(2e-9)}), SHAPE, None, 1)
    zero = ProfiledCost(Profile({}, {**base_fits(), **_glue(0.0)}), SHAPE, None, 1)
    without = ProfiledCost(Profile({}, {**base_fits(), **_glue(0.0)}), SHAPE, None, 1)
    without.f["layer_glue"].coef.pop("sq")
    mid = StageSpec(1, 2, 6, False, False)
    for items in ("0:512", MANY[0], "0:32;300:1;77:1", "99:1;50:1"):
        plan = plan_of(items)
        extra = with_sq.stage_time(mid, plan) - zero.stage_time(mid, plan)
        assert extra == pytest.approx(4 * 2e-9 * prefill_sq(plan), rel=1e-9, abs=1e-15), items
        assert zero.stage_time(mid, plan) == without.stage_time(mid, plan)  # bit for bit: old profiles unchanged


def test_fits_without_the_many_item_plans_leave_them_out_of_the_glue(tmp_path):
    """By default (``multi_items=False``, as before part 22) the glue's gaps hold the one-item plans only;
    ``multi_items=True`` (glue_live.py's ``items`` and ``sq`` ways) fits on the many-item plans too."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = _rows(2e-9) + operator_rows()
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "all"), glue_sq=True, multi_items=True)
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "single"), glue_prefill_step=False)
    plans = {d: {g["plan"] for g in read_profile(tmp_path / d).meta["layer_gap"]["plans"]} for d in ("all", "single")}
    assert set(MANY[:2]) <= plans["all"] and not plans["single"] & {MANY[0], MANY[1], MANY[4]}
    coef = {d: json.loads((tmp_path / d / "fits.json").read_text())["layer_glue"]["coef"] for d in ("all", "single")}
    assert coef["all"]["sq"] > 0 and "sq" not in coef["single"]


@pytest.mark.parametrize("key", ["sq", "dreq"])
@pytest.mark.parametrize("bad", [float("nan"), 1e300, "x"])
def test_a_profile_whose_optional_glue_term_is_not_a_number_is_refused(key, bad):
    d = {"form": "tok_req", "coef": {"c0": 1e-5, "tok": 1e-7, "req": 1e-6, key: bad}}
    assert f"coef {key}" in fit_problem("layer_glue", d)
    assert fit_problem("layer_glue", {**d, "coef": {**d["coef"], key: 1e-9}}) is None


def test_calibrate_fits_the_prefill_attention_context_term_only_when_asked(tmp_path):
    """Part 30 (c) reverted the context term on its fresh readings: ``ppsim calibrate`` fits ``attn_prefill``'s four
    terms; ``attn_ctx=True`` (``glue_live.py``'s ``ctx`` way) adds ``ctx``."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = _rows(0.0) + operator_rows()
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "default"))
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "ctx"), attn_ctx=True)
    coef = {d: json.loads((tmp_path / d / "fits.json").read_text())["attn_prefill"]["coef"] for d in ("default", "ctx")}
    assert set(coef["default"]) == {"call", "tok", "cp", "cc"}
    assert "ctx" in coef["ctx"] and coef["ctx"]["ctx"] >= 0


@pytest.mark.parametrize("bad", [float("nan"), -1e-9, 1e300, "x"])
def test_a_profile_whose_prefill_attention_context_term_is_not_a_time_is_refused(bad):
    """``prefill_attn``'s optional ``ctx`` (part 30) is checked as its four terms are: a finite, non-negative size."""
    d = {"form": "prefill_attn", "coef": {"call": 1e-5, "tok": 1e-7, "cp": 1e-10, "cc": 1e-10, "ctx": bad}}
    assert "coef ctx" in fit_problem("attn_prefill", d)
    assert fit_problem("attn_prefill", {**d, "coef": {**d["coef"], "ctx": 2e-8}}) is None


def _dec_rows() -> list[dict]:
    """Stage samples of a model whose ``layer_glue`` charges 15 us a decode request and nothing a prefill item."""
    glue = _glue(0.0)
    glue["layer_glue"].coef.update(req=0.0, dreq=15e-6)
    return _rows(0.0, glue)


def test_the_glue_fit_per_decode_request_recovers_a_request_term_prefill_items_do_not_pay():
    """32 prefill items of 16 tokens cost no more beyond their operators than one of 512: the request term over
    decode requests only gives the model back, the one over every request charges the 32 items for it."""
    got = fit_stage_glue(base_fits(), {}, SHAPE, _dec_rows(), "mean", per_decode=True)[0]["layer_glue"]
    assert got.coef["dreq"] == pytest.approx(15e-6, abs=1e-10) and got.coef["req"] == 0.0
    assert got.coef["c0"] == pytest.approx(TRUE["layer_glue"]["c0"], abs=1e-9)
    cost = ProfiledCost(Profile({}, {**base_fits(), "layer_glue": got}), SHAPE, None, 1)
    zero = ProfiledCost(Profile({}, {**base_fits(), **_glue(0.0)}), SHAPE, None, 1)
    mid = StageSpec(1, 2, 6, False, False)
    decodes, prefills = plan_of("127:1;200:1;50:1;80:1"), plan_of(MANY[0])
    c = TRUE["layer_glue"]
    assert cost.stage_time(mid, decodes) - zero.stage_time(mid, decodes) == pytest.approx(
        4 * (4 * 15e-6 - 4 * c["req"]), rel=1e-6
    )
    assert cost.stage_time(mid, prefills) - zero.stage_time(mid, prefills) == pytest.approx(
        -4 * 32 * c["req"], rel=1e-6
    )
