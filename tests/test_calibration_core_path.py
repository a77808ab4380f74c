"""The engine core's per-step path as calibration reads it from a live engine's records
(``calibration/core_path.py``): exact arithmetic on a hand-made timeline, then the profiled cost
model charging the fits."""

from __future__ import annotations

import pytest

from calibration.core_path import calibration_scenario, rows_of, step_paths
from ppsim.metrics.records import OpRecord


def core(kind: str, a: float, b: float, n: int) -> OpRecord:
    return OpRecord("core", kind, -1, a, b, 0, n)


def compute(step: int, a: float, b: float, n: int) -> OpRecord:
    return OpRecord("stage0", "compute", step, a, b, n, n)


# two steps: schedule 0-0.1 ms, launch to 0.5, compute 0.5-5.5, return to 5.8, update 5.8-5.9, emit
# work to 6.0, schedule 6.0-6.05, launch to 6.4, compute 6.4-9.4 (3 requests now), return to 9.75, update
TIMELINE = [
    core("schedule", 0.0, 0.1e-3, 4),
    compute(0, 0.5e-3, 5.5e-3, 4),
    core("update", 5.8e-3, 5.9e-3, 4),
    core("schedule", 6.0e-3, 6.05e-3, 3),
    compute(1, 6.4e-3, 9.4e-3, 3),
    core("update", 9.75e-3, 9.8e-3, 3),
    core("schedule", 10.0e-3, 10.02e-3, 3),
]


def test_step_paths_splits_a_step_into_core_spans_and_gaps():
    p = step_paths(TIMELINE)
    assert [n for n, _ in p["schedule"]] == [4, 3, 3]
    assert [t for _, t in p["schedule"]] == pytest.approx([0.1e-3, 0.05e-3, 0.02e-3])
    assert p["launch"] == [(4, pytest.approx(0.4e-3)), (3, pytest.approx(0.35e-3))]
    assert p["return"] == [(4, pytest.approx(0.3e-3)), (3, pytest.approx(0.35e-3))]
    # update runs from its span's start to the next schedule: the driver's emission work included
    assert p["update"] == [(4, pytest.approx(0.2e-3)), (3, pytest.approx(0.25e-3))]


def test_rows_are_medians_per_request_count():
    rows = rows_of({"return": [(2, 1e-3), (2, 3e-3), (2, 2e-3), (5, 4e-3)], "launch": [(1, -1e-6)]})
    by = {(r["op"], r["n"]): r for r in rows}
    assert by[("return", 2)]["median_s"] == pytest.approx(2e-3) and by[("return", 2)]["repeats"] == 3
    assert by[("return", 5)]["median_s"] == pytest.approx(4e-3)
    assert ("launch", 1) not in by  # a negative gap (clock noise) is dropped
    assert all(r["split"] == "fit" and "mean_s" not in r for r in rows)  # wall clock: the median is fitted


def test_the_calibration_workload_shrinks_the_running_set():
    s = calibration_scenario("tiny", "cpu", 1)
    assert s.cluster.pipeline_parallel_size == 1 and s.engine.policy.kind == "vllm-sync"
    from ppsim.deployment import prepare

    outs = prepare(s).requests.output_len
    assert outs.min() <= 8 and outs.max() >= 56 and len(outs) == 32


def test_control_path_report_reads_a_validation_dir(tmp_path):
    """``experiments/validation/control_path.py`` on an engine and a simulator run of the same timeline."""
    from experiments.validation.control_path import report
    from ppsim.metrics.io import ops_csv

    for d in ("engine-0", "sim"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "stage_ops.csv").write_text(ops_csv(TIMELINE))
    text = report(tmp_path)
    assert "engine (1 runs)" in text and "launch    engine   0.375  sim   0.375" in text


def test_overlap_report_bins_step_errors_by_concurrent_compute(tmp_path):
    from experiments.validation.control_path import overlap_report
    from ppsim.metrics.io import ops_csv

    ops = [
        compute(0, 0.0, 1.0, 2),  # stage 0 alone
        OpRecord("stage1", "compute", 0, 1.0, 2.0, 2, 2),  # stage 1, half beside stage 0's next step
        compute(1, 1.5, 2.5, 2),
    ]
    (tmp_path / "engine-0").mkdir()
    (tmp_path / "engine-0" / "stage_ops.csv").write_text(ops_csv(ops))
    (tmp_path / "step_costs.csv").write_text("run,stage,step_id,cpu_error\n0,0,0,-0.01\n0,1,0,-0.3\n0,0,1,-0.2\n")
    text = overlap_report(tmp_path)
    assert "overlap 0.0-0.2:    1 steps, median -1.0%" in text
    assert "overlap 0.2-0.6:    2 steps, median -25.0%" in text


