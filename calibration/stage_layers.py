"""``stage_layers``: what a layer costs in a stage of ``n`` layers over one in the profiler's stack.

The operators and the stage glue are timed over ``stack`` distinct layers in turn (as many as fit
``STACK_BYTES``), so the caches hold none of the next layer's weights, as in a stage of that size. A
pipeline stage holds fewer layers: at PP=2 half of them. On this project's 2-vCPU VM a stage of fewer
layers runs each of them measurably faster, its weights more often still in the core's caches when
the next step comes round (the same engine step on a middle stage, thread CPU time, interleaved rounds,
2026-12-05, two readings): ``tiny-moe`` (7.5 MB a layer) 4 layers at 0.89-0.96 of 8 per layer,
``dense-1024`` (45 MB a layer) 2 layers at 0.83-1.00 of 4 and 1 layer at 0.69-0.94. The stage model prices every
stage at the stack's per-layer cost, and calibration's two-stage live runs came in under it
(``tiny-moe``, MoE rounds 20-21: two stages over one, each over the model, 0.947 and 0.953), which the
depth ratio, held at 1, does not charge.

Calibration times a middle stage (no ends) of the stack's first ``n`` layers for every stage size a
pipeline of 1-4 stages would give the model (up to ``stack``), on :data:`PLANS`, in the same
interleaved rounds as every other task; the fit is, per ``n``, the median over the plans of the
per-layer time net of ``prepare_inputs`` over the stack's, ``interp`` over ``n`` with 1 at
``stack``. Recorded in ``meta.json``, not charged (docs/validation.md: part 17 judged it against when the glue saw
only the stack; part 19 adopted it once the glue was fitted on the live runs' stages of every size too; part 20,
on the readings run after that verdict, reverted it, 2026-12-05). ``calibrate.analyse_and_write(...,
charge_stage_layers=True)`` charges it: fitted before the glue, it prices the live steps' stages in the glue's
fit, and :class:`ppsim.cost.profiled.ProfiledCost` multiplies a stage's layers by it
(:func:`ppsim.cost.profiled.stage_layers_ratio`: flat outside the measured sizes).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from ppsim.cost.profiled import OpFit

if TYPE_CHECKING:
    from calibration.profile_ops import Task

OP = "stage_layers"
NOTE = "a layer's time in a middle stage of n layers / in the stack's, by n"
SPLIT = "stage_layers"
PLANS = ("D1x128", "D8x128", "D32x128", "P64@0")  # decodes of 1-32 requests, one prefill
MAX_PP = 4


def layer_counts(num_layers: int, stack: int, max_pp: int = MAX_PP) -> list[int]:
    """Stage sizes of 1-``max_pp`` stages over ``num_layers`` (an uneven split's two sizes), capped at
    ``stack``, with ``stack`` itself (the reference); ascending."""
    sizes = {stack}
    for pp in range(1, max_pp + 1):
        for n in (num_layers // pp, -(-num_layers // pp)):
            if 1 <= n <= stack:
                sizes.add(n)
    return sorted(sizes)


def tasks(prof: Any) -> list[Task]:
    """One task per (stage size, plan) on ``prof`` (:class:`calibration.profile_ops.OpProfiler`): a
    middle stage over its stack's first ``n`` layers. None where the stack is the only size."""
    from calibration.profile_ops import Task, parse_plan, plan_features  # it imports calibrate, which imports this

    st = prof.stages
    stack = st.end - st.start
    counts = layer_counts(st.s.num_layers, stack)
    if counts == [stack]:
        return []
    out = []
    for spec in PLANS:
        seqs = parse_plan(spec, prof.rng)
        for n in counts:
            feats = {**plan_features(seqs), "layers": n, "start_layer": st.start}
            make = lambda n=n, seqs=seqs: st.layout_step_fn(st.start, st.start + n, False, False, seqs)  # noqa: E731
            out.append(Task(OP, SPLIT, feats, make, plan=spec, seqs=seqs))
    return out


def fit(rows: list[dict[str, Any]], prepare: OpFit | None, stat: str, value: Any) -> OpFit | None:
    """The ``stage_layers`` fit from the ``stage_layers`` rows (per step), or None without them.
    ``prepare`` (the ``prepare_inputs`` fit) is taken off each step before dividing by its layers;
    ``value(row, stat)`` reads a row's time."""
    sel = [r for r in rows if r["op"] == OP and r["split"] == SPLIT]
    if not sel:
        return None
    samples: dict[tuple[str, int], list[float]] = {}  # more than one where calibrations are pooled (merge.py)
    for r in sel:
        n, reqs = int(r["layers"]), int(r["reqs"])
        prep = prepare.at(reqs) if prepare is not None else 0.0
        samples.setdefault((str(r["plan"]), n), []).append((value(r, stat) - prep) / n)
    per = {k: statistics.median(v) for k, v in samples.items()}
    stack = max(n for _, n in per)
    ratios = {}
    for n in sorted({n for _, n in per}):
        rs = [per[(p, n)] / per[(p, stack)] for p, m in per if m == n and per.get((p, stack), 0.0) > 0.0]
        if rs:
            ratios[n] = statistics.median(rs)
    xs = sorted(ratios)
    return OpFit(OP, "interp", "layers", {"xs": [float(n) for n in xs], "ys": [ratios[n] for n in xs]})
