"""The stage glue fits (``calibration.glue_fits.fit_stage_glue``) recover known glue from synthetic
engine stage steps, and the profiled cost model charges it where a stage runs it. Pure arithmetic:
no torch, no timing."""

from __future__ import annotations

import math

import pytest

from calibration.calibrate import analyse_and_write
from calibration.glue_fits import fit_stage_glue
from calibration.samples import statistic, value
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import OpFit, Profile, ProfiledCost, fit_from_json, read_profile
from ppsim.models.shape import load_model
from tests.test_calibration_profiled import _fits, _write  # a complete synthetic operator set

SHAPE = load_model("tiny")
PLANS = ["99:1", "0:64", "127:1;200:1;50:1;80:1", "0:32;300:1;77:1", "255:1;" * 15 + "255:1", "512:128"]
TRUE = {
    "layer_glue": {"c0": 20e-6, "tok": 0.3e-6, "req": 4e-6},
    "first_glue": {"c0": 50e-6, "tok": 0.1e-6, "req": 1e-6},
    "last_glue": {"c0": 300e-6, "tok": 0.0, "req": 25e-6},
}
PRESTEP = {  # part 31's layer glue: decode requests and one charge a step holding a prefill item, no token term
    **TRUE,
    "layer_glue": {"c0": 20e-6, "tok": 0.0, "req": 0.0, "dreq": 6e-6, "pstep": 400e-6},
}
PRELOG = {  # part 32's: that charge growing with log2 of the step's largest prefill item
    **TRUE,
    "layer_glue": {"c0": 20e-6, "tok": 0.0, "req": 0.0, "dreq": 6e-6, "pstep": 100e-6, "plog": 60e-6},
}


def base_fits() -> dict[str, OpFit]:
    """The synthetic operators without any glue."""
    return {k: fit_from_json(k, v) for k, v in _fits().items() if k != "layer_glue"}


def synthetic_rows(stat_key: str = "mean_s", true: dict[str, dict[str, float]] = TRUE) -> list[dict]:
    """Stage samples as a profile with the ``true`` glue (TRUE) predicts them, for 3 layers from layer 0."""
    from calibration.samples import KINDS, plan_of

    glue = {k: OpFit(k, "tok_req", "", c) for k, c in true.items()}
    cost = ProfiledCost(Profile({}, {**base_fits(), **glue}), SHAPE, None, 1)
    rows = []
    for kind in ("stage_first", "stage_mid", "stage_last"):
        first, last = KINDS[kind]
        for items in PLANS:
            plan = plan_of(items)
            t = cost.stage_time(StageSpec(0, 0, 3, first, last), plan)
            rows.append(
                {
                    "op": kind,
                    "split": "stage",
                    "plan": items,
                    "items": items,
                    "layers": 3,
                    "start_layer": 0,
                    "tokens": plan.num_tokens,
                    "reqs": plan.num_reqs,
                    "median_s": t * 0.9,
                    stat_key: t,
                }
            )
    return rows


def operator_rows() -> list[dict]:
    """Operator samples of the synthetic operators: every 1-D one at 1-256, both attentions on a small grid."""
    from calibration.calibrate import FORMS

    rows = []
    for name, f in base_fits().items():
        if f.form in ("linear", "linear_floor") and FORMS.get(name, ("", ""))[1] in ("tokens", "reqs", "n"):
            for x in (1, 8, 64, 256):
                rows.append({"op": name, "split": "fit", FORMS[name][1]: x, "mean_s": f.at(x), "median_s": f.at(x)})
    pre, dec = base_fits()["attn_prefill"], base_fits()["attn_decode"]
    for c in (8, 64, 256):
        for p in (0, 128, 512):
            t = pre.prefill(c, p)
            rows.append({"op": "attn_prefill", "split": "fit", "chunk": c, "prefix": p, "mean_s": t, "median_s": t})
    for b in (1, 4, 16, 64):
        for ctx in (16, 512):
            t = dec.decode(b, b * ctx)
            rows.append(
                {"op": "attn_decode", "split": "fit", "batch": b, "ctx_tokens": b * ctx, "mean_s": t, "median_s": t}
            )
    return rows


def test_fit_stage_glue_recovers_the_glue_of_each_stage_end():
    base = base_fits()
    got, gaps = fit_stage_glue(base, {}, SHAPE, synthetic_rows(), "mean")
    assert set(got) == set(TRUE) and len(gaps) == 3 * len(PLANS)
    for name, coef in TRUE.items():
        for k, v in coef.items():
            assert got[name].coef[k] == pytest.approx(v, abs=1e-9), (name, k)


def _relative_errors(rows: list[dict], got: dict[str, OpFit]) -> list[float]:
    from calibration.samples import plan_of

    cost = ProfiledCost(Profile({}, {**base_fits(), **got}), SHAPE, None, 1)
    return [
        (cost.stage_time(StageSpec(0, 0, 3, False, False), plan_of(r["items"])) - r["mean_s"]) / r["mean_s"]
        for r in rows
        if r["op"] == "stage_mid"
    ]


def test_relative_glue_fit_minimises_the_stage_steps_relative_error():
    """Samples the linear glue cannot follow (a long step 10% slow): the relative form (the default
    since 2026-12-01) has the least sum of squared relative errors of the stage steps, less than the
    least squares in seconds (``relative=False``, ``experiments/validation/glue_fit.py``), and the
    short step closer."""
    rows = synthetic_rows()
    for r in rows:
        r["mean_s"] *= {"512:128": 1.10, "0:64": 0.95}.get(r["plan"], 1.0)
    relative = _relative_errors(rows, fit_stage_glue(base_fits(), {}, SHAPE, rows, "mean", relative=True)[0])
    seconds = _relative_errors(rows, fit_stage_glue(base_fits(), {}, SHAPE, rows, "mean", relative=False)[0])
    assert sum(e * e for e in relative) < sum(e * e for e in seconds)
    assert abs(relative[0]) < abs(seconds[0])  # the one-request decode step


def test_glue_is_charged_at_the_stage_ends_only():
    base = base_fits()
    glue = {k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}
    with_g = ProfiledCost(Profile({}, {**base, **glue}), SHAPE, None, 1)
    no_ends = ProfiledCost(Profile({}, {**base, "layer_glue": glue["layer_glue"]}), SHAPE, None, 1)
    from calibration.samples import plan_of

    plan = plan_of("0:32;300:1;77:1")  # 34 tokens, 3 requests
    mid = StageSpec(1, 2, 4, False, False)
    assert with_g.stage_time(mid, plan) == no_ends.stage_time(mid, plan)
    first, last = StageSpec(0, 0, 2, True, False), StageSpec(2, 4, 6, False, True)
    assert with_g.stage_time(first, plan) - no_ends.stage_time(first, plan) == pytest.approx(50e-6 + 34 * 0.1e-6 + 3e-6)
    assert with_g.stage_time(last, plan) - no_ends.stage_time(last, plan) == pytest.approx(300e-6 + 3 * 25e-6)


def test_statistic_is_the_mean_where_the_clock_excludes_other_processes():
    assert statistic("thread", "cpu") == "mean" and statistic("wall", "cuda") == "mean"
    assert statistic("wall", "cpu") == "median"
    assert value({"median_s": 1.0, "mean_s": 2.0}, "mean") == 2.0
    assert value({"median_s": 1.0}, "mean") == 1.0  # an artifact from before the mean was kept


def test_analyse_and_write_fits_the_glue_from_stage_rows(tmp_path):
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = synthetic_rows() + operator_rows()
    out = tmp_path / "out"
    analyse_and_write(rows, SHAPE, meta, str(out), glue_prefill_step=False)  # the glue before part 31
    prof = read_profile(out)
    assert {"first_glue", "last_glue", "layer_glue"} <= set(prof.fits)
    assert prof.meta["layer_gap"]["plans"][0]["stage"] == "stage_mid"
    for name, coef in TRUE.items():  # refitted operators reproduce the synthetic ones: so does the glue
        assert prof.fits[name].coef["c0"] == pytest.approx(coef["c0"], rel=0.05, abs=2e-6), name


def test_analyse_and_write_fits_the_prefill_step_glue_where_asked():
    """Part 31: with ``glue_prefill_step`` ``layer_glue`` is c0 + dreq x decode requests + pstep on a step holding a
    prefill item (no token term); from stage steps made with such a glue it recovers its three terms and the ends'
    glue. By default (part 31 (c)) the (1, tokens, requests) glue: no ``pstep``."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        meta = dict(read_profile(_write(Path(d) / "src")).meta, statistic="mean")
        rows = synthetic_rows(true=PRESTEP) + operator_rows()
        analyse_and_write(rows, SHAPE, meta, str(Path(d) / "out"), glue_prefill_step=True)
        analyse_and_write(rows, SHAPE, meta, str(Path(d) / "default"))
        fits = read_profile(Path(d) / "out").fits
        assert "pstep" not in read_profile(Path(d) / "default").fits["layer_glue"].coef
    got = fits["layer_glue"].coef
    assert got["tok"] == got["req"] == 0.0
    for k in ("c0", "dreq", "pstep"):
        assert got[k] == pytest.approx(PRESTEP["layer_glue"][k], rel=0.05, abs=1e-7), k
    for name in ("first_glue", "last_glue"):
        assert fits[name].coef["c0"] == pytest.approx(PRESTEP[name]["c0"], rel=0.05, abs=2e-6), name


def test_analyse_and_write_fits_the_prefill_log_glue_where_asked(tmp_path):
    """Part 32: with ``glue_prefill_log`` the glue's prefill charge is pstep + plog x log2 of the step's largest prefill
    item; from stage steps made with such a glue it recovers its four terms."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = synthetic_rows(true=PRELOG) + operator_rows()
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "out"), glue_prefill_log=True)
    got = read_profile(tmp_path / "out").fits["layer_glue"].coef
    for k in ("c0", "dreq", "pstep", "plog"):
        assert got[k] == pytest.approx(PRELOG["layer_glue"][k], rel=0.05, abs=1e-7), k


