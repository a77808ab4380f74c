"""``stage_layers``: a layer's time in a stage of n layers over one in the profiler's stack.

The sizes calibration times, the fit (net of ``prepare_inputs``, median over plans), the profile
check, and the stage-time composition: the ratio scales a stage's layers only, flat outside the
measured sizes, and nothing changes without it."""

from __future__ import annotations

import pytest

from calibration.samples import value
from calibration.stage_layers import OP, PLANS, SPLIT, fit, layer_counts
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import OpFit, stage_layers_ratio
from ppsim.errors import PPSimError
from tests.test_calibration_profiled import PLAN, _fits, _load, _write


@pytest.mark.parametrize(
    ("layers", "stack", "counts"),
    [
        (8, 8, [2, 3, 4, 8]),  # tiny, tiny-moe: PP 1-4 (3 stages: 2 and 3 layers)
        (4, 4, [1, 2, 4]),  # dense-1024
        (80, 5, [5]),  # a stage of any PP <= 4 is past the stack: the reference alone
        (1, 1, [1]),
        (10, 8, [2, 3, 4, 5, 8]),  # PP=1's 10 layers past the stack
    ],
)
def test_layer_counts_are_the_stage_sizes_of_one_to_four_stages_up_to_the_stack(layers, stack, counts):
    assert layer_counts(layers, stack) == counts


def _rows(per_layer: dict[str, float], ratio: dict[int, float], prep: OpFit) -> list[dict]:
    """Per-step stage rows as the profiler writes them: prepare_inputs plus n layers at ratio(n)."""
    out = []
    for plan, reqs in zip(PLANS, (1, 8, 32, 1), strict=True):
        for n, r in ratio.items():
            t = prep.at(reqs) + n * per_layer[plan] * r
            out.append({"op": OP, "split": SPLIT, "plan": plan, "reqs": reqs, "layers": n, "mean_s": t, "median_s": t})
    return out


def test_fit_recovers_the_ratio_net_of_prepare_inputs():
    prep = OpFit("prepare_inputs", "linear", "reqs", {"c0": 2e-4, "c1": 1e-5})
    per_layer = dict(zip(PLANS, (1e-3, 2e-3, 4e-3, 3e-3), strict=True))
    truth = {2: 0.9, 3: 0.93, 4: 0.95, 8: 1.0}
    f = fit(_rows(per_layer, truth, prep), prep, "mean", value)
    assert f.name == OP and f.form == "interp" and f.x == "layers"
    assert f.coef["xs"] == [2.0, 3.0, 4.0, 8.0]
    assert f.coef["ys"] == pytest.approx([0.9, 0.93, 0.95, 1.0], rel=1e-12)
    # without taking prepare_inputs off, the per-step cost would read as a per-layer one: a different ratio
    assert fit(_rows(per_layer, truth, prep), None, "mean", value).coef["ys"][0] != pytest.approx(0.9, rel=1e-3)
    assert fit([{"op": "stage_mid", "split": "stage"}], prep, "mean", value) is None


def test_fit_takes_the_median_over_plans():
    prep = OpFit("prepare_inputs", "linear", "reqs", {"c0": 0.0, "c1": 0.0})
    rows = []
    for plan, r2 in zip(PLANS, (0.8, 0.9, 0.95, 1.1), strict=True):
        for n, r in ((2, r2), (8, 1.0)):
            rows.append({"op": OP, "split": SPLIT, "plan": plan, "reqs": 1, "layers": n, "mean_s": n * 1e-3 * r})
    assert fit(rows, prep, "mean", value).coef["ys"] == pytest.approx([0.925, 1.0])


def test_ratio_is_flat_outside_the_measured_sizes():
    f = OpFit(OP, "interp", "layers", {"xs": [2.0, 4.0, 8.0], "ys": [0.8, 0.9, 1.0]})
    assert stage_layers_ratio(f, 1) == 0.8
    assert stage_layers_ratio(f, 3) == pytest.approx(0.85)
    assert stage_layers_ratio(f, 8) == 1.0 and stage_layers_ratio(f, 40) == 1.0  # past the stack: no extrapolation
    assert stage_layers_ratio(None, 3) == 1.0


def test_stage_time_scales_the_layers_and_not_the_stage_ends(tmp_path):
    plain = _load(_write(tmp_path / "plain"))
    fits = {**_fits(), OP: {"form": "interp", "x": "layers", "coef": {"xs": [2.0, 4.0, 8.0], "ys": [0.8, 0.9, 1.0]}}}
    scaled = _load(_write(tmp_path / "scaled", fits=fits))
    layer = plain.layer_time(PLAN)
    for stage, ratio in ((StageSpec(0, 0, 4, True, False), 0.9), (StageSpec(1, 4, 8, False, True), 0.9)):
        ends = plain.stage_time(stage, PLAN) - 4 * layer  # prepare_inputs, embedding or the last stage's head
        assert scaled.stage_time(stage, PLAN) == pytest.approx(4 * layer * ratio + ends, rel=1e-12)
    whole = StageSpec(0, 0, 8, True, True)
    assert scaled.stage_time(whole, PLAN) == plain.stage_time(whole, PLAN)  # the stack's own size: 1
    assert scaled.layer_time(PLAN) == layer  # per layer, as the operators were timed


def test_profile_check_refuses_a_stage_layers_fit_of_another_form(tmp_path):
    fits = {**_fits(), OP: {"form": "linear", "x": "layers", "coef": {"c0": 1.0, "c1": 0.0}}}
    with pytest.raises(PPSimError, match="stage_layers: form 'linear' cannot time it"):
        _load(_write(tmp_path, fits=fits))


def test_fit_of_pooled_calibrations_takes_each_size_s_median():
    """Pooled calibrations (calibration/merge.py) give a (plan, size) more than once: the median, not the last."""
    prep = OpFit("prepare_inputs", "linear", "reqs", {"c0": 0.0, "c1": 0.0})
    rows = [
        {"op": OP, "split": SPLIT, "plan": "D1x128", "reqs": 1, "layers": n, "mean_s": t}
        for n, t in ((2, 1.6e-3), (2, 1.8e-3), (2, 2.6e-3), (8, 8e-3), (8, 8e-3))
    ]
    assert fit(rows, prep, "mean", value).coef["ys"] == pytest.approx([0.9, 1.0])