def stage(k: int, step: int, a: float, b: float) -> OpRecord:
    return OpRecord(f"stage{k}", "compute", step, a, b, 1, 1)


def send(step: int, a: float, b: float, nbytes: float) -> OpRecord:
    return OpRecord("link0->1", "send", step, a, b, 1, 1, nbytes=nbytes)


def test_handoffs_keep_transfers_to_a_waiting_stage():
    from calibration.core_path import handoffs

    ops = [
        stage(0, 0, 0.0, 4e-3),
        send(0, 4.01e-3, 4.2e-3, 2048),
        stage(1, 0, 4.3e-3, 8e-3),  # waited: 0.3 ms from stage 0's end
        stage(0, 1, 5e-3, 6e-3),
        send(1, 6.01e-3, 6.2e-3, 4096),
        stage(1, 1, 8.1e-3, 9e-3),  # busy with step 0 until 8 ms: a queue, not a transfer
    ]
    assert handoffs(ops) == [(2048, pytest.approx(0.3e-3))]


def test_launches_and_returns_that_waited_are_not_the_path():
    ops = [
        core("schedule", 0.0, 0.1e-3, 2),
        compute(0, 0.5e-3, 5.0e-3, 2),
        core("schedule", 1.0e-3, 1.1e-3, 1),  # the stage is busy with step 0: this launch waits
        compute(1, 5.0e-3, 6.0e-3, 1),
        core("update", 5.4e-3, 5.5e-3, 2),
        core("schedule", 5.5e-3, 7.0e-3, 2),  # the core is busy when step 1 ends at 6 ms
        core("update", 7.2e-3, 7.3e-3, 1),
        core("schedule", 7.3e-3, 7.4e-3, 1),
    ]
    p = step_paths(ops)
    assert p["launch"] == [(2, pytest.approx(0.4e-3))]
    assert p["return"] == [(2, pytest.approx(0.4e-3))]


def test_control_path_report_adds_the_stage_handoff(tmp_path):
    from experiments.validation.control_path import report
    from ppsim.metrics.io import ops_csv

    ops = [stage(0, 0, 0.0, 4e-3), send(0, 4.01e-3, 4.2e-3, 2048), stage(1, 0, 4.3e-3, 8e-3)]
    for d in ("engine-0", "sim"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "stage_ops.csv").write_text(ops_csv(ops))
    assert "handoff   engine   0.300  sim   0.300  (n 1, 1)" in report(tmp_path)


def test_handoff_fit_is_the_median_excess_over_the_ping_pong():
    from calibration.path_fits import fit_handoff
    from ppsim.cost.profiled import OpFit

    wire = OpFit("send_recv", "linear", "bytes", {"c0": 50e-6, "c1": 1e-9})
    rows = [
        {"op": "handoff", "bytes": 1000, "median_s": 351e-6, "repeats": 3},  # excess 300 us
        {"op": "handoff", "bytes": 100000, "median_s": 550e-6, "repeats": 1},  # excess 400 us
    ]
    f = fit_handoff({"send_recv": wire}, rows)
    assert f.coef == {"c0": pytest.approx(300e-6), "c1": 0.0}
    assert fit_handoff({}, rows) is None and fit_handoff({"send_recv": wire}, []) is None


def test_live_steps_are_the_engine_computes_with_their_plan_stage_and_idle_gap():
    from types import SimpleNamespace

    from calibration.core_path import live_steps
    from ppsim.cost.base import StageSpec
    from ppsim.policy.plan import PlanItem, make_plan

    stages = (StageSpec(0, 0, 4, True, False), StageSpec(1, 4, 8, False, True))
    plans = {
        0: make_plan(0, [PlanItem(7, 0, 16, True, True)]),
        1: make_plan(1, [PlanItem(7, 16, 1, False, True), PlanItem(9, 40, 1, False, True)]),
    }
    ops = [
        OpRecord("stage0", "compute", 0, 0.0, 2e-3, 16, 1),
        OpRecord("stage1", "compute", 0, 2.5e-3, 4.5e-3, 16, 1),
        OpRecord("stage0", "compute", 1, 5e-3, 6e-3, 2, 2),
        OpRecord("stage1", "compute", 1, 6.3e-3, 7.5e-3, 2, 2),
        OpRecord("core", "update", -1, 7.6e-3, 7.7e-3, 0, 2),
    ]
    run = SimpleNamespace(prep=SimpleNamespace(topology=SimpleNamespace(stages=stages)), ops=ops, plans=plans)
    rows = live_steps(run)  # each stage's first compute (after start-up) is left out
    assert [(r["op"], r["split"], r["items"], r["layers"], r["start_layer"]) for r in rows] == [
        ("stage_first", "live2", "16:1;40:1", 4, 0),
        ("stage_last", "live2", "16:1;40:1", 4, 4),
    ]
    assert [r["gap_s"] for r in rows] == pytest.approx([3e-3, 1.8e-3])
    assert [r["median_s"] for r in rows] == pytest.approx([1e-3, 1.2e-3])