def test_the_prefill_step_glue_is_charged_once_a_step_that_holds_a_prefill_item():
    """``pstep`` is charged once a layer on a step with any prefill item, however many items or tokens it holds, and
    not on a decode-only step; ``dreq`` on each decode request; a glue without ``pstep`` prices as before."""
    from calibration.samples import plan_of

    stage = StageSpec(0, 0, 3, False, False)

    def cost(coef: dict[str, float]) -> ProfiledCost:
        glue = OpFit("layer_glue", "tok_req", "", coef)
        return ProfiledCost(Profile({}, {**base_fits(), "layer_glue": glue}), SHAPE, None, 1)

    base = {"c0": 20e-6, "tok": 0.0, "req": 0.0, "dreq": 6e-6}
    with_step, without = cost({**base, "pstep": 400e-6}), cost(base)
    for items in ("0:16", "0:16;" * 31 + "0:16", "0:512", "0:32;300:1;77:1"):
        plan = plan_of(items)
        extra = with_step.stage_time(stage, plan) - without.stage_time(stage, plan)
        assert extra == pytest.approx(3 * 400e-6), items
    decodes = plan_of("127:1;200:1;50:1")
    assert with_step.stage_time(stage, decodes) == without.stage_time(stage, decodes)
    with_log = cost({**base, "pstep": 400e-6, "plog": 50e-6})  # part 32: + plog x log2 of the largest prefill item
    for items, largest in (("0:16", 16), ("0:16;" * 31 + "0:16", 16), ("0:512", 512), ("0:32;300:1;77:1", 32)):
        plan = plan_of(items)
        extra = with_log.stage_time(stage, plan) - with_step.stage_time(stage, plan)
        assert extra == pytest.approx(3 * 50e-6 * math.log2(largest)), items
    assert with_log.stage_time(stage, decodes) == without.stage_time(stage, decodes)
    no_dreq = cost({"c0": 20e-6, "tok": 0.0, "req": 0.0})
    assert without.stage_time(stage, decodes) - no_dreq.stage_time(stage, decodes) == pytest.approx(3 * 3 * 6e-6)


def test_idle_fit_is_per_layer_extra_time_over_back_to_back_and_never_decreases():
    from calibration.path_fits import fit_idle
    from ppsim.cost.base import StageSpec

    def row(plan: str, gap: float, t: float) -> dict:
        return {
            "op": "stage_idle",
            "split": "idle",
            "plan": plan,
            "gap_s": gap,
            "layers": 4,
            "mean_s": t,
            "median_s": 0.0,
        }

    rows = [row("A", 0.0, 4.0e-3), row("A", 0.005, 4.4e-3), row("A", 0.02, 4.8e-3), row("A", 0.1, 4.7e-3)]
    rows += [row("B", 0.0, 8.0e-3), row("B", 0.005, 8.2e-3), row("B", 0.02, 8.8e-3), row("B", 0.1, 8.9e-3)]
    f = fit_idle(rows, "mean")
    assert f.coef["xs"] == [0.0, 0.005, 0.02, 0.1]
    assert f.coef["ys"] == pytest.approx([0.0, 0.075e-3, 0.2e-3, 0.2e-3])  # (0.1 + 0.05) / 2, (0.2 + 0.2) / 2, held
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": f}), SHAPE, None, 1)
    two = StageSpec(0, 0, 2, True, False)
    assert cost.has_idle and cost.idle_time(two, 0.0) == 0.0
    assert cost.idle_time(two, 0.0125) == pytest.approx(2 * (0.075e-3 + 0.5 * 0.125e-3))
    assert cost.idle_time(two, 5.0) == pytest.approx(2 * 0.2e-3)  # held beyond the longest gap
    assert fit_idle([], "mean") is None and not ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1).has_idle


def test_launch_at_more_than_one_stage_uses_its_own_fit():
    launch = OpFit("launch", "linear", "n", {"c0": 3e-4, "c1": 1e-5})
    multi = OpFit("launch_multi", "linear", "n", {"c0": 5e-4, "c1": 1e-5})
    fits = {**base_fits(), "launch": launch, "launch_multi": multi}
    assert ProfiledCost(Profile({}, fits), SHAPE, None, 1).launch_time(2) == pytest.approx(3.2e-4)
    assert ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2).launch_time(2) == pytest.approx(5.2e-4)
    older = {**base_fits(), "launch": launch}  # a profile without the two-stage run
    assert ProfiledCost(Profile({}, older), SHAPE, None, 1, pp=2).launch_time(2) == pytest.approx(3.2e-4)


def test_the_control_path_at_more_than_one_stage_uses_its_two_stage_fits():
    """Part 40: the return and the core's schedule and update spans as calibration measured them at two stages
    (``<kind>_multi``) are charged at PP > 1, the one-stage fits at PP = 1 and where a profile has no two-stage run."""

    def line(op: str, c0: float) -> OpFit:
        return OpFit(op, "linear", "n", {"c0": c0, "c1": 1e-6})

    one = {"return": line("return", 2e-4), "schedule": line("schedule", 2e-5), "update": line("update", 3e-5)}
    two = {f"{k}_multi": line(f"{k}_multi", f.coef["c0"] * 1.5) for k, f in one.items()}
    fits = {**base_fits(), **one, **two}
    at1 = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    at2 = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2)
    older = ProfiledCost(Profile({}, {**base_fits(), **one}), SHAPE, None, 1, pp=2)
    for cost, k in ((at1, 1.0), (at2, 1.5), (older, 1.0)):
        assert cost.return_time(4) == pytest.approx(2e-4 * k + 4e-6)
        assert cost.cpu_time("schedule", 4) == pytest.approx(2e-5 * k + 4e-6)
        assert cost.cpu_time("update", 4) == pytest.approx(3e-5 * k + 4e-6)


def test_fit_all_fits_the_two_stage_path_only_with_path_multi():
    from calibration.calibrate import fit_all

    rows = [
        {"op": op, "split": "fit", "n": n, "median_s": 1e-4 * n + (1e-4 if "multi" in op else 0.0)}
        for op in ("return", "return_multi", "schedule_multi", "update_multi")
        for n in (1, 2, 4, 8)
    ]
    fits, _ = fit_all(rows, path_multi=True)
    assert {"return", "return_multi", "schedule_multi", "update_multi"} <= set(fits)
    assert fits["return_multi"].at(2) == pytest.approx(3e-4) and fits["return"].at(2) == pytest.approx(2e-4)
    fits, _ = fit_all(rows)  # the default: recorded, not fitted (part 40, not adopted)
    assert "return" in fits and not {"return_multi", "schedule_multi", "update_multi"} & set(fits)


def test_paired_idle_rows_carry_the_penalty_itself_from_zero_at_no_gap():
    """idle_paired samples are (step after the gap) - (the back-to-back step just before it): no gap-0
    task to subtract, so one slow back-to-back task can no longer cancel the penalty (it did: P64@0's)."""
    from calibration.path_fits import fit_idle

    def row(plan: str, gap: float, extra: float) -> dict:
        return {"op": "stage_idle", "split": "idle_paired", "plan": plan, "gap_s": gap, "layers": 4, "median_s": extra}

    rows = [row("D1", 0.003, 0.6e-3), row("D1", 0.01, 0.9e-3), row("D1", 0.03, 0.8e-3)]
    rows += [row("P64", 0.003, 0.4e-3), row("P64", 0.01, 1.1e-3), row("P64", 0.03, -0.2e-3)]
    f = fit_idle(rows, "mean")
    assert f.coef["xs"] == [0.0, 0.003, 0.01, 0.03] and f.coef["per"] == "step"
    # per step: (0.6 + 0.4) / 2, (0.9 + 1.1) / 2, then (0.8 - 0.2) / 2 < that: held
    assert f.coef["ys"] == pytest.approx([0.0, 0.5e-3, 1.0e-3, 1.0e-3])
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": f}), SHAPE, None, 1)
    from ppsim.cost.base import StageSpec

    for layers in (1, 4):  # charged once per step, whatever the stage's depth
        assert cost.idle_time(StageSpec(0, 0, layers, True, False), 0.0065) == pytest.approx(0.75e-3)
    # the same rows with a split of the old kind would need gap-0 tasks: none, no fit
    assert fit_idle([{**r, "split": "idle"} for r in rows], "mean") is None


def test_replay_without_idle_drops_only_the_idle_charge():
    """replay_adjusted.py --without-idle: the same cost model, no stage_idle charge (what that term is worth)."""
    from experiments.validation.replay_adjusted import WithoutIdle
    from ppsim.cost.base import StageSpec
    from ppsim.policy.plan import PlanItem, make_plan

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 1e-3], "per": "step"})
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)
    bare = WithoutIdle(cost)
    stage, plan = StageSpec(0, 0, 2, True, False), make_plan(0, (PlanItem(0, 100, 1, False, True),))
    assert cost.has_idle and cost.idle_time(stage, 0.02) == pytest.approx(1e-3)
    assert not bare.has_idle and bare.idle_time(stage, 0.02) == 0.0
    assert bare.stage_time(stage, plan) == cost.stage_time(stage, plan) and bare.link_time(64) == cost.link_time(64)


def _live_rows(cost: ProfiledCost, factor: float, stages: int, gap_s: float) -> list[dict]:
    """Live-engine stage computes taking ``factor`` x their time alone (plus the idle charge), every
    other one timed alone."""
    from calibration.samples import KINDS, plan_of

    kinds = ("stage_full",) if stages == 1 else ("stage_first", "stage_last")
    rows = []
    for kind in kinds:
        first, last = KINDS[kind]
        spec = StageSpec(0, 0, 3, first, last)
        for i, items in enumerate(PLANS):
            alone = 1.1 * cost.stage_time(spec, plan_of(items))  # the model's own error does not enter
            t = factor * alone + cost.idle_time(spec, gap_s)
            row = {"op": kind, "split": f"live{stages}", "items": items, "layers": 3, "start_layer": 0}
            rows.append({**row, "gap_s": gap_s, "median_s": t, "mean_s": t, "repeats": 1})
            if i % 2 == 0:
                rows[-1]["alone_s"] = alone
    return rows


