"""Cost of the per-run dashboard: the recorder's time per operation and the drawing's time.

1. Simulates N requests (default 10,000; Llama-3-8B, PP=4, 512 in / 128 out, all at t=0, the scale
   benchmark's scenario), then replays every stage/link/core operation of the run through a fresh
   ``SeriesRecorder``: the time the recorder adds to a run of that size, and its size in memory.
2. Writes the run's files and times ``write_dashboard`` (series CSVs + reading requests.csv +
   drawing + PNG), the first call including matplotlib's import, and a second call.
3. ``--synthetic-rows M`` (e.g. 1000000): writes an M-row requests.csv into a copy of the run
   directory and times ``ppsim plot`` on it (reading M rows, CDFs from 400 quantiles).

Run on a quiet machine: .venv/bin/python benchmarks/bench_dashboard.py [--num-prompts N] [--synthetic-rows M]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ppsim.config import build_scenario
from ppsim.metrics.series import SeriesRecorder
from ppsim.report.dashboard import plot_run, write_dashboard
from ppsim.run import run_scenario


def deep_size(rec: SeriesRecorder) -> int:
    lists = [*rec.busy_ns, rec.kv_area, rec.kv_max, rec.window_ops]
    return sum(sys.getsizeof(x) for x in lists) + sum(sys.getsizeof(v) for x in lists for v in x)


def synthetic_requests(path: Path, rows: int) -> None:
    rnd = random.Random(0)
    with path.open("w") as f:
        f.write(
            "request_id,status,arrival_s,sent_s,scheduled_s,first_token_s,finish_s,input_tokens,"
            "output_tokens,ttft_ms,tpot_ms,e2el_ms,preemptions\n"
        )
        for i in range(rows):
            ttft, tpot = rnd.expovariate(1 / 500), rnd.uniform(20, 80)
            f.write(f"{i},finished,0,0,0,0,0,512,128,{ttft:.6f},{tpot:.6f},{ttft + 127 * tpot:.6f},0\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=10_000)
    ap.add_argument("--synthetic-rows", type=int, default=0)
    args = ap.parse_args()
    s = build_scenario(
        overrides={
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 4},
            "workload": {
                "num_prompts": args.num_prompts,
                "request_rate": "inf",
                "random_input_len": 512,
                "random_output_len": 128,
            },
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        out = run_scenario(s, run_dir, dashboard=False)
        t_run = time.perf_counter() - t0
        ops = out.result.ops
        rec = SeriesRecorder.for_run(4, (r.arrival_s for r in out.result.prepared.requests))
        t0 = time.perf_counter()
        rec.add_ops(ops)
        t_rec = time.perf_counter() - t0
        print(f"requests                 {len(out.result.requests)}")
        print(f"run + files (s)          {t_run:.2f}")
        print(
            f"recorder: {len(ops)} ops  {t_rec:.3f} s ({t_rec / max(1, len(ops)) * 1e9:.0f} ns/op), "
            f"{deep_size(out.result.series) / 1024:.0f} KiB held"
        )
        for label in ("first (with import)", "second"):
            t0 = time.perf_counter()
            write_dashboard(run_dir, out.result.series)
            print(f"write_dashboard {label:<20} {time.perf_counter() - t0:.3f} s")
        if args.synthetic_rows:
            big = Path(tmp) / "big"
            shutil.copytree(run_dir, big)
            synthetic_requests(big / "requests.csv", args.synthetic_rows)
            t0 = time.perf_counter()
            plot_run(big)
            print(f"ppsim plot, {args.synthetic_rows} request rows: {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
