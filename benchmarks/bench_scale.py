"""Simulator at scale (issue 11): wall time, peak RSS and simulated requests per second of `ppsim simulate`.

Each case runs the CLI as a child process with its default outputs (summary.json, requests.csv,
config.json and the dashboard series; ``--no-dashboard`` skips only the PNG) and measures the child
alone: wall clock around it, peak RSS from ``os.wait4``'s resource usage.

  (a) Vidur's own scenario: Llama-2-70B, TP=2, A100, PP=4, 20,000 requests of 512 in / 128 out,
      Poisson 2 req/s, --max-num-seqs 128 --max-num-batched-tokens 4096, with Vidur's A100 profile
      imported by `ppsim import-vidur` (``--vidur-root`` or $PPSIM_VIDUR_ROOT, default
      ../shared/data/vidur-profiling); the analytic model when the data is absent.
      Target <= 10 s, <= 500 MB (Vidur: 347.7 s, 3,503 MB).
  (b) 10,000 offline requests, Llama-3-8B, PP=4, H100, 512 in / 128 out. Target <= 5 s.
  (c) 1,000,000 requests, Llama-3-8B, PP=4, H100, 256 in / 32 out, Poisson 150 req/s: generated,
      and the same requests from a trace CSV (written here first, read by the run). Target <= 1 GB.

Run on a quiet machine:  python benchmarks/bench_scale.py
A quick check of the script: python benchmarks/bench_scale.py --scale 0.01
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, VIDUR, simulate_argv

DEFAULT_VIDUR = ROOT.parent / "shared" / "data" / "vidur-profiling"

OFFLINE = [
    "--model",
    "llama-3-8b",
    "--hardware",
    "h100-sxm",
    "-pp",
    "4",
    "--request-rate",
    "inf",
    "--random-input-len",
    "512",
    "--random-output-len",
    "128",
]
MILLION = ["--model", "llama-3-8b", "--hardware", "h100-sxm", "-pp", "4"]
MILLION_LENGTHS = ["--random-input-len", "256", "--random-output-len", "32"]  # the generated stream's
MILLION_RATE = 150.0


def run_child(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit status) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        err = p.stderr.read().decode() if p.stderr else ""
        print(f"  failed ({p.returncode}): {' '.join(argv[3:])}\n  {err.strip()[-500:]}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, p.returncode


def vidur_profile(root: Path, out: Path) -> list[str]:
    """``--profile DIR`` of Vidur's A100 Llama-2-70B TP=2 data, or [] (analytic) if it is absent."""
    if not root.is_dir():
        print(f"(a) Vidur data not at {root}: the analytic model instead", file=sys.stderr)
        return []
    cmd = [
        sys.executable,
        "-m",
        "ppsim.cli",
        "import-vidur",
        "--root",
        str(root),
        "--device",
        "a100",
        "--model",
        "llama-2-70b",
        "-tp",
        "2",
        "--output-dir",
        str(out),
    ]
    if subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True).returncode:
        print("(a) import-vidur failed: the analytic model instead", file=sys.stderr)
        return []
    return ["--profile", str(out)]


def write_trace(path: Path, n: int, rate: float) -> None:
    """The requests `ppsim simulate` would generate for MILLION at ``rate``, as a trace CSV."""
    sys.path.insert(0, str(ROOT))
    from ppsim.config import build_scenario
    from ppsim.workload import build_workload

    s = build_scenario(
        None, {"workload": {"num_prompts": n, "request_rate": rate, "random_input_len": 256, "random_output_len": 32}}
    )
    wl = build_workload(s.workload, s.seed)
    with open(path, "w") as f:
        f.write("arrival_s,input_tokens,output_tokens\n")
        for i in range(0, n, 65536):
            sl = slice(i, i + 65536)
            f.writelines(
                f"{t!r},{a},{b}\n"
                for t, a, b in zip(
                    wl.arrival_s[sl].tolist(), wl.prompt_len[sl].tolist(), wl.output_len[sl].tolist(), strict=True
                )
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every request count (0.01 for a check)")
    ap.add_argument("--vidur-root", default=os.environ.get("PPSIM_VIDUR_ROOT", str(DEFAULT_VIDUR)))
    ap.add_argument("--only", choices=["a", "b", "c"], action="append", help="run these cases (default all)")
    args = ap.parse_args()
    cases = args.only or ["a", "b", "c"]
    n_a, n_b, n_c = (max(10, int(n * args.scale)) for n in (20_000, 10_000, 1_000_000))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_scale.") as tmp:
        t = Path(tmp)
        if "a" in cases:
            prof = vidur_profile(Path(args.vidur_root), t / "vidur-a100-70b-tp2")
            label = "(a) Vidur scenario" + (", Vidur A100 profile" if prof else ", analytic")
            rows.append(
                (
                    label,
                    n_a,
                    *run_child(simulate_argv([*VIDUR, *prof, "--num-prompts", str(n_a)], t / "a")),
                    "<= 10 s, <= 500 MB",
                )
            )
        if "b" in cases:
            rows.append(
                (
                    "(b) offline Llama-3-8B PP=4",
                    n_b,
                    *run_child(simulate_argv([*OFFLINE, "--num-prompts", str(n_b)], t / "b")),
                    "<= 5 s",
                )
            )
        if "c" in cases:
            gen = [*MILLION, *MILLION_LENGTHS, "--request-rate", str(MILLION_RATE), "--num-prompts", str(n_c)]
            rows.append(("(c) generated Poisson", n_c, *run_child(simulate_argv(gen, t / "c1")), "<= 1 GB"))
            trace = t / "trace.csv"
            write_trace(trace, n_c, MILLION_RATE)
            rows.append(
                (
                    "(c) trace CSV",
                    n_c,
                    *run_child(simulate_argv([*MILLION, "--trace", str(trace)], t / "c2")),
                    "<= 1 GB",
                )
            )
            c1, c2 = t / "c1" / "summary.json", t / "c2" / "summary.json"
            same = c1.is_file() and c2.is_file() and c1.read_bytes() == c2.read_bytes()
            print(f"(c) the trace replays the generated requests: same summary.json: {same}")
    print(f"{'case':<44}{'requests':>10}{'wall s':>9}{'peak MB':>9}{'sim req/s':>11}  target")
    for label, n, wall, rss, rc, target in rows:
        rate = f"{n / wall:,.0f}" if not rc else "failed"
        print(f"{label:<44}{n:>10,}{wall:>9.1f}{rss:>9.0f}{rate:>11}  {target}")


if __name__ == "__main__":
    main()