def test_a_live_runs_host_shift_is_the_sampler_after_over_during():
    """The in-run sampler's mean while a run's steps were timed alone over its mean during the run."""
    from calibration.core_path import shift_by_host

    samples = [(t / 4, 0.002) for t in range(40)] + [(10 + t / 4, 0.0022) for t in range(20)]  # 10% slower
    rows = [
        {"split": "live1", "run": 0, "live_window_s": (1.0, 9.0), "alone_window_s": (10.0, 14.0)},
        {"split": "live1", "run": 1, "live_window_s": (1.0, 9.0), "alone_window_s": (20.0, 21.0)},  # no samples
        {"split": "stage", "op": "stage_full"},  # not a live row
    ]
    shift_by_host(rows, samples)
    assert rows[0]["host_shift"] == pytest.approx(1.1) and "host_shift" not in rows[1]
    assert not any(k.endswith("window_s") for r in rows for k in r)
    assert rows[2] == {"split": "stage", "op": "stage_full"}


def test_a_launch_runs_from_the_steps_own_schedule():
    """``trtllm-slots``' core tries the next slot right after the step's own schedule and finds nothing
    (``num_reqs`` 0): the launch runs from the step's own schedule (part 35), not from the empty one, which
    the schedule samples still keep; ``own_schedule=False`` measures it as calibration did before."""
    ops = [
        core("schedule", 0.0, 0.1e-3, 2),
        core("schedule", 0.12e-3, 0.15e-3, 0),  # the next slot: nothing to launch
        compute(0, 0.6e-3, 5.0e-3, 2),
        core("update", 5.4e-3, 5.5e-3, 2),
        core("schedule", 5.5e-3, 5.6e-3, 2),
        core("schedule", 5.62e-3, 5.65e-3, 0),
        compute(1, 6.0e-3, 9.0e-3, 2),
    ]
    own, anysched = step_paths(ops), step_paths(ops, own_schedule=False)
    assert own["launch"] == [(2, pytest.approx(0.5e-3)), (2, pytest.approx(0.4e-3))]
    assert anysched["launch"] == [(2, pytest.approx(0.45e-3)), (2, pytest.approx(0.35e-3))]
    assert [n for n, _ in own["schedule"]] == [n for n, _ in anysched["schedule"]] == [2, 0, 2, 0]
    assert own["return"] == anysched["return"] == [(2, pytest.approx(0.4e-3))]
    # records cut short (a compute missing): the first compute after the schedule, empty schedules still skipped
    assert step_paths(ops[:-1])["launch"] == [(2, pytest.approx(0.5e-3))]


def test_the_simulators_own_ring_launch_is_measured_back_from_its_trace(tmp_path):
    """Exact trace: a ``trtllm-slots`` run at two stages charging ``ring_launch`` (0.5 ms + 20 us a request):
    calibration's measure (:func:`step_paths`) on the simulator's own records gives back that charge at every
    launch it keeps; measured from whichever schedule came last, the empty schedules that the core runs right
    after the step's own cut some of them short (calibration's ring samples until part 35)."""
    from ppsim.config import build_scenario
    from ppsim.run import run_scenario
    from tests.test_calibration_profiled import _fits, _write

    lin = {"form": "linear", "x": "n", "coef": {"c0": 5e-4, "c1": 2e-5}}
    d = _write(tmp_path / "prof", fits={**_fits(), "ring_launch": lin, "ring_return": lin})
    s = build_scenario(
        None,
        {
            "model": "tiny",
            "cost": {"kind": "profile", "profile_dir": str(d)},
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": {"kind": "trtllm-slots"}, "max_num_seqs": 8},
            "workload": {"num_prompts": 12, "request_rate": 200.0, "random_input_len": 16, "random_output_len": 8},
        },
    )
    ops = list(run_scenario(s).result.ops)
    assert any(o.track == "core" and o.kind == "schedule" and o.num_reqs == 0 for o in ops)
    own = step_paths(ops)["launch"]
    assert len(own) >= 10 and all(t == pytest.approx(5e-4 + 2e-5 * n, rel=1e-6) for n, t in own)
    short = [(n, t) for n, t in step_paths(ops, own_schedule=False)["launch"] if t < 0.99 * (5e-4 + 2e-5 * n)]
    assert short