def test_live_factor_is_the_engine_over_the_same_steps_alone_per_depth_after_the_idle_charge():
    from calibration.live_fits import fit_live
    from calibration.samples import plan_of
    from experiments.validation.replay_adjusted import WithLive, WithoutDepth

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 0.4e-3], "per": "step"})
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)
    rows = _live_rows(cost, 1.04, 1, 0.5e-3) + _live_rows(cost, 1.13, 2, 4e-3)
    f = fit_live(cost, rows)
    assert f.coef["xs"] == [1.0, 2.0] and f.coef["ys"] == pytest.approx([1.04, 1.13])
    assert fit_live(cost, [r for r in rows if r["split"] == "live1"]).coef["ys"] == pytest.approx([1.04])
    # one run in a slow spell of the host among three: the median over the runs, not its ratio
    runs = [{**r, "run": k} for k, f in enumerate((1.04, 1.5, 1.06)) for r in _live_rows(cost, f, 1, 0.5e-3)]
    assert fit_live(cost, runs).coef["ys"] == pytest.approx([1.06])
    assert fit_live(cost, [{k: v for k, v in r.items() if k != "alone_s"} for r in rows]) is None
    assert fit_live(cost, []) is None
    # the host 10% slower while a run's steps were timed alone than during the run: its ratio x 1.1
    shifted = [{**r, "host_shift": 1.1} if r["split"] == "live1" else r for r in rows]
    assert fit_live(cost, shifted, shift=True).coef["ys"] == pytest.approx([1.04 * 1.1, 1.13])
    assert fit_live(cost, shifted).coef["ys"] == pytest.approx([1.04, 1.13])  # the charged factor: unshifted
    plan, full, first = plan_of(PLANS[2]), StageSpec(0, 0, 3, True, True), StageSpec(0, 0, 3, True, False)
    charged = {**base_fits(), "stage_idle": idle, "live_stage": f}
    for pp, spec, factor in ((1, full, 1.04), (2, first, 1.13), (4, first, 1.13)):
        scaled = ProfiledCost(Profile({}, charged), SHAPE, None, 1, pp=pp)
        assert scaled.live_factor == pytest.approx(factor)  # measured and reported
        # charged: its depth ratio (the level, common to both depths, moves with the host and is not)
        depth = 1.0 if pp == 1 else 1.13 / 1.04
        assert scaled.depth_factor == pytest.approx(depth)
        assert scaled.stage_time(spec, plan) == pytest.approx(depth * cost.stage_time(spec, plan))
        assert scaled.stage_times((spec,), plan) == [scaled.stage_time(spec, plan)]
        assert scaled.idle_time(spec, 4e-3) == cost.idle_time(spec, 4e-3)  # the idle charge is not scaled
        charged_live = WithLive(scaled)  # replay_adjusted.py --with-live: the level on top
        assert charged_live.stage_time(spec, plan) == pytest.approx(factor * cost.stage_time(spec, plan))
        assert charged_live.idle_time(spec, 4e-3) == cost.idle_time(spec, 4e-3)  # the idle charge is not scaled
        bare = WithoutDepth(scaled)  # replay_adjusted.py --without-depth: the stages-alone model
        assert bare.stage_time(spec, plan) == pytest.approx(cost.stage_time(spec, plan))
    assert cost.live_factor == 1.0 and cost.depth_factor == 1.0  # a profile without live runs: the model as fitted
    # live runs at two stages only: no level to divide by, so nothing is charged
    two = OpFit("live_stage", "interp", "stages", {"xs": [2.0], "ys": [1.2]})
    only2 = ProfiledCost(Profile({}, {**base_fits(), "live_stage": two}), SHAPE, None, 1, pp=2)
    assert only2.depth_factor == 1.0 and only2.stage_time(first, plan) == cost.stage_time(first, plan)
    # two stages measured faster than one: the host's drift between the runs, not a speed-up; held at 1
    under = OpFit("live_stage", "interp", "stages", {"xs": [1.0, 2.0], "ys": [1.1, 1.0]})
    held = ProfiledCost(Profile({}, {**base_fits(), "live_stage": under}), SHAPE, None, 1, pp=2)
    assert held.depth_factor == 1.0 and held.stage_time(first, plan) == cost.stage_time(first, plan)


def test_the_simulators_model_charges_the_live_level_held_at_one_at_every_depth():
    """``live_stage`` at one stage, held at 1 or more, times every stage compute of the simulator's model
    (``charge_level``, as ``load_profiled_cost`` builds it) at every depth, the depth ratio on top at PP > 1;
    the idle charge is not scaled; a model built directly (calibration, steps timed alone) charges none;
    ``replay_adjusted.py``'s ``LevelAs`` gives back the model a run was recorded with."""
    from calibration.samples import plan_of
    from experiments.validation.replay_adjusted import LevelAs, WithLive
    from ppsim.validate.run import level_factor_of

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 0.4e-3], "per": "step"})
    live = OpFit("live_stage", "interp", "stages", {"xs": [1.0, 2.0], "ys": [1.04, 1.13]})
    fits = {**base_fits(), "stage_idle": idle, "live_stage": live}
    plan, full, first = plan_of(PLANS[2]), StageSpec(0, 0, 3, True, True), StageSpec(0, 0, 3, True, False)
    alone = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)
    for pp, spec, depth in ((1, full, 1.0), (2, first, 1.13 / 1.04)):
        charged = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=pp, charge_level=True)
        assert charged.level_factor == pytest.approx(1.04) == level_factor_of(charged)
        assert charged.stage_time(spec, plan) == pytest.approx(1.04 * depth * alone.stage_time(spec, plan))
        assert charged.stage_times((spec,), plan) == [charged.stage_time(spec, plan)]
        assert charged.idle_time(spec, 4e-3) == alone.idle_time(spec, 4e-3)
        direct = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=pp)  # calibration's, the checks alone
        assert direct.level_factor == 1.0 and level_factor_of(direct) == 1.0
        assert direct.stage_time(spec, plan) == pytest.approx(depth * alone.stage_time(spec, plan))
        recorded = LevelAs(charged, 1.0)  # a run recorded before the level was charged
        assert recorded.stage_time(spec, plan) == pytest.approx(direct.stage_time(spec, plan))
        # --with-live: the whole live_stage at this depth, as measured
        assert WithLive(charged).stage_time(spec, plan) == pytest.approx(
            live.at(float(pp)) * alone.stage_time(spec, plan)
        )
    # a level under 1 is the host's drift between a run and its alone timing: held at 1
    under = OpFit("live_stage", "interp", "stages", {"xs": [1.0, 2.0], "ys": [0.93, 0.99]})
    held = ProfiledCost(Profile({}, {**base_fits(), "live_stage": under}), SHAPE, None, 1, charge_level=True)
    assert held.level_factor == 1.0 and held.stage_time(full, plan) == alone.stage_time(full, plan)
    # the depth ratio over the level as charged: PP=2 charges max(L1, L2, 1), a one-stage level under 1 being
    # that depth's own drift; replay_adjusted.py --depth-over-measured-level gives the rule before (over L1 as
    # measured: max(L1, 1) x max(L2 / L1, 1)), which differs only where L1 < 1
    from experiments.validation.replay_adjusted import WithoutDepth, depth_over_level

    for ys, pp2, before in (
        ([0.93, 0.99], 1.0, 0.99 / 0.93),
        ([0.948, 1.057], 1.057, 1.057 / 0.948),
        ([0.926, 0.998], 1.0, 0.998 / 0.926),
        ([1.04, 1.13], 1.13, 1.13),
        ([1.2, 1.1], 1.2, 1.2),
    ):
        f = {**base_fits(), "live_stage": OpFit("live_stage", "interp", "stages", {"xs": [1.0, 2.0], "ys": ys})}
        for pp, spec, want, then in ((1, full, max(ys[0], 1.0), max(ys[0], 1.0)), (2, first, pp2, before)):
            model = ProfiledCost(Profile({}, f), SHAPE, None, 1, pp=pp, charge_level=True)
            assert model.stage_time(spec, plan) == pytest.approx(want * alone.stage_time(spec, plan))
            held = WithoutDepth(model, 1.0, depth_over_level(model, pp))
            now = WithoutDepth(model, 1.0, depth_over_level(model, pp, charged=True))  # no live_depth: as charged
            assert now.stage_time(spec, plan) == pytest.approx(model.stage_time(spec, plan))
            assert held.stage_time(spec, plan) == pytest.approx(then * alone.stage_time(spec, plan))
            # calibration's own model (steps timed alone, no level charged) keeps the ratio over L1 as measured
            direct = ProfiledCost(Profile({}, f), SHAPE, None, 1, pp=pp)
            assert direct.depth_factor == pytest.approx(1.0 if pp == 1 else max(ys[1] / ys[0], 1.0))
    # live runs at two stages only: no level measured, none charged
    two = OpFit("live_stage", "interp", "stages", {"xs": [2.0], "ys": [1.2]})
    only2 = ProfiledCost(Profile({}, {**base_fits(), "live_stage": two}), SHAPE, None, 1, pp=2, charge_level=True)
    assert only2.level_factor == 1.0 and only2.stage_time(first, plan) == alone.stage_time(first, plan)


