"""How much slower is an engine stage's step after an idle gap than back to back? Paired measurements.

A PP=2 stage waits for the other stage's compute (3-5 ms on the tiny model) before each of its own;
calibration's ``stage_idle`` charges the step after such a gap its extra time
(``calibration/stage_step.py::EngineStages.idle_penalty_fn``). This prints the paired figures behind
that fit's form, for middle stages of several depths built as the engine builds them
(``engine/model.py``, one torch thread), timed interleaved in one process:

* ``hot``       thread CPU ms of a step run right after another (the reference of each pair)
* ``sleep G``   the step after ``G`` ms asleep, minus the ``hot`` step just before it
* ``spin 3``    the same after 3 ms spent spinning in Python instead of sleeping

Medians of ``--pairs`` pairs per round, then over ``--rounds`` rounds. On this project's 2-vCPU VM
(tiny model, 1- and 4-request decodes at context 150, four runs over an hour): +0.10-0.33 ms after
3 ms and +0.30-0.85 ms after 10 ms, for stages of 1, 2, 4 and 8 layers alike within each run (the
level moves with the host between runs), and +0.09-0.32 ms after spinning 3 ms: the penalty is per
step and grows with the time away from the layers, not with their number. Meaningful on a quiet host.

Run: python benchmarks/bench_idle_penalty.py [--model tiny] [--depths 1,2,4,8] [--batch 4] [--rounds 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--depths", default="1,2,4,8", help="stage depths in layers, comma-separated")
    ap.add_argument("--batch", type=int, default=4, help="decode requests per step")
    ap.add_argument("--ctx", type=int, default=150, help="context tokens per request")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()

    import torch

    from engine.kvcache import PagedKVCache
    from engine.model import build_stage, torch_dtype
    from engine.step import forward_step
    from engine.transport import StepItem
    from ppsim.models.shape import load_model

    torch.set_num_threads(1)
    s = load_model(args.model)
    dt = torch_dtype(s.dtype)
    depths = [int(d) for d in args.depths.split(",")]
    if max(depths) > s.num_layers or min(depths) < 1:
        raise SystemExit(f"error: --depths: each must be 1..{s.num_layers} for {args.model}")
    blocks = -(-(args.ctx + 1) // 16)
    items = tuple(StepItem(i, args.ctx, 1, True, tuple(range(i * blocks, (i + 1) * blocks))) for i in range(args.batch))
    h = torch.randn(args.batch, s.hidden_size).to(dt)
    steps: dict[int, Callable[[], float]] = {}
    for d in depths:
        m = build_stage(s, 0, d, False, False, d, dt)
        kv = PagedKVCache(m.num_layers, args.batch * blocks, 16, s.num_kv_heads, s.head_dim, dt)

        def step(m=m, kv=kv) -> float:
            c0 = time.thread_time()
            forward_step(m, kv, items, None, h, h, 16, torch.device("cpu"))
            return time.thread_time() - c0

        steps[d] = step

    def spin(seconds: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            pass

    gaps: dict[str, Callable[[], None]] = {
        "sleep 1": lambda: time.sleep(0.001),
        "sleep 3": lambda: time.sleep(0.003),
        "sleep 10": lambda: time.sleep(0.010),
        "spin 3": lambda: spin(0.003),
    }
    res: dict[tuple[int, str], list[float]] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for d, step in steps.items():
                for name, gap in gaps.items():
                    hot, extra = [], []
                    for _ in range(args.pairs):
                        step()
                        a = step()
                        gap()
                        extra.append(step() - a)
                        hot.append(a)
                    res.setdefault((d, name), []).append(statistics.median(extra))
                    res.setdefault((d, "hot"), []).append(statistics.median(hot))
    print(f"{args.model}, {args.batch}-request decode at context {args.ctx}; thread CPU ms, medians")
    print(f"{'layers':>6s} {'hot':>8s} " + " ".join(f"{'+' + n:>10s}" for n in gaps))
    for d in depths:
        cells = " ".join(f"{1e3 * statistics.median(res[(d, n)]):+10.3f}" for n in gaps)
        print(f"{d:6d} {1e3 * statistics.median(res[(d, 'hot')]):8.3f} {cells}")


if __name__ == "__main__":
    main()
