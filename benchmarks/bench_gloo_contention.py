"""gloo point-to-point on a host whose CPUs the stages' computes fill: where the engine's stalls come from.

Two gloo ranks over TCP loopback run the live engine's hand-over pattern (``engine/transport.py``):
rank 0 computes a step, waits for its previous step's sends (vLLM's order), then ``isend``s the
step's hidden states and residual (two 1 x 256 fp32 tensors, a tiny-moe decode step); rank 1 posts
the two ``irecv``s, waits for them and computes the step. Printed per mode, in milliseconds:
median, mean, p99, max and the count above 1 ms of

* ``end->isends posted``: rank 0's compute end to both isends posted (the previous sends waited);
* ``irecv post``: rank 1 posting its two irecvs (the call alone);
* ``hand-over``: rank 0's isends posted to rank 1's irecvs done, where rank 1 was already waiting.

Modes: ``compute`` (both ranks compute ``--compute-ms`` of small matmuls, one torch thread each:
both vCPUs of this VM busy, as two PP stages with two micro-batches in flight), ``sleep`` (the same
schedule with each compute a sleep: the CPUs free), ``light`` (rank 1 computes 0.3x: it waits for
rank 0). ``--policy`` puts the computing thread under another scheduling policy or nice value
after the process group is up (gloo's own threads keep the default), to test whether the stalls
are the transport's threads waiting for a CPU. ``--pin`` puts each rank on a core of its own
before the group is up, as the engine places its CPU stages (``engine.worker.stage_cores``);
``--idle-loop`` puts gloo's event-loop thread at SCHED_IDLE after it, as the engine does
(``engine.worker.idle_helpers``).

On this project's 2-vCPU VM (kernel 6.18, HZ 250; 2026-12-01, 300 steps of 4 ms): ``compute``
had 23-45 of 300 steps with end->isends posted above 1 ms (mean 0.43-0.81 ms, p99 4-8 ms; the
previous send not yet complete, or the isend call itself blocked up to 4 ms) and irecv posts up
to 7.7 ms; ``sleep`` and ``light`` at most 1 step above 1 ms (mean 0.10-0.16 ms). nice 5 / 10,
SCHED_BATCH and SCHED_IDLE for the computing thread left 14-49 steps above 1 ms. gloo's TCP pair
writes a send in the caller only once the receiver's "recv ready" notice has been read by its
event-loop thread, and both the loop thread and the pair's mutex holder need a CPU; with both
vCPUs computing they wait up to a scheduler tick (4 ms here) or more. The simulator's hand-over is
timed by calibration with one step in flight (no contention): docs/moe.md, ninth round.
With ``--pin --idle-loop`` (2026-12-05): the irecv post's p99 5.0 -> 0.17 ms, end->isends posted
5.2 -> 1.4 ms: gloo's loop thread, woken while the caller held the pair's lock, had preempted it and
spun (docs/engine.md, "gloo's event loop at SCHED_IDLE").

Run: python benchmarks/bench_gloo_contention.py [--steps 300] [--compute-ms 4] [--modes compute,sleep,light]
     [--policy nice:5 | batch | idle] [--pin] [--idle-loop]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.launcher import free_port

HIDDEN = 256
TIMEOUT_S = 60


def _busy(x: torch.Tensor, w: torch.Tensor, ms: float) -> torch.Tensor:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1e3:
        x = torch.tanh(x @ w)
    return x


def _apply_policy(policy: str) -> None:
    if policy.startswith("nice:"):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(policy.split(":")[1]))
    elif policy in ("batch", "idle"):
        os.sched_setscheduler(0, os.SCHED_BATCH if policy == "batch" else os.SCHED_IDLE, os.sched_param(0))


def _rank(
    rank: int, port: int, steps: int, ms: list[float], sleep: bool, policy: str, pin: bool, idle_loop: bool, out: str
) -> None:
    torch.set_num_threads(1)
    if pin:
        from engine.worker import pin as pin_stage

        if pin_stage(rank, 2, 1, "cpu") is None:
            raise SystemExit("bench_gloo_contention: --pin needs two cores (Linux)")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S)
    )
    _apply_policy(policy)
    if idle_loop:
        from engine.worker import idle_helpers

        idle_helpers()
    w, x = torch.randn(HIDDEN, HIDDEN) / 16, torch.randn(1, HIDDEN)
    compute = (lambda x, m: (time.sleep(m / 1e3), x)[1]) if sleep else (lambda x, m: _busy(x, w, m))
    events, sends = [], []
    dist.barrier()
    for s in range(steps):
        if rank == 0:
            x = compute(x, ms[0])
            end = time.perf_counter()
            for work in sends:
                work.wait()
            bufs = (x.clone(), x.clone())
            sends = [dist.isend(b, 1, tag=2 * s + k) for k, b in enumerate(bufs)]
            events.append((s, end, time.perf_counter()))
        else:
            h, r = torch.empty(1, HIDDEN), torch.empty(1, HIDDEN)
            t0 = time.perf_counter()
            works = [dist.irecv(h, 0, tag=2 * s), dist.irecv(r, 0, tag=2 * s + 1)]
            t1 = time.perf_counter()
            for work in works:
                work.wait()
            events.append((s, t0, t1, time.perf_counter()))
            x = compute(h, ms[1])
    for work in sends:
        work.wait()
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(events))
    dist.destroy_process_group()


def run_mode(
    mode: str, steps: int, compute_ms: float, policy: str, pin: bool = False, idle_loop: bool = False
) -> dict[str, np.ndarray]:
    """One mode's three latency samples, milliseconds (perf_counter is one clock across processes)."""
    ms = [compute_ms, compute_ms * (0.3 if mode == "light" else 1.0)]
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [
            ctx.Process(target=_rank, args=(r, port, steps, ms, mode == "sleep", policy, pin, idle_loop, out))
            for r in (0, 1)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(TIMEOUT_S + steps * compute_ms / 1e3 * 4)
            if p.is_alive():
                p.kill()
                raise SystemExit(f"bench_gloo_contention: mode {mode}: a rank did not finish")
        r0 = {e[0]: e for e in json.loads(Path(out, "rank0.json").read_text())}
        r1 = {e[0]: e for e in json.loads(Path(out, "rank1.json").read_text())}
    waited = [r1[s][3] - r0[s][2] for s in r1 if r1[s][2] < r0[s][2]]
    return {
        "end->isends posted": 1e3 * np.array([r0[s][2] - r0[s][1] for s in r0]),
        "irecv post": 1e3 * np.array([r1[s][2] - r1[s][1] for s in r1]),
        "hand-over": 1e3 * np.array(waited),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--compute-ms", type=float, default=4.0)
    ap.add_argument("--modes", default="compute,sleep,light")
    ap.add_argument("--policy", default="", help="nice:N, batch or idle for the computing thread")
    ap.add_argument("--pin", action="store_true", help="each rank on a core of its own (as the engine's stages)")
    ap.add_argument("--idle-loop", action="store_true", help="gloo's event loop at SCHED_IDLE (as the engine's stages)")
    args = ap.parse_args()
    print(f"{'mode':8s} {'sample':20s} {'n':>4s} {'median':>7s} {'mean':>7s} {'p99':>7s} {'max':>7s} {'>1ms':>5s}")
    for mode in args.modes.split(","):
        for name, v in run_mode(mode, args.steps, args.compute_ms, args.policy, args.pin, args.idle_loop).items():
            if len(v) == 0:
                print(f"{mode:8s} {name:20s} {0:4d}")
                continue
            print(
                f"{mode:8s} {name:20s} {len(v):4d} {np.median(v):7.3f} {v.mean():7.3f} "
                f"{np.percentile(v, 99):7.3f} {v.max():7.2f} {int((v > 1).sum()):5d}"
            )


if __name__ == "__main__":
    main()