def test_with_live_finds_the_factor_under_a_ring_policys_wrapper():
    """A ring policy's cost model wraps the profile's (RingReturnCost): --with-live must still find it."""
    from calibration.samples import plan_of
    from experiments.validation.replay_adjusted import WithLive, live_factor_of
    from ppsim.cost.ring import RingReturnCost
    from ppsim.validate.run import depth_factor_of

    live = OpFit("live_stage", "interp", "stages", {"xs": [1.0, 2.0], "ys": [1.05, 1.2]})
    cost = ProfiledCost(Profile({}, {**base_fits(), "live_stage": live}), SHAPE, None, 1, pp=2)
    ring = RingReturnCost(cost, 0.0, 0.0, 2)
    assert live_factor_of(ring) == pytest.approx(1.2) and live_factor_of(object()) == 1.0
    assert depth_factor_of(ring) == pytest.approx(1.2 / 1.05) and depth_factor_of(object()) == 1.0
    stage, plan = StageSpec(0, 0, 2, True, False), plan_of("99:1;50:1")
    # the ring's model already charges the depth ratio; --with-live adds the level, 1.05
    assert WithLive(ring).stage_time(stage, plan) == pytest.approx(ring.stage_time(stage, plan) * 1.05)


def test_spread_is_each_steps_ratio_over_its_runs_level_mean_one_and_charged_at_pp2_only():
    """``stage_spread``: per live2 step (live - idle charge) / alone over the run's ratio of sums, pooled,
    mean one; ProfiledCost draws it per (stage, step) at PP > 1 only, and the mean model is untouched."""
    from calibration.live_fits import SPREAD_QUANTILES, fit_spread
    from calibration.samples import plan_of
    from ppsim.cost.ring import RingReturnCost
    from ppsim.cost.scaled import JitteredCompute

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 0.4e-3], "per": "step"})
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)
    # two runs at different levels (1.1 and 1.5), the same spread of steps about them: 0.8x and 1.2x
    spec, rows = StageSpec(1, 3, 6, False, True), []
    for run, level in enumerate((1.1, 1.5)):
        for k in range(3 * SPREAD_QUANTILES):
            items = PLANS[k % len(PLANS)]
            alone = cost.stage_time(spec, plan_of(items))
            t = level * (0.8 if k % 2 else 1.2) * alone + cost.idle_time(spec, 4e-3)
            row = {"op": "stage_last", "split": "live2", "items": items, "layers": 3, "start_layer": 3}
            rows.append({**row, "gap_s": 4e-3, "median_s": t, "alone_s": alone, "run": run})
    f = fit_spread(cost, rows)
    ys = f.coef["ys"]
    assert f.name == "stage_spread" and f.x == "quantile" and len(ys) == SPREAD_QUANTILES
    assert sum(ys) / len(ys) == pytest.approx(1.0) and ys == sorted(ys) and min(ys) > 0
    # the steps' spread is kept (0.8 : 1.2 about their mean), the runs' levels are not
    assert ys[0] == pytest.approx(0.8, abs=0.05) and ys[-1] == pytest.approx(1.2, abs=0.05)
    assert fit_spread(cost, [r for r in rows if r["split"] != "live2"]) is None
    assert fit_spread(cost, rows[:10]) is None  # too few steps for the table
    plan = plan_of(PLANS[2])
    fits = {**base_fits(), "stage_idle": idle, "stage_spread": f}
    one = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=1)
    assert one.spread is None  # at one stage a mean-one spread moves no mean: not charged
    two = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2, seed=4)
    draws = [two.spread(s, k) for s in (0, 1) for k in range(400)]
    assert set(draws) <= set(ys) and min(draws) == ys[0] and max(draws) == ys[-1]
    assert sum(draws) / len(draws) == pytest.approx(1.0, abs=0.05)
    assert two.stage_time(spec, plan) == cost.stage_time(spec, plan)  # the mean (the step-level check)
    assert [ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2, seed=5).spread(0, k) for k in range(40)] != draws[:40]
    assert RingReturnCost(two, 0.0, 0.0, 2).spread(1, 7) == two.spread(1, 7)  # a ring policy's wrapper
    assert JitteredCompute(two, [1.0]).spread is None  # the engine's own ratios replace it
    from experiments.validation.replay_adjusted import WithoutSpread

    bare = WithoutSpread(two, 1.5)  # replay_adjusted.py --without-spread: every compute its mean (x factor)
    assert bare.spread is None and bare.stage_time(spec, plan) == pytest.approx(1.5 * two.stage_time(spec, plan))


def test_turnaround_is_the_median_restart_and_charged_past_the_first_stage_at_pp2():
    from calibration.path_fits import fit_turnaround
    from ppsim.cost.ring import RingReturnCost

    rows = [
        {"op": "turnaround", "split": "live", "stage": 1, "median_s": 1.0e-3, "repeats": 5},
        {"op": "turnaround", "split": "live", "stage": 2, "median_s": 3.0e-3, "repeats": 2},
    ]
    f = fit_turnaround(rows)
    assert f.name == "turnaround" and f.coef["c0"] == pytest.approx(1.0e-3) and f.coef["c1"] == 0.0
    assert fit_turnaround([]) is None
    fits = {**base_fits(), "turnaround": f}
    assert ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=1).turnaround_s == 0.0  # one stage: no restart
    two = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2)
    assert two.turnaround_s == pytest.approx(1.0e-3) and RingReturnCost(two, 0.0, 0.0, 2).turnaround_s == 1.0e-3
    assert ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1, pp=2).turnaround_s == 0.0
    from experiments.validation.replay_adjusted import WithoutTurnaround

    assert WithoutTurnaround(two).turnaround_s == 0.0  # replay_adjusted.py --without-turnaround


def test_each_restart_is_recorded_one_by_one_and_no_fit_reads_it(tmp_path):
    """The calibration run's restarts one by one (``turnaround_each``, split ``record``): they survive
    samples.csv with their fields, and the turnaround fit reads only its own rows."""
    from calibration.artifact import read_samples, samples_csv
    from calibration.core_path import each_restart
    from calibration.path_fits import fit_turnaround
    from ppsim.metrics.records import OpRecord

    ms = 1e-3
    ops = [OpRecord("stage0", "compute", 0, 0, 4 * ms, 1, 1), OpRecord("stage1", "compute", 9, 3 * ms, 6 * ms, 1, 2)]
    ops += [OpRecord("stage1", "compute", 0, 6.2 * ms, 9 * ms, 1, 1)]
    ops += [OpRecord("core", "schedule", -1, -1 * ms, 0, 1, 1)]  # the engine's core records carry no step id
    rows = each_restart(ops, run=4)
    assert rows == [
        pytest.approx(
            {"op": "turnaround_each", "split": "record", "run": 4, "step_id": 0, "reqs": 1, "tokens": 1, "chunk": 0,
             "gap_s": 2 * ms, "median_s": 0.2 * ms, "prev_s": 3 * ms, "prev_prefill": 0, "at_s": 6 * ms,
             "core_lag_s": -6 * ms, "prev_step_id": 9, "after_handover": 1, "repeats": 1}
        )
    ]  # fmt: skip
    (tmp_path / "samples.csv").write_text(samples_csv(rows))
    assert read_samples(tmp_path) == rows
    assert fit_turnaround(rows) is None


def test_each_restart_carries_its_parts_from_the_stage_loop(tmp_path):
    """With the run's stage-loop rows, each restart also carries the hand-on of the stage's previous outputs
    (and whether it was switched out), the control messages and the input's receive before it."""
    from calibration.artifact import read_samples, samples_csv
    from calibration.core_path import each_restart
    from ppsim.metrics.records import OpRecord

    ms = 1e-3
    ops = [OpRecord("stage0", "compute", 0, 0, 4 * ms, 1, 1), OpRecord("stage1", "compute", 9, 3 * ms, 6 * ms, 1, 2)]
    ops += [OpRecord("stage1", "compute", 0, 6.2 * ms, 9 * ms, 1, 1)]
    # LOOP_FIELDS: stage, step, tokens, reqs, ready, recv done, start, end, ctrl, out, out cpu, switched, cpu, preempted
    loop = [(1, 9, 1, 2, 2.9 * ms, 2.95 * ms, 3 * ms, 6 * ms, 0.05 * ms, 0.1 * ms, 0.05 * ms, 1, 3 * ms, 0)]
    loop += [(1, 0, 1, 1, 6.12 * ms, 6.15 * ms, 6.2 * ms, 9 * ms, 0.02 * ms, 0.1 * ms, 0.05 * ms, 0, 2.8 * ms, 0)]
    loop += [(0, 0, 1, 1, 0.0, -1.0, 0.0, 4 * ms, 0.01 * ms, 0.2 * ms, 0.1 * ms, 0, 4 * ms, 0)]
    (row,) = each_restart(ops, run=4, loop=loop)
    assert row["median_s"] == pytest.approx(0.2 * ms)
    assert (row["out_s"], row["out_switched"]) == (pytest.approx(0.1 * ms), 1)  # step 9's hand-on
    assert row["ctrl_s"] == pytest.approx(0.02 * ms) and row["recv_wait_s"] == pytest.approx(0.03 * ms)
    (tmp_path / "samples.csv").write_text(samples_csv([row]))
    assert read_samples(tmp_path) == [pytest.approx(row)]
    assert "out_s" not in each_restart(ops, run=4)[0]  # no stage-loop rows: no parts


