"""experiments/validation/plan_class.py: step-level errors split by plan class, and its refusals."""

from __future__ import annotations

import csv

import pytest

from experiments.validation import plan_class as pc

FIELDS = ["run", "stage", "step_id", "num_tokens", "num_reqs", "num_prefill_tokens", "cpu_error"]


def _write(d, rows):
    d.mkdir(parents=True)
    with open(d / "step_costs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for i, (tokens, prefill, err) in enumerate(rows):
            w.writerow([0, 0, i, tokens, 1, prefill, err])


def test_classes_and_difference():
    rows = [
        {"num_tokens": "64", "num_prefill_tokens": "64", "cpu_error": "-0.10"},
        {"num_tokens": "65", "num_prefill_tokens": "64", "cpu_error": "-0.20"},
        {"num_tokens": "1", "num_prefill_tokens": "0", "cpu_error": "0.05"},
        {"num_tokens": "2", "num_prefill_tokens": "0", "cpu_error": "0.01"},
    ]
    errs = pc.class_errors(rows)
    assert errs == {"prefill": [-0.10], "mixed": [-0.20], "decode": [0.05, 0.01]}
    assert pc.prefill_minus_decode(errs) == pytest.approx(-0.15 - 0.03)
    assert pc.prefill_minus_decode({"prefill": [], "mixed": [], "decode": [0.1]}) is None


def test_runs_report_searches_one_level(tmp_path, capsys):
    _write(tmp_path / "set" / "a", [(64, 64, -0.1), (1, 0, 0.0), (1, 0, 0.02)])
    _write(tmp_path / "set" / "b", [(1, 0, 0.0)])  # no prefill: no difference
    assert pc.main(["runs", str(tmp_path / "set")]) == 0
    out = capsys.readouterr().out
    assert "a " in out and "b " in out
    assert "median prefill - decode: -0.110 over 1 scenarios, 1 below zero" in out


@pytest.mark.parametrize(
    "argv, fragment", [(["runs", "/nonexistent-ppsim"], "does not exist"), (["runs", "."], "no step_costs.csv")]
)
def test_runs_refuses_in_one_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pc.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1 and fragment in captured.err
    assert captured.out == ""


def test_runs_names_a_damaged_csv(tmp_path, capsys):
    d = tmp_path / "a"
    d.mkdir()
    (d / "step_costs.csv").write_text("num_tokens,num_prefill_tokens,cpu_error\n64,64,x\n")
    assert pc.main(["runs", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: dirs: {d} holds a damaged validation.json or CSV") and err.count("\n") == 1
