"""What a run writes: three files by default, the detailed ones with --save-detailed, a windowed trace."""

from __future__ import annotations

import io
import json

from ppsim.config import build_scenario
from ppsim.metrics.records import OpRecord
from ppsim.metrics.trace import chrome_trace
from ppsim.run import run_scenario
from ppsim.sim.progress import RunProgress

SMALL = {
    "model": "tiny",
    "cluster": {"pipeline_parallel_size": 2},
    "workload": {"num_prompts": 12, "random_input_len": 40, "random_output_len": 5, "request_rate": 200.0},
}


BOUNDED = [".ppsim-result", "config.json", "requests.csv", "summary.json", "timeline.csv", "timeseries.csv"]


def test_default_outputs_are_summary_requests_config(tmp_path):
    out = run_scenario(build_scenario(None, SMALL), tmp_path / "o", lean=True, dashboard=False)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == BOUNDED
    assert len(out.result.ops) == 0 and out.result.ledger.times is None  # lean: no per-op, per-token record
    rows = (tmp_path / "o" / "requests.csv").read_text().splitlines()
    assert len(rows) == 1 + 12


def test_save_detailed_adds_tokens_ops_trace_with_the_same_summary(tmp_path):
    s = build_scenario(None, SMALL)
    lean = run_scenario(s, tmp_path / "a", lean=True, dashboard=False)
    full = run_scenario(s, tmp_path / "b", save_detailed=True, dashboard=False)
    names = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert names == sorted([*BOUNDED, "stage_ops.csv", "tokens.csv", "trace.json", "actions.csv"])
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()
    for name in ("requests.csv", "timeseries.csv", "timeline.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    ops = (tmp_path / "b" / "stage_ops.csv").read_text().splitlines()
    assert ops[0].startswith("track,kind,step_id") and len(ops) == 1 + len(full.result.ops)
    tokens = (tmp_path / "b" / "tokens.csv").read_text().splitlines()
    assert len(tokens) == 1 + lean.summary["total_output_tokens"]
    actions = (tmp_path / "b" / "actions.csv").read_text().splitlines()  # every plan launched: one compute each
    assert actions[0] == "step,stage,kind,requests,tokens"
    assert len(actions) == 1 + sum(o.track == "stage0" and o.kind == "compute" for o in full.result.ops)


def test_trace_window_keeps_the_first_seconds():
    ops = [OpRecord("stage0", "compute", i, 10.0 + i, 10.5 + i, 1, 1) for i in range(10)]
    xs = [e for e in chrome_trace(ops, window_s=3.0)["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["compute mb0", "compute mb1", "compute mb2"]
    assert len([e for e in chrome_trace(ops)["traceEvents"] if e["ph"] == "X"]) == 10


def test_cli_trace_window_flag(tmp_path, ppsim_cli):
    r = ppsim_cli(
        "simulate",
        "--model",
        "tiny",
        "-pp",
        "2",
        "--num-prompts",
        "30",
        "--request-rate",
        "20",
        "--random-input-len",
        "40",
        "--random-output-len",
        "4",
        "--save-detailed",
        "--trace-window-s",
        "0.2",
        "--no-dashboard",
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert r.returncode == 0, r.stderr
    assert "trace.json" in r.stdout and r.stderr == ""  # no bar: stderr is not a terminal
    ev = [e for e in json.loads((tmp_path / "o" / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert ev and max(e["ts"] for e in ev) - min(e["ts"] for e in ev) < 0.2e6
    bad = ppsim_cli("simulate", "--trace-window-s", "0", "--output-dir", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--trace-window-s" in bad.stderr
    # without --save-detailed there is no trace.json for the window to shape: refused, naming both flags
    bad = ppsim_cli("simulate", "--model", "tiny", "--trace-window-s", "5", "--output-dir", str(tmp_path / "y"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--trace-window-s" in bad.stderr and "--save-detailed" in bad.stderr and not (tmp_path / "y").exists()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    quiet = RunProgress(100, enabled=True, stream=io.StringIO())
    assert quiet.bar is None
    off = RunProgress(100, enabled=False, stream=_Tty())
    assert off.bar is None
    tty = _Tty()
    bar = RunProgress(100, enabled=True, stream=tty, delay_s=0.0)  # draw at once (the CLI waits DELAY_S)
    assert bar.bar is not None
    bar.bar.mininterval = 0.0  # redraw on every update
    for i in range(100):
        bar.ended(float(i))
    bar.close()
    assert "100/100" in tty.getvalue() and "simulated" in tty.getvalue()