def test_turnaround_b2b_is_the_line_through_back_to_back_restarts_only():
    """Part 24: restarts right after a hand-over (the fast mode) are left out; the rest by requests give the
    line (0.5 ms + 0.02 ms a request here, the fast 0.2-ms ones at 8 requests ignored); rows without
    ``after_handover`` (the first calibrations that kept them) count as back-to-back where the step before is
    among the run's restarts; without such rows, the constant."""
    from calibration.path_fits import back_to_back, fit_turnaround

    def each(sid, reqs, ms, after=None, run=3):
        r = {"op": "turnaround_each", "split": "record", "run": run, "step_id": sid, "reqs": reqs}
        r["median_s"] = ms * 1e-3
        return r if after is None else {**r, "after_handover": after}

    rows = [each(0, 1, 0.52, 0), each(1, 1, 0.52, 0), each(2, 8, 0.66, 0), each(3, 8, 0.66, 0), each(4, 16, 0.82, 0)]
    rows += [each(5, 8, 0.2, 1), each(6, 8, 0.2, 1), each(7, 8, 0.2, 1)]
    waited = [{"op": "turnaround_waited", "split": "live", "stage": 1, "median_s": 0.4e-3, "repeats": 9}]
    waited += [{"op": "turnaround", "split": "live", "reqs": 8, "median_s": 0.7e-3, "repeats": 12}]  # by requests
    f = fit_turnaround(rows + waited, b2b=True)
    assert f.x == "reqs" and f.coef == pytest.approx({"c0": 0.5e-3, "c1": 0.02e-3})
    assert fit_turnaround(rows + waited).coef == {"c0": pytest.approx(0.4e-3), "c1": 0.0}  # the default: unchanged
    old = [each(10, 1, 0.5), each(11, 1, 0.5), each(13, 8, 0.2), each(14, 8, 0.64), each(14, 4, 9.0, run=4)]
    assert [r["step_id"] for r in back_to_back(old)] == [11, 14]  # 10 and 13 follow no restart; run 4 has no 13
    assert fit_turnaround(waited, b2b=True).coef == {"c0": pytest.approx(0.4e-3), "c1": 0.0}  # no rows: the constant


def test_turnaround_wide_is_the_line_through_every_restart_of_the_wide_run():
    """Part 26: ``wide`` fits the line by requests through all the wide run's restarts (``turnaround_wide``),
    the fast ones too, each request count's median weighted by its count; the two-micro-batch run's rows take no
    part; a calibration without the wide run keeps the constant; the default is the constant either way."""
    from calibration.path_fits import fit_turnaround

    def wide(sid, reqs, ms, after=0):
        r = {"op": "turnaround_wide", "split": "record", "run": -1, "step_id": sid, "reqs": reqs}
        return {**r, "median_s": ms * 1e-3, "after_handover": after}

    rows = [wide(0, 1, 0.8), wide(1, 1, 0.8), wide(2, 32, 1.42), wide(3, 32, 1.42), wide(4, 16, 1.1, 1)]
    rows += [wide(5, 16, 1.12, 1), wide(6, 16, 1.1)]  # per count, the median: 16 -> 1.1 ms (a fast one would count)
    each = [{**r, "op": "turnaround_each", "reqs": 8, "median_s": 5e-3} for r in rows]  # not the wide run's
    waited = [{"op": "turnaround_waited", "split": "live", "stage": 1, "median_s": 0.4e-3, "repeats": 9}]
    waited += [{"op": "turnaround", "split": "live", "reqs": 8, "median_s": 0.7e-3, "repeats": 12}]  # by requests
    f = fit_turnaround(rows + each + waited, wide=True)
    assert f.x == "reqs" and f.coef == pytest.approx({"c0": 0.78e-3, "c1": 0.02e-3})
    assert fit_turnaround(rows + each + waited).coef == {"c0": pytest.approx(0.4e-3), "c1": 0.0}  # the default
    assert fit_turnaround(each + waited, wide=True).coef == {
        "c0": pytest.approx(0.4e-3),
        "c1": 0.0,
    }  # none: the constant
    # part 28: through the back-to-back ones only (the two after a hand-over at 16 left out: 16 -> 1.1 ms still)
    fast = [wide(7, 1, 0.18, 1), wide(8, 1, 0.18, 1), wide(9, 1, 0.18, 1)]  # round 56's fast one-request tail
    assert fit_turnaround(rows + fast + waited, wide=True).coef["c0"] < 0.5e-3  # every restart: pulled down
    b2b = fit_turnaround(rows + fast + waited, wide=True, wide_b2b=True)
    assert b2b.coef == pytest.approx({"c0": 0.78e-3, "c1": 0.02e-3})


def test_turnaround_held_stops_the_line_at_the_most_requests_its_restarts_had():
    """Part 25 (c): ``held`` keeps the b2b line and records ``n_max``, the most requests among the back-to-back
    restarts; the model charges a step of more requests the line's value there (through the ring wrapper
    too); without ``held``, or a fit without ``n_max`` (every profile before), the line runs on unheld."""
    from calibration.path_fits import fit_turnaround
    from ppsim.cost.profile_check import fit_problem
    from ppsim.cost.ring import RingReturnCost

    rows = [
        {
            "op": "turnaround_each",
            "split": "record",
            "run": 3,
            "step_id": i,
            "reqs": n,
            "median_s": (0.5 + 0.02 * n) * 1e-3,
        }
        for i, n in enumerate((1, 1, 8, 8))
    ]
    for r in rows:
        r["after_handover"] = 0
    held = fit_turnaround(rows, b2b=True, held=True)
    assert held.coef == pytest.approx({"c0": 0.5e-3, "c1": 0.02e-3, "n_max": 8.0})
    assert "n_max" not in fit_turnaround(rows, b2b=True).coef
    assert fit_problem("turnaround", {"form": "linear", "x": "reqs", "coef": held.coef}) is None
    two = ProfiledCost(Profile({}, {**base_fits(), "turnaround": held}), SHAPE, None, 1, pp=2)
    assert two.turnaround_max_reqs == 8.0 and RingReturnCost(two, 0.0, 0.0, 2).turnaround_max_reqs == 8.0
    unheld = ProfiledCost(
        Profile({}, {**base_fits(), "turnaround": fit_turnaround(rows, b2b=True)}), SHAPE, None, 1, pp=2
    )
    assert unheld.turnaround_max_reqs == float("inf")


def test_turnaround_by_requests_is_a_line_through_the_medians_and_charged_per_request():
    """Rows by the step's requests (calibration since part 21): a weighted line through their medians,
    recovered exactly from points on one; a negative slope or one request count gives the weighted
    median; by default (part 21 did not adopt the line) the constant from the ``turnaround_waited`` rows."""
    from calibration.path_fits import fit_turnaround
    from experiments.validation.replay_adjusted import WithoutTurnaround, WithPath
    from ppsim.cost.ring import RingReturnCost

    line = [
        {"op": "turnaround", "split": "live", "reqs": n, "median_s": 5e-4 + 2e-5 * n, "repeats": k}
        for n, k in ((1, 13), (3, 17), (8, 95))
    ]
    waited = {"op": "turnaround_waited", "split": "live", "stage": 1, "median_s": 2.4e-4, "repeats": 40}
    f = fit_turnaround([*line, waited], by_reqs=True)
    assert f.x == "reqs" and f.coef == pytest.approx({"c0": 5e-4, "c1": 2e-5})
    assert fit_turnaround([*line, waited]).coef == {"c0": pytest.approx(2.4e-4), "c1": 0.0}  # the default
    falling = [{**r, "median_s": 1e-3 - 1e-5 * r["reqs"]} for r in line]
    assert fit_turnaround(falling, by_reqs=True).coef == {"c0": pytest.approx(1e-3 - 8e-5), "c1": 0.0}  # 95 of 125 at 8
    assert fit_turnaround(line[:1], by_reqs=True).coef == {"c0": pytest.approx(5.2e-4), "c1": 0.0}
    two = ProfiledCost(Profile({}, {**base_fits(), "turnaround": f}), SHAPE, None, 1, pp=2)
    assert two.turnaround_s == pytest.approx(5e-4) and two.turnaround_per_req_s == pytest.approx(2e-5)
    assert RingReturnCost(two, 0.0, 0.0, 2).turnaround_per_req_s == pytest.approx(2e-5)
    assert WithoutTurnaround(two).turnaround_per_req_s == 0.0
    assert WithPath(two, 1.0, 1.5).turnaround_per_req_s == pytest.approx(3e-5)
    one = ProfiledCost(Profile({}, {**base_fits(), "turnaround": f}), SHAPE, None, 1, pp=1)
    assert one.turnaround_s == 0.0 and one.turnaround_per_req_s == 0.0
    old = ProfiledCost(
        Profile({}, {**base_fits(), "turnaround": fit_turnaround([waited], by_reqs=False)}), SHAPE, None, 1, pp=2
    )
    assert old.turnaround_per_req_s == 0.0  # a constant fit (by stage) charges no slope


def test_the_idle_table_checked_on_the_two_stage_live_runs():
    """idle_live_scale: the share of the paired idle table that makes the two-stage live runs, net of it,
    run at the one-stage runs' level; 1 where they run slower, 0 where they run faster even without it."""
    from calibration.live_fits import idle_live_scale

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 1e-4], "per": "step"})
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)  # steps of ~0.2 ms
    bare = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    one = _live_rows(cost, 1.04, 1, 0.0)  # back to back: no idle charge at one stage
    # two stages after 10 ms idle: 1.04 x alone plus 40% of the table's charge, the rest the table's excess
    two = _live_rows(bare, 1.04, 2, 0.01)
    for r in two:
        r["median_s"] += 0.4 * 1e-4
    assert idle_live_scale(cost, one + two) == pytest.approx(0.4, abs=1e-9)
    slower = _live_rows(cost, 1.13, 2, 0.01)  # the whole charge and slower still: the table stands
    assert idle_live_scale(cost, one + slower) == 1.0
    faster = _live_rows(bare, 1.0, 2, 0.01)  # faster than one stage even with no charge: drift, none kept
    assert idle_live_scale(cost, one + faster) == 0.0
    assert idle_live_scale(cost, one) == 1.0 and idle_live_scale(cost, []) == 1.0  # nothing to check against
    huge = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 1e-3], "per": "step"})
    over = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": huge}), SHAPE, None, 1)  # 5x the step
    assert idle_live_scale(over, one + two) == pytest.approx(0.04, abs=1e-9)
    # calibrate prints it (reported in meta.json, not charged)
    from calibration.report import format_report

    line = "idle charge (stage_idle) checked on the live runs: the two-stage runs bear out x0.400 of the paired"
    assert line in format_report({"stage_idle_live_scale": 0.4}, {})
    assert "idle charge" not in format_report({"stage_idle_live_scale": 1.0}, {}) + format_report({}, {})


