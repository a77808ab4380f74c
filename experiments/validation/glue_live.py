"""Two ways of fitting a calibration's stage model, compared on finished ``ppsim validate`` runs of it: by default the
stage glue fitted on the grid alone against the grid and calibration's live steps timed alone
(``glue_fits.fit_layer_glue_live``, the default since 2026-12-05); ``--compare live:layers`` that default against the
same with ``stage_layers`` charged (fitted first, pricing the live steps' stages in the glue's fit); ``--compare
waited:reqs`` today's defaults with the stage turnaround as before docs/validation.md part 21 (a constant, from the
restarts whose input came 1 ms or more early) against the same by the step's requests; ``--compare live:items``
today's glue (fitted without the grid's stage plans of many prefill items, timed since part 22) against it with them;
``--compare items:sq`` the glue with them against the same with a term on the plan's prefill items' tokens squared
(part 22); ``--compare live:dec`` today's glue against the glue with the many-item plans and its request term over
decode requests only (part 22); ``--compare waited:b2b`` the constant turnaround against a line by the step's
requests through calibration's back-to-back restarts only (part 24; calibrations that kept their restarts one by one,
``turnaround_each``); ``--compare live:bare`` today's defaults against the same with none of the live charges (level,
depth ratio, co-run: meta ``live_charges`` "recorded"; part 25; until its verdict the readings dropped those fits
from the refitted copy, the same model); ``--compare b2b:held`` and ``waited:held`` the line through the back-to-back
restarts charged at no more requests than they had (``n_max``; part 25 (c)) against that line unheld and against the
constant; ``--compare live:bareheld`` both changes together against today's defaults (part 25 (d)).

The profile is refitted from its own ``samples.csv`` both ways with today's code (copies under ``--work``; the
validation runs take no part in either fit): ``grid`` (the glue on the grid's stages alone), ``live`` (``layer_glue``
also on the live steps: what ``ppsim calibrate`` fits) and ``layers`` (``live`` with ``stage_layers`` charged). Each
run is predicted with both (the plain prediction, not a replay: ``replay_with`` on the refitted profile, every term of
it refitted alike, the depth ratio over the model included), and the script prints, per run and metric, |error|
base -> new; ``--csv`` appends one row per run and metric for the judgement over many calibrations.

``judge FILE`` reads such a file and applies the rule fixed before the readings (docs/validation.md, parts 18 and 19): a
reading is a MoE scenario (``--reading run``: its |error|) or a held-out draw (``--reading draw``, the default: the
median |error| over its scenarios); on TPOT (``live:items``, ``items:sq`` and ``live:dec``: median TTFT, the metric
prefill steps make, fixed before their readings), "for" where the new way is closer by more than 0.5 points, "against"
where further by more than 0.5, else level; adopted if "for" outnumbers "against" and, over all readings, no other
target's median |error| worsens by more than 1 point (the bubble by more than 0.01).
``experiments/validation/glue_live_readings.csv`` holds the readings part 18 was judged on (MoE rounds 19-24,
``dense-1024`` seeds 50-64), ``experiments/validation/stage_layers_readings.csv`` those of part 19,
``experiments/validation/multi_item_readings_{items,sq,dec}.csv`` those of part 22 (MoE rounds 33-35, seeds 71-73),
``experiments/validation/multi_item_readings_items_warm.csv`` those of part 23 (MoE rounds 37-42, seeds 74-75) and
``experiments/validation/turnaround_b2b_readings.csv`` those of part 24 (MoE rounds 38-42, seed 75), and
``experiments/validation/turnaround_b2b_readings_after.csv`` its fresh readings after the verdict (rounds 43-50, seeds
76-77: part 25 (a) reverted it); ``live_charges_readings.csv``, ``turnaround_held_readings_{b2b,waited}.csv`` and
``bare_held_readings.csv`` those of part 25 (b), (c) and (d), ``turnaround_wide_readings_{replay,plain}.csv`` and
``glue_tokfix_readings.csv`` those of parts 26 and 27 (MoE rounds 54-56, seed 79),
``turnaround_wide_readings_after.csv`` and ``turnaround_wideb2b_readings.csv`` those of part 28 (a) and (b) (rounds
57-59). ``--compare waited:wide`` the constant against a line by the step's requests through the restarts of
calibration's wide run (micro-batches of 1-32 requests, part 26); ``--replay`` predicts each way's speed-adjusted replay
instead (the runs' own compute speed: the host's drift between calibration and the runs falls on both ways alike and out
of the reading; the comparison is written "... replay"), which part 26 is judged on. ``--compare live:tokfix`` today's
glue against the same with its token term fitted first on the grid's plans of one prefill item alone, then the constant
and request terms with it held (part 27; judged on median TTFT, the plain prediction: a glue changes the predicted
computes the replay's factor is taken over). ``--compare wide:wideb2b`` the wide line (the default from part 26's
verdict until part 28 (a)) against the same through the wide run's back-to-back restarts only (part 28). ``--compare
pooled:busy`` the step-to-step spread as one table against two split by the gap before the step
(``live_fits.fit_spread(by_gap=True)``, part 29; a spread is mean one, so ``--replay`` holds for it);
``experiments/validation/spread_gap_readings_{replay,plain}.csv`` hold its readings (MoE rounds 60-62, seed 80),
``spread_gap_readings_insample.csv`` those of rounds 54-59, which the form was found on, and
``spread_gap_readings_after{,_plain}.csv`` the fresh readings of part 29 (b), rounds 63-65, which reverted it.
``--compare before30:ctx`` (part 30 (a)) the model before part 30 against ``attn_prefill`` with its context term
(adopted by (a), reverted by (c) on its fresh readings, ``attn_ctx_readings_after.csv``); ``before30:tokfix`` part
27's token term read again against the same base (part 30 (b): part 27's ``live:tokfix`` refitted its base with the
live charges charged since part 25 (b), its new way without them); ``before30:both`` the two together and ``ctx:both``
the token term on top of the context term. Each way names both switches, so the readings hold whatever calibrate's
defaults: ``attn_ctx_readings.csv``, ``glue_tokfix_readings_again.csv`` and ``attn_ctx_tokfix_readings.csv`` (MoE
rounds 54-67, seeds 79-81), ``attn_ctx_readings_after.csv`` and ``attn_ctx_tokfix_readings_after.csv`` (rounds 68-69,
seed 82). ``--compare before31:prestep`` (part 31) the glue before it against ``layer_glue`` charging a step that holds
a prefill item once and its decode requests, no token term (``calibrate.analyse_and_write(...,
glue_prefill_step=True)``; adopted by (a), reverted by (c)): ``prestep_readings.csv`` (MoE rounds 54-69, seeds 79-82)
and ``prestep_readings_after.csv`` (rounds 70-71, seed 83). ``--compare before31:prelog`` (part 32) that charge
growing with log2 of the step's largest prefill item (``glue_prefill_log=True``; (a) did not call for fresh
runs): ``prelog_readings.csv`` (rounds 54-71, seeds 79-83). ``--compare before34:ringlad`` (part 34) ``ring_launch``
and ``ring_return`` by relative least squares over the per-count medians against least absolute deviation over every
recorded gap (``ring_lad``, calibrate's default from (a) until (c) reverted it), a core-path change, so ``--replay``
holds: ``ringlad_readings.csv`` (replay) and ``ringlad_readings_plain.csv`` (the kept PP=2 ``sglang-ring`` and
``trtllm-slots`` scenarios of seeds 76-84 and ``tiny`` 60), ``ringlad_readings_after{,_plain}.csv`` ((c): ``tiny``
61's, run with the new fits, ``dense-1024`` 85's and ``tiny`` 62's). ``--compare before35:ownsched`` (part 35)
``ring_launch`` from calibration's launches measured from whichever schedule came last, the empty one
``trtllm-slots``' core runs after the step's own included (kept as ``ring_launch_any`` by calibrations since part 35),
against the step's own schedule (``ring_own_schedule``), both by relative least squares (calibrate's default again
since part 34 (c)); a core-path change, so ``--replay`` holds: ``ownsched_readings{,_plain}.csv`` (the PP=2 ring
scenarios of ``dense-1024`` 86 and ``tiny`` 63-64; (a) adopted it). ``--compare before36:whole`` (part 36)
``layer_glue`` fitted on the live steps of every depth against the one-stage runs' only (``glue_whole``, calibrate's
default since its verdict), a compute change, so the plain prediction: ``whole_readings.csv`` (``tiny`` seeds 65-66,
``dense-1024`` 87-88, MoE rounds 75-76; read as ``today:whole`` before the verdict, the same two fits).
``--compare before40:multi`` (part 40) the control path's return, schedule and update at PP > 1 as measured at one stage
(before it) against as measured at two (``path_multi``: ``return_multi``, ``schedule_multi``, ``update_multi`` from
calibration's two-stage run; not adopted, 0 for, 1 against, 5 level), a core-path change, so ``--replay`` holds:
``multi_readings{,_plain}.csv`` (``tiny`` 76-77, ``dense-1024`` 95, MoE round 87). ``--compare waited:wide`` read again
(part 41, after the core's heap freeze), judged on the replay with ``--probed`` beside it (each way's probe-conditioned
prediction: every stage compute times the factor the whole-model probe read before the runs, part 37):
``turnaround_wide_again_insample_{replay,plain,probed}.csv`` (the kept MoE rounds 74-88, in-sample) and
``turnaround_wide_again_readings_{replay,plain,probed}.csv`` (the runs after its rule). ``--compare before42:lastlive``
(part 42) the live last stage's excess over its priced ends charged at PP > 1 (``last_live``) against not, and
``before4142:widelast`` it and part 41's wide turnaround line together against neither: compute changes whose replay
takes each way's own factor (:func:`own_factor`) and whose probe price they leave alone, so ``--replay`` and
``--probed`` hold: ``lastlive_insample_*.csv`` and ``widelast_insample_*.csv`` (in-sample: the kept `tiny` 75-79,
``dense-1024`` 94-96 and MoE rounds 86-91), ``widelast_readings_{replay,probed,plain}.csv`` (the runs after its rule).
``--compare before45:decbatch`` (part 45) a decode-only stage compute of R requests charged calibration's live decodes
timed alone over the stage model at R (``decode_batch``) against not, judged on the replay at each way's own factor
(``--probed``: the probe's factor over each way's price of its step): ``decode_batch_seen{,_replay,_probed}.csv`` (the
draws it was found on) and ``decode_batch_readings{,_replay,_probed}.csv`` (the runs after its rule).
``--compare decbatch:decshape`` (part 46) that ratio whole against its shape only (each bin over the median of the
calibration's decode steps' ratios: the level stays the stage model's), judged on the plain prediction:
``decode_shape_seen{,_replay,_probed}.csv`` (part 45's draws, in-sample) and ``decode_shape_readings*.csv`` (after).
``today`` is calibrate's defaults.

Run: python experiments/validation/glue_live.py refit --profile DIR
         [--compare grid:live|live:layers|waited:reqs|live:items|items:sq|live:dec|waited:b2b|live:bare|
                   b2b:held|waited:held|live:bareheld|waited:wide|live:tokfix|wide:wideb2b|pooled:busy|
                   before30:ctx|before30:tokfix|before30:both|ctx:both|before31:prestep|
                   before31:prelog|before34:ringlad|before35:ownsched|before36:whole|before40:multi|
                   before42:lastlive|before4142:widelast|before45:decbatch|decbatch:decshape]
         [--work DIR] [--csv FILE] [--reading run] [--replay | --probed] RUN_DIR [...]
     python experiments/validation/glue_live.py judge FILE
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calibration import calibrate as cal  # noqa: E402
from calibration import live_fits, path_fits  # noqa: E402
from calibration.artifact import read_samples  # noqa: E402
from calibration.samples import multi_item  # noqa: E402
from engine.probe import PROBE_BATCH  # noqa: E402  (the fixed probe's requests; no torch at import)
from experiments.validation.glue_fit import approx_plan, check_refit_inputs  # noqa: E402
from experiments.validation.replay_adjusted import COLUMNS, pick, prepared, recorded_steps  # noqa: E402
from experiments.validation.runfiles import reading_run  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.cost.profiled import read_profile  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.outputs import check_apart  # noqa: E402
from ppsim.validate.run import at_speed, replay_with, speed_adjusted  # noqa: E402
from ppsim.validate.steps import inner_with  # noqa: E402

# way -> calibrate.refit's keywords
WAYS: dict[str, dict[str, bool]] = {
    "grid": {"glue_live": False, "charge_stage_layers": False},
    "live": {"glue_live": True, "charge_stage_layers": False, "charge_live": True},  # the live charges charged
    "layers": {"glue_live": True, "charge_stage_layers": True},
    "waited": {"turnaround_by_reqs": False, "turnaround_b2b": False, "turnaround_wide": False},  # the constant
    "reqs": {"turnaround_by_reqs": True, "turnaround_b2b": False, "turnaround_wide": False},  # every restart (part 21)
    "b2b": {"turnaround_b2b": True, "turnaround_wide": False},  # the line through back-to-back restarts (part 24)
    "items": {"multi_items": True},  # the glue also on the grid's plans of many prefill items (part 22)
    "sq": {"multi_items": True, "glue_sq": True},  # and a term on the prefill items' tokens squared (part 22)
    "dec": {"multi_items": True, "glue_per_decode": True},  # with them, the request term over decodes only
    "bare": {"charge_live": False},  # the simulator charging none of the live charges (part 25 (b))
    "held": {"turnaround_b2b": True, "turnaround_held": True, "turnaround_wide": False},  # b2b's line held (25 (c))
    "bareheld": {"turnaround_b2b": True, "turnaround_held": True, "charge_live": False, "turnaround_wide": False},
    "wide": {"turnaround_wide": True},  # the line by requests through the wide run's restarts, 1-32 (part 26)
    "wideb2b": {"turnaround_wide": True, "turnaround_wide_b2b": True},  # its back-to-back restarts only (part 28)
    "pooled": {"spread_by_gap": False},  # one step-to-step spread table (today's)
    "busy": {"spread_by_gap": True},  # two, split by the gap before the step (part 29; reverted, 29 (b))
    "today": {},  # calibrate's defaults today (``live`` charges the live charges, as before part 25 (b))
    # part 30: before it, each of its two changes alone, both (explicit, whatever the defaults)
    "before30": {"attn_ctx": False, "glue_tok_prefill": False},
    "ctx": {"attn_ctx": True, "glue_tok_prefill": False},  # attn_prefill with a term on each item's context
    "tokfix": {"glue_tok_prefill": True, "attn_ctx": False},  # part 27's glue token term (read again, part 30 (b))
    "both": {"attn_ctx": True, "glue_tok_prefill": True},
    # part 31: the glue as before it, and charging a step with a prefill item once (no token term)
    "before31": {"attn_ctx": False, "glue_tok_prefill": False, "glue_prefill_step": False},
    "prestep": {"attn_ctx": False, "glue_tok_prefill": False, "glue_prefill_step": True},
    # part 32: that charge growing with log2 of the step's largest prefill item
    "prelog": {"attn_ctx": False, "glue_tok_prefill": False, "glue_prefill_step": True, "glue_prefill_log": True},
    # part 34: ring_launch and ring_return by relative least squares (before it) or least absolute deviation
    "before34": {"ring_lad": False},
    "ringlad": {"ring_lad": True},
    # part 35: ring_launch from launches measured from whichever schedule came last (before it) or the step's own
    "before35": {"ring_lad": False, "ring_own_schedule": False},
    "ownsched": {"ring_lad": False, "ring_own_schedule": True},
    # part 36: the layer glue on the live steps of every depth (before it) or of the one-stage runs only (the whole
    # model's footprint; calibrate's default since its verdict; its readings were taken as ``today:whole`` before it)
    "before36": {"glue_whole": False},
    "whole": {"glue_whole": True},
    # part 40: the control path's return, schedule and update at PP > 1 as measured at one stage, or at two
    "before40": {"path_multi": False},
    "multi": {"path_multi": True},
    # part 42: the live last stage's excess over its priced ends, charged at PP > 1 (its stages' shares sum to 0)
    "before42": {"last_live": False},
    "lastlive": {"last_live": True},
    # part 42 (b): with part 41's wide turnaround line, both against neither
    "before4142": {"last_live": False, "turnaround_wide": False},
    "widelast": {"last_live": True, "turnaround_wide": True},
    # part 45: a decode-only stage compute times calibration's live decodes alone over the stage model, by requests
    "before45": {"decode_batch": False},
    "decbatch": {"decode_batch": True},
    # part 46: its shape across request counts only, the calibration's decodes timed alone keeping the model's level
    "decshape": {"decode_batch": True, "decode_batch_shape": True},
}
COMPARES = (
    "grid:live",
    "live:layers",
    "waited:reqs",
    "live:items",
    "items:sq",
    "live:dec",
    "waited:b2b",
    "live:bare",
    "b2b:held",
    "waited:held",
    "live:bareheld",
    "waited:wide",
    "live:tokfix",
    "wide:wideb2b",
    "pooled:busy",
    "before30:ctx",
    "before30:tokfix",
    "before30:both",
    "ctx:both",
    "before31:prestep",
    "before31:prelog",
    "before34:ringlad",
    "before35:ownsched",
    "before36:whole",
    "before40:multi",
    "before42:lastlive",
    "before4142:widelast",
    "before45:decbatch",
    "decbatch:decshape",
)
TURNAROUNDS = ("waited:reqs", "waited:b2b", "b2b:held", "waited:held", "waited:wide", "wide:wideb2b")
# the mean stage computes alike: the replay's factor holds for both (part 34's ring fits are core path, not computes)
REPLAYABLE = (*TURNAROUNDS, "pooled:busy", "before34:ringlad", "before35:ownsched", "before40:multi")
# compute changes a replay reads at each way's own factor (the runs' stage seconds over the recorded predictions moved
# to that way's prices, :func:`own_factor`), and whose probe price (the whole model at one stage) they leave alone
OWN_FACTOR = ("before42:lastlive", "before4142:widelast", "before45:decbatch", "decbatch:decshape")
FIELDS = ("compare", "reading", "profile", "run", "metric", "base", "new")
PRIMARY = "mean_tpot_ms"
TTFT_JUDGED = (
    "live:items",
    "items:sq",
    "live:dec",
    "live:tokfix",
    *(c for c in COMPARES if "both" in c or "30" in c),
    "before31:prestep",
    "before31:prelog",
)
PRIMARY_OF = dict.fromkeys(TTFT_JUDGED, "median_ttft_ms")
BUBBLE = "pipeline_bubble_fraction"
CLOSER = 0.005  # a reading moves "for" or "against" beyond half a point of TPOT
WORSE = {BUBBLE: 0.01}  # how far another target's median |error| may worsen (1 point, the bubble 0.01)


def refit_copy(profile: Path, dst: Path, way: str) -> Path:
    """``profile`` copied to ``dst`` and refitted with the glue fitted ``way`` (``bare`` and ``bareheld``: the live
    charges recorded, not charged; ``live`` charged, as before part 25 (b)). Every way but ``today`` and those that
    name it fits the (1, tokens, requests) glue its readings were taken with, not part 31's ``prestep``."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(profile, dst)
    before31 = {} if way == "today" else {"glue_prefill_step": False}
    cal.refit(str(dst), **{**before31, **WAYS[way]})
    return dst


