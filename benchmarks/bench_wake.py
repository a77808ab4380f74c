"""A message's round trip between two processes after the host sat idle, with and without a busy core.

The live engine's stages and engine core wait on sockets and queues between steps. Where every
process waits at once (the pipeline idle: part 6 of the validate report), a VM's vCPUs halt, and the
next message has to wake one. This times that wake-up: two processes ping-pong one small message
over a ``multiprocessing`` pipe (a socket pair, as gloo's TCP transport), the pinger sleeping
``gap`` before each ping, the ponger answering at once. Printed per gap, in microseconds: median,
mean, p99 and max of the round trip, and the share of round trips above 1 ms:

* ``idle``  nothing else running: both vCPUs halt during the gap
* ``busy``  a third process spins at nice 19 on the host (it yields to the pair, but one vCPU never
  halts)

A gap of 0 is the hot loop calibration's ``send_recv`` ping-pong uses. Meaningful on a quiet host.
On this project's 2-vCPU EPYC VM (2026-12-01, 300 pings per gap): median 35 / 26 / 72 / 149 us at
gaps of 0 / 1 / 5 / 20 ms idle, p99 at most 225 us, none above 1 ms; with the spinner 19 / 26 / 84 /
144 us. Waking after idle costs tens of microseconds here, not the milliseconds of the MoE runs'
stalls (docs/moe.md).

Run: python benchmarks/bench_wake.py [--gaps-ms 0,1,5,20] [--pings 400]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np


def pong(conn: object) -> None:
    while True:
        msg = conn.recv_bytes()
        if msg == b"stop":
            return
        conn.send_bytes(msg)


def spin() -> None:
    os.nice(19)
    while True:
        pass


def round_trips(gap_s: float, pings: int) -> np.ndarray:
    a, b = mp.Pipe()
    p = mp.Process(target=pong, args=(b,), daemon=True)
    p.start()
    payload, out = b"x" * 2048, []
    for _ in range(20):  # warm
        a.send_bytes(payload)
        a.recv_bytes()
    for _ in range(pings):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        a.send_bytes(payload)
        a.recv_bytes()
        out.append(time.perf_counter() - t0)
    a.send_bytes(b"stop")
    p.join(timeout=5)
    return np.array(out) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaps-ms", default="0,1,5,20")
    ap.add_argument("--pings", type=int, default=400)
    args = ap.parse_args(argv)
    gaps = [float(g) * 1e-3 for g in args.gaps_ms.split(",")]
    print(f"{'host':<6}{'gap ms':>8}{'median us':>11}{'mean us':>9}{'p99 us':>9}{'max us':>9}{'>1 ms':>7}")
    for mode in ("idle", "busy"):
        spinner = mp.Process(target=spin, daemon=True) if mode == "busy" else None
        if spinner:
            spinner.start()
            time.sleep(0.2)
        try:
            for g in gaps:
                rt = round_trips(g, args.pings)
                print(
                    f"{mode:<6}{g * 1e3:>8.0f}{np.median(rt):>11.0f}{rt.mean():>9.0f}{np.percentile(rt, 99):>9.0f}"
                    f"{rt.max():>9.0f}{np.mean(rt > 1000):>7.1%}"
                )
        finally:
            if spinner:
                spinner.kill()
                spinner.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