def test_depth_over_model_takes_the_stage_models_error_on_the_live_steps_out(tmp_path):
    """``replay_adjusted.py --depth-over-model``: live steps 1.04x (one stage) and 1.13x (two) their time
    alone as first timed, the two-stage steps' alone timing then 10% under it: over the steps alone the
    ratio reads (1.13 / 0.9) / 1.04, over the model 1.13 / 1.04; 1 at one stage."""
    from calibration.artifact import samples_csv
    from calibration.live_fits import fit_live
    from experiments.validation.replay_adjusted import depth_over_model
    from ppsim.errors import PPSimError

    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    rows = _live_rows(cost, 1.04, 1, 0.0) + _live_rows(cost, 1.13, 2, 0.0)
    rows = [{**r, "alone_s": 0.9 * r["alone_s"]} if r["split"] == "live2" and "alone_s" in r else r for r in rows]
    (tmp_path / "samples.csv").write_text(samples_csv(rows))
    live = fit_live(cost, rows)
    assert live.coef["ys"] == pytest.approx([1.04, 1.13 / 0.9])
    v = {"scenario": {"cost": {"profile_dir": str(tmp_path)}}}
    for pp, want in ((1, 1.0), (2, 1.13 / 1.04)):
        model = ProfiledCost(Profile({}, {**base_fits(), "live_stage": live}), SHAPE, None, 1, pp=pp, charge_level=True)
        assert depth_over_model(v, model, pp) == pytest.approx(want)
    assert ProfiledCost(Profile({}, {**base_fits(), "live_stage": live}), SHAPE, None, 1, pp=2).depth_factor == (
        pytest.approx(1.13 / 0.9 / 1.04)
    )
    (tmp_path / "samples.csv").unlink()  # fits.json only: refused in one line
    with pytest.raises(PPSimError, match="--depth-over-model: .* has no samples.csv"):
        depth_over_model(v, model, 2)


def test_the_simulator_charges_the_depth_ratio_over_the_model_where_the_profile_has_it():
    """``live_depth`` (live_fits.fit_depth): the live runs at two stages over one, each over the stage model;
    the simulator's model charges it at PP > 1 (held at 1 or more) in place of live_stage's ratio over the
    steps timed alone, which counts the model's error on the two-stage steps a second time; calibration's own
    model keeps live_stage's; calibrate reports which; --depth-over-model gives the same ratio on older
    profiles."""
    from calibration.fit import fit_to_json
    from calibration.live_fits import fit_depth, fit_live
    from calibration.report import format_report
    from calibration.samples import plan_of
    from experiments.validation.replay_adjusted import WithoutDepth, depth_over_level

    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    rows = _live_rows(cost, 1.04, 1, 0.0) + _live_rows(cost, 1.13, 2, 0.0)
    rows = [{**r, "alone_s": 0.9 * r["alone_s"]} if r["split"] == "live2" and "alone_s" in r else r for r in rows]
    live, depth = fit_live(cost, rows), fit_depth(cost, rows)
    assert depth.name == "live_depth" and depth.coef == pytest.approx({"c0": 1.13 / 1.04, "c1": 0.0})
    assert fit_depth(cost, [r for r in rows if r["split"] != "live2"]) is None  # one depth only: no ratio
    assert fit_depth(cost, []) is None
    fits = {**base_fits(), "live_stage": live, "live_depth": depth}
    plan, full, first = plan_of(PLANS[2]), StageSpec(0, 0, 3, True, True), StageSpec(0, 0, 3, True, False)
    for pp, spec, want in ((1, full, 1.04), (2, first, 1.04 * 1.13 / 1.04)):
        model = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=pp, charge_level=True)
        assert model.stage_time(spec, plan) == pytest.approx(want * cost.stage_time(spec, plan))
    two = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2, charge_level=True)
    # the rule before (live_stage over the level as charged) on the same profile: replay_adjusted's flag
    before = WithoutDepth(two, 1.0, depth_over_level(two, 2, charged=True))
    assert before.stage_time(first, plan) == pytest.approx(1.13 / 0.9 * cost.stage_time(first, plan))
    direct = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2)  # calibration's model: live_stage's ratio
    assert direct.depth_factor == pytest.approx(1.13 / 0.9 / 1.04)
    under = {**fits, "live_depth": OpFit("live_depth", "linear", "stages", {"c0": 0.97, "c1": 0.0})}
    assert ProfiledCost(Profile({}, under), SHAPE, None, 1, pp=2, charge_level=True).depth_factor == 1.0
    fj = {k: fit_to_json(f, {}) for k, f in fits.items()}
    assert "its depth ratio x1.087 at PP > 1 (over the model, live_depth)" in format_report({}, fj)
    del fj["live_depth"]
    assert "its depth ratio x1.207 at PP > 1 (live_stage)" in format_report({}, fj)


def test_level_over_model_charges_live_runs_under_the_model_unheld(tmp_path):
    """``replay_adjusted.py --level-over-model``: live runs that came in under their steps alone (0.85x at one
    stage, 0.84x at two; the engine's stages on cores of their own), the steps alone 1.1x the model, are
    charged as measured over the model: the level 0.935, not held at 1 as the simulator charges it, the
    depth ratio 0.924 / 0.935, not held at 1 (1 without two-stage runs); refused in one line for a profile
    without samples.csv."""
    from calibration.artifact import samples_csv
    from calibration.live_fits import fit_depth, fit_live
    from calibration.samples import plan_of
    from experiments.validation.replay_adjusted import LevelAs, WithoutDepth, level_over_model
    from ppsim.errors import PPSimError

    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    rows = _live_rows(cost, 0.85, 1, 0.0) + _live_rows(cost, 0.84, 2, 0.0)
    (tmp_path / "samples.csv").write_text(samples_csv(rows))
    fits = {**base_fits(), "live_stage": fit_live(cost, rows), "live_depth": fit_depth(cost, rows)}
    v = {"scenario": {"cost": {"profile_dir": str(tmp_path)}}}
    plan, full, first = plan_of(PLANS[2]), StageSpec(0, 0, 3, True, True), StageSpec(0, 0, 3, True, False)
    for pp, spec, want in ((1, full, 0.935), (2, first, 0.924)):
        model = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=pp, charge_level=True)
        assert model.stage_time(spec, plan) == pytest.approx(cost.stage_time(spec, plan))  # held at 1, twice
        level, depth = level_over_model(v, model, pp)
        assert (level, depth) == pytest.approx((0.935, 0.924 / 0.935 if pp > 1 else 1.0))
        unheld = WithoutDepth(LevelAs(model, level), 1.0, depth)
        assert unheld.stage_time(spec, plan) == pytest.approx(want * cost.stage_time(spec, plan))
    one_depth = tmp_path / "one"
    one_depth.mkdir()
    (one_depth / "samples.csv").write_text(samples_csv(_live_rows(cost, 0.85, 1, 0.0)))
    w = {"scenario": {"cost": {"profile_dir": str(one_depth)}}}
    assert level_over_model(w, model, 1) == pytest.approx((0.935, 1.0))
    assert level_over_model(w, model, 2) == pytest.approx((0.935, 1.0))  # no two-stage runs: no depth ratio
    (tmp_path / "samples.csv").unlink()
    with pytest.raises(PPSimError, match="--level-over-model: .* has no samples.csv"):
        level_over_model(v, model, 2)


def _alone_rows(layer_c0: float) -> list[dict]:
    """Live-engine steps timed alone (``alone_s``) as a model with the TRUE glue but ``layer_c0`` per layer
    prices them: one-stage (3 layers, both ends) and two-stage (a first and a last stage of 3 layers)."""
    from calibration.samples import KINDS, plan_of

    glue = {k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}
    glue["layer_glue"] = OpFit("layer_glue", "tok_req", "", {**TRUE["layer_glue"], "c0": layer_c0})
    cost = ProfiledCost(Profile({}, {**base_fits(), **glue}), SHAPE, None, 1)
    rows = []
    for split, kinds in (("live1", ("stage_full",)), ("live2", ("stage_first", "stage_last"))):
        for kind in kinds:
            first, last = KINDS[kind]
            for items in PLANS:
                alone = cost.stage_time(StageSpec(0, 0, 3, first, last), plan_of(items))
                row = {"op": kind, "split": split, "items": items, "layers": 3, "start_layer": 0, "alone_s": alone}
                rows.append({**row, "gap_s": 0.0, "median_s": alone, "mean_s": alone, "repeats": 1})
    return rows


def test_live_glue_recovers_the_glue_where_the_grid_and_the_live_steps_agree():
    """``fit_layer_glue_live``: the grid's middle stages and the live steps timed alone (their ends priced with
    the fitted end glues) from one model give that model's ``layer_glue`` back."""
    got, _ = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=_alone_rows(20e-6))
    for k, v in TRUE["layer_glue"].items():
        assert got["layer_glue"].coef[k] == pytest.approx(v, abs=1e-9), k
    assert got["first_glue"].coef == pytest.approx(TRUE["first_glue"]) and got["last_glue"].coef == pytest.approx(
        TRUE["last_glue"]
    )


def test_live_glue_weighs_the_grid_and_the_live_steps_alike_however_many_of_each():
    """Live steps cheaper than the grid by 15 us a layer: the fit lands between the two, closer to each set than
    the other set's own glue is, and the same with the live steps repeated (each set's total weight is one)."""
    grid_c0, live_c0 = TRUE["layer_glue"]["c0"], 5e-6
    alone = _alone_rows(live_c0)
    got = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=alone)[0]["layer_glue"]
    assert live_c0 < got.coef["c0"] < grid_c0
    again = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=alone * 5)[0]["layer_glue"]
    assert again.coef == pytest.approx(got.coef, rel=1e-9, abs=1e-15)
    grid_only = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean")[0]["layer_glue"]
    assert grid_only.coef["c0"] == pytest.approx(grid_c0, abs=1e-12)


