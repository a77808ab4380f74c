"""Each operator of a decoder layer timed in context, against the same attention timed alone.

A stack of four layers (``calibration.layer.Layer``: the engine's own operators, each layer its own weights and
KV) runs whole layer forwards on a prefill plan; the thread CPU time between operators gives each one's cost as a
stage runs it. Beside it, the calibration's attention task (``OpProfiler.attn_fn``: the same paged attention on
inputs built once, over the same stack) on the same plan. On `tiny-moe` (2026-12-05, 2-vCPU VM): attention in
context over alone 1.10 for one 512-token item (11.2 against 10.1 ms a layer), 1.08 for two of 256, 1.18 for 32
of 16, 2.0 for one of 16 (0.13 against 0.07 ms): where a stage's cost beyond its operators sits, which the stage
glue carries per token and request (docs/validation.md, "What is left out").

Run: python experiments/validation/attn_in_layer.py [--model tiny-moe] [--rounds 6] [PLAN ...]
     (PLAN: K x chunk, e.g. 1x512 2x256 32x16; default 1x512 2x256 32x16 1x16)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402

OPS = ("norm1", "qkv", "rope", "attend", "o_proj", "norm2", "mlp")
STACK = 4


def parse_plan(spec: str) -> tuple[int, int]:
    """``KxC`` -> (items, chunk tokens)."""
    try:
        k, c = (int(v) for v in spec.lower().split("x"))
    except ValueError:
        raise PPSimError(f"plan {spec!r}: give items x chunk tokens, e.g. 32x16") from None
    if not (1 <= k <= 256 and 1 <= c <= 4096):
        raise PPSimError(f"plan {spec!r}: items must be in [1, 256] and chunk tokens in [1, 4096]")
    return k, c


def layer_ops(layers: list, kvs: list, pos, T: int, hidden: int) -> list[list[float]]:  # noqa: ANN001
    """One forward through the stack: per layer, each operator's thread CPU seconds in context."""
    import torch

    x, r = torch.randn(T, hidden), torch.randn(T, hidden)
    out = []
    for L, kv in zip(layers, kvs, strict=True):
        t = [time.thread_time()]
        r = x + r
        h = L.rms_norm(r, L.ln1)
        t.append(time.thread_time())
        q, k, v = L.qkv(h)
        t.append(time.thread_time())
        q, k = L.rope(q, k, pos)
        t.append(time.thread_time())
        a = L.attend(q, k, v, kv)
        t.append(time.thread_time())
        x = L.o_proj(a)
        t.append(time.thread_time())
        r = x + r
        h = L.rms_norm(r, L.ln2)
        t.append(time.thread_time())
        x = L.moe(h) if L.moe is not None else L.down(L.act(L.gate_up(h)))
        t.append(time.thread_time())
        out.append([b - a for a, b in zip(t, t[1:], strict=False)])
    return out


def measure(model: str, rounds: int, plans: list[tuple[int, int]]) -> list[str]:
    import torch

    from calibration.layer import Layer, Seq
    from calibration.profile_ops import OpProfiler
    from calibration.timer import Timer
    from ppsim.models.shape import load_model

    torch.set_num_threads(1)
    s = load_model(model)
    layers = [Layer(s, s.dtype, "cpu", seed=i) for i in range(STACK)]
    prof = OpProfiler(layers[0], Timer("cpu", clock="thread"), stack=STACK)
    runs = {}
    for k, c in plans:
        seqs = [Seq(0, c)] * k
        pos = torch.cat([torch.arange(q.start, q.start + q.n) for q in seqs])
        runs[(k, c)] = ([L.kv(seqs) for L in layers], pos, prof.attn_fn(seqs))
    inside = {p: {o: [] for o in OPS} for p in plans}
    alone: dict[tuple[int, int], list[float]] = {p: [] for p in plans}
    with torch.inference_mode():
        for _ in range(rounds):  # interleaved: the host's drift between rounds hits every plan alike
            for (k, c), (kvs, pos, attn) in runs.items():
                layer_ops(layers, kvs, pos, k * c, s.hidden_size)  # warm
                for per_layer in layer_ops(layers, kvs, pos, k * c, s.hidden_size):
                    for o, dt in zip(OPS, per_layer, strict=True):
                        inside[(k, c)][o].append(dt)
                attn()
                t0 = time.thread_time()
                attn()
                alone[(k, c)].append((time.thread_time() - t0) / STACK)
    lines = []
    for p in plans:
        med = {o: statistics.median(inside[p][o]) for o in OPS}
        cells = "  ".join(f"{o} {med[o] * 1e6:.0f}" for o in OPS)
        a = statistics.median(alone[p])
        lines.append(
            f"{p[0]}x{p[1]}: per layer in context (us) {cells}; attention alone {a * 1e6:.0f} us, "
            f"in context / alone {med['attend'] / a:.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/attn_in_layer.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("plans", nargs="*", default=["1x512", "2x256", "32x16", "1x16"])
    args = ap.parse_args(argv)

    def go() -> None:
        if not 1 <= args.rounds <= 100:
            raise PPSimError(f"--rounds: {args.rounds} must be in [1, 100]")
        plans = [parse_plan(p) for p in args.plans]
        print("\n".join(measure(args.model, args.rounds, plans)))

    return run_main(go)


if __name__ == "__main__":
    sys.exit(main())
