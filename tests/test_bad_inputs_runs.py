"""The checks behind the bad inputs of tests/bad_inputs_runs.py (run by tests/test_bad_inputs.py) pass
what ppsim itself writes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ppsim.cli import main
from tests.bad_inputs_runs import REQUESTS_HEAD, SERIES_HEAD, _json, run_dir

ROOT = Path(__file__).resolve().parents[1]


def test_the_undamaged_run_directory_plots_and_compares(tmp_path, capsys):
    """The cases above damage one file each of this directory; whole, it is drawn."""
    run_dir()(tmp_path)
    run = str(tmp_path / "run")
    assert main(["plot", run, "--output", str(tmp_path / "p.png")]) == 0
    assert main(["compare", run, run, "--output-dir", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 10_000 and (tmp_path / "cmp" / "compare.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "p.png", "run"]  # probes leave nothing


def _draws_quietly(run: Path, tmp_path: Path, capsys) -> None:
    """plot and compare of ``run`` end in exit 0 with nothing on stderr and no Python warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["plot", str(run), "--output", str(tmp_path / "p.png")]) == 0
        assert main(["compare", str(run), str(run), "--output", str(tmp_path / "c.png")]) == 0
    assert [str(w.message) for w in caught] == [] and capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "files",
    [
        {"requests_csv": REQUESTS_HEAD + "0,rejected,,,\n1,rejected,,,\n"},  # every request rejected
        {"config_json": None, "requests_csv": None, "timeline_csv": None, "timeseries_csv": None},  # summary only
    ],
    ids=["all-rejected", "summary-only"],
)
def test_runs_without_latencies_draw_without_warnings(files, tmp_path, capsys):
    """compare asked for a legend on latency panels without a line: matplotlib's UserWarning, with its
    source line, reached stderr."""
    run_dir(**files)(tmp_path)
    _draws_quietly(tmp_path / "run", tmp_path, capsys)


def test_values_at_the_limits_are_drawn(tmp_path, capsys):
    """The ranges run files are held to (tests/bad_inputs_runs.py refuses past them) are drawn whole."""
    top = 1e30
    run_dir(
        summary_json=_json("summary.json", completed=10**30, duration=top, request_throughput=top, mean_ttft_ms=top),
        requests_csv=REQUESTS_HEAD + "0,finished,0,0,0\n1,finished,1e30,1e30,1e30\n",
        timeseries_csv=SERIES_HEAD + "0,1e30,1,0,1e30,1e30\n",
        timeline_csv="track,kind,start_s,end_s\nwindow,window,0,1e30\nstage0,compute,0,1e30\n",
    )(tmp_path)
    _draws_quietly(tmp_path / "run", tmp_path, capsys)
    run_dir(timeseries_csv=None, stage_ops_csv="track,kind,start_s,end_s\nstage0,compute,0,1e30\n")(tmp_path / "ops")
    _draws_quietly(tmp_path / "ops" / "run", tmp_path, capsys)


def test_space_resolves_each_model_once_and_passes_configs_that_do_not_fit(tmp_path, monkeypatch):
    """Resolving a space loads each model once however many configurations use it; a configuration
    that does not fit in memory is a result of the sweep (no-fit), not bad input."""
    import ppsim.sweep.resolve as resolve
    from ppsim.sweep.space import load_space

    calls = []
    real = resolve.load_model
    monkeypatch.setattr(resolve, "load_model", lambda m: calls.append(m) or real(m))
    sp = load_space(ROOT / "experiments" / "spaces" / "llama2-70b-vidur.toml")
    assert len(sp.configs) == 216 and calls == ["llama-2-70b"]
    f = tmp_path / "s.toml"
    f.write_text(
        '[base]\nmodel = "llama-2-70b"\n[base.workload]\nnum_prompts = 4\n[space]\ntp = [1, 8]\n'
        "[slo]\np99_ttft_ms = 1000\n"
    )
    assert len(load_space(f).configs) == 2  # tp = 1: 70B weights on one H100 do not fit


def test_error_lines_escape_control_characters(tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "out")]
    assert main(["simulate", "--model", "tiny", "--trace", f"{tmp_path}/a\nb\tc\u2028.csv", *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a\\nb\\tc\\u2028.csv" in err, err
    assert main(["simulate", "--model", "tiny", "--output-dir", f"{tmp_path}/a\x00b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\x00" in err and "\x00" not in err, err
