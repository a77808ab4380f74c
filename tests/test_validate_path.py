"""Part 6 of the validate report: each stage's span split into computes, idle beside other stages and
idle pipeline; the hand-over on a free receiver (``ppsim/validate/path.py``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.config import build_scenario
from ppsim.metrics.records import OpRecord
from ppsim.run import run_scenario
from ppsim.validate.path import (
    format_path,
    handovers,
    restart_records,
    restarts,
    stage_split,
    summarize_path,
    turnarounds,
)


def _c(stage, step, a, b, reqs=1):
    return OpRecord(f"stage{stage}", "compute", step, a, b, 1, reqs)


def test_split_and_handover_by_hand():
    """Two stages, two micro-batches: times in ms chosen so every figure is checkable by hand."""
    ms = 1e-3
    ops = [
        _c(0, 0, 0 * ms, 4 * ms),
        _c(0, 1, 5 * ms, 9 * ms),  # 1 ms idle, nothing else computing: idle pipeline
        _c(1, 0, 4.5 * ms, 8.5 * ms),  # hand-over 0.5 ms on a free receiver
        _c(1, 1, 10 * ms, 14 * ms),  # stage 1 was free from 8.5 ms: hand-over 1 ms
        _c(0, 2, 16 * ms, 20 * ms),  # stage 0 idle 9-16: 10-14 beside stage 1, the rest pipeline idle
        OpRecord("link0->1", "send", 0, 4 * ms, 4.5 * ms, 1, 1),  # not a compute: ignored
    ]
    s = stage_split(ops)
    assert s[0]["computes"] == 3 and s[0]["span_s"] == pytest.approx(20 * ms)
    assert s[0]["busy_s"] == pytest.approx(12 * ms)
    # gaps 4-5 (stage 1 computes from 4.5) and 9-16 (stage 1 computes 10-14)
    assert s[0]["idle_others_s"] == pytest.approx(4.5 * ms) and s[0]["idle_pipeline_s"] == pytest.approx(3.5 * ms)
    # stage 1: span 4.5-14, gap 8.5-10 beside stage 0's compute until 9
    assert s[1]["span_s"] == pytest.approx(9.5 * ms) and s[1]["busy_s"] == pytest.approx(8 * ms)
    assert s[1]["idle_others_s"] == pytest.approx(0.5 * ms) and s[1]["idle_pipeline_s"] == pytest.approx(1 * ms)
    assert handovers(ops) == {0: pytest.approx([0.5 * ms, 1 * ms])}


def test_a_receiver_busy_with_another_step_is_not_a_handover():
    ms = 1e-3
    ops = [_c(0, 0, 0, 4 * ms), _c(1, 9, 3 * ms, 6 * ms), _c(1, 0, 6.2 * ms, 9 * ms), _c(0, 1, 4 * ms, 8 * ms)]
    assert handovers(ops) == {0: []}  # stage 1 computed step 9 after step 0 left stage 0: queueing


@st.composite
def _runs(draw):
    ops = []
    for s in range(draw(st.integers(1, 3))):
        t = draw(st.floats(0, 0.01))
        for k in range(draw(st.integers(1, 12))):
            t += draw(st.floats(0, 0.005))
            d = draw(st.floats(1e-5, 0.01))
            ops.append(_c(s, k, t, t + d))
            t += d
    return ops


@given(_runs())
@settings(max_examples=200, deadline=None)
def test_the_split_adds_up_to_the_span(ops):
    for d in stage_split(ops).values():
        assert d["busy_s"] + d["idle_others_s"] + d["idle_pipeline_s"] == pytest.approx(d["span_s"], abs=1e-12)
        assert d["idle_others_s"] >= 0 and d["idle_pipeline_s"] >= -1e-12 and d["busy_s"] > 0
    for lat in (*handovers(ops).values(), *turnarounds(ops).values()):
        assert all(x >= 0 for x in lat)


def test_simulated_handover_is_the_link_time_with_one_micro_batch_in_flight():
    """One request at a time at PP=2: every stage-1 compute starts when its seam transfer ends, so the
    hand-over on a free receiver is each step's own send, and engine == simulator gives zero difference."""
    s = build_scenario(
        overrides={
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 2},
            "workload": {"num_prompts": 3, "request_rate": "inf", "max_concurrency": 1, "random_output_len": 6},
            "seed": 1,
        }
    )
    ops = run_scenario(s).result.ops
    sends = {o.step_id: o.end_s - o.start_s for o in ops if o.track == "link0->1"}
    steps = sorted(o.step_id for o in ops if o.track == "stage0")
    assert handovers(ops)[0] == pytest.approx([sends[k] for k in steps])
    p = summarize_path([ops, ops], ops)
    for d in p["stages"].values():
        assert d["engine"] == pytest.approx(d["sim"])
    text = format_path(p)
    assert "stage 1: engine span - simulator span +0.000 s" in text and "hand-over 0->1" in text
    assert summarize_path([], ops) == {} and "no stage computes" in format_path({})


