"""experiments/validation/stage_loop.py on records written here: which restarts it keeps, how it splits
them, the core records it finds under a switched hand-on, and its one-line refusals."""

from __future__ import annotations

import csv

import pytest

from experiments.validation import stage_loop
from ppsim.metrics.records import LOOP_FIELDS


def loop_row(stage, step, reqs, ready, recv, start, end, ctrl, out, switched):
    return {
        "stage": stage,
        "step_id": step,
        "num_tokens": reqs,
        "num_reqs": reqs,
        "ready_s": ready,
        "recv_done_s": recv,
        "start_s": start,
        "end_s": end,
        "ctrl_s": ctrl,
        "out_s": out,
        "out_cpu_s": out / 2,
        "out_switched": switched,
        "cpu_s": end - start,
        "preempted": 0,
    }


# stage 1's computes: step 1 ends at 10.0 ms and hands on for 0.8 ms, switched out (a core record at
# 10.2-10.5 ms); stage 0 had computed step 2 by then (9.0 ms): a restart of 1.2 ms, its input arriving as the loop
# took it; step 3 was computed on stage 0 after stage 1 freed (a hand-over: left out); step 4 restarts again.
ROWS = [
    loop_row(1, 1, 8, 0.0050, 0.0051, 0.0052, 0.0100, 0.0, 0.0008, 1),
    loop_row(1, 2, 8, 0.0110, 0.0110, 0.0112, 0.0200, 0.0001, 0.0001, 0),
    loop_row(1, 3, 32, 0.0202, 0.0212, 0.0213, 0.0300, 0.0001, 0.0001, 0),
    loop_row(1, 4, 32, 0.0302, 0.0304, 0.0305, 0.0400, 0.0002, 0.0002, 0),
    loop_row(0, 1, 8, 0.0001, -1.0, 0.0002, 0.0045, 0.0001, 0.0002, 0),
    loop_row(0, 2, 8, 0.0048, -1.0, 0.0049, 0.0090, 0.0001, 0.0002, 0),
    loop_row(0, 3, 32, 0.0200, -1.0, 0.0201, 0.0210, 0.0001, 0.0002, 0),
    loop_row(0, 4, 32, 0.0212, -1.0, 0.0213, 0.0290, 0.0001, 0.0002, 0),
]
CORE = [(0.0102, 0.0105), (0.0106, 0.0107)]


def test_restarts_are_the_simulators_and_split():
    rs = stage_loop.restarts(ROWS, 1, CORE)
    assert [r["reqs"] for r in rs] == [8, 32]  # step 3 was computed upstream after stage 1 freed
    first, second = rs
    assert first["restart"] == pytest.approx(0.0012) and first["out"] == pytest.approx(0.0008)
    assert first["ctrl"] == pytest.approx(0.0001) and first["wait"] == 0.0
    assert first["rest"] == pytest.approx(0.0003)
    assert first["switched"] and first["core"]
    assert not second["switched"] and not second["core"] and second["restart"] == pytest.approx(0.0005)
    assert second["wait"] == pytest.approx(0.0002)  # its input arrived after the loop took the step
    assert len(stage_loop.restarts(ROWS, 0, CORE)) == 3  # the first stage: every compute after another


def test_overlap_is_any_core_record_meeting_the_hand_on():
    assert stage_loop.overlaps(CORE, 0.0100, 0.0108)
    assert stage_loop.overlaps(CORE, 0.0104, 0.01041)  # inside one record
    assert not stage_loop.overlaps(CORE, 0.0107, 0.0110) and not stage_loop.overlaps(CORE, 0.0090, 0.0102)
    assert not stage_loop.overlaps([], 0.0, 1.0)


def write(d, rows, name="stage_loop.csv"):
    d.mkdir(parents=True, exist_ok=True)
    with (d / name).open("w", newline="") as f:
        w = csv.DictWriter(f, LOOP_FIELDS)
        w.writeheader()
        w.writerows(rows)


def test_report_reads_an_engine_dir_and_a_validate_dir(tmp_path, capsys):
    write(tmp_path / "eng", ROWS)
    write(tmp_path / "val" / "engine-0", ROWS)
    (tmp_path / "eng" / "stage_ops.csv").write_text(
        "track,kind,step_id,start_s,end_s\ncore,update,-1,0.0102,0.0105\ncore,schedule,-1,0.0106,0.0107\n"
    )
    assert stage_loop.main([str(tmp_path / "eng"), str(tmp_path / "val")]) == 0
    out = capsys.readouterr().out
    assert "eng: stage 1" in out and "engine-0: stage 1" in out
    assert "8 reqs:    1 restarts, median 1.200 ms" in out
    assert "switched in the hand-on 1 (restart 1.200, over a core record 1)" in out  # the engine dir's core
    assert "switched in the hand-on 1 (restart 1.200, over a core record 0)" in out  # no stage_ops.csv there


def _foreign(d):
    d.mkdir()
    (d / "stage_loop.csv").write_text("stage,step_id\n1,2\n")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "not a directory"),
        (lambda d: d.mkdir(), "no stage_loop.csv and no engine-N/ inside"),
        (lambda d: (d / "engine-0").mkdir(parents=True), "stage_loop.csv: missing"),
        (lambda d: _foreign(d), "not a stage_loop.csv"),
    ],
)
def test_bad_dirs_are_refused_in_one_line(tmp_path, capsys, make, message):
    d = tmp_path / "run"
    make(d)
    assert stage_loop.main([str(d)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_negative_stage_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        stage_loop.main(["--stage", "-1", str(tmp_path)])
    assert e.value.code == 2 and "--stage: -1 is negative" in capsys.readouterr().err
