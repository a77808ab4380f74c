"""Fits recover known coefficients from synthetic samples (with and without noise)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit import fit_decode, fit_linear, fit_linear_floor, fit_linear_lad, fit_op, fit_prefill
from ppsim.cost.profiled import OpFit


def test_linear_exact():
    x = np.array([1, 2, 4, 8, 16, 64, 256], float)
    c = fit_linear(x, 3e-6 + 2e-7 * x)
    assert c["c0"] == pytest.approx(3e-6, rel=1e-6)
    assert c["c1"] == pytest.approx(2e-7, rel=1e-6)


def test_linear_floor_recovers_knee():
    x = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], float)
    y = np.maximum(50e-6, 5e-6 + 1e-6 * x)  # knee at x = 45
    c = fit_linear_floor(x, y)
    assert c["floor"] == pytest.approx(50e-6, rel=1e-6)
    assert c["c1"] == pytest.approx(1e-6, rel=1e-3)
    fit = OpFit("g", "linear_floor", "tokens", c)
    for xi, yi in zip(x, y, strict=True):
        assert fit.at(xi) == pytest.approx(yi, rel=1e-3)


def test_linear_floor_with_noise():
    rng = np.random.default_rng(0)
    x = np.repeat(np.array([1, 4, 16, 64, 256, 1024], float), 5)
    truth = np.maximum(20e-6, 2e-6 + 3e-7 * x)
    y = truth * rng.lognormal(0, 0.03, size=x.size)
    c = fit_linear_floor(x, y)
    assert c["floor"] == pytest.approx(20e-6, rel=0.05)
    assert c["c1"] == pytest.approx(3e-7, rel=0.05)


def test_prefill_and_decode_attention_terms():
    chunk = np.repeat(np.array([8, 32, 128, 512], float), 4)
    prefix = np.tile(np.array([0, 128, 512, 2048], float), 4)
    y = 4e-6 + 1e-8 * chunk + 3e-10 * chunk * prefix + 2e-10 * chunk**2
    c = fit_prefill(chunk, prefix, y)
    assert (c["call"], c["tok"], c["cp"], c["cc"]) == pytest.approx((4e-6, 1e-8, 3e-10, 2e-10), rel=1e-4)
    B = np.repeat(np.array([1, 4, 16, 64], float), 3)
    ctx = B * np.tile(np.array([16, 256, 2048], float), 4)
    d = fit_decode(B, ctx, 10e-6 + 2e-6 * B + 5e-9 * ctx)
    assert (d["call"], d["req"], d["ctx"]) == pytest.approx((10e-6, 2e-6, 5e-9), rel=1e-4)


def test_prefill_attention_context_term_recovers_work_once_a_call_over_the_items_context():
    """``ctx`` (docs/validation.md part 30): the engine gathers each item's K/V and expands it to every query head
    before its matmuls, work in chunk + prefix once a call; the four-term form has no such term and misses a small
    chunk over a long prefix, the form with it recovers every coefficient."""
    chunk = np.repeat(np.array([8, 32, 128, 512], float), 4)
    prefix = np.tile(np.array([0, 128, 512, 2048], float), 4)
    true = (4e-6, 1e-8, 3e-10, 2e-10, 2e-8)
    y = true[0] + true[1] * chunk + true[2] * chunk * prefix + true[3] * chunk**2 + true[4] * (chunk + prefix)
    c = fit_prefill(chunk, prefix, y, ctx=True)
    assert (c["call"], c["tok"], c["cp"], c["cc"], c["ctx"]) == pytest.approx(true, rel=1e-4)
    with_ctx = OpFit("attn_prefill", "prefill_attn", "", c)
    four = OpFit("attn_prefill", "prefill_attn", "", fit_prefill(chunk, prefix, y))
    assert "ctx" not in four.coef
    assert with_ctx.prefill(8, 2048) == pytest.approx(y[3], rel=1e-4)
    assert abs(four.prefill(8, 2048) / y[3] - 1) > 0.2
    _, cv = fit_op("attn_prefill", "prefill_attn", "", {"chunk": chunk, "prefix": prefix}, y, attn_ctx=True)
    assert cv["cv_median_abs_rel_err"] < 1e-4


def test_a_prefill_fit_without_the_context_term_prices_as_before():
    """A profile fitted before part 30 has no ``ctx``: its price is the four terms, bit for bit."""
    coef = {"call": 4e-6, "tok": 1e-8, "cp": 3e-10, "cc": 2e-10}
    old = OpFit("attn_prefill", "prefill_attn", "", coef)
    zero = OpFit("attn_prefill", "prefill_attn", "", {**coef, "ctx": 0.0})
    for c, p in ((1, 0), (16, 0), (8, 1536), (512, 512)):
        assert old.prefill(c, p) == 4e-6 + 1e-8 * c + 3e-10 * c * p + 2e-10 * c * c
        assert zero.prefill(c, p) == old.prefill(c, p)
    assert OpFit("a", "prefill_attn", "", {**coef, "ctx": 1e-8}).prefill(8, 100) == pytest.approx(
        old.prefill(8, 100) + 1e-8 * 108
    )


def test_cross_validation_reports_error_of_wrong_form():
    """A quadratic fitted as linear: leave-one-out error is large, exact data gives ~0."""
    x = np.array([1, 2, 4, 8, 16, 32, 64], float)
    _, good = fit_op("a", "linear", "tokens", {"tokens": x}, 1e-6 + 1e-7 * x)
    _, bad = fit_op("b", "linear", "tokens", {"tokens": x}, 1e-6 + 1e-7 * x**2)
    assert good["cv_median_abs_rel_err"] < 1e-6
    assert bad["cv_median_abs_rel_err"] > 0.2


def test_form_selection_by_cross_validation():
    from calibration.fit import fit_select

    x = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], float)
    lin, s1 = fit_select("g", ("linear_floor", "interp"), "tokens", {"tokens": x}, np.maximum(9e-6, 1e-6 + 1e-7 * x))
    assert lin.form == "linear_floor" and s1["cv_median_abs_rel_err"] < 1e-6
    curved = 1e-6 * x * (1 + 0.5 * np.sin(np.log2(x)))  # efficiency that wobbles with size
    tab, s2 = fit_select("h", ("linear_floor", "interp"), "tokens", {"tokens": x}, curved)
    assert tab.form == "interp" and set(s2["cv_median_abs_rel_err_by_form"]) == {"linear_floor", "interp"}
    assert tab.at(64) == pytest.approx(curved[6])


def test_a_table_through_every_count_beats_a_line_on_a_saw_tooth():
    """A CPU GEMM's time saw-tooths with the token count (rows in blocks of 4, the rest on a slower
    path: 3 rows cost more than 4). Through every count from 1 to 16 the table answers each query with
    its own sample, so its cross-validation skips those points (a left-out 3 interpolated between 2 and
    4 is no query the table meets) and the table wins; the straight line misses the tooth."""
    from calibration.fit import _answered_by_table, fit_select

    x = np.array([*range(1, 17), 20, 24, 28, 32, 64, 128, 256, 512], float)
    blocks, rest = np.ceil(x / 4), x % 4
    y = 1e-6 * (30 + 25 * blocks + np.select([rest == 1, rest == 2, rest == 3], [20, 22, 45], 0))
    answered = _answered_by_table(x)
    assert answered[:15].all() and not answered[15:].any()  # 1..15; 16 has a query (17-19) beside it
    fit, stats = fit_select("gate_up", ("linear_floor", "interp"), "tokens", {"tokens": x}, y)
    assert fit.form == "interp"
    assert fit.at(3) == pytest.approx(y[2]) and fit.at(3) > fit.at(4)
    line = OpFit("l", "linear_floor", "tokens", fit_linear_floor(x, y))
    assert abs(line.at(3) - y[2]) / y[2] > 0.15  # what a line through the tooth predicts at 3 rows
    assert stats["cv_median_abs_rel_err_by_form"]["interp"] < stats["cv_median_abs_rel_err_by_form"]["linear_floor"]


def test_a_sparse_or_fractional_grid_is_cross_validated_whole():
    from calibration.fit import _answered_by_table

    assert not _answered_by_table(np.array([1, 2, 4, 8, 16], float))[1:].any()
    assert _answered_by_table(np.array([1, 2, 4, 8, 16], float))[0]  # 1 and 2: no count below 1
    assert not _answered_by_table(np.array([0.5, 1.5, 2.5], float)).any()


def test_linear_lad_is_a_median_line_that_stray_small_rows_do_not_pull_down():
    """``ring_launch``'s case (docs/validation.md part 34): per-count medians near 0.4 ms and two stray small ones
    from few gaps. Relative least squares goes to the small ones (weights 1 / y); least absolute deviation, rows
    weighted by their repeats, stays on the line through the rest, exact where the data are a line."""
    n = np.arange(1.0, 17.0)
    y = 0.3e-3 + 10e-6 * n
    assert fit_linear_lad(n, y) == pytest.approx({"c0": 0.3e-3, "c1": 10e-6}, rel=1e-6)
    stray = y.copy()
    stray[[8, 14]] = [0.065e-3, 0.09e-3]
    reps = np.full(16, 4.0)
    reps[[8, 14]] = 2.0
    lad = fit_linear_lad(n, stray, reps)
    assert lad == pytest.approx({"c0": 0.3e-3, "c1": 10e-6}, rel=1e-6)
    rel = fit_linear(n, stray)
    assert rel["c0"] + 4 * rel["c1"] < 0.6 * (0.3e-3 + 4 * 10e-6)  # far under its own samples
    flat = fit_linear_lad(n, np.full(16, 0.4e-3), reps)  # never a negative slope or intercept
    assert flat["c0"] == pytest.approx(0.4e-3) and flat["c1"] == pytest.approx(0.0, abs=1e-12)


def test_ring_fits_by_least_absolute_deviation_on_request_and_the_rest_unchanged():
    """``fit_all``: with ``ring_lad`` (calibrate's default from part 34 (a) until (c) reverted it) ``ring_launch`` and
    ``ring_return`` are median lines written as ``linear``; ``launch`` keeps its relative least squares either way."""
    import inspect

    from calibration.calibrate import analyse_and_write, fit_all

    assert inspect.signature(analyse_and_write).parameters["ring_lad"].default is False
    assert inspect.signature(fit_all).parameters["ring_lad"].default is False
    rows = []
    for op in ("ring_launch", "launch"):
        for k in range(1, 17):
            t = 0.065e-3 if k == 9 else 0.3e-3 + 10e-6 * k
            rows.append({"op": op, "split": "fit", "n": k, "median_s": t, "repeats": 2 if k == 9 else 5})
    lad, _ = fit_all(rows, ring_lad=True)
    rel, _ = fit_all(rows, ring_lad=False)
    assert lad["ring_launch"].form == "linear"
    assert lad["ring_launch"].at(4) == pytest.approx(0.34e-3, rel=1e-6)
    assert rel["ring_launch"].at(4) < lad["ring_launch"].at(4)
    assert lad["launch"].coef == rel["launch"].coef


def test_ring_launch_from_the_steps_own_schedule_by_default_and_as_before_part_35_on_request():
    """``fit_all``: ``ring_launch`` from its launches measured from the step's own schedule (the default since part
    35's verdict); ``ring_own_schedule=False`` from ``ring_launch_any`` (split ``record``: launches from whichever
    schedule came last, as measured before part 35) where a calibration kept them; a calibration from before part 35
    has only the one measure, fitted either way."""
    import inspect

    from calibration.calibrate import analyse_and_write, fit_all

    assert inspect.signature(analyse_and_write).parameters["ring_own_schedule"].default is True
    assert inspect.signature(fit_all).parameters["ring_own_schedule"].default is True
    own = [{"op": "ring_launch", "split": "fit", "n": k, "median_s": 0.5e-3 + 10e-6 * k, "repeats": 4} for k in (1, 8)]
    anysched = [{**r, "op": "ring_launch_any", "split": "record", "median_s": 0.08e-3} for r in own]
    fits, _ = fit_all(own + anysched)
    assert fits["ring_launch"].at(4) == pytest.approx(0.54e-3, rel=1e-6) and "ring_launch_any" not in fits
    before, _ = fit_all(own + anysched, ring_own_schedule=False)
    assert before["ring_launch"].at(4) == pytest.approx(0.08e-3, rel=1e-6)
    older, _ = fit_all(own, ring_own_schedule=False)  # a calibration from before part 35: one measure, both ways
    assert older["ring_launch"].coef == fits["ring_launch"].coef
