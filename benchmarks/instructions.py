"""Instructions executed by `ppsim simulate` of scenario (a) (bench_scale.py), counted by valgrind.

On a shared machine wall and even CPU time move by tens of per cent from one run to the next; the
number of instructions a run executes barely does (runs of one checkout differ by at most ~0.5%),
so it is what ranks changes of a per cent or more. The whole process is counted (start-up and output writing
included), with a fixed hash seed and an output directory whose name has the same length for every
checkout (the length alone moves the count by ~1%).

  python benchmarks/instructions.py --profile DIR --num-prompts 2000 [--root CHECKOUT ...]

``--profile``: a directory written by `ppsim import-vidur` (see ab_scale.py; the analytic model if
omitted). ``--root``: checkouts to count (default: this one), one after the other. Needs valgrind
(``apt-get install valgrind``); under it a run is ~50x slower (2,000 requests: about a minute).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, VIDUR, simulate_argv


def count(root: Path, args: list[str], out: Path) -> int:
    """Instructions of one `ppsim simulate` child run from checkout ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    p = subprocess.run([*cmd, *simulate_argv(args, out)], env=env, cwd=root, capture_output=True, text=True)
    m = re.search(r"I\s+refs:\s+([\d,]+)", p.stderr)
    if p.returncode or m is None:
        sys.exit(f"{root}: run failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", action="append", help="a checkout to count (repeatable; default: this one)")
    ap.add_argument("--profile", help="an imported Vidur profile directory (default: the analytic model)")
    ap.add_argument("--num-prompts", type=int, default=2000)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: install it (apt-get install valgrind)")
    sim = [*VIDUR, "--num-prompts", str(args.num_prompts), *(["--profile", args.profile] if args.profile else [])]
    roots = [Path(r).resolve() for r in args.root or [str(ROOT)]]
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for root in roots:
            out = Path(tmp) / "out"  # the same output path for every checkout
            shutil.rmtree(out, ignore_errors=True)
            n = count(root, sim, out)
            first = first or n
            print(f"{root}: {n / 1e9:.3f} G instructions ({n / first:.3f} of the first)")


if __name__ == "__main__":
    main()
