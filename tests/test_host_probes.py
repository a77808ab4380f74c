"""experiments/validation/host_probes.py: a probe's reading around each engine repeat against the
repeat's own step level, on validation.json files written here."""

from __future__ import annotations

import json

import pytest

from experiments.validation import host_probes


def _validation(errors, models, pp=1, model_ref=0.010):
    readings = []
    for i, m in enumerate(models):
        for when in ("before", "after"):
            readings.append({"when": f"{when} {i}", "probe_s": 0.002, "stage_probe_s": 0.005, "model_probe_s": m})
    return {
        "scenario": {"cluster": {"pipeline_parallel_size": pp}},
        "host": {
            "readings": readings,
            "reference_probe_s": 0.002,
            "stage_reference_s": 0.005,
            "model_reference_s": model_ref,
            "model_price_s": 0.0125,  # the profile charges the probe's step 0.0125 s
        },
        "step_cost": {"by_run": {str(i): {"median_cpu_error": e} for i, e in enumerate(errors)}},
    }


def test_each_repeat_pairs_its_own_readings_with_its_level(tmp_path, capsys):
    # repeat 0: engine 20% slower than predicted (error -1/6), whole model 20% slower than at calibration
    v = _validation([-1 / 6, 0.0, -1 / 11], [0.012, 0.010, 0.011])  # the third: both 10% slower
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "validation.json").write_text(json.dumps(v))
    rows = host_probes.collect([str(tmp_path)])
    assert [r["repeat"] for r in rows] == [0, 1, 2] and rows[0]["pp"] == 1
    assert rows[0]["level"] == pytest.approx(0.2) and rows[0]["model"] == pytest.approx(0.2)
    assert rows[1]["level"] == pytest.approx(0.0) and rows[0]["cpu"] == 0.0 and rows[0]["stage"] == 0.0
    assert rows[0]["price"] == pytest.approx(0.012 / 0.0125 - 1)  # the probe against the profile's price
    assert host_probes.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "model  n   3  r +1.00  median |probe - level| 0.000  mad 0.000" in out and "PP = 1 repeats:" in out


def test_a_run_from_before_the_model_probe_has_none_and_bad_folders_exit_2(tmp_path, capsys):
    v = _validation([-0.1], [0.01], model_ref=None)
    (tmp_path / "validation.json").write_text(json.dumps(v))
    assert host_probes.collect([str(tmp_path)])[0]["model"] is None
    assert host_probes.main([str(tmp_path / "nope")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert host_probes.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and "no validation.json" in err


def test_conditioned_reads_the_plain_and_probe_conditioned_errors(tmp_path, capsys):
    v = _validation([-0.1], [0.011])
    v["rows"] = [{"metric": "mean_tpot_ms", "error": -0.10}, {"metric": "output_throughput", "error": 0.08}]
    v["probe_conditioned"] = {
        "factor": 1.1,
        "rows": [{"metric": "mean_tpot_ms", "error": -0.02}, {"metric": "output_throughput", "error": 0.01}],
    }
    (tmp_path / "b8").mkdir()
    (tmp_path / "b8" / "validation.json").write_text(json.dumps(v))
    assert host_probes.main(["--conditioned", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("b8: factor 1.100; output_throughput +0.080 -> +0.010, mean_tpot_ms -0.100 -> -0.020")
    assert out.strip().endswith("TPOT for")
    v["probe_conditioned"]["rows"][0]["error"] = -0.097  # within half a point: level
    assert host_probes.conditioned_line("x", v).endswith("TPOT level")
    v["probe_shaped"] = {
        "factor": 1.05,
        "step": [8, 60],
        "rows": [{"metric": "mean_tpot_ms", "error": -0.05}, {"metric": "output_throughput", "error": 0.04}],
    }
    (tmp_path / "b8" / "validation.json").write_text(json.dumps(v))
    csv_path = tmp_path / "shaped.csv"
    args = ["--conditioned", "--compare", "probed:shaped", "--csv", str(csv_path), "--label", "MOE98"]
    assert host_probes.main([*args, str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("b8: factor 1.100 -> 1.050 (step 8@60); output_throughput +0.010 -> +0.040")
    assert "mean_tpot_ms -0.097 -> -0.050; TPOT for" in out and "2 rows appended" in out
    lines = csv_path.read_text().splitlines()
    assert lines[1].startswith("probed:shaped,MOE98,profile,MOE98/b8,")
    with pytest.raises(SystemExit) as e:  # only with --conditioned
        host_probes.main(["--compare", "probed:shaped", str(tmp_path)])
    assert e.value.code == 2 and "--compare: goes with --conditioned" in capsys.readouterr().err
    del v["probe_shaped"]
    del v["probe_conditioned"]  # a run from before it: nothing to read, exit 2
    (tmp_path / "b8" / "validation.json").write_text(json.dumps(v))
    assert host_probes.main(["--conditioned", str(tmp_path)]) == 2


def test_before_is_the_repeat_s_own_reading_and_drawn_their_mean_by_draw_judges_them(tmp_path, capsys):
    # price 0.0125 s; before 0 reads 10% over it, before 1 20% over; the afters read something else entirely
    v = _validation([-1 / 11, -1 / 6], [0.0, 0.0])
    for r, before in zip(v["host"]["readings"], (0.01375, 0.0, 0.015, 0.0), strict=True):
        r["model_probe_s"] = before if r["when"].startswith("before") else 0.020
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / "validation.json").write_text(json.dumps(v))
    rows = host_probes.collect([str(tmp_path / "d")])
    assert [r["before"] for r in rows] == [pytest.approx(0.1), pytest.approx(0.2)]
    assert [r["drawn"] for r in rows] == [pytest.approx(0.15)] * 2  # what probe_conditioned scales by
    assert [r["level"] for r in rows] == [pytest.approx(0.1), pytest.approx(0.2)]
    lines, counts = host_probes.by_draw(rows, "draw")  # each repeat's own reading follows it exactly: for
    assert counts == {"for": 1, "against": 0, "level": 0}
    assert "|before - level| 0.000, |drawn - level| 0.050" in lines[0]
    v["step_cost"]["by_run"] = {"0": {"median_cpu_error": -1 / 6}, "1": {"median_cpu_error": -1 / 11}}  # swapped
    (tmp_path / "d" / "x" / "validation.json").write_text(json.dumps(v))
    assert host_probes.main(["--by-draw", "--reading", "run", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "/x: 2 repeats, median |before - level| 0.100, |drawn - level| 0.050; against" in out
    assert out.strip().endswith("for 0, against 1, level 0")
    v["host"]["readings"] = [r for r in v["host"]["readings"] if not r["when"].startswith("before")]
    (tmp_path / "d" / "x" / "validation.json").write_text(json.dumps(v))  # no reading before the repeats: exit 2
    assert host_probes.main(["--by-draw", str(tmp_path / "d")]) == 2
    assert "no repeat with the whole-model probe read before it" in capsys.readouterr().err
