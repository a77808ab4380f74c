"""Does a stage cost what its parts cost? The profiled cost model's composition, measured.

The profiled model predicts a stage step as its ends plus its layers: the first stage's input
preparation and embedding and the last stage's norm, lm_head and sampler are timed as stages of no
layers (``stage_first`` / ``stage_last``), the layers as a middle stage of ``--stack`` layers
(``stage_mid``), and a whole-model stage (``stage_full``) is their sum
(``calibration/stage_step.py::EngineStages``). A PP=2 layout splits the same layers into a first and
a last half. This times, interleaved per round in one process on the engine's own stage code (one
torch thread, thread CPU time, the calibration's clock):

* ``full / parts``   ``stage_full`` over ``stage_mid + stage_first + stage_last``: the composition
* ``halves / full``  the PP=2 layout's two halves (``[0, stack/2)`` with the first end, the rest with
  the last) over the one-stage layout of the same layers

Both are 1.0 if the model's composition holds. Per-round ratios, then their median. On this
project's 2-vCPU VM (``dense-1024``, four rounds, two runs on 2026-12-01, 35 s each): full / parts
0.94-1.08 median per plan (single rounds 0.90-1.35), halves / full 0.88-1.13 (0.73-1.22), neither
on one side of 1 in both runs: no systematic gap beyond the host's round-to-round swing (the same
step's time moved 30-40% between minutes that hour).
Meaningful on a quiet host.

Run: python benchmarks/bench_stage_compose.py [--model tiny] [--stack 4] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics

PLANS = ("D1x128", "D4x128", "D16x256", "P64@0", "P64@0+D8x256")  # calibration's plan specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="experiments/validation/models/dense-1024", help="preset or config.json dir")
    ap.add_argument("--stack", type=int, default=4, help="layers of the middle and whole stages (even)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="timer repeats per sample")
    a = ap.parse_args()

    import numpy as np
    import torch

    from calibration.profile_ops import parse_plan
    from calibration.stage_step import EngineStages
    from calibration.timer import Timer, summarize
    from ppsim.models.shape import load_model

    torch.set_num_threads(1)
    shape = load_model(a.model)
    stages = EngineStages(shape, torch.float32, torch.device("cpu"), a.stack)
    timer = Timer(clock="thread", repeats=a.repeats)
    lo, hi = stages.start, stages.end
    mid = lo + (hi - lo) // 2
    fns = {
        "full": lambda s: stages.step_fn("stage_full", s),
        "mid": lambda s: stages.step_fn("stage_mid", s),
        "first": lambda s: stages.step_fn("stage_first", s),
        "last": lambda s: stages.step_fn("stage_last", s),
        "half0": lambda s: stages.layout_step_fn(lo, mid, True, False, s),
        "half1": lambda s: stages.layout_step_fn(mid, hi, False, True, s),
    }
    rng = np.random.default_rng(0)
    plans = {spec: parse_plan(spec, rng) for spec in PLANS}  # the same requests for every part
    t: dict[tuple[str, str], list[float]] = {}
    with torch.inference_mode():
        for _ in range(a.rounds):
            for name, seqs in plans.items():
                for part, fn in fns.items():
                    xs, inner = timer.samples(fn(seqs))
                    t.setdefault((name, part), []).append(summarize(xs, inner).mean_s)
    print(f"{a.model}: stack {a.stack} layers [{lo}, {hi}), {a.rounds} rounds, thread CPU time")
    print(f"{'plan':14s} {'full ms':>8s}  {'full / parts (per round)':40s} {'halves / full (per round)'}")
    for name in PLANS:
        g = {p: t[(name, p)] for p in fns}
        comp = [g["full"][i] / (g["mid"][i] + g["first"][i] + g["last"][i]) for i in range(a.rounds)]
        halves = [(g["half0"][i] + g["half1"][i]) / g["full"][i] for i in range(a.rounds)]
        c = f"{statistics.median(comp):.3f} ({' '.join(f'{x:.2f}' for x in comp)})"
        h = f"{statistics.median(halves):.3f} ({' '.join(f'{x:.2f}' for x in halves)})"
        print(f"{name:14s} {statistics.median(g['full']) * 1e3:8.2f}  {c:40s} {h}")


if __name__ == "__main__":
    main()