def own_factor(steps: list[dict[str, str]], stages: Any, base: Any, cost: Any) -> float:
    """The runs' measured stage seconds over their recorded predictions moved to ``cost``: each engine stage compute's
    recorded prediction (made with ``base``, the calibration as it was) plus ``cost``'s price of its plan minus
    ``base``'s (the plan rebuilt from the step's counts, :func:`glue_fit.approx_plan`; ``stages``, the run's): the
    replay's speed factor for a way that prices the computes otherwise."""
    measured = moved = 0.0
    for r in steps:
        spec = stages[int(r["stage"])]
        T, R, P = int(r["num_tokens"]), int(r["num_reqs"]), int(r["num_prefill_tokens"])
        plan = approx_plan(T, R, P, int(r["decode_ctx_tokens"]))
        measured += float(r["measured_s"])
        moved += float(r["predicted_s"]) + cost.stage_time(spec, plan) - base.stage_time(spec, plan)
    if measured <= 0 or moved <= 0:
        raise PPSimError("no stage computes in step_costs.csv to take the runs' speed from; give finished runs")
    return measured / moved


def batch_ratio(cost: Any, reqs: int) -> float:
    """``cost``'s ``decode_batch`` ratio at ``reqs`` (the profiled cost inside the wrappers that add the ring's
    return and the like; 1 for a model without it)."""
    cost = inner_with(cost, "decode_batch_ratio")
    return cost.decode_batch_ratio(reqs) if hasattr(cost, "decode_batch_ratio") else 1.0


