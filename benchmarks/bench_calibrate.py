"""Benchmark: a full ``ppsim calibrate --device cpu`` of the tiny model.

Targets (issue 4): wall time < 5 minutes; held-out median |error| < 10%. Prints both figures and
the per-kind held-out errors; exits 1 if a target is missed.

    .venv/bin/python benchmarks/bench_calibrate.py [--output DIR] [--model tiny]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WALL_LIMIT_S = 300.0
HELDOUT_LIMIT = 0.10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--output", help="artifact dir (default: a temporary dir)")
    args = ap.parse_args()
    out = Path(args.output or tempfile.mkdtemp(prefix="ppsim-cal-"))
    ppsim = Path(sys.executable).with_name("ppsim")
    t0 = time.perf_counter()
    subprocess.run(
        [str(ppsim), "calibrate", "--model", args.model, "--device", "cpu", "--output-dir", str(out)],
        check=True,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    h = json.loads((out / "meta.json").read_text())["heldout"]
    res = {
        "wall_s": round(wall, 1),
        "heldout_median_abs_rel_err_all": round(h["median_abs_rel_err_all"], 4),
        "heldout_median_abs_rel_err_ops": round(h["median_abs_rel_err_ops"], 4),
        "heldout_median_abs_rel_err_layer": round(h["median_abs_rel_err_layer"], 4),
        "heldout_points": len(h["points"]),
        "wall_ok": wall < WALL_LIMIT_S,
        "heldout_ok": h["median_abs_rel_err_all"] < HELDOUT_LIMIT,
        "artifact": str(out),
    }
    print(json.dumps(res, indent=2))
    return 0 if res["wall_ok"] and res["heldout_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
