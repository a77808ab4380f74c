"""Per-run dashboard and its recorder, ``ppsim plot`` and ``ppsim compare``.

The recorder is checked against a direct accumulation (bins merged pairwise as the run grows must
equal bins of the final width filled from the start), the written series against the summary (busy
fractions integrate to the summary's per-stage busy fractions; the KV maximum is the summary's
peak), and ``compare``'s ratios against the two runs' summary.json.
"""

from __future__ import annotations

import csv
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli import main
from ppsim.config import build_scenario
from ppsim.metrics.oplog import OpLog
from ppsim.metrics.series import NS_PER_S, SeriesRecorder
from ppsim.run import run_scenario


def scenario(policy: str = "vllm-batch-queue", **workload):
    return build_scenario(
        None,
        {
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 4},
            "engine": {"policy": policy},
            "workload": {
                "num_prompts": 40,
                "request_rate": 8.0,
                "random_input_len": 512,
                "random_output_len": 48,
                **workload,
            },
        },
    )


def reference_bins(intervals: list[tuple[int, int]], width: int, nbins: int) -> list[int]:
    """Overlap of each [a, b) ns interval with bins of ``width`` ns, counted one ns-slice at a time
    per bin boundary (the straightforward way)."""
    out = [0] * nbins
    for a, b in intervals:
        t = a
        while t < b:
            k = t // width
            nxt = min(b, (k + 1) * width)
            out[k] += nxt - t
            t = nxt
    return out


ops_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 50_000), st.integers(1, 30_000)),  # stage, gap ns, length ns
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops_strategy, max_bins=st.sampled_from([2, 4, 8, 16]), first=st.integers(1, 5_000))
def test_bin_merging_preserves_busy_time_exactly_and_memory_is_bounded(ops, max_bins, first):
    rec = SeriesRecorder(3, max_bins=max_bins, first_width_ns=first)
    clock = [0, 0, 0]
    intervals: list[list[tuple[int, int]]] = [[], [], []]
    for stage, gap, length in ops:
        a = clock[stage] + gap
        b = a + length
        clock[stage] = b
        intervals[stage].append((a, b))
        rec.add_busy(stage, a / NS_PER_S, b / NS_PER_S)
        assert all(len(bins) == max_bins for bins in rec.busy_ns)  # O(1) memory whatever the run length
    end = max(clock)
    doublings = rec.width_ns // first
    assert rec.width_ns == first * doublings and doublings & (doublings - 1) == 0  # width = first x 2^k
    assert end <= max_bins * rec.width_ns  # every op fits in the bins
    assert rec.width_ns == first or end > max_bins * rec.width_ns // 2  # and the width is the least that fits
    for s in range(3):
        exact = sum(b - a for a, b in intervals[s])
        assert sum(rec.busy_ns[s]) == exact  # no time lost or gained by merging
        assert rec.busy_ns[s] == reference_bins(intervals[s], rec.width_ns, max_bins)
        assert all(0 <= x <= rec.width_ns for x in rec.busy_ns[s])  # one stage: never busier than the bin


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["stage0", "stage1", "link0->1", "core", "broadcast"]),
            st.sampled_from(["compute", "send", "schedule"]),
            st.integers(-2_000, 60_000),  # start ns (a little before 0 too)
            st.integers(0, 30_000),  # length ns
        ),
        min_size=1,
        max_size=60,
    ),
    max_bins=st.sampled_from([2, 4, 8]),
    window_start=st.integers(0, 40_000),
)
def test_oplog_feeds_the_series_as_add_op_does(ops, max_bins, window_start):
    """OpLog.add_compute / add_other inline SeriesRecorder's recording (the hot path): the series they
    build is the one add_op builds, bins, end, window and all."""
    kw = {"max_bins": max_bins, "first_width_ns": 100, "window_start_s": window_start / 1e9, "window_steps": 3}
    via_log, direct = SeriesRecorder(2, **kw), SeriesRecorder(2, **kw)
    log = OpLog(keep=False, series=via_log)
    for track, kind, a, length in ops:
        kind = "compute" if track.startswith("stage") else kind
        start, end = a / 1e9 + 1e-4, (a + length) / 1e9 + 1e-4
        if kind == "compute":
            log.add_compute(track, 0, start, end, 1, 1, 0, 1)
        else:
            log.add_other(track, kind, 0, start, end, 1, 1)
        direct.add_op(track, kind, start, end)
    for attr in ("busy_ns", "end_ns", "width_ns", "window_ops", "window_end_ns", "_wb_s"):
        assert getattr(via_log, attr) == getattr(direct, attr), attr


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 40_000), st.integers(0, 500)), min_size=1, max_size=50),
    max_bins=st.sampled_from([2, 4, 8]),
)
def test_kv_series_keeps_the_exact_integral_and_maximum(steps, max_bins):
    rec = SeriesRecorder(1, max_bins=max_bins, first_width_ns=100)
    t, prev_t, prev_used, area, peak = 0, 0, 0, 0, 0
    for gap, used in steps:
        t += gap
        rec.sample_kv(t / NS_PER_S, used)
        area += prev_used * (t - prev_t)
        prev_t, prev_used, peak = t, used, max(peak, used)
    end = t + 1_000
    rec.close(end / NS_PER_S)
    area += prev_used * (end - prev_t)
    assert sum(rec.kv_area) == area
    assert max(rec.kv_max) == peak
    assert len(rec.kv_area) == len(rec.kv_max) == max_bins


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    a, b = base / "vllm-batch-queue", base / "sglang-ring"
    # the first with the detailed files: `ppsim plot` of a run without series files rebuilds them from stage_ops.csv
    return (
        run_scenario(scenario(), a, save_detailed=True),
        a,
        run_scenario(scenario("sglang-ring"), b, dashboard=False),
        b,
    )


