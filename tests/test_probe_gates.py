"""experiments/validation/probe_gates.py: gates on the probe's factor read off the committed draws' errors."""

from __future__ import annotations

import csv

import pytest

from experiments.validation import probe_gates
from experiments.validation.tables import TARGETS


def _row(plain, probed, factor):
    return {"set": "held-out", "mean_tpot_ms_error": plain, "mean_tpot_ms_probed": probed, "probe_factor": factor}


def test_a_gate_s_error_lies_on_the_line_through_the_plain_and_probed_errors():
    r = _row("-0.10", "0.00", "1.10")  # the probe read 10% slow; scaled by it the error is gone
    assert probe_gates.error_at(r, 1.0, "mean_tpot_ms") == pytest.approx(-0.10)
    assert probe_gates.error_at(r, 1.10, "mean_tpot_ms") == pytest.approx(0.0)
    assert probe_gates.error_at(r, 1.05, "mean_tpot_ms") == pytest.approx(-0.05)
    assert probe_gates.error_at(_row("-0.1", "-0.1", "1.0"), 1.3, "mean_tpot_ms") == -0.1  # no line: plain
    g = probe_gates.GATES
    assert g["shrink0.5"](1.10) == pytest.approx(1.05) and g["dead0.05"](1.04) == 1.0 and g["dead0.05"](0.9) == 0.9
    assert g["soft0.03"](1.10) == pytest.approx(1.07) and g["soft0.03"](0.90) == pytest.approx(0.93)


def test_the_table_reads_each_draw_s_median_and_counts_the_target(tmp_path):
    def full(row):  # every column tally.py reads: the other targets' errors 0
        cells = {f"{m}_{s}": "0" for m in TARGETS for s in ("error", "adjusted", "probed")}
        return {**cells, **row}

    for name, rows in {
        "results-seed70.csv": [_row("-0.10", "0.00", "1.10"), _row("-0.08", "-0.02", "1.06")],
        "results-dense-1024-seed91.csv": [_row("0.02", "-0.06", "1.08"), {**_row("0.5", "0.5", "1"), "set": "dev"}],
        "results-seed69.csv": [{**_row("-0.2", "", ""), "probe_factor": ""}],  # before the probe: not read
    }.items():
        rows = [full(r) for r in rows]
        with (tmp_path / name).open("w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    found = probe_gates.draws(tmp_path)
    assert sorted(found) == [("dense-1024", 91), ("tiny", 70)] and len(found[("dense-1024", 91)]) == 1
    lines = probe_gates.table(found, "mean_tpot_ms")
    assert "dense-1024 plain        2.0%  within target on 1 of 1" in lines
    assert "dense-1024 probed       6.0%  within target on 0 of 1" in lines
    assert "tiny       probed       1.0%  within target on 1 of 1" in lines  # median of 0 and 2%
    assert "tiny       plain        9.0%  within target on 0 of 1" in lines


def test_it_reads_the_committed_draws(capsys):
    assert probe_gates.main([]) == 0
    out = capsys.readouterr().out
    assert "in-sample" in out and "dense-1024 probed" in out and "tiny       dead0.03" in out
