"""Where each stage's time went, engine against simulator: computes, idle beside other stages, idle pipeline.

The step-level error (:mod:`ppsim.validate.steps`) judges the cost of each compute; this judges the
rest of a stage's wall clock. Over one run, a stage's span (its first compute's start to its last
compute's end) splits exactly into

- ``busy_s``: the sum of its computes,
- ``idle_others_s``: idle while at least one other stage computes (waiting for its input or for the
  step after a hand-over),
- ``idle_pipeline_s``: idle while no stage computes (the engine core's path, transfers, the sampled
  tokens' return, and gaps with no request in the system),

so the engine's span minus the simulator's is the sum of the three differences: more computes or
slower ones, against a longer path. The **hand-over** is the one path latency that needs no model of
the policy: stage k's compute of a step ending, to stage k + 1's compute of the same step starting,
counted only where stage k + 1 computed nothing in between (it was free: no queueing in the figure).
Its median and mean (the mean carries the tail: a pipeline's cycle adds means) check the link and
hand-over calibration on the run's own transfers.
The **turnaround** is its other side: where stage k + 1 was still busy with an earlier step when
stage k finished this one (by ``TURN_MARGIN_S`` or more: the input was there), stage k + 1's
previous compute ending to this one starting, which the simulator makes zero (the next compute
starts as the stage frees); the live engine's stage loop spends it sending the sampled tokens,
taking the next step message and completing the receive. :func:`restarts` is every such restart
where stage k finished first by any margin, with the step's request count: calibration's sample
(its gap does not depend on the margin: MoE rounds 26-27, B = 1 / 8 / 32, flat from 0 to 2 ms).

Pure functions of :class:`OpRecord` lists; the engine's figures are the mean over its repeats.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ppsim.metrics.records import OpRecord

SPLIT = ("busy_s", "idle_others_s", "idle_pipeline_s")
LABELS = {"busy_s": "computes", "idle_others_s": "idle while others compute", "idle_pipeline_s": "idle pipeline"}


def _computes(ops: Sequence[OpRecord]) -> dict[int, list[tuple[float, float, int]]]:
    """Stage -> its computes as (start, end, step id), by start."""
    out: dict[int, list[tuple[float, float, int]]] = {}
    for op in ops:
        if op.kind == "compute" and op.track.startswith("stage"):
            out.setdefault(int(op.track[len("stage") :]), []).append((op.start_s, op.end_s, op.step_id))
    return {s: sorted(v) for s, v in out.items()}


def _requests(ops: Sequence[OpRecord]) -> dict[int, int]:
    """Step id -> its request count (from its computes)."""
    return {op.step_id: op.num_reqs for op in ops if op.kind == "compute" and op.track.startswith("stage")}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _covered(a: float, b: float, union: list[tuple[float, float]], starts: np.ndarray) -> float:
    """Seconds of [a, b) inside the (merged, sorted) intervals; ``starts`` their start times."""
    tot = 0.0
    for x, y in union[max(int(np.searchsorted(starts, a, side="right")) - 1, 0) :]:
        if x >= b:
            break
        tot += max(0.0, min(b, y) - max(a, x))
    return tot


def stage_split(ops: Sequence[OpRecord]) -> dict[int, dict[str, float]]:
    """Per stage of one run: computes, span_s and its split into busy, idle beside others, idle pipeline."""
    comps = _computes(ops)
    out = {}
    for s, mine in comps.items():
        others = _union([(a, b) for t, v in comps.items() if t != s for a, b, _ in v])
        starts = np.array([a for a, _ in others])
        busy = sum(b - a for a, b, _ in mine)
        gaps = [(mine[k][1], mine[k + 1][0]) for k in range(len(mine) - 1) if mine[k + 1][0] > mine[k][1]]
        beside = sum(_covered(a, b, others, starts) for a, b in gaps)
        span = mine[-1][1] - mine[0][0]
        out[s] = {
            "computes": float(len(mine)),
            "span_s": span,
            "busy_s": busy,
            "idle_others_s": beside,
            "idle_pipeline_s": span - busy - beside,
        }
    return out


def handover_steps(ops: Sequence[OpRecord]) -> list[tuple[int, int, float]]:
    """(link k, step id, seconds) of every hand-over on a free receiver: stage k's compute of the step
    ending -> stage k + 1's compute of it starting, where stage k + 1 had finished its previous compute
    by then (it was waiting, so the gap is the path, not a queue)."""
    return _handover_steps(_computes(ops))


def _handover_steps(comps: dict[int, list[tuple[float, float, int]]]) -> list[tuple[int, int, float]]:
    out = []
    for k in sorted(comps):
        nxt = comps.get(k + 1)
        if not nxt:
            continue
        at = {sid: (a, i) for i, (a, _, sid) in enumerate(nxt)}
        for _, end, sid in comps[k]:
            if sid in at:
                start, i = at[sid]
                if start >= end and (i == 0 or nxt[i - 1][1] <= end):
                    out.append((k, sid, start - end))
    return out


TURN_MARGIN_S = 1e-3  # a turnaround counts where the sender finished this long before the receiver was free


def _turnaround_steps(
    comps: dict[int, list[tuple[float, float, int]]], margin_s: float = TURN_MARGIN_S
) -> list[tuple[int, int, float, float]]:
    """(link k, step id, margin, seconds) of every restart of stage k + 1 whose input waited: the previous
    compute's end to this step's start, where stage k had finished the step ``margin_s`` or more (the
    margin) before that end."""
    out = []
    for k in sorted(comps):
        nxt = comps.get(k + 1)
        if not nxt:
            continue
        at = {sid: i for i, (_, _, sid) in enumerate(nxt)}
        for _, end, sid in comps[k]:
            i = at.get(sid)
            if i and nxt[i - 1][1] >= end + margin_s and nxt[i][0] >= nxt[i - 1][1]:
                out.append((k, sid, nxt[i - 1][1] - end, nxt[i][0] - nxt[i - 1][1]))
    return out


def turnarounds(ops: Sequence[OpRecord]) -> dict[int, list[float]]:
    """Link k (stage k -> k + 1) -> stage k + 1's turnaround seconds wherever its input waited."""
    stages = _computes(ops)
    out: dict[int, list[float]] = {k: [] for k in stages if k + 1 in stages}
    for k, _, _, t in _turnaround_steps(stages):
        out[k].append(t)
    return out


