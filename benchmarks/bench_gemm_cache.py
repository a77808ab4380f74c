"""A projection timed hot (one weight, over and over) and cold (distinct copies of it in turn), by rows.

Calibration times the operators that read weights over a stack of distinct layers
(``calibration/profile_ops.py``, ``STACKED_OPS``): an engine stage reads each layer's weights once per
step, so by the next step the caches hold none of them, while one weight timed over and over stays
in the CPU's caches. This prints the figures behind that choice and behind the token grid's every
count up to 16 (a CPU GEMM handles rows in blocks of 4 and the rest on a slower path):

* ``hot``   microseconds per ``F.linear`` of ``rows`` x ``in`` by one ``out`` x ``in`` weight
* ``cold``  the same cycling through ``--copies`` distinct weights (about 2x the L3 or more)

Thread CPU time, one torch thread, medians of 7 repeats of >= 50 ms. On this project's 2-vCPU EPYC
VM (32 MB L3): ``--in 256 --out 704`` (tiny's gate) 1 row 19 us hot, 88 us cold; ``--in 1024 --out
2816`` (dense-1024's) 225 against 684 us, 4 rows 881 / 1198 us, 3 rows 644 / 1644 us; at 64 rows
4.4 / 4.7 ms. Meaningful on a quiet host.

Run: python benchmarks/bench_gemm_cache.py [--in 1024] [--out 2816] [--copies 16] [--rows 1,2,3,4,8,16,64]
"""

from __future__ import annotations

import argparse
import time


def per_call_s(weights: list, x: object, F: object) -> float:
    """Median over 7 repeats of seconds per call, cycling through ``weights``."""
    out = []
    for _ in range(7):
        n, t0 = 0, time.thread_time()
        while time.thread_time() - t0 < 0.05:
            for w in weights:
                F.linear(x, w)
                n += 1
        out.append((time.thread_time() - t0) / n)
    return sorted(out)[3]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="k", type=int, default=1024)
    ap.add_argument("--out", dest="n", type=int, default=2816)
    ap.add_argument("--copies", type=int, default=16, help="distinct weights cycled for 'cold'")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16,64")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    ws = [torch.randn(args.n, args.k) for _ in range(max(1, args.copies))]
    mb = args.k * args.n * 4 / 1e6
    total = mb * len(ws)
    print(f"{args.n} x {args.k} float32, {mb:.1f} MB per copy, {len(ws)} copies ({total:.0f} MB) cycled for cold")
    print(f"{'rows':>5} {'hot us':>9} {'cold us':>9} {'cold/hot':>9}")
    for m in (int(v) for v in args.rows.split(",")):
        x = torch.randn(m, args.k)
        hot, cold = per_call_s(ws[:1], x, F), per_call_s(ws, x, F)
        print(f"{m:>5} {hot * 1e6:>9.0f} {cold * 1e6:>9.0f} {cold / hot:>9.2f}")


if __name__ == "__main__":
    main()
