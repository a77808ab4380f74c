"""The engine core's per-step work and control path, measured on the live engine itself.

The simulator charges every step the engine core's ``schedule`` and ``update`` CPU, the ``launch``
of the step to the first stage and the ``return`` of its sampled tokens (``ppsim/cost/profiled.py``).
Micro-benchmarks of the pieces (ppsim's scheduler alone, :mod:`calibration.cpu_overheads`; a step
message between two bare processes, :mod:`calibration.control`) under-count what the engine does
around them: in validation traces of the tiny model the engine's return took 0.40-0.49 ms against
0.18-0.19 ms from the queue benchmark, its schedule and update spans 0.03-0.04 ms against 0.004 and
0.002 ms, about 0.3 ms a step, 5% of a one-request decode step at PP=1.

So calibration runs the live engine (``engine/``, one stage, ``vllm-sync``: one step in flight, so
every gap is the path itself, not a queue) on a fixed calibration workload: 32 requests of 16 prompt
tokens and 4-64 output tokens, all at t=0, at most 16 running, so the running set shrinks from 16
to 1 as requests finish. From its records, per step of ``n`` requests:

* ``schedule``: the core's schedule span (the generator's real CPU from resuming to yielding);
* ``update``: the update span plus the core's work until the next schedule starts (the driver's
  token emission and records, which the simulator does not time separately);
* ``launch``: schedule end -> the stage's compute start (step messages built, pickled, queued; the
  stage wakes and takes it);
* ``return``: the stage's compute end -> the core's update start (tokens queued back, the core wakes);
* ``launch_multi``: the launch again, from a second run at two stages (one message per stage's queue;
  0.58 ms against 0.39 at one stage in a validation trace), which the simulator charges at PP > 1.
* ``return_multi``, ``schedule_multi``, ``update_multi``: the rest of the control path from that run, recorded
  (``calibrate.fit_all(..., path_multi=True)`` fits them, and the simulator then charges them at PP > 1; not adopted
  on docs/validation.md part 40's fresh readings: one run's fit is noisier than the effect): with two stage processes
  beside the engine core on this host's two cores the return took 0.29 ms against 0.26 at one stage (medians of three
  runs each, ``tiny``), the schedule and update spans 10-25% longer, and in the held-out draws' PP=2 runs the engine's
  return ran 1.31x what the one-stage fit charged (1.00x at PP=1).
* ``handoff``: from that run, a stage's compute end -> the next stage's compute start, per payload
  (``bytes`` of hidden states + residual), where the next stage was waiting: the engine's own
  transfer (two isends, the receiver's thread woken from its wait), which the link ping-pong
  (``calibration/link.py``: two hot processes bouncing one buffer) under-counts by about 0.25 ms a
  step on this host (0.32-0.56 ms against 0.08-0.34 ms in validation traces). The profile keeps the
  median excess over ``send_recv`` (``path_fits.fit_handoff``), which every link transfer is charged.
* ``turnaround``: from a fourth run at two stages with two micro-batches in flight (``vllm-batch-queue``
  with ``--pp-throttle``), stage 1 restarting where its next input was already sent (stage 0 finished
  the step before stage 1 freed: :func:`ppsim.validate.path.restarts`), by the step's request count:
  the stage loop's work between two computes (the sampled tokens sent, the next step message taken,
  the receive completed), which the pipelines charge before a stage's next compute at PP > 1. It
  grows with the requests (MoE validation runs: 0.5-0.65 ms at 1, 0.6-1.0 at 8, 1.1-1.5 at 32), and
  does not depend on how long before stage 1 freed the input came (flat from 0 to 2 ms). Until
  2026-12-05 only restarts whose input came 1 ms or more before were kept (40-50 a calibration, one
  constant: 0.24-0.96 ms over MoE rounds 25-28); that sample is kept as ``turnaround_waited`` and is
  what ``path_fits.fit_turnaround`` fits by default (a line by requests was tried in docs/validation.md
  part 21 and not adopted: this run's restarts are bimodal, and its few at small counts set the slope).
* ``turnaround_wide``: every restart of one more run at two stages with four times the requests and running
  sequences (:data:`WIDE`: micro-batches of 1-32 requests, where the run above has 1-8), one row each as
  :func:`each_restart` gives them; ``path_fits.fit_turnaround(..., wide=True)`` fits a line by requests through
  them (docs/validation.md part 26: adopted; part 28 (a): reverted on fresh readings, the constant charged again).
* ``ring_launch`` and ``ring_return``: launch and return from a third run at two stages with the
  sampled-token ring (``trtllm-slots``: ``engine/datapath.py``'s ``RingSender`` -> rank 0's
  ``RingForwarder`` thread -> the core's queue): 0.64-0.88 ms per return in validation traces against
  the one 8-byte hop (0.08 ms) charged before, and rank 0 posting the ring's receive for every step.
  Each launch from the step's own schedule (:func:`step_paths`); ``ring_launch_any`` (split ``record``) keeps
  them as measured until docs/validation.md part 35, from whichever schedule came last, the empty one the
  ``trtllm-slots`` core runs after the step's own included (``calibrate.fit_all(..., ring_own_schedule=False)``
  fits ``ring_launch`` from them).

Only gaps where the far side was waiting are kept (with more than one step in flight a launch can
also wait for the stage to finish the step before, a return for the core to finish other work).
These are wall-clock gaps: the median per ``n`` is fitted (linear in ``n``), as for every
wall-clock sample.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from ppsim.validate.path import handover_steps, restart_records, restarts, turnarounds

MULTI_PATH = ("launch", "return", "schedule", "update")  # measured at two stages as ``<kind>_multi`` too
LIVE_RUNS = 3  # live runs per pipeline depth whose stage computes are timed alone too (live_fits.fit_live)
WORKLOAD = {
    "num_prompts": 32,
    "request_rate": float("inf"),
    "random_input_len": 16,
    "random_output_len": 34,
    "random_range_ratio": 0.88,  # outputs of 4-64 tokens: the running set shrinks step by step
}


WIDE = 4  # the wide turnaround run: WIDE times the requests and running seqs (micro-batches of 1-32 at two stages)


def calibration_scenario(  # noqa: ANN201
    model: str,
    device: str,
    threads: int,
    pp: int = 1,
    policy: str = "vllm-sync",
    throttle: bool = False,
    wide: int = 1,
):
    from ppsim.config import build_scenario

    policy_cfg = {"kind": policy, **({"pp_throttle": True} if throttle else {})}
    return build_scenario(
        None,
        {
            "model": model,
            "seed": 0,
            "cluster": {"pipeline_parallel_size": pp},
            "engine": {"policy": policy_cfg, "max_num_seqs": 16 * wide},
            "workload": {**WORKLOAD, "num_prompts": WORKLOAD["num_prompts"] * wide},
            "live_engine": {"device": device, "threads_per_stage": threads},
        },
    )


def step_paths(ops: list[Any], own_schedule: bool = True) -> dict[str, list[tuple[int, float]]]:
    """``op -> [(n, seconds)]`` from an engine (or simulator) run's records (see the module doc): the
    launch to the first stage, the return from the last. A launch counts only if the first stage was
    idle when it began, a return only if the core was: with more than one step in flight the rest
    hold waits, not the path.

    A launch runs from the step's own schedule (``own_schedule``, since docs/validation.md part 35): steps
    reach the first stage in the order they were scheduled, so the k-th schedule that launched anything
    pairs with the first stage's k-th compute; a schedule that found nothing to launch (``num_reqs`` 0:
    ``trtllm-slots`` and ``vllm-mrv2`` try the next slot right after the step's own) neither starts a
    launch nor cuts one, as the simulator charges it (where the counts differ, records cut short: the first
    compute after the schedule's end). Off, as calibration measured ``ring_launch`` until part 35: the first
    compute after whichever schedule came last, an empty one included (about half its samples 0.03-0.1 ms
    where the step's own schedule was 0.45-0.6 ms before the compute)."""
    core = sorted((o for o in ops if o.track == "core"), key=lambda o: o.start_s)
    stages = sorted({o.track for o in ops if o.track.startswith("stage")}, key=lambda t: int(t[5:]))
    if not stages:
        return {}
    first = sorted((o for o in ops if o.track == stages[0] and o.kind == "compute"), key=lambda o: o.start_s)
    comp = sorted((o for o in ops if o.track == stages[-1] and o.kind == "compute"), key=lambda o: o.end_s)
    starts = [o.start_s for o in first]
    ends = [o.end_s for o in comp]
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)

    def empty(o: Any) -> bool:
        return own_schedule and o.kind == "schedule" and o.num_reqs == 0

    launched = [o for o in core if o.kind == "schedule" and o.num_reqs > 0]
    paired = own_schedule and len(launched) == len(first)  # the k-th schedule that launched: the k-th compute
    step_of = {id(o): k for k, o in enumerate(launched)} if paired else {}
    later = [o for o in core if not empty(o)]
    after = {id(a): b for a, b in zip(later[:-1], later[1:], strict=True)}  # the next core op, no empty schedule
    for i, o in enumerate(core):
        nxt = core[i + 1] if i + 1 < len(core) else None
        if o.kind == "schedule":
            out["schedule"].append((o.num_reqs, o.end_s - o.start_s))
            if empty(o):
                continue  # found nothing to launch
            j = step_of[id(o)] if paired else bisect.bisect_left(starts, o.end_s)
            cut = after.get(id(o))
            idle = j == 0 or first[j - 1].end_s <= o.end_s
            if j < len(first) and idle and (cut is None or first[j].start_s <= cut.start_s):
                out["launch"].append((first[j].num_reqs, first[j].start_s - o.end_s))
        elif o.kind == "update" and nxt is not None and nxt.kind == "schedule":
            out["update"].append((o.num_reqs, nxt.start_s - o.start_s))
            j = bisect.bisect_right(ends, o.start_s) - 1
            if j >= 0 and (i == 0 or core[i - 1].end_s <= comp[j].end_s):
                out["return"].append((comp[j].num_reqs, o.start_s - comp[j].end_s))
    return out


def handoffs(ops: list[Any]) -> list[tuple[int, float]]:
    """``[(bytes, seconds)]``: each stage-to-stage send's sender compute end -> receiver compute start,
    where the receiver had finished its previous step before the sender finished (it was waiting):
    :func:`ppsim.validate.path.handover_steps`, with the payload of the step's send."""
    sent = {
        (int(o.track[4:].split("->")[0]), o.step_id): o.nbytes
        for o in ops
        if o.kind == "send" and o.track.startswith("link") and "->" in o.track
    }
    return [(int(sent[(k, sid)]), s) for k, sid, s in handover_steps(ops) if (k, sid) in sent]


def live_steps(run: Any) -> list[dict[str, Any]]:
    """Sample rows (split ``live<stages>``) of a live engine run's stage computes, each with its plan
    (``items``), its stage (``op`` = the stage kind, ``layers``, ``start_layer``), the idle gap since the
    stage's previous compute (``gap_s``), whether its micro-batch started beside an earlier one still in
    the pipeline (``corun``: 1 or 0, :func:`ppsim.validate.steps.corun_steps`) and its wall time: what the
    profile's stage model, fitted on stages timed alone, is checked against (``live_fits.fit_live``). A
    stage's first compute, whose gap is the start-up, is left out."""
    from ppsim.validate.steps import corun_steps

    stages = run.prep.topology.stages
    co = corun_steps(list(run.ops), len(stages))
    last_end: dict[str, float] = {}
    rows = []
    for op in sorted(run.ops, key=lambda o: o.start_s):
        if op.kind != "compute" or not op.track.startswith("stage"):
            continue
        prev = last_end.get(op.track)
        last_end[op.track] = op.end_s
        plan = run.plans.get(op.step_id)
        if prev is None or plan is None or plan.is_empty:
            continue
        st = stages[int(op.track[len("stage") :])]
        kind = {(True, True): "stage_full", (True, False): "stage_first", (False, True): "stage_last"}
        t = op.end_s - op.start_s
        rows.append(
            {
                "op": kind.get((st.is_first, st.is_last), "stage_mid"),
                "split": f"live{len(stages)}",
                "layers": st.num_layers,
                "start_layer": st.start_layer,
                "items": ";".join(f"{it.start}:{it.num_tokens}" for it in plan.items),
                "gap_s": op.start_s - prev,
                "corun": int(op.step_id in co),
                "median_s": t,
                "mean_s": t,
                "repeats": 1,
                "inner": 1,
            }
        )
    return rows


def rows_of(paths: dict[str, list[tuple[int, float]]], x: str = "n") -> list[dict[str, Any]]:
    """Sample rows (median, p10, p90 per value of the feature ``x``) for the fits: wall-clock gaps, so
    the median, as for every wall-clock sample (``calibration.samples.statistic``): a busy host's one-sided delays
    would otherwise enter the fit."""
    rows = []
    for op, pairs in paths.items():
        by_n: dict[int, list[float]] = defaultdict(list)
        for n, t in pairs:
            if t >= 0:
                by_n[n].append(t)
        for n, xs in sorted(by_n.items()):
            a = np.asarray(xs)
            rows.append(
                {
                    "op": op,
                    "split": "fit",
                    x: n,
                    "median_s": float(np.median(a)),
                    "p10_s": float(np.percentile(a, 10)),
                    "p90_s": float(np.percentile(a, 90)),
                    "repeats": len(xs),
                    "inner": 1,
                }
            )
    return rows


def each_restart(ops: list[Any], run: int, loop: list[tuple] | None = None) -> list[dict[str, Any]]:
    """One ``turnaround_each`` row (split ``record``: no fit reads it) per restart of the run with two
    micro-batches in flight, so that the sample's two modes can be told apart afterwards
    (:func:`ppsim.validate.path.restart_records`; ``experiments/validation/restarts.py --calibration``):
    the step's ``step_id``, ``reqs``, ``tokens`` and ``chunk`` (its prefill tokens), ``gap_s`` (how early
    its input came), ``median_s`` (the restart), ``prev_s``, ``prev_prefill`` and ``prev_step_id`` (the stage's
    compute before: its seconds, prefill tokens and step), ``after_handover`` (1: that compute was not a restart),
    ``core_lag_s`` (the core's schedule of the step ended that long after the stage freed) and ``at_s`` (when the
    stage freed, from the run's first compute). With ``loop`` (the run's ``stage_loop.csv`` rows,
    :data:`ppsim.metrics.records.LOOP_FIELDS`), the restart's parts from the engine's stage-loop record as well:
    ``out_s`` and ``out_switched`` (the hand-on of the stage's previous outputs, and whether its thread was switched
    out in it), ``ctrl_s`` (reading control messages) and ``recv_wait_s`` (the input's receive) before the step
    (``experiments/validation/stage_loop.py`` splits a run's restarts the same way)."""
    parts = loop_parts(loop or [])
    rows = []
    for r in restart_records(ops):
        row = {
            "op": "turnaround_each",
            "split": "record",
            "run": run,
            "step_id": r["step_id"],
            "reqs": r["reqs"],
            "tokens": r["tokens"],
            "chunk": r["prefill_tokens"],
            "gap_s": r["margin_s"],
            "median_s": r["restart_s"],
            "prev_s": r["prev_s"],
            "prev_prefill": r["prev_prefill_tokens"],
            "prev_step_id": r["prev_step_id"],
            "after_handover": r["after_handover"],
            "at_s": r["at_s"],
            "repeats": 1,
        }
        if "core_lag_s" in r:
            row["core_lag_s"] = r["core_lag_s"]
        stage = int(r["link"]) + 1
        prev, this = parts.get((stage, int(r["prev_step_id"]))), parts.get((stage, int(r["step_id"])))
        if prev is not None and this is not None:
            row.update(out_s=prev["out_s"], out_switched=prev["out_switched"])
            row.update(ctrl_s=this["ctrl_s"], recv_wait_s=this["recv_wait_s"])
        rows.append(row)
    return rows


def loop_parts(loop: list[tuple]) -> dict[tuple[int, int], dict[str, float]]:
    """(stage, step id) -> that compute's ``out_s``, ``out_switched``, ``ctrl_s`` and ``recv_wait_s`` (its receive
    done after the loop took the step; 0 without a receive) from ``stage_loop.csv`` rows."""
    from ppsim.metrics.records import LOOP_FIELDS

    out = {}
    for t in loop:
        r = dict(zip(LOOP_FIELDS, t, strict=True))
        wait = r["recv_done_s"] - r["ready_s"] if r["recv_done_s"] >= 0 and r["ready_s"] >= 0 else 0.0
        keep = {"out_s": r["out_s"], "out_switched": r["out_switched"], "ctrl_s": r["ctrl_s"]}
        out[(int(r["stage"]), int(r["step_id"]))] = {**keep, "recv_wait_s": max(wait, 0.0)}
    return out


def profile_core_path(
    model: str, device: str, threads: int, alone: Callable[[list[dict[str, Any]]], None] | None = None
) -> list[dict[str, Any]]:
    """Run the live engine on the calibration workload; rows ``schedule``/``update``/``launch``/``return``
    at one stage, and where the model has two layers: the same four as ``<kind>_multi`` and ``handoff`` at two stages
    (``turnaround`` from a run with two micro-batches in flight)
    (the core puts a step message on every stage's queue, and their feeder threads share its GIL; the
    stages hand hidden states over), ``ring_launch``/``ring_return`` at two stages with the ring.

    Every run's stage computes are kept too (:func:`live_steps`, ``run`` numbering the runs), three
    runs per depth, one stage and two in turn, and ``alone`` (given: calibration's
    :func:`calibration.stage_step.time_live_alone`) times some of them again right after their own run,
    so that live and alone see the same host."""
    from engine.run import run_engine
    from ppsim.models.shape import load_model

    runs: list[Any] = []

    def serve(*args: Any) -> Any:
        """The engine on ``calibration_scenario(model, device, threads, *args)``, its serving window on
        ``time.monotonic`` kept as ``window_s``."""
        t = time.monotonic()
        run = run_engine(calibration_scenario(model, device, threads, *args), None)
        start = t + float(run.info["startup_s"])
        run.window_s = (start, start + float(run.info["wall_s"]))
        return run

    def live(run: Any) -> list[dict[str, Any]]:
        rows = [{**r, "run": len(runs)} for r in live_steps(run)]
        runs.append(run)
        if alone is not None:
            a0 = time.monotonic()
            alone(rows)
            windows = {"live_window_s": run.window_s, "alone_window_s": (a0, time.monotonic())}
            rows = [{**r, **windows} for r in rows]
        return rows

    def at_two(k: int) -> list[dict[str, Any]]:
        """The ``k``-th run at two stages: ``vllm-sync`` (launch_multi, handoff), the ring, then with two
        micro-batches in flight (turnaround: stage 1's input waits for it)."""
        if k == 0:
            pp2 = serve(2)
            two = list(pp2.ops)
            paths = step_paths(two)  # the whole control path at two stages (part 40: recorded)
            out = rows_of({f"{k}_multi": paths.get(k, []) for k in MULTI_PATH}) + live(pp2)
            return out + [{**r, "split": "live"} for r in rows_of({"handoff": handoffs(two)}, x="bytes")]
        if k == 1:
            ring_run = serve(2, "trtllm-slots")
            ring_ops = list(ring_run.ops)
            ring = step_paths(ring_ops)
            paths = {"ring_launch": ring.get("launch", []), "ring_return": ring.get("return", [])}
            anysched = {"ring_launch_any": step_paths(ring_ops, own_schedule=False).get("launch", [])}
            return rows_of(paths) + [{**r, "split": "record"} for r in rows_of(anysched)] + live(ring_run)
        queued = serve(2, "vllm-batch-queue", True)
        ops = list(queued.ops)
        waited = [(i + 1, t) for i, ts in turnarounds(ops).items() for t in ts]
        turns = [p for ps in restarts(ops).values() for p in ps]
        rows = rows_of({"turnaround": turns}, x="reqs") + rows_of({"turnaround_waited": waited}, x="stage")
        rows = [{**r, "split": "live"} for r in rows] + each_restart(ops, len(runs), queued.result.loop)
        return rows + live(queued)

    # one stage and two stages in turn, so that the host's drift over the minutes this takes falls on
    # both depths alike (their ratio is charged at PP > 1: ProfiledCost.depth_factor)
    two_stages = load_model(model).num_layers >= 2
    rows: list[dict[str, Any]] = []
    for k in range(LIVE_RUNS):
        run = serve()
        rows += (rows_of(step_paths(list(run.ops))) if k == 0 else []) + live(run)
        if two_stages:
            rows += at_two(k)
    if two_stages:  # the restarts over the requests a served micro-batch has (docs/validation.md part 26)
        wide = serve(2, "vllm-batch-queue", True, WIDE)
        rows += [{**r, "op": "turnaround_wide"} for r in each_restart(list(wide.ops), -1, wide.result.loop)]
    return rows


def shift_by_host(rows: list[dict[str, Any]], samples: list[tuple[float, float]]) -> None:
    """Set each live row's ``host_shift``: the in-run sampler's mean while its steps were timed alone over
    its mean during the live run (:func:`engine.host_sampler.window_mean`), i.e. how much slower the
    host ran for the one than for the other. ``live_fits.fit_live(shift=True)`` multiplies the run's
    live / alone ratio by it, recorded in ``meta.json`` (``live_stage_host_shifted``), not charged: the
    host's speed flips within seconds, and a run whose alone timing caught a slower spell than the run
    itself comes out too fast (one calibration measured 0.85 at one stage and 1.03 at two, a depth
    ratio of 1.21 that the engine did not show), but the sampler also reads the alone timing's hot
    loop beside it (the first calibration with it shifted every run up, by 1.02-1.26), so whether the
    shift is the host's is still to be shown. Rows without both windows, or a window with fewer than
    two samples, keep none (no shift). The window keys are removed."""
    from engine.host_sampler import window_mean

    for r in rows:
        live, alone = r.pop("live_window_s", None), r.pop("alone_window_s", None)
        if live is None or alone is None:
            continue
        during, after = window_mean(samples, *live), window_mean(samples, *alone)
        if during and after:
            r["host_shift"] = after / during