def test_turnaround_is_the_restart_of_a_receiver_whose_input_waited():
    """Stage 1 busy with step 9 until 6 ms while step 0 left stage 0 at 4 ms: its restart at 6.2 ms is a
    0.2 ms turnaround (not a hand-over); a sender done less than TURN_MARGIN_S before does not count."""
    ms = 1e-3
    ops = [_c(0, 0, 0, 4 * ms), _c(1, 9, 3 * ms, 6 * ms), _c(1, 0, 6.2 * ms, 9 * ms), _c(0, 1, 4 * ms, 8.5 * ms)]
    ops.append(_c(1, 1, 9.3 * ms, 12 * ms))  # step 1 left stage 0 at 8.5, 0.5 ms before stage 1 freed
    assert turnarounds(ops) == {0: pytest.approx([0.2 * ms])} and handovers(ops) == {0: []}
    p = summarize_path([ops], ops)
    assert p["turnaround"]["0->1"]["engine"] == pytest.approx({"n": 1.0, "median_ms": 0.2, "mean_ms": 0.2})
    assert "turnaround of stage 1 with its input waiting: engine median 0.200 ms" in format_path(p)


def test_restarts_are_every_restart_whose_input_left_before_the_receiver_freed_with_its_requests():
    """Calibration's turnaround sample: step 0 (left stage 0 2 ms early) and step 1 (0.5 ms early) both
    count, each with its request count; step 2, sent after stage 1 freed, is a hand-over."""
    ms = 1e-3
    ops = [_c(0, 0, 0, 4 * ms), _c(1, 9, 3 * ms, 6 * ms), _c(1, 0, 6.2 * ms, 9 * ms), _c(0, 1, 4 * ms, 8.5 * ms)]
    ops[3] = _c(0, 1, 4 * ms, 8.5 * ms, reqs=3)
    ops += [_c(1, 1, 9.3 * ms, 12 * ms, reqs=3), _c(0, 2, 8.5 * ms, 13 * ms), _c(1, 2, 13.4 * ms, 15 * ms)]
    assert restarts(ops) == {0: [(1, pytest.approx(0.2 * ms)), (3, pytest.approx(0.3 * ms))]}
    assert turnarounds(ops) == {0: pytest.approx([0.2 * ms])}  # the report's: 1 ms early or more


def test_restart_records_carry_what_may_set_each_restart():
    """The same two restarts as above, one record each: step 0's (after step 9's 3 ms compute; the core's
    schedule that launched it, the last to end before stage 0 started it, ended 6 ms before stage 1 freed) and
    step 1's (after step 0's compute, a prefill of 16; its schedule ended 5.5 ms before). Step 9 was no restart
    (the first of the stage's busy spell: step 0's restart comes after a hand-over), step 0 was one (step 1's is
    back-to-back). Core records carry no step id (-1), as the engine writes them."""
    ms = 1e-3
    ops = [_c(0, 0, 0, 4 * ms), _c(1, 9, 3 * ms, 6 * ms), _c(1, 0, 6.2 * ms, 9 * ms)]
    ops[2] = OpRecord("stage1", "compute", 0, 6.2 * ms, 9 * ms, 16, 1, 16)
    ops += [_c(0, 1, 4 * ms, 8.5 * ms, reqs=3), _c(1, 1, 9.3 * ms, 12 * ms, reqs=3)]
    ops += [OpRecord("core", "schedule", -1, -0.5 * ms, 0, 1, 1)]
    ops += [OpRecord("core", "schedule", -1, 3 * ms, 3.5 * ms, 1, 3)]
    first, second = restart_records(ops)
    assert first == pytest.approx(
        {"link": 0, "step_id": 0, "reqs": 1, "tokens": 16, "prefill_tokens": 16, "margin_s": 2 * ms,
         "restart_s": 0.2 * ms, "prev_s": 3 * ms, "prev_prefill_tokens": 0, "at_s": 6 * ms, "core_lag_s": -6 * ms,
         "prev_step_id": 9, "after_handover": 1}
    )  # fmt: skip
    assert second == pytest.approx(
        {"link": 0, "step_id": 1, "reqs": 3, "tokens": 1, "prefill_tokens": 0, "margin_s": 0.5 * ms,
         "restart_s": 0.3 * ms, "prev_s": 2.8 * ms, "prev_prefill_tokens": 16, "at_s": 9 * ms, "core_lag_s": -5.5 * ms,
         "prev_step_id": 0, "after_handover": 0}
    )  # fmt: skip
    assert [(r["reqs"], r["restart_s"]) for r in restart_records(ops)] == [(n, t) for n, t in restarts(ops)[0]]
    assert "core_lag_s" not in restart_records([o for o in ops if o.track != "core"])[0]  # no core records
