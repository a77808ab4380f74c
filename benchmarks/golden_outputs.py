"""Same answers before and after a speed change: run a set of CLI scenarios, save or compare outputs.

  python benchmarks/golden_outputs.py save DIR      # on the code before the change
  python benchmarks/golden_outputs.py compare DIR   # on the code after: requests.csv, summary.json and
                                                    # the dashboard series must be identical, byte for byte
Scenarios: every policy, aborts, a closed loop, preemption under KV pressure, the Vidur profile (if given
by --profile-dir, from `ppsim import-vidur`).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, VIDUR, simulate_argv

from ppsim.policy.pipelines import BUILDERS

POLICIES = list(BUILDERS)  # every registered policy, in registry order
BASE = [
    "--model",
    "llama-3-8b",
    "--hardware",
    "h100-sxm",
    "-pp",
    "4",
    "--num-prompts",
    "120",
    "--random-input-len",
    "300",
    "--random-output-len",
    "40",
    "--random-range-ratio",
    "0.5",
]


def scenarios(profile: str | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in POLICIES:
        out[f"{p}-rate"] = [*BASE, "--policy", p, "--request-rate", "20"]
        out[f"{p}-offline"] = [*BASE, "--policy", p, "--request-rate", "inf"]
        out[f"{p}-abort"] = [*BASE, "--policy", p, "--request-rate", "10", "--abort-rate", "0.3"]
        out[f"{p}-closed"] = [*BASE, "--policy", p, "--request-rate", "inf", "--max-concurrency", "5"]
        out[f"{p}-kv"] = [
            "--model",
            "llama-2-70b",
            "--hardware",
            "h100-sxm",
            "-pp",
            "4",
            "--policy",
            p,
            "--num-prompts",
            "60",
            "--random-input-len",
            "2000",
            "--random-output-len",
            "200",
            "--request-rate",
            "inf",
            "--gpu-memory-utilization",
            "0.44",
            "--max-num-seqs",
            "64",
        ]
    for name, args in out.items():  # vLLM's V1 runner schedules asynchronously only without PP
        if name.startswith("vllm-async"):
            i = args.index("-pp")
            out[name] = [*args[:i], "-pp", "1", *args[i + 2 :]]
    out["sglang-defer"] = [*BASE, "--policy", "sglang-ring", "--pp-async-batch-depth", "2", "--request-rate", "20"]
    out["mrv2-serialized"] = [*BASE, "--policy", "vllm-mrv2", "--pp-broadcast", "serialized", "--request-rate", "20"]
    out["batch-queue-small-budget"] = [*BASE, "--request-rate", "30", "--max-num-batched-tokens", "256"]
    if profile:
        out["vidur-200"] = [*VIDUR, "--num-prompts", "200", "--profile", profile]
    return out


def run(args: list[str], out: Path) -> str:
    p = subprocess.run(
        simulate_argv(args, out), env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    return "" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-300:]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "compare"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--profile-dir", default=None)
    ap.add_argument("-k", default="", help="only scenarios whose name contains this")
    a = ap.parse_args()
    bad = 0
    for name, args in scenarios(a.profile_dir).items():
        if a.k not in name:
            continue
        dest = a.dir / name
        if a.mode == "save":
            err = run(args, dest)
            print(f"{name}: {err or 'saved'}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            err = run(args, Path(tmp) / "o")
            saved_err = (dest / "ERROR").read_text() if (dest / "ERROR").exists() else ""
            if err or not dest.is_dir():
                same = bool(err) and not dest.is_dir()
                print(f"{name}: {'same (both fail)' if same else 'DIFFERENT: ' + (err or 'no saved output')}")
                bad += not same
                continue
            diffs = [
                f
                for f in ("requests.csv", "summary.json", "timeseries.csv", "timeline.csv")
                if (dest / f).exists() and not filecmp.cmp(Path(tmp) / "o" / f, dest / f, shallow=False)
            ]
            print(f"{name}: {'DIFFERENT ' + ' '.join(diffs) if diffs else 'identical'}{saved_err}")
            bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