def test_simulate_writes_a_dashboard_whose_series_match_the_summary(two_runs):
    out, run_dir = two_runs[0], two_runs[1]
    png = run_dir / "dashboard.png"
    assert 20_000 < png.stat().st_size < 1_000_000
    assert _png_size(png) == (1300, 950)
    rows = _rows(run_dir / "timeseries.csv")
    assert 1 < len(rows) <= 512
    s = out.summary
    for k, frac in enumerate(s["stage_busy_fraction"]):
        busy_s = sum(float(r[f"stage{k}_busy"]) * (float(r["t_end_s"]) - float(r["t_start_s"])) for r in rows)
        assert busy_s / s["pipeline_window_s"] == pytest.approx(frac, rel=1e-6)
    assert max(int(r["kv_blocks_max"]) for r in rows) == s["kv_peak_blocks_used"]
    assert float(rows[-1]["t_end_s"]) == pytest.approx(out.result.end_s, abs=1e-9)
    window, *ops = _rows(run_dir / "timeline.csv")
    start, end = float(window["start_s"]), float(window["end_s"])
    assert start == pytest.approx(0.1 * max(r.arrival_s for r in out.result.prepared.requests))
    assert ops and all(float(o["end_s"]) > start and float(o["start_s"]) < end for o in ops)
    firsts = [o for o in ops if o["track"] == "stage0" and float(o["start_s"]) >= start]
    assert len(firsts) == 16  # window_steps = 4 x stages first-stage micro-batches
    assert {o["kind"] for o in ops} >= {"compute", "send"}


def test_no_dashboard_still_writes_the_series_and_plot_draws_it(two_runs, capsys):
    run_dir = two_runs[3]
    assert not (run_dir / "dashboard.png").exists() and (run_dir / "timeseries.csv").exists()
    assert main(["plot", str(run_dir)]) == 0
    assert _png_size(run_dir / "dashboard.png") == (1300, 950)
    assert "dashboard written to" in capsys.readouterr().out


def test_plot_rebuilds_the_busy_series_of_a_run_without_series_files(two_runs, tmp_path):
    import shutil

    from ppsim.report.runfiles import load_run

    old = tmp_path / "old"
    shutil.copytree(two_runs[1], old)
    (old / "timeseries.csv").unlink()
    (old / "timeline.csv").unlink()
    run = load_run(old)
    s = two_runs[0].summary
    for k, frac in enumerate(s["stage_busy_fraction"]):
        t0, t1 = run.series["t_start_s"], run.series["t_end_s"]
        busy_s = sum(f * (b - a) for f, a, b in zip(run.series[f"stage{k}_busy"], t0, t1, strict=True))
        assert busy_s / s["pipeline_window_s"] == pytest.approx(frac, rel=1e-6)
    assert "kv_blocks_mean" not in run.series and run.timeline
    assert main(["plot", str(old)]) == 0 and (old / "dashboard.png").stat().st_size > 20_000


