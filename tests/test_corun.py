"""Stages computing at once on one host (``stage_corun``): calibration's paired measurement, its fit, the
cost model's factor, the rule the pipelines charge it by, and the step-level check charging it alike."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from calibration.live_fits import _uncharged, fit_corun, fit_live
from calibration.samples import plan_of
from ppsim.cost.base import StageSpec
from ppsim.cost.profiled import OpFit, Profile, ProfiledCost, corun_ratio
from ppsim.cost.ring import RingReturnCost
from ppsim.metrics.records import OpRecord
from ppsim.validate.steps import corun_steps, model_factor, step_costs
from tests.conftest import proc_stat
from tests.test_calibration_glue import SHAPE, _live_rows, base_fits

FIRST, LAST = StageSpec(0, 0, 2, True, False), StageSpec(1, 2, 4, False, True)


def _state(pid: int) -> str | None:
    """A process's state letter (``/proc/PID/stat``), None once it is gone."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def _stopped(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` reaches state T (stopped) within ``within_s``: SIGSTOP is delivered
    asynchronously, and on a loaded host the process may still read R just after ``kill``."""
    deadline = time.monotonic() + within_s
    while _state(pid) != "T":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _corun_rows(ratios: list[float]) -> list[dict]:
    return [
        {"op": "stage_corun", "split": "corun", "plan": f"D{i}x128", "median_s": r * 0.01, "alone_s": 0.01}
        for i, r in enumerate(ratios)
    ]


def test_fit_is_the_median_of_the_paired_ratios_and_is_charged_held_at_one():
    f = fit_corun(_corun_rows([1.02, 1.09, 1.05]) + [{"op": "stage_mid", "split": "fit", "median_s": 1.0}])
    assert f.name == "stage_corun" and f.coef["c0"] == pytest.approx(1.05) and corun_ratio(f) == pytest.approx(1.05)
    assert fit_corun([]) is None and fit_corun([{**r, "alone_s": ""} for r in _corun_rows([1.1])]) is None
    # a paired ratio under 1 is the host's noise: another stage computing does not make one faster
    assert corun_ratio(fit_corun(_corun_rows([0.97, 0.99, 0.98]))) == 1.0


def test_readings_spread_over_the_calibration_are_averaged_not_their_median_taken():
    """Per reading the median over plans (robust to one plan's noise), then the mean over the readings:
    the pipelines charge every co-running compute of a draw, so the host's time average counts."""
    readings = [[0.99, 1.0, 0.98], [1.31, 1.29, 1.11], [1.01, 1.0, 1.02]]
    rows = [{**r, "reading": k} for k, rs in enumerate(readings) for r in _corun_rows(rs)]
    assert fit_corun(rows).coef["c0"] == pytest.approx((0.99 + 1.29 + 1.01) / 3)


def test_cost_model_carries_the_factor_at_pp2_only_and_the_ring_wrapper_forwards_it():
    fits = {**base_fits(), "stage_corun": OpFit("stage_corun", "linear", "stages", {"c0": 1.07, "c1": 0.0})}
    one = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=1)
    two = ProfiledCost(Profile({}, fits), SHAPE, None, 1, pp=2)
    bare = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1, pp=2)
    assert one.corun_factor == 1.0 and two.corun_factor == pytest.approx(1.07) and bare.corun_factor == 1.0
    plan = plan_of("99:1;50:1")
    assert two.stage_time(FIRST, plan) == bare.stage_time(FIRST, plan)  # a state-dependent charge: not here
    ring = RingReturnCost(two, 0.0, 0.0, 2)
    assert ring.corun_factor == pytest.approx(1.07) and model_factor(ring, "corun_factor") == pytest.approx(1.07)
    assert model_factor(object(), "corun_factor") == 1.0


def _compute(track: str, step: int, a: float, b: float) -> OpRecord:
    return OpRecord(track, "compute", step, a, b, 2, 2)


def test_rule_marks_a_micro_batch_that_starts_while_an_earlier_one_is_in_the_pipeline():
    ops = [
        _compute("stage0", 0, 0.0, 1.0),
        _compute("stage1", 0, 1.1, 2.1),
        _compute("stage0", 1, 1.0, 2.0),  # step 0 still on stage 1: beside it
        _compute("stage1", 1, 2.1, 3.1),
        _compute("stage0", 2, 3.2, 4.0),  # step 1 ended at 3.1: alone
        _compute("stage1", 2, 4.1, 5.0),
        _compute("stage0", 3, 5.0, 6.0),  # step 2 ended exactly then: done, alone
        _compute("stage1", 3, 6.1, 7.0),
        _compute("stage0", 4, 6.5, 7.5),  # step 3 ends at 7.0: beside it
    ]
    assert corun_steps(ops, 2) == {1, 4}
    assert corun_steps(ops, 1) == set()  # one stage: nothing computes beside it
    # a step that never reached the last stage is still in the pipeline
    assert corun_steps(ops[:5] + [_compute("stage0", 5, 9.0, 9.5)], 2) == {1, 5}


class _Cost:
    corun_factor = 1.2

    def stage_time(self, stage: StageSpec, plan: object) -> float:
        return 0.5