def predicted(
    run: Path, profile: Path, replay: bool = False, probed: bool = False, base: Any = None
) -> dict[str, float]:
    """The run's scenario simulated with ``profile``, its errors against the run's engine summaries; with ``replay``
    the speed-adjusted replay instead (every stage compute times the runs' measured over recorded stage time, from the
    run's ``step_costs.csv``: :func:`ppsim.validate.run.speed_adjusted`; the turnaround and the core path unscaled).
    The factor is over the predictions the run recorded, so a run made with another compute model than the refit's
    (another depth or level charge: ``replay_adjusted.py`` handles those) would be scaled off; every reading of parts
    26 and 28 was a fresh run of its own calibration. With ``probed`` the probe-conditioned prediction (part 37: every
    stage compute times the factor the whole-model probe read before the repeats, ``probe_conditioned`` in the run's
    ``validation.json``; nothing read after a run started), which part 41 checks its replay's verdict against. With
    ``replay`` and ``base`` (the cost model of the calibration the runs were predicted with), the replay at this
    profile's own factor (:func:`own_factor`: part 42's compute change); with ``probed`` and ``base``, the probe's
    factor over this profile's price of the probe's step (its recorded ``step``, the fixed probe's 4 requests for a
    run from before part 44): part 45's ``decode_batch`` moves that price by its ratio at the step's requests."""
    v, prep = prepared(run, str(profile))
    if replay and base is not None:
        with (run / "step_costs.csv").open(newline="") as f:
            steps = list(csv.DictReader(f))
        factor = own_factor(steps, prep.topology.stages, base, prep.cost)
        return pick(at_speed(prep, factor, v["engine_summaries"])["rows"])
    if probed:
        pc = v.get("probe_conditioned") or {}
        factor = pc.get("factor")
        if factor is None:
            raise PPSimError(f"{run}: no probe-conditioned prediction in validation.json; give runs of ppsim validate")
        if base is not None:  # the probe's step priced by this way: a whole-model decode, moved by decode_batch only
            batch = int((pc.get("step") or [PROBE_BATCH])[0])
            factor = float(factor) * batch_ratio(base, batch) / batch_ratio(prep.cost, batch)
        return pick(at_speed(prep, float(factor), v["engine_summaries"])["rows"])
    if not replay:
        return pick(replay_with(prep, prep.cost, v["engine_summaries"])["rows"])
    adjusted = speed_adjusted(prep, recorded_steps(run), v["engine_summaries"])
    if adjusted is None:
        raise PPSimError(f"{run}: no stage computes in step_costs.csv to take the runs' speed from; give finished runs")
    return pick(adjusted["rows"])


