"""The error arithmetic and the report format of `ppsim validate`."""

import json

import pytest

from ppsim.metrics.records import OpRecord, RequestRecord
from ppsim.validate.compare import compare_summaries, is_fraction, per_request_errors, signed_error, verdict
from ppsim.validate.report import format_table, write_validation


def _summary(scale: float, busy=(0.5, 0.5)) -> dict:
    s = {m: 100.0 * scale for m in ("request_throughput", "output_throughput", "pipeline_bubble_fraction")}
    for m in ("ttft", "tpot", "itl", "e2el"):
        for st in ("mean", "median", "p99"):
            s[f"{st}_{m}_ms"] = 10.0 * scale
    s["stage_busy_fraction"] = list(busy)
    return s


def test_signed_error_and_spread():
    assert signed_error(110, 100) == pytest.approx(0.10)
    assert signed_error(90, 100) == pytest.approx(-0.10)
    assert signed_error(0, 0) == 0.0
    rows = compare_summaries([_summary(1.0), _summary(1.2)], _summary(1.21))
    r = {x.metric: x for x in rows}
    assert r["mean_ttft_ms"].engine == pytest.approx(11.0)
    assert r["mean_ttft_ms"].engine_spread == pytest.approx(2.0 / 11.0)
    assert r["mean_ttft_ms"].error == pytest.approx(12.1 / 11.0 - 1)
    assert "stage_busy_fraction[1]" in r


def test_verdict_limits():
    rows = compare_summaries([_summary(1.0)], _summary(1.07))
    v = verdict(rows)
    assert "output_throughput" in v["misses"] and "mean_tpot_ms" in v["misses"]  # 7% > 5%
    assert "mean_ttft_ms" not in v["misses"]  # 7% <= 10%


def _rec(i, sent, times):
    r = RequestRecord(i, sent, 10, len(times), sent_s=sent, token_times=list(times), finish_s=times[-1])
    r.status = "finished"
    return r


def test_per_request_errors_and_ks():
    eng = [_rec(i, 0.0, [1.0 + i, 2.0 + i]) for i in range(20)]
    sim = [_rec(i, 0.0, [1.1 * (1.0 + i), 2.0 + i]) for i in range(20)]
    out = per_request_errors([eng], sim)
    assert out["matched_requests"] == 20
    assert out["ttft"]["median_abs_error"] == pytest.approx(0.10)
    assert out["e2el"]["median_abs_error"] == pytest.approx(0.0)
    assert 0 <= out["ttft"]["ks_pvalue"] <= 1


def test_per_request_errors_pool_every_repeat():
    sim = [_rec(i, 0.0, [1.0 + i, 2.0 + i]) for i in range(10)]
    same = [_rec(i, 0.0, [1.0 + i, 2.0 + i]) for i in range(10)]
    slow = [_rec(i, 0.0, [2.0 * (1.0 + i), 2.0 * (2.0 + i)]) for i in range(10)]
    one = per_request_errors([same], sim)
    both = per_request_errors([same, slow], sim)
    assert one["ttft"]["ks_statistic"] == pytest.approx(0.0) and one["ttft"]["median_abs_error"] == 0.0
    assert both["repeats"] == 2 and both["matched_requests"] == 20
    # the second repeat enters the KS test: at 10 s the pooled CDF is 15/20, the simulated 10/10
    assert both["ttft"]["ks_statistic"] == pytest.approx(0.25)
    assert both["ttft"]["p90_abs_error"] == pytest.approx(0.5)  # sim = half the slow run's TTFT


def test_verdict_keeps_points_apart_from_percent():
    rows = compare_summaries([_summary(1.0)], _summary(1.02))
    bubble = next(r for r in rows if r.metric == "pipeline_bubble_fraction")
    assert is_fraction(bubble.metric) and bubble.error == pytest.approx(2.0)  # 100 -> 102 "fraction": 2 points
    v = verdict(rows)
    assert v["median_abs_error"] == pytest.approx(0.02)  # relative metrics only: the 2-point bubble is not in it
    assert v["bubble_error_points"] == pytest.approx(2.0) and v["max_abs_fraction_points"] == pytest.approx(2.0)
    assert "pipeline_bubble_fraction" in v["misses"] and "mean_ttft_ms" not in v["misses"]


def test_report_files_and_table(tmp_path):
    rows = compare_summaries([_summary(1.0)], _summary(1.05))
    table = format_table(rows)
    assert "metric" in table.splitlines()[1] and "+5.0%" in table
    eng = [_rec(i, 0.0, [1.0 + i, 2.0 + i, 2.5 + i]) for i in range(5)]
    ops = [OpRecord("stage0", "compute", 0, 0.0, 1.0, 4, 1)]
    write_validation(tmp_path, {"rows": [r.to_dict() for r in rows]}, eng, eng, ops, ops)
    assert (tmp_path / "latency_cdf.png").stat().st_size > 1000
    tr = json.loads((tmp_path / "trace_combined.json").read_text())
    assert {e["pid"] for e in tr["traceEvents"]} == {0, 1}
    assert json.loads((tmp_path / "validation.json").read_text())["rows"][0]["metric"] == "request_throughput"