def test_step_level_check_charges_the_factor_where_the_pipelines_would():
    ops = [
        _compute("stage0", 0, 0.0, 0.5),
        _compute("stage1", 0, 0.6, 1.1),
        _compute("stage0", 1, 0.5, 1.0),
        _compute("stage1", 1, 1.1, 1.6),
    ]
    plans = {0: plan_of("99:1;50:1"), 1: plan_of("100:1;51:1")}
    rows = step_costs(_Cost(), (FIRST, LAST), plans, ops)
    assert {(r["stage"], r["step_id"]): r["predicted_s"] for r in rows} == pytest.approx(
        {(0, 0): 0.5, (1, 0): 0.5, (0, 1): 0.6, (1, 1): 0.6}
    )
    one = step_costs(_Cost(), (StageSpec(0, 0, 4, True, True),), plans, [o for o in ops if o.track == "stage0"])
    assert [r["predicted_s"] for r in one] == [0.5, 0.5]  # one stage: never charged


def test_live_factor_counts_a_charged_compute_without_its_charge():
    """The live runs' computes that started beside an earlier micro-batch are charged ``corun`` by the
    pipelines: ``live_stage`` measures the rest, so the same factor is not charged twice."""
    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    rows = _live_rows(cost, 1.04, 1, 0.0) + _live_rows(cost, 1.10, 2, 0.0)
    marked = [{**r, "corun": 1, "median_s": r["median_s"] * 1.05} if r["split"] == "live2" else r for r in rows]
    assert fit_live(cost, marked, 1.05).coef["ys"] == pytest.approx([1.04, 1.10])
    assert fit_live(cost, marked).coef["ys"] == pytest.approx([1.04, 1.10 * 1.05])  # no charge made: all of it
    assert _uncharged({"median_s": "0.21", "corun": "1"}, 1.05) == pytest.approx(0.2)
    assert _uncharged({"median_s": "0.21", "corun": ""}, 1.05) == pytest.approx(0.21)  # an older artifact


def test_paired_measurement_runs_a_real_second_stage_process_and_stops_it():
    """calibration/corun.py on the tiny model: a spawned process computes middle-stage steps while this one
    times its own with it running and stopped; one row per plan, and no process left behind."""
    import torch

    from calibration.corun import PLANS, profile_corun
    from calibration.stage_step import EngineStages

    torch.set_num_threads(1)
    stages = EngineStages(SHAPE, torch.float32, torch.device("cpu"), 2, seed=0)
    rows = profile_corun(stages, SHAPE, "float32", rounds=1, calls=1)
    assert [r["plan"] for r in rows] == list(PLANS)
    assert all(r["op"] == "stage_corun" and r["split"] == "corun" for r in rows)
    assert all(r["median_s"] > 0 and r["alone_s"] > 0 and r["repeats"] == 2 for r in rows)
    assert multiprocessing.active_children() == []
    assert fit_corun(rows) is not None


def test_one_process_serves_readings_spread_over_a_calibration():
    """CoRunner: the other stage is spawned once, stopped between readings (so it costs the timing in
    between nothing), numbered readings, and killed on exit."""
    import torch

    from calibration.corun import PLANS, CoRunner
    from calibration.stage_step import EngineStages

    torch.set_num_threads(1)
    stages = EngineStages(SHAPE, torch.float32, torch.device("cpu"), 2, seed=0)
    with CoRunner(stages, SHAPE, "float32") as co:
        first = co.reading(1, calls=1)
        pid = co.proc.pid
        assert _stopped(pid)  # stopped between readings
        second = co.reading(1, calls=1)
        assert co.proc.pid == pid
    assert [r["reading"] for r in first + second] == [0] * len(PLANS) + [1] * len(PLANS)
    assert multiprocessing.active_children() == [] and not os.path.exists(f"/proc/{pid}/stat")
    assert fit_corun(first + second) is not None
    with pytest.raises(RuntimeError, match="outside its with block"):
        co.reading(1)


PARENT = """
import time, torch
from calibration.corun import CoRunner
from calibration.stage_step import EngineStages
from tests.test_calibration_glue import SHAPE
torch.set_num_threads(1)
stages = EngineStages(SHAPE, torch.float32, torch.device("cpu"), 2, seed=0)
with CoRunner(stages, SHAPE, "float32") as co:
    print(co.proc.pid, flush=True)
    time.sleep(600)
"""


def _gone(pid: int, timeout_s: float) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z"):  # gone, or a zombie its new parent has not reaped yet: dead
            return True
        time.sleep(0.1)
    return False


def test_a_calibration_ended_by_sigterm_leaves_no_stopped_co_runner_behind():
    """SIGTERM skips the parent's ``with`` clean-up; the co-running stage, stopped (SIGSTOP) between
    readings, dies with its parent (``PR_SET_PDEATHSIG``) instead of staying stopped forever."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=root, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _stopped(child)  # stopped, as between any two readings
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == -signal.SIGTERM
        assert _gone(child, 30.0)
    finally:
        parent.kill()
        parent.wait(30)
        if child is not None and _state(child) not in (None, "Z"):  # the test failed: leave nothing behind
            os.kill(child, signal.SIGKILL)