def restarts(ops: Sequence[OpRecord]) -> dict[int, list[tuple[int, float]]]:
    """Link k -> (requests of the step, seconds) of every restart of stage k + 1 where stage k had
    finished the step before stage k + 1 freed, by any margin (calibration's ``turnaround`` sample)."""
    stages = _computes(ops)
    out: dict[int, list[tuple[int, float]]] = {k: [] for k in stages if k + 1 in stages}
    for k, reqs, _, t in restart_margins(ops):
        out[k].append((reqs, t))
    return out


def restart_margins(ops: Sequence[OpRecord]) -> list[tuple[int, int, float, float]]:
    """(link k, requests of the step, margin, seconds) of every restart :func:`restarts` counts; the margin
    is how long before stage k + 1 freed stage k finished the step."""
    reqs = _requests(ops)
    return [(k, reqs[sid], margin, t) for k, sid, margin, t in _turnaround_steps(_computes(ops), 0.0)]


def restart_records(ops: Sequence[OpRecord]) -> list[dict[str, float]]:
    """Every restart :func:`restarts` counts, one record each, with what may set it: ``link``, ``step_id``,
    ``reqs``, ``tokens`` and ``prefill_tokens`` of the step, ``margin_s`` (how long before the stage freed its
    input was there), ``restart_s``, ``prev_s``, ``prev_prefill_tokens`` and ``prev_step_id`` (the stage's
    compute before), ``after_handover`` (1 where that compute was not itself a restart: its input came after the
    stage freed, and this restart is the first of a busy spell; calibration's fast mode sits there),
    ``core_lag_s`` (the core's schedule of this step, the last to end before the first stage started it,
    ended that long after the stage freed; negative: before; absent where the run has no core schedule
    records) and ``at_s`` (the stage's free time since the run's first compute)."""
    step = {op.step_id: op for op in ops if op.kind == "compute" and op.track.startswith("stage")}
    ends = sorted(op.end_s for op in ops if op.track == "core" and op.kind == "schedule")  # core records: no step id
    comps = _computes(ops)
    first = {sid: a for a, _, sid in comps[min(comps)]} if comps else {}
    sched = {sid: ends[j - 1] for sid, a in first.items() if (j := bisect.bisect_right(ends, a)) > 0}
    t0 = min((c[0][0] for c in comps.values() if c), default=0.0)
    at = {k: {c[2]: j for j, c in enumerate(cs)} for k, cs in comps.items()}
    steps = _turnaround_steps(comps, 0.0)
    restarted = {(k, sid) for k, sid, _, _ in steps}
    out = []
    for k, sid, margin, t in steps:
        p_start, p_end, p_sid = comps[k + 1][at[k + 1][sid] - 1]
        rec = {
            "link": k,
            "step_id": sid,
            "reqs": step[sid].num_reqs,
            "tokens": step[sid].num_tokens,
            "prefill_tokens": step[sid].num_prefill_tokens,
            "margin_s": margin,
            "restart_s": t,
            "prev_s": p_end - p_start,
            "prev_prefill_tokens": step[p_sid].num_prefill_tokens,
            "prev_step_id": p_sid,
            "after_handover": int((k, p_sid) not in restarted),
            "at_s": p_end - t0,
        }
        if sid in sched:
            rec["core_lag_s"] = sched[sid] - p_end
        out.append(rec)
    return out