def check_inputs(args: argparse.Namespace) -> None:
    """The profile (readable, with its samples and live steps), the run dirs, ``--work`` and ``--csv``, before
    any refit."""
    inputs = check_refit_inputs(
        args, tuple(args.compare.split(":")), ("validation.json",), "a calibration with live runs"
    )
    if args.csv is not None:
        check_apart(Path(args.csv), "--csv", inputs)
        if Path(args.csv).is_dir():
            raise PPSimError(f"--csv: {args.csv} is a directory; give a file to append to")


def glue_live(args: argparse.Namespace) -> None:
    check_inputs(args)
    samples = read_samples(args.profile)
    if not live_fits.timed_alone(samples):
        raise PPSimError(f"--profile: {args.profile} has no live steps timed alone; calibrate with the live engine")
    if "layers" in args.compare and not any(r["op"] == "stage_layers" for r in samples):
        raise PPSimError(f"--profile: {args.profile} has no stage_layers samples; calibrate with today's code")
    if "reqs" in args.compare and not any(r["op"] == "turnaround" and "reqs" in r for r in samples):
        raise PPSimError(
            f"--profile: {args.profile} has no turnaround samples by requests; calibrate with today's code"
        )
    ways = [WAYS[w] for w in args.compare.split(":")]
    if any(w.get("turnaround_wide") for w in ways) and not any(r["op"] == "turnaround_wide" for r in samples):
        raise PPSimError(
            f"--profile: {args.profile} has no wide run's restarts (turnaround_wide); calibrate with today's code"
        )
    if any(w in args.compare for w in ("b2b", "held")) and not path_fits.back_to_back(samples):  # bareheld too
        raise PPSimError(
            f"--profile: {args.profile} has no back-to-back restarts one by one (turnaround_each); "
            "calibrate with today's code"
        )
    if "before35" in args.compare and not any(r["op"] == "ring_launch_any" for r in samples):
        raise PPSimError(
            f"--profile: {args.profile} has no ring launches from any schedule (ring_launch_any); "
            "calibrate with today's code"
        )
    if "multi" in args.compare.split(":") and not any(r["op"] in cal.PATH_MULTI for r in samples):
        raise PPSimError(
            f"--profile: {args.profile} has no control path measured at two stages (return_multi); "
            "calibrate with today's code"
        )
    if (
        any(w.get("last_live") for w in ways)
        and len(live_fits.last_live_pairs(samples)) < live_fits.LAST_LIVE_MIN_PAIRS
    ):
        raise PPSimError(
            f"--profile: {args.profile} has no two-stage live steps timed alone at both stages; calibrate with today's "
            "code"
        )
    needs_many = any(w in args.compare for w in ("items", "dec"))
    if needs_many and not any(r["split"] == "stage" and multi_item(r) for r in samples):
        raise PPSimError(
            f"--profile: {args.profile} has no stage plans of many prefill items; calibrate with today's code"
        )
    for flag in ("replay", "probed"):
        if getattr(args, flag) and args.compare not in (*REPLAYABLE, *OWN_FACTOR):
            raise PPSimError(
                f"--{flag}: {args.compare} changes the predicted stage computes the {flag} speed factor is taken "
                f"over; drop --{flag}, or compare turnarounds, spreads or the ways a replay reads at their own "
                f"factor ({', '.join((*REPLAYABLE, *OWN_FACTOR))})"
            )
    base, new = args.compare.split(":")
    profiles = {w: refit_copy(Path(args.profile), Path(args.work) / w, w) for w in (base, new)}
    calibrated = f"{args.profile}@{read_profile(args.profile).meta.get('date', '')}"  # a reused path stays apart
    for w, p in profiles.items():
        fits = read_profile(str(p)).fits
        c = {k: v * 1e6 for k, v in fits["layer_glue"].coef.items()}
        t = fits.get("turnaround")
        turn = f"; turnaround {t.coef['c0'] * 1e6:.0f} us + {t.coef['c1'] * 1e6:.1f} us/req" if t is not None else ""
        turn += f" up to {t.coef['n_max']:.0f} req" if t is not None and "n_max" in t.coef else ""
        share = f", sq {c['sq'] * 1e3:.3f} us per 1000 squared tokens" if "sq" in c else ""
        share += f", dreq {c['dreq']:6.2f} us a decode request" if "dreq" in c else ""
        share += f", pstep {c['pstep']:7.1f} us a prefill step" if "pstep" in c else ""
        share += f", plog {c['plog']:7.1f} us x log2 largest item" if "plog" in c else ""
        sp = fits.get("stage_spread")
        if sp is not None and "ys_idle" in sp.coef:  # part 29's two tables
            sds = (statistics.pstdev(sp.coef[k]) for k in ("ys", "ys_idle"))
            turn += "; spread sd {:.3f} busy, {:.3f} after gaps".format(*sds)
        elif sp is not None:
            turn += f"; spread sd {statistics.pstdev(sp.coef['ys']):.3f}"
        print(f"layer_glue {w:6s}: c0 {c['c0']:7.1f} us, tok {c['tok']:6.2f} us, req {c['req']:6.2f} us{share}{turn}")
    out = []
    for run in map(Path, args.runs):
        with reading_run(run, "runs"):
            own = (args.replay or args.probed) and args.compare in OWN_FACTOR
            was = prepared(run, args.profile)[1].cost if own else None
            errs = {w: predicted(run, p, args.replay, args.probed, was) for w, p in profiles.items()}
        cells = "  ".join(f"{m} {abs(errs[base][m]):.3f}->{abs(errs[new][m]):.3f}" for m in COLUMNS if m in errs[base])
        print(f"{run.name}: {cells}")
        reading = f"{calibrated}:{run}" if args.reading == "run" else calibrated
        out += [
            [
                args.compare + (" replay" if args.replay else " probed" if args.probed else ""),
                reading,
                args.profile,
                str(run),
                m,
                errs[base][m],
                errs[new][m],
            ]
            for m in COLUMNS
            if m in errs[base]
        ]
    if args.csv is not None:
        fresh = not Path(args.csv).exists()
        with open(args.csv, "a", newline="") as f:
            w = csv.writer(f)
            if fresh:
                w.writerow(FIELDS)
            w.writerows(out)