def test_tok_prefill_takes_the_glue_token_term_from_the_grids_one_item_prefills_alone():
    """Part 27: ``tok_prefill`` fits the token term on the grid's plans of one prefill item (``0:64``, ``512:128``),
    then the constant and request terms with it held. Where grid and live steps agree, the glue comes back; with the
    live steps 15 us a layer cheaper, the token term stays the prefills' own while the joint fit's moves."""
    from calibration.samples import one_prefill, plan_of

    assert [one_prefill(plan_of(p)) for p in PLANS] == [False, True, False, False, False, True]
    same = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=_alone_rows(20e-6), tok_prefill=True)
    assert same[0]["layer_glue"].coef == pytest.approx(TRUE["layer_glue"], abs=1e-12)
    apart = _alone_rows(5e-6)
    fixed = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=apart, tok_prefill=True)[0]
    joint = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=apart)[0]
    assert fixed["layer_glue"].coef["tok"] == pytest.approx(TRUE["layer_glue"]["tok"], abs=1e-12)
    assert abs(joint["layer_glue"].coef["tok"] - TRUE["layer_glue"]["tok"]) > 1e-9
    assert 5e-6 < fixed["layer_glue"].coef["c0"] < 20e-6  # the constant between the two sets, as before
    grid_only = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", tok_prefill=True)[0]
    assert grid_only["layer_glue"].coef == pytest.approx(TRUE["layer_glue"], abs=1e-12)  # no live steps: as before


def test_analyse_and_write_fits_the_layer_glue_on_the_live_steps_too_by_default(tmp_path):
    """``ppsim calibrate`` (and ``refit``) take the live steps timed alone into ``layer_glue`` and say so in its
    note; ``glue_live=False`` is the grid's fit alone."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = synthetic_rows() + _alone_rows(5e-6) + operator_rows()
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "live"))
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "grid"), glue_live=False)
    import json

    live = json.loads((tmp_path / "live" / "fits.json").read_text())["layer_glue"]
    grid = json.loads((tmp_path / "grid" / "fits.json").read_text())["layer_glue"]
    assert live["n_live_samples"] == len(PLANS) and "live engine's steps timed alone" in live["note"]
    assert "one-stage runs' only" in live["note"]  # glue_whole, the default since part 36
    assert "n_live_samples" not in grid and "live engine" not in grid["note"]
    assert 5e-6 < live["coef"]["c0"] < grid["coef"]["c0"]
    assert grid["coef"]["c0"] == pytest.approx(TRUE["layer_glue"]["c0"], rel=0.05, abs=2e-6)


def test_glue_whole_fits_the_layer_glue_on_the_one_stage_live_steps_only(tmp_path):
    """Part 36: with the two-stage runs' steps cheaper by 15 us a layer (their stages' weights in cache) and the
    one-stage runs' steps as the grid's model prices them, ``glue_whole`` (the default since its verdict) gives that
    model's glue back and counts the one-stage steps alone; with it off the fit lands between the two sets."""
    import json

    from calibration.live_fits import whole_model_steps

    live = [r for r in _alone_rows(20e-6) if r["split"] == "live1"]
    live += [r for r in _alone_rows(5e-6) if r["split"] == "live2"]
    assert whole_model_steps(live) == live[: len(PLANS)]
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    rows = synthetic_rows() + live + operator_rows()
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "whole"))
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "before"), glue_whole=False)
    whole = json.loads((tmp_path / "whole" / "fits.json").read_text())["layer_glue"]
    before = json.loads((tmp_path / "before" / "fits.json").read_text())["layer_glue"]
    assert whole["n_live_samples"] == len(PLANS) and before["n_live_samples"] == 3 * len(PLANS)
    assert whole["coef"]["c0"] == pytest.approx(TRUE["layer_glue"]["c0"], rel=0.05, abs=2e-6)
    assert 5e-6 < before["coef"]["c0"] < whole["coef"]["c0"] - 2e-6
    assert "glue_whole" in whole["note"] and "glue_whole" not in before["note"]


def test_live_glue_prices_a_smaller_stage_with_stage_layers_where_it_is_charged():
    """Live steps of one-layer stages costing 0.8x a layer of the three-layer stack: with ``stage_layers`` charged
    (``replay_adjusted.py --with-stage-layers``) the live fit takes the ratio out and gives the stack's glue back;
    recorded only, the glue absorbs it (lower)."""
    from calibration.samples import KINDS, plan_of

    ratio = OpFit("stage_layers", "interp", "layers", {"xs": [1.0, 3.0], "ys": [0.8, 1.0]})
    glue = {k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}
    cost = ProfiledCost(Profile({}, {**base_fits(), **glue, "stage_layers": ratio}), SHAPE, None, 1)
    alone = []
    for kind in ("stage_first", "stage_last"):
        first, last = KINDS[kind]
        for items in PLANS:
            t = cost.stage_time(StageSpec(0, 0, 1, first, last), plan_of(items))
            alone.append({"op": kind, "split": "live2", "items": items, "layers": 1, "start_layer": 0, "alone_s": t})
    charged = {**base_fits(), "stage_layers": ratio}
    got = fit_stage_glue(charged, {}, SHAPE, synthetic_rows(), "mean", live=alone)[0]["layer_glue"]
    for k, v in TRUE["layer_glue"].items():
        assert got.coef[k] == pytest.approx(v, abs=1e-9), k
    recorded = fit_stage_glue(base_fits(), {}, SHAPE, synthetic_rows(), "mean", live=alone)[0]["layer_glue"]
    assert recorded.coef["c0"] < got.coef["c0"] - 1e-6