def handovers(ops: Sequence[OpRecord]) -> dict[int, list[float]]:
    """Link k (stage k -> k + 1) -> the hand-over seconds of every step whose receiver was free."""
    stages = _computes(ops)
    out: dict[int, list[float]] = {k: [] for k in stages if k + 1 in stages}
    for k, _, s in _handover_steps(stages):
        out[k].append(s)
    return out


def _latency(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"n": float(len(xs)), "median_ms": float(np.median(xs) * 1e3), "mean_ms": float(np.mean(xs) * 1e3)}


def summarize_path(engine_runs: Sequence[Sequence[OpRecord]], sim: Sequence[OpRecord]) -> dict[str, Any]:
    """Per stage the split of the engine (mean over its runs) and of the simulator; per link the
    hand-over on a free receiver (engine runs pooled). Empty when either side has no compute."""
    eng = [stage_split(r) for r in engine_runs]
    sim_split = stage_split(sim)
    if not sim_split or not any(eng):
        return {}
    stages: dict[str, Any] = {}
    for s in sorted(sim_split):
        runs = [e[s] for e in eng if s in e]
        if runs:
            mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            stages[str(s)] = {"engine": mean, "sim": sim_split[s]}
    return {
        "stages": stages,
        "handover": _per_link(handovers, engine_runs, sim),
        "turnaround": _per_link(turnarounds, engine_runs, sim),
    }


def _per_link(
    of: Callable[[Sequence[OpRecord]], dict[int, list[float]]],
    engine_runs: Sequence[Sequence[OpRecord]],
    sim: Sequence[OpRecord],
) -> dict[str, Any]:
    """``"k->k+1"`` -> the latencies ``of`` finds on that link: the engine's runs pooled, the simulator's."""
    sim_x = of(sim)
    eng_x: dict[int, list[float]] = {}
    for r in engine_runs:
        for k, v in of(r).items():
            eng_x.setdefault(k, []).extend(v)
    return {
        f"{k}->{k + 1}": {"engine": _latency(eng_x.get(k, [])), "sim": _latency(sim_x.get(k, []))}
        for k in sorted(set(sim_x) | set(eng_x))
    }


def span_differences(p: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per stage: engine minus simulator of its span (``span_s``) and of each part of :data:`SPLIT`."""
    return {s: {k: d["engine"][k] - d["sim"][k] for k in ("span_s", *SPLIT)} for s, d in p.get("stages", {}).items()}


def format_path(p: dict[str, Any]) -> str:
    """The table of part 6 of the report, one line per stage, then one per link's hand-over."""
    if not p:
        return "where the time went: no stage computes to compare"
    head = (
        f"{'stage':<7}{'computes':>15}{'mean compute':>18}{'busy s':>15}{'idle beside others':>19}"
        f"{'idle pipeline':>17}{'span s':>15}"
    )
    title = " where each stage's time went (engine mean over runs / simulator) "
    lines = [f"{title:=^{len(head)}}", head]
    lines.append("-" * len(head))
    for s, d in p["stages"].items():
        e, m = d["engine"], d["sim"]
        mean_e = e["busy_s"] / e["computes"] * 1e3 if e["computes"] else 0.0
        mean_m = m["busy_s"] / m["computes"] * 1e3 if m["computes"] else 0.0
        lines.append(
            f"{s:<7}{e['computes']:>7.0f} /{m['computes']:>6.0f}{mean_e:>8.2f} /{mean_m:>6.2f}ms"
            f"{e['busy_s']:>7.2f} /{m['busy_s']:>6.2f}{e['idle_others_s']:>11.2f} /{m['idle_others_s']:>6.2f}"
            f"{e['idle_pipeline_s']:>9.2f} /{m['idle_pipeline_s']:>6.2f}{e['span_s']:>7.2f} /{m['span_s']:>6.2f}"
        )
    lines.append("=" * len(head))
    for s, diff in span_differences(p).items():
        parts = ", ".join(f"{LABELS[k]} {diff[k]:+.3f} s" for k in SPLIT)
        lines.append(f"stage {s}: engine span - simulator span {diff['span_s']:+.3f} s = {parts}")
    for k, d in p["handover"].items():
        e, m = d["engine"], d["sim"]
        if e and m:
            lines.append(
                f"hand-over {k} on a free receiver: engine median {e['median_ms']:.3f} ms, mean {e['mean_ms']:.3f} ms "
                f"({e['n']:.0f}); simulator {m['median_ms']:.3f} / {m['mean_ms']:.3f} ms ({m['n']:.0f})"
            )
    for k, d in p.get("turnaround", {}).items():
        e, m = d["engine"], d["sim"]
        if e:
            sim = f"{m['median_ms']:.3f} / {m['mean_ms']:.3f} ms ({m['n']:.0f})" if m else "none"
            stage = k.split("->")[1]
            lines.append(
                f"turnaround of stage {stage} with its input waiting: engine median {e['median_ms']:.3f} ms, "
                f"mean {e['mean_ms']:.3f} ms ({e['n']:.0f}); simulator {sim}"
            )
    return "\n".join(lines)