def readings(path: str) -> tuple[str, dict[str, dict[str, tuple[float, float]]]]:
    """The comparison, and reading -> metric -> (|error| base, |error| new way), the median over the reading's
    runs: a held-out draw (``refit --reading draw``: one calibration's runs) or one run (``--reading run``: a MoE
    round's B)."""
    by: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    compares = set()
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            compares.add(r["compare"])
            by[r["reading"]][r["metric"]].append((abs(float(r["base"])), abs(float(r["new"]))))
    if len(compares) > 1:
        raise ValueError(f"rows of {len(compares)} comparisons, {', '.join(sorted(compares))}: judge one at a time")
    return next(iter(compares), ""), {
        k: {m: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for m, v in ms.items()}
        for k, ms in by.items()
    }


def judge(path: str) -> None:
    try:
        compare, got = readings(path)
    except (OSError, KeyError, ValueError) as e:
        raise PPSimError(f"judge: {path}: not a glue_live.py --csv file ({e}); give the file --csv wrote") from None
    primary = PRIMARY_OF.get(compare, PRIMARY)
    if not got or any(primary not in ms for ms in got.values()):
        raise PPSimError(f"judge: {path}: a reading without {primary}; give the file --csv wrote")
    tally = {"for": 0, "against": 0, "level": 0}
    for k, ms in got.items():
        g, v = ms[primary]
        tag = "for" if g - v > CLOSER else "against" if v - g > CLOSER else "level"
        tally[tag] += 1
        print(f"{k}: {primary} |error| {g:.1%} -> {v:.1%} {tag}")
    worse = []
    for m in COLUMNS:
        pairs = [ms[m] for ms in got.values() if m in ms]
        if not pairs:
            continue
        g, v = (statistics.median(p[i] for p in pairs) for i in (0, 1))
        shown = f"{g:.3f} -> {v:.3f} pts" if m == BUBBLE else f"{g:.1%} -> {v:.1%}"
        print(f"  median over {len(pairs)} readings, {m}: {shown}")
        if m != primary and v - g > WORSE.get(m, 0.01):
            worse.append(m)
    adopted = tally["for"] > tally["against"] and not worse
    print(
        f"for {tally['for']}, against {tally['against']}, level {tally['level']}; other targets worse: "
        f"{', '.join(worse) or 'none'}: {'adopted' if adopted else 'not adopted'}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/glue_live.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rf = sub.add_parser("refit", help="refit one calibration both ways and predict its runs with each")
    rf.add_argument("runs", nargs="+", help="ppsim validate output dirs of one calibration")
    rf.add_argument("--profile", required=True, help="that calibration (with its live runs' steps timed alone)")
    rf.add_argument("--compare", choices=COMPARES, default=COMPARES[0], help="the two ways, base:new")
    rf.add_argument("--work", default="/tmp/ppsim-glue-live", help="where the two refitted copies go")
    rf.add_argument("--csv", default=None, help="append one row per run and metric to this file")
    rf.add_argument(
        "--reading",
        choices=("draw", "run"),
        default="draw",
        help="what judge counts as one reading: the calibration's runs together (a held-out draw) or each run (MoE)",
    )
    speed = rf.add_mutually_exclusive_group()
    speed.add_argument(
        "--replay",
        action="store_true",
        help="each way's speed-adjusted replay (the runs' compute speed) in place of its prediction (part 26)",
    )
    speed.add_argument(
        "--probed",
        action="store_true",
        help="each way's probe-conditioned prediction (the probe's reading before the runs, part 37) instead (part 41)",
    )
    jg = sub.add_parser("judge", help="the pre-committed rule over the readings of a --csv file")
    jg.add_argument("file")
    args = ap.parse_args(argv)
    return run_main(lambda: glue_live(args) if args.cmd == "refit" else judge(args.file))


if __name__ == "__main__":
    sys.exit(main())
