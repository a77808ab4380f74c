"""Interleaved A/B of scenario (a) of bench_scale.py between two checkouts: wall and CPU time of each.

On a shared machine absolute times drift with the load; runs of A and B alternate so both see the
same drift, and the ratio of their medians is what to read. Each run is `ppsim simulate` in a child
process with its default outputs (`--quiet --no-dashboard`); CPU time is the child's user + system.

  python benchmarks/ab_scale.py --a /path/to/main --b . --profile DIR --num-prompts 2000 --reps 3

``--profile``: a directory written by `ppsim import-vidur --root ../shared/data/vidur-profiling
--device a100 --model llama-2-70b -tp 2 --output-dir DIR` (the analytic model if omitted). At the end
the two runs' requests.csv and summary.json are compared byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import VIDUR, simulate_argv


def run(root: Path, args: list[str], out: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one `ppsim simulate` child run from checkout ``root``."""
    cmd = simulate_argv(args, out)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{root}: failed: {p.stderr.read().decode().strip()[-400:] if p.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (e.g. main)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B (e.g. this branch)")
    ap.add_argument("--profile", default=None, help="imported Vidur profile directory (else the analytic model)")
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    args = [*VIDUR, "--num-prompts", str(a.num_prompts), *(["--profile", a.profile] if a.profile else [])]
    res: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.reps):
            for side, root in (("A", a.a), ("B", a.b)) if i % 2 == 0 else (("B", a.b), ("A", a.a)):
                wall, cpu = run(root.resolve(), args, Path(tmp) / side)
                res[side].append((wall, cpu))
                print(f"rep {i + 1} {side}: wall {wall:6.2f} s  cpu {cpu:6.2f} s  load {os.getloadavg()[0]:.2f}")
        same = all(
            filecmp.cmp(Path(tmp) / "A" / f, Path(tmp) / "B" / f, shallow=False)
            for f in ("requests.csv", "summary.json")
        )
    med = {s: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for s, r in res.items()}
    print(
        f"median A: wall {med['A'][0]:.2f} s cpu {med['A'][1]:.2f} s | B: wall {med['B'][0]:.2f} s "
        f"cpu {med['B'][1]:.2f} s | B/A wall {med['B'][0] / med['A'][0]:.2f} cpu {med['B'][1] / med['A'][1]:.2f}"
    )
    print("requests.csv and summary.json:", "identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