def test_spread_by_gap_keeps_a_table_for_busy_steps_and_one_for_steps_after_longer_gaps():
    """Part 29: ``fit_spread(by_gap=True)`` splits the live2 steps at ``SPREAD_GAP_S`` by the gap before them; the
    pipelines' draw takes the table of the compute's own gap; a class too small for a table takes the pooled one;
    fits.json's check refuses half a second table."""
    from calibration.live_fits import SPREAD_GAP_S, SPREAD_QUANTILES, fit_spread
    from calibration.samples import plan_of
    from ppsim.cost.profile_check import fit_problem

    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    spec, rows = StageSpec(1, 3, 6, False, True), []
    # a busy run (gaps of 1 ms, steps 0.9x / 1.1x about its level) and a waiting one (20 ms, 0.6x / 1.4x)
    for run, (gap, lo) in enumerate(((1e-3, 0.9), (20e-3, 0.6))):
        for k in range(2 * SPREAD_QUANTILES):
            items = PLANS[k % len(PLANS)]
            alone = cost.stage_time(spec, plan_of(items))
            row = {"op": "stage_last", "split": "live2", "items": items, "layers": 3, "start_layer": 3, "run": run}
            rows.append({**row, "gap_s": gap, "median_s": (lo if k % 2 else 2 - lo) * alone, "alone_s": alone})
    pooled, split = fit_spread(cost, rows), fit_spread(cost, rows, by_gap=True)
    assert "ys_idle" not in pooled.coef and pooled.coef["ys"][0] == pytest.approx(0.6, abs=0.05)
    busy, idle = split.coef["ys"], split.coef["ys_idle"]
    assert split.coef["gap_s"] == SPREAD_GAP_S and len(busy) == len(idle) == SPREAD_QUANTILES
    assert (busy[0], busy[-1]) == (pytest.approx(0.9, abs=0.02), pytest.approx(1.1, abs=0.02))
    assert (idle[0], idle[-1]) == (pytest.approx(0.6, abs=0.02), pytest.approx(1.4, abs=0.02))
    assert sum(busy) / len(busy) == pytest.approx(1.0) and sum(idle) / len(idle) == pytest.approx(1.0)
    # 16 steps after a wait: too few for a table of their own
    fewer = rows[: 2 * SPREAD_QUANTILES] + rows[-SPREAD_QUANTILES // 2 :]
    assert fit_spread(cost, fewer, by_gap=True).coef["ys_idle"] == fit_spread(cost, fewer).coef["ys"]
    two = ProfiledCost(Profile({}, {**base_fits(), "stage_spread": split}), SHAPE, None, 1, pp=2, seed=3)
    after_busy = {two.spread(s, k, 2e-3) for s in (0, 1) for k in range(300)}
    after_wait = {two.spread(s, k, 20e-3) for s in (0, 1) for k in range(300)}
    assert after_busy <= set(busy) and after_wait <= set(idle) and min(after_wait) < min(after_busy)
    assert two.spread(1, 7, SPREAD_GAP_S) == two.spread(1, 7)  # the split's own gap is busy; so is no gap given
    old = ProfiledCost(Profile({}, {**base_fits(), "stage_spread": pooled}), SHAPE, None, 1, pp=2, seed=3)
    assert [old.spread(0, k, 1.0) for k in range(50)] == [old.spread(0, k) for k in range(50)]  # one table: no split
    d = {"form": "interp", "coef": dict(split.coef)}
    assert fit_problem("stage_spread", d) is None
    half = {"form": "interp", "coef": {k: v for k, v in split.coef.items() if k != "gap_s"}}
    assert "ys_idle and gap_s come together" in fit_problem("stage_spread", half)
    short = {"form": "interp", "coef": {**split.coef, "ys_idle": idle[:-1]}}
    assert "xs and ys_idle as non-empty lists of equal length" in fit_problem("stage_spread", short)
    bad_gap = {"form": "interp", "coef": {**split.coef, "gap_s": -1.0}}
    assert "coef gap_s = -1.0" in fit_problem("stage_spread", bad_gap)
    word = {"form": "interp", "coef": {**split.coef, "ys_idle": ["x", *idle[1:]]}}
    assert fit_problem("stage_spread", word) == "coef ys_idle[0] = 'x' is not a number"


def _live2_pairs(cost: ProfiledCost, excess: float, alone: bool = True) -> list[dict]:
    """Calibration's two-stage live steps (``live2``, 4 layers each of ``tiny``'s 8) as ``cost`` prices them, the last
    stage ``excess`` seconds slower than priced; both timed alone (``alone_s``) unless ``alone`` is False."""
    from calibration.samples import plan_of

    rows = []
    for items in PLANS:
        plan = plan_of(items)
        for kind, first, last, start in (("stage_first", True, False, 0), ("stage_last", False, True, 4)):
            t = cost.stage_time(StageSpec(0, start, start + 4, first, last), plan) + (excess if last else 0.0)
            row = {
                "op": kind,
                "split": "live2",
                "items": items,
                "layers": 4,
                "start_layer": start,
                "median_s": t,
                "gap_s": 0.0,
            }
            rows.append({**row, "alone_s": t} if alone else row)
    return rows


def test_fit_last_live_is_the_live_last_stage_over_its_priced_ends_against_the_first():
    """Part 42: the median over calibration's two-stage steps timed alone of (last - first, measured) minus (the same,
    priced); the layers' glue cancels, as both stages hold as many layers. Too few pairs timed alone: None."""
    from calibration.live_fits import fit_last_live

    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    cost = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    rows = _live2_pairs(cost, 150e-6)
    assert fit_last_live(fits, {}, SHAPE, rows) == pytest.approx(150e-6)
    other = {**fits, "layer_glue": OpFit("layer_glue", "tok_req", "", {"c0": 90e-6, "tok": 1e-6, "req": 8e-6})}
    assert fit_last_live(other, {}, SHAPE, rows) == pytest.approx(150e-6)  # whatever the layers' glue
    assert fit_last_live(fits, {}, SHAPE, _live2_pairs(cost, 150e-6, alone=False)) is None


def test_last_live_moves_stage_time_to_the_last_stage_at_pp_above_one_only():
    """The profile's ``last_live`` X: a stage of n of the model's L layers is charged X (if last) - X n / L, so one
    stage (PP=1) is priced as before, at PP=2 the last stage X / 2 more and the first X / 2 less, the sum the same."""
    from calibration.samples import plan_of

    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    x = 400e-6
    before = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    after = ProfiledCost(
        Profile({}, {**fits, "last_live": OpFit("last_live", "linear", "", {"c0": x, "c1": 0})}), SHAPE, None, 1
    )
    whole = StageSpec(0, 0, 8, True, True)
    two = (StageSpec(0, 0, 4, True, False), StageSpec(1, 4, 8, False, True))
    three = (StageSpec(0, 0, 2, True, False), StageSpec(1, 2, 6, False, False), StageSpec(2, 6, 8, False, True))
    for items in PLANS:
        plan = plan_of(items)
        assert after.stage_time(whole, plan) == pytest.approx(before.stage_time(whole, plan))
        b, a = before.stage_times(two, plan), after.stage_times(two, plan)
        assert a[0] == pytest.approx(b[0] - x / 2) and a[1] == pytest.approx(b[1] + x / 2)
        b, a = before.stage_times(three, plan), after.stage_times(three, plan)
        assert [y - z for y, z in zip(a, b, strict=True)] == pytest.approx([-x / 4, -x / 2, x * 3 / 4])


def test_analyse_and_write_fits_last_live_only_when_asked(tmp_path):
    """``last_live=True`` writes the ``last_live`` fit from the two-stage live steps, with its note; the default
    (part 42's rule not yet judged) does not."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    live = _live2_pairs(ProfiledCost(Profile({}, fits), SHAPE, None, 1), 200e-6)
    rows = synthetic_rows() + operator_rows() + live
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "default"))
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "last"), last_live=True)
    assert "last_live" not in read_profile(tmp_path / "default").fits
    got = read_profile(tmp_path / "last").fits["last_live"]
    assert got.coef["c0"] == pytest.approx(200e-6, rel=0.05)  # priced with the glue fitted from these rows


def _live_decodes(cost: ProfiledCost, ratio: dict[int, float], each: int = 3) -> list[dict]:
    """Calibration's live decode steps timed alone (``live1``, the whole of ``tiny``), ``each`` per request count,
    each at ``ratio[n]`` of what ``cost`` prices it; and one live prefill step, which the fit leaves out."""
    from calibration.samples import plan_of

    whole = StageSpec(0, 0, 8, True, True)
    rows = []
    for n, q in ratio.items():
        items = ";".join(["99:1"] * n)
        t = cost.stage_time(whole, plan_of(items))
        row = {"op": "stage_full", "split": "live1", "items": items, "layers": 8, "gap_s": 0.0}
        rows += [{**row, "median_s": t * q, "alone_s": t * q}] * each
    row = {"op": "stage_full", "split": "live1", "items": "0:64", "layers": 8, "gap_s": 0.0}
    t = 1.5 * cost.stage_time(whole, plan_of("0:64"))
    rows.append({**row, "median_s": t, "alone_s": t})
    return rows


def test_fit_decode_batch_is_the_live_decodes_timed_alone_over_the_stage_model_by_requests():
    """Part 45: per bin of requests (1, 2-3, 4-7, ...) the median of the live decode steps timed alone over their
    price, at the bin's median request count; prefill steps and bins of fewer than three steps left out; None with
    fewer than two bins."""
    from calibration.live_fits import fit_decode_batch

    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    cost = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    got = fit_decode_batch(fits, {}, SHAPE, _live_decodes(cost, {1: 0.9, 5: 1.1, 16: 1.0}))
    assert got.name == "decode_batch" and got.x == "reqs"
    assert got.coef["xs"] == [1.0, 5.0, 16.0] and got.coef["ys"] == pytest.approx([0.9, 1.1, 1.0])
    thin = _live_decodes(cost, {1: 0.9, 5: 1.1}) + _live_decodes(cost, {16: 1.3}, each=2)
    assert fit_decode_batch(fits, {}, SHAPE, thin).coef["xs"] == [1.0, 5.0]  # the 13-20 bin has two steps
    assert fit_decode_batch(fits, {}, SHAPE, _live_decodes(cost, {1: 0.9})) is None
    charged = {**fits, "decode_batch": OpFit("decode_batch", "interp", "reqs", {"xs": [1.0], "ys": [0.5]})}
    again = fit_decode_batch(charged, {}, SHAPE, _live_decodes(cost, {1: 0.9, 5: 1.1}))
    assert again.coef["ys"] == pytest.approx([0.9, 1.1])  # over the model without it


def test_fit_decode_batch_shape_only_keeps_the_model_level_at_the_steps_median():
    """Part 46: with ``shape_only`` each bin is over the median of every kept step's ratio (here 1.0 among 0.8 x 3,
    1.0 x 3, 1.3 x 5): the shape across request counts is kept, the calibration's decodes' level is the model's."""
    from calibration.live_fits import fit_decode_batch

    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    cost = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    rows = _live_decodes(cost, {1: 0.8, 5: 1.0}) + _live_decodes(cost, {16: 1.3}, each=5)
    full = fit_decode_batch(fits, {}, SHAPE, rows)
    shape = fit_decode_batch(fits, {}, SHAPE, rows, shape_only=True)
    assert full.coef["ys"] == pytest.approx([0.8, 1.0, 1.3]) and shape.coef["xs"] == full.coef["xs"]
    assert shape.coef["ys"] == pytest.approx([0.8, 1.0, 1.3])  # the median step is at 1.0
    low = _live_decodes(cost, {1: 0.8, 5: 0.9}) + _live_decodes(cost, {16: 0.95}, each=7)  # median step 0.95
    got = fit_decode_batch(fits, {}, SHAPE, low, shape_only=True)
    assert got.coef["ys"] == pytest.approx([0.8 / 0.95, 0.9 / 0.95, 1.0])


def test_decode_batch_scales_decode_only_stage_computes_by_their_requests():
    """A decode-only plan of R requests costs ``decode_batch`` at R times its stage model (interpolated, held beyond
    the ends), at every stage; a plan holding a prefill item is priced as without it."""
    from calibration.samples import plan_of

    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    before = ProfiledCost(Profile({}, fits), SHAPE, None, 1)
    batch = OpFit("decode_batch", "interp", "reqs", {"xs": [1.0, 8.0], "ys": [0.8, 1.2]})
    after = ProfiledCost(Profile({}, {**fits, "decode_batch": batch}), SHAPE, None, 1)
    two = (StageSpec(0, 0, 4, True, False), StageSpec(1, 4, 8, False, True))
    for n, q in ((1, 0.8), (4, 0.8 + 0.4 * 3 / 7), (8, 1.2), (20, 1.2)):
        plan = plan_of(";".join(["99:1"] * n))
        assert after.decode_batch_ratio(n) == pytest.approx(q)
        assert after.stage_times(two, plan) == pytest.approx([q * t for t in before.stage_times(two, plan)])
    for items in ("0:32;300:1;77:1", "512:128"):
        plan = plan_of(items)
        assert after.stage_times(two, plan) == pytest.approx(before.stage_times(two, plan))
    assert before.decode_batch_ratio(1) == 1.0


def test_analyse_and_write_charges_decode_batch_by_default_and_records_it_either_way(tmp_path):
    """By default (part 45's verdict) the fit is in the profile; ``decode_batch=False`` records it in ``meta.json``
    and the profile does not charge it."""
    meta = dict(read_profile(_write(tmp_path / "src")).meta, statistic="mean")
    fits = {**base_fits(), **{k: OpFit(k, "tok_req", "", c) for k, c in TRUE.items()}}
    live = _live_decodes(ProfiledCost(Profile({}, fits), SHAPE, None, 1), {1: 0.85, 8: 1.05})
    rows = synthetic_rows() + operator_rows() + live
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "default"), decode_batch=False)
    analyse_and_write(rows, SHAPE, meta, str(tmp_path / "batch"))
    default, batch = read_profile(tmp_path / "default"), read_profile(tmp_path / "batch")
    assert "decode_batch" not in default.fits and default.meta["decode_batch"]["xs"] == [1.0, 8.0]
    assert batch.fits["decode_batch"].coef == default.meta["decode_batch"]
    assert batch.fits["decode_batch"].coef["ys"][0] < 1.0 < batch.fits["decode_batch"].coef["ys"][1]
