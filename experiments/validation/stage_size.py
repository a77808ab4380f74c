"""A layer's time in a middle engine stage by the stage's layer count, on this host.

One process times ``engine/step.py::forward_step`` on middle stages (no ends) of the model's first n
layers, for each n of ``--layers``, on decode and prefill plans, in interleaved rounds (one torch
thread, thread CPU time, the calibration's clock), and prints the time per layer and its ratio to the
largest n. What ``calibration/stage_layers.py`` measures inside ``ppsim calibrate`` (there net of
``prepare_inputs``, on its own plans), here over more plans and rounds: on this project's 2-vCPU VM a
stage of fewer layers ran each layer 4-11% faster on ``tiny-moe`` (4 layers against 8) and 0-31% on
``dense-1024`` (1-2 against 4), with the same code and weights (2026-12-05, docs/calibration.md).

Run: python experiments/validation/stage_size.py --model MODEL [--layers 1,2,4] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics

from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError

# plan -> requests as (start, new tokens): decodes of B requests at contexts c, c + 1, ...; one 64-token prefill
PLANS = {
    **{f"D{b}x{c}": [(c + i, 1) for i in range(b)] for b, c in ((1, 300), (8, 20), (8, 300), (32, 40))},
    "P64@0": [(0, 64)],
}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/stage_size.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-moe", help="preset name or HF config.json path")
    ap.add_argument("--layers", default=None, help="comma-separated layer counts (default: 1, 2, 4, ... up to all)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (1-20)")
    args = ap.parse_args(argv)
    return run_main(lambda: stage_size(args))


def sizes(arg: str | None, num_layers: int) -> list[int]:
    """``--layers`` parsed and checked against the model (each 1..num_layers), ascending, or the powers of
    two up to the model's layers and the model's own count."""
    if arg is None:
        return sorted({*(2**i for i in range(num_layers.bit_length()) if 2**i <= num_layers), num_layers})
    try:
        counts = sorted({int(x) for x in arg.split(",")})
    except ValueError:
        raise PPSimError(f"--layers: {arg!r} is not comma-separated integers; e.g. --layers 1,2,4") from None
    if counts[0] < 1 or counts[-1] > num_layers:
        raise PPSimError(f"--layers: {arg!r} must be within 1..{num_layers} (the model's layers)")
    return counts


def stage_size(args: argparse.Namespace) -> int:
    from ppsim.models.shape import load_model

    try:
        s = load_model(args.model)
    except PPSimError as err:
        raise PPSimError(f"--model: {str(err).removeprefix('model: ')}") from None
    if not 1 <= args.rounds <= 20:
        raise PPSimError(f"--rounds: {args.rounds} is not within 1..20")
    counts = sizes(args.layers, s.num_layers)
    import torch

    from calibration.layer import Seq
    from calibration.stage_step import EngineStages
    from calibration.timer import Timer
    from engine.model import torch_dtype

    torch.set_num_threads(1)
    st = EngineStages(s, torch_dtype(s.dtype), torch.device("cpu"), 1)
    timer = Timer("cpu", clock="thread", repeats=3, warmup=2, min_repeat_s=0.01)
    plans = {k: [Seq(start, n) for start, n in v] for k, v in PLANS.items()}
    per: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):  # interleaved: a drift of the host between rounds hits every size alike
            for n in counts:
                for k, seqs in plans.items():
                    xs, _ = timer.samples(st.layout_step_fn(0, n, False, False, seqs))
                    per.setdefault((k, n), []).append(statistics.mean(xs) / n)
    print(f"{args.model}: ms per layer in a middle stage of n layers (ratio to n = {counts[-1]})")
    print(f"{'plan':8s}" + "".join(f"{f'n = {n}':>20s}" for n in counts))
    for k in plans:
        ref = statistics.median(per[(k, counts[-1])])
        cells = (statistics.median(per[(k, n)]) for n in counts)
        print(f"{k:8s}" + "".join(f"{f'{1e3 * m:.3f} ({m / ref:.3f})':>20s}" for m in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
