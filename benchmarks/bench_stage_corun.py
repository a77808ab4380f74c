"""Why is a PP=2 engine stage slower than its calibrated prediction? Co-run measurements.

One stage of the live engine (``engine/model.py`` layers over ``engine/kvcache.py``, one torch
thread, as a PP stage process) times a fixed decode micro-batch again and again, by wall clock and
by thread CPU time (the calibration's clock), in these settings:

* ``alone``        the stage process by itself (what calibration sees; PP=1 has one stage + core)
* ``pair``         two such stage processes at once (PP=2: two stages on two cores)
* ``pair+core``    two stages and a third process busy ``--core-duty`` of the time, in 1 ms slices
                   (the engine core: scheduling, queue pickling, polling) - three runnable on two cores
* ``alone+core``   one stage and the core-like process (PP=1 on two cores)

and prints, per setting, the median (over forwards, then over the stage processes and rounds) wall
and CPU ms per forward and the cost model's prediction for the same plan (``--profile``). Settings
alternate for ``--rounds`` rounds, so a host whose speed drifts weighs on all of them alike.
Wall / CPU above 1 is time the stage was runnable but not running (the OS gave its core to another
process); CPU above ``alone``'s is slower execution (shared caches, memory bandwidth, clock
frequency). Meaningful only on a quiet host (the script reports the load average before and after).

Run: python benchmarks/bench_stage_corun.py [--model tiny] [--layers 4] [--batch 4] [--ctx 134] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np


def stage_worker(model: str, layers: int, batch: int, ctx: int, duration_s: float, start_at: float, q) -> None:
    import torch

    from engine.kvcache import PagedKVCache, build_batch
    from engine.model import build_stage, torch_dtype
    from engine.transport import StepItem
    from ppsim.models.shape import load_model

    torch.set_num_threads(1)
    s = load_model(model)
    dt = torch_dtype(s.dtype)
    m = build_stage(s, 0, layers, True, False, 0, dt)
    bs = 16
    per = -(-(ctx + 1) // bs)
    kv = PagedKVCache(layers, per * batch, bs, s.num_kv_heads, s.head_dim, dt, "cpu")
    items = tuple(StepItem(i, ctx, 1, True, tuple(range(i * per, (i + 1) * per))) for i in range(batch))
    ids = torch.zeros(batch, dtype=torch.long)

    def forward() -> None:
        with torch.inference_mode():
            b = build_batch(items, bs)
            m(b.positions, kv.attention(b), ids, None, None)

    for _ in range(5):
        forward()
    while time.time() < start_at:
        time.sleep(0.001)
    walls, cpus = [], []
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        t0, c0 = time.perf_counter(), time.thread_time()
        forward()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    q.put((float(np.median(walls)), float(np.median(cpus)), len(walls)))


def core_worker(duty: float, duration_s: float, start_at: float) -> None:
    """Busy ``duty`` of every 1 ms slice, asleep the rest (pure Python, as the engine core)."""
    while time.time() < start_at:
        time.sleep(0.001)
    end = time.perf_counter() + duration_s + 0.5
    while time.perf_counter() < end:
        t = time.perf_counter()
        while time.perf_counter() - t < duty * 1e-3:
            pass
        time.sleep((1 - duty) * 1e-3)


def run_setting(args: argparse.Namespace, stages: int, core: bool) -> list[tuple[float, float, int]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 8.0  # after every worker has built its model
    procs = [
        ctx.Process(
            target=stage_worker, args=(args.model, args.layers, args.batch, args.ctx, args.duration_s, start_at, q)
        )
        for _ in range(stages)
    ]
    if core:
        procs.append(ctx.Process(target=core_worker, args=(args.core_duty, args.duration_s, start_at)))
    for p in procs:
        p.start()
    out = [q.get(timeout=120) for _ in range(stages)]
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return out


def predicted_ms(args: argparse.Namespace) -> float | None:
    if not args.profile:
        return None
    from ppsim.cost.base import StageSpec
    from ppsim.cost.profiled import ProfiledCost, read_profile
    from ppsim.models.shape import load_model
    from ppsim.policy.plan import PlanItem, make_plan

    cost = ProfiledCost(read_profile(args.profile), load_model(args.model), None, 1)
    plan = make_plan(0, [PlanItem(i, args.ctx, 1, False, True) for i in range(args.batch)])
    return 1e3 * cost.stage_time(StageSpec(0, 0, args.layers, True, False), plan)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=4, help="layers in the stage (tiny at PP=2: 4)")
    ap.add_argument("--batch", type=int, default=4, help="decode requests in the micro-batch")
    ap.add_argument("--ctx", type=int, default=134, help="context tokens per request")
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--core-duty", type=float, default=0.5, help="busy fraction of the core-like process")
    ap.add_argument("--profile", default="profiles/tiny-cpu", help="profile for the prediction ('' for none)")
    ap.add_argument("--rounds", type=int, default=3, help="times every setting runs, alternating (default 3)")
    ap.add_argument("--settings", nargs="*", choices=["alone", "pair", "alone+core", "pair+core"])
    args = ap.parse_args()
    pred = predicted_ms(args)
    print(
        f"load before: {os.getloadavg()[0]:.2f}; cores {os.cpu_count()}; prediction "
        f"{'-' if pred is None else f'{pred:.3f} ms'} ({args.model}, {args.layers} layers, "
        f"{args.batch} decodes at ctx {args.ctx})"
    )
    settings = {"alone": (1, False), "pair": (2, False), "alone+core": (1, True), "pair+core": (2, True)}
    chosen = args.settings or list(settings)
    got: dict[str, list[tuple[float, float, int]]] = {k: [] for k in chosen}
    for r in range(args.rounds):  # settings alternate, so a drifting host weighs on all of them alike
        for name in chosen:
            got[name] += run_setting(args, *settings[name])
            print(f"round {r + 1}/{args.rounds} {name}: cpu ms {1e3 * got[name][-1][1]:.3f}", file=sys.stderr)
    print(
        f"{'setting':<12}{'wall ms':>10}{'cpu ms':>10}{'wall/cpu':>10}{'pred/wall':>11}{'pred/cpu':>10}{'forwards':>10}"
    )
    for name, res in got.items():
        wall = float(np.median([r[0] for r in res])) * 1e3
        cpu = float(np.median([r[1] for r in res])) * 1e3
        pw = "-" if pred is None else f"{pred / wall - 1:+.1%}"
        pc = "-" if pred is None else f"{pred / cpu - 1:+.1%}"
        print(
            f"{name:<12}{wall:>10.3f}{cpu:>10.3f}{wall / cpu:>10.2f}{pw:>11}{pc:>10}{sum(r[2] for r in res):>10}",
            flush=True,
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
