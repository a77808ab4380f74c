"""experiments/validation/steals.py: who took a stage's core inside its computes, from a perf scheduler trace."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.validation import steals

OFFSET_S = 1000.0  # the trace's clock against the engine's
CORE, KWORKER = 50, 7


def _switch(t: float, prev: tuple[str, int], state: str, nxt: tuple[str, int], cpu: int = 0) -> str:
    return (
        f"  {prev[0]:>12s} {prev[1]}/{prev[1]} [{cpu:03d}] {t:.6f}: sched:sched_switch: prev_comm={prev[0]} "
        f"prev_pid={prev[1]} prev_prio=120 prev_state={state} ==> next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120\n"
    )


def _run(tmp_path: Path) -> tuple[Path, Path]:
    """Stage 0 (pid 100) computes 2 ms every 10 ms, ten times; the engine core (pid 50) takes its core for
    0.3 ms inside computes 3 and 7, a kworker for 0.1 ms inside compute 5, and the core once more between two
    computes (not counted). Stage 1 (pid 200) computes 1 ms after each, never preempted."""
    idle, stage0, stage1 = ("swapper/0", 0), ("python3", 100), ("python3", 200)
    core, kworker = ("ppsim", CORE), ("kworker/0:1", KWORKER)
    lines, ops = [], ["track,kind,step_id,start_s,end_s,num_tokens,num_reqs"]
    for i in range(10):
        a = 0.010 * (i + 1)
        b = a + 0.002
        ops += [f"stage0,compute,{i},{a},{b},1,1", f"stage1,compute,{i},{b + 0.001},{b + 0.002},1,1"]
        t = OFFSET_S + a
        lines.append(_switch(t, idle, "R", stage0))
        if i in (3, 5, 7):
            thief, dt = (kworker, 1e-4) if i == 5 else (core, 3e-4)
            lines.append(_switch(t + 5e-4, stage0, "R", thief))
            lines.append(_switch(t + 5e-4 + dt, thief, "S", stage0))
        lines.append(_switch(t + 0.002, stage0, "S", idle))
        if i == 4:  # between computes: runnable but off, not inside one
            lines.append(_switch(t + 0.004, idle, "R", stage0))
            lines.append(_switch(t + 0.0042, stage0, "R", core))
            lines.append(_switch(t + 0.0045, core, "S", stage0))
            lines.append(_switch(t + 0.005, stage0, "S", idle))
        lines.append(_switch(t + 0.003, idle, "R", stage1, cpu=1))
        lines.append(_switch(t + 0.004, stage1, "S", idle, cpu=1))
    run = tmp_path / "R" / "engine-0"
    run.mkdir(parents=True)
    (run / "stage_ops.csv").write_text("\n".join(ops) + "\n")
    (run / "engine.json").write_text(json.dumps({"stage_pids": [100, 200], "core_pid": CORE}))
    trace = tmp_path / "run.txt"
    trace.write_text("".join(sorted(lines, key=lambda s: float(s.split("]")[1].split(":")[0]))))
    return trace, run


def test_the_preemptions_inside_computes_by_whom_with_the_clocks_aligned(tmp_path, capsys):
    trace, run = _run(tmp_path)
    assert steals.main([str(trace), str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "stage 0 (pid 100): 10 computes, 20.0 ms; on its core 96.5% of it (trace clock = engine clock + 1000.000000 s);"
        " preempted inside them 3 times, 0.7 ms (3.5%)" in out
    )
    assert "ppsim (50) (the engine core)                 2 times      0.6 ms  median 0.300 ms" in out
    assert "kworker/0:1 (7)                              1 times      0.1 ms  median 0.100 ms" in out
    assert "stage 1 (pid 200): 10 computes, 10.0 ms; on its core 100.0% of it" in out
    assert "preempted inside them 0 times, 0.0 ms (0.0%)" in out


def test_a_trace_without_switch_events_or_a_dir_without_the_run_is_one_line_exit_2(tmp_path, capsys):
    trace, run = _run(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("not perf output\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "engine.json").write_text("{")
    (bad / "stage_ops.csv").write_text("track\n")
    for argv, fragment in (
        ([str(empty), str(run)], "no sched:sched_switch events; record with `perf record -e sched:sched_switch -a`"),
        ([str(trace), str(tmp_path)], "no engine.json and stage_ops.csv; give an engine run dir"),
        ([str(tmp_path / "missing.txt"), str(run)], "trace: "),
        ([str(trace), str(bad)], "engine.json: not JSON"),
    ):
        assert steals.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and fragment in err