def test_compare_prints_ratios_to_the_first_run(two_runs, tmp_path, capsys):
    a, b = two_runs[1], two_runs[3]
    png = tmp_path / "cmp.png"
    assert main(["compare", str(a), str(b), "--output", str(png)]) == 0
    text = capsys.readouterr().out
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    row = next(line for line in text.splitlines() if line.startswith("Request throughput"))
    va, vb, r = row.split()[-3:]
    assert float(va) == pytest.approx(sa["request_throughput"], abs=1e-3)
    assert float(vb) == pytest.approx(sb["request_throughput"], abs=1e-3)
    assert r == f"{sb['request_throughput'] / sa['request_throughput']:.2f}x"
    row = next(line for line in text.splitlines() if line.startswith("P99 TTFT"))
    assert row.split()[-1] == f"{sb['p99_ttft_ms'] / sa['p99_ttft_ms']:.2f}x"
    assert png.stat().st_size > 20_000


def test_compare_and_plot_refuse_a_directory_without_summary(two_runs, tmp_path, capsys):
    for argv in (["compare", str(two_runs[1]), str(tmp_path)], ["plot", str(tmp_path / "missing")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ")
        assert "no summary.json" in err or "does not exist" in err
    assert not (tmp_path / "dashboard.png").exists()


def test_no_pp_replicas_dashboard_matches_summary(tmp_path):
    s = build_scenario(
        None,
        {
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": "no-pp"},
            "workload": {"num_prompts": 20, "request_rate": 8.0, "random_input_len": 256, "random_output_len": 16},
        },
    )
    out = run_scenario(s, tmp_path)
    rows = _rows(tmp_path / "timeseries.csv")
    for k, frac in enumerate(out.summary["stage_busy_fraction"]):
        busy_s = sum(float(r[f"stage{k}_busy"]) * (float(r["t_end_s"]) - float(r["t_start_s"])) for r in rows)
        assert busy_s / out.summary["pipeline_window_s"] == pytest.approx(frac, rel=1e-6)
    assert (tmp_path / "dashboard.png").stat().st_size > 20_000


def test_engine_run_writes_a_dashboard_from_its_stage_times(tmp_path):
    pytest.importorskip("torch")
    from engine.run import run_engine

    s = build_scenario(
        None,
        {
            "model": "tiny",
            "seed": 3,
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"max_num_batched_tokens": 32},
            "workload": {
                "num_prompts": 6,
                "request_rate": float("inf"),
                "random_input_len": 40,
                "random_output_len": 6,
            },
        },
    )
    run = run_engine(s, tmp_path)
    assert _png_size(tmp_path / "dashboard.png") == (1300, 950)
    rows = _rows(tmp_path / "timeseries.csv")
    for k, frac in enumerate(run.summary["stage_busy_fraction"]):
        busy_s = sum(float(r[f"stage{k}_busy"]) * (float(r["t_end_s"]) - float(r["t_start_s"])) for r in rows)
        assert busy_s / run.summary["pipeline_window_s"] == pytest.approx(frac, rel=1e-6)
    assert 0 < max(int(r["kv_blocks_max"]) for r in rows) <= run.summary["kv_peak_blocks_used"]
    _, *ops = _rows(tmp_path / "timeline.csv")
    assert {o["track"] for o in ops} >= {"stage0", "stage1", "link0->1"}


def test_a_validate_directory_stands_for_its_runs(two_runs, tmp_path, capsys):
    import shutil

    val = tmp_path / "val"
    shutil.copytree(two_runs[1], val / "engine-0")
    shutil.copytree(two_runs[3], val / "sim")
    (val / "validation.json").write_text("{}")
    assert main(["compare", str(val), "--output-dir", str(tmp_path / "cmp")]) == 0
    head = capsys.readouterr().out.splitlines()[1].split()
    assert head == ["metric", "engine-0", "sim", "ratio"]
    assert (tmp_path / "cmp" / "compare.png").is_file()
    assert main(["plot", str(val)]) == 0
    assert capsys.readouterr().out.count("dashboard written to") == 2
