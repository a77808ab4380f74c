"""``ppsim calibrate``: measure operators, link and CPU overheads, fit once, check on held-out shapes.

Steps: (1) time every task of the grid (:mod:`calibration.profile_ops`), (2) time ppsim's scheduler
(:mod:`calibration.cpu_overheads`) and the link (:mod:`calibration.link`), (3) fit each operator
(:mod:`calibration.fit`) with leave-one-out error, (4) fit the stage glue to the engine's own stage
steps (:mod:`calibration.stage_step`): ``layer_glue`` per layer from middle stages and the live engine's
steps timed alone (:func:`calibration.glue_fits.fit_layer_glue_live`), ``first_glue`` and ``last_glue`` from the stage
ends (the
gaps are reported), (5) predict the held-out samples, which no
fit saw, and report their errors, (6) write the artifact.

Statistic: with the thread CPU clock or CUDA events, each operator's time is the *mean* of its
samples, else the median. The simulator sums step times, so the expected cost is what it needs;
the median was there against other processes' one-sided noise in wall-clock samples, which those two
clocks do not contain. On the 2-vCPU VM of this project the speed of each vCPU flips between two
states second by second (a pure-Python loop 5.5 or 9.8 ms, a matmul loop 68 or 82 ms, at 100% CPU):
the median took the fast state and the engine's steps averaged both (median 9.5 ms, mean 10.0 ms for
one decode step over 30 s).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from calibration import stage_layers
from calibration.artifact import base_meta, check_output_dir, device_name, write_artifact
from calibration.fit import fit_select, fit_to_json, predict
from calibration.glue_fits import fit_glue, fit_stage_glue
from calibration.host_memory import check_memory
from calibration.live_fits import (
    LAST_LIVE_NOTE,
    fit_corun,
    fit_decode_batch,
    fit_depth,
    fit_last_live,
    fit_live,
    fit_spread,
    idle_live_scale,
    timed_alone,
    whole_model_steps,
)
from calibration.path_fits import back_to_back, fit_handoff, fit_idle, fit_turnaround
from calibration.samples import KINDS, features, multi_item, plan_of, stage_spec, statistic, value
from ppsim.cost.profile_check import LIVE_CHARGED, LIVE_RECORDED
from ppsim.cost.profiled import (
    REQ_OPS,
    TOKEN_OPS,
    OpFit,
    Profile,
    ProfiledCost,
    corun_ratio,
)
from ppsim.errors import PPSimError
from ppsim.live_engine import MAX_THREADS_PER_STAGE
from ppsim.models.shape import ModelShape, load_model, refuse_skew_on_dense
from ppsim.validate.host import cpu_identity, cpu_probe

# operator -> (form, feature)
FORMS: dict[str, tuple[str, str]] = {
    **{op: ("linear_floor", "tokens") for op in (*TOKEN_OPS, "embedding", "moe_router", "moe_shared")},
    "moe_experts": ("tok_exp", ""),
    "attn_prefill": ("prefill_attn", ""),
    "attn_decode": ("decode_attn", ""),
    **{op: ("linear_floor", "reqs") for op in REQ_OPS},
    "schedule": ("linear", "n"),
    "update": ("linear", "n"),
    "send_recv": ("linear", "bytes"),
    "launch": ("linear", "n"),
    "launch_multi": ("linear", "n"),
    "return": ("linear", "n"),
    # the rest of the control path at two stages: fitted, and charged at PP > 1, only with ``path_multi`` (part 40)
    "return_multi": ("linear", "n"),
    "schedule_multi": ("linear", "n"),
    "update_multi": ("linear", "n"),
    "ring_launch": ("linear", "n"),
    "ring_return": ("linear", "n"),
}
LINK_SIZES = {"quick": (1024, 65536, 1 << 20), "full": (256, 4096, 65536, 262144, 1 << 20, 1 << 22)}
STACK_BYTES = 256 * 1024**2  # whole-layer timings run up to this many bytes of distinct layers in a row
CPU_NS = {"quick": (1, 16, 64), "full": (1, 4, 16, 64, 256)}
GLUE_KIND = {"layer_glue": "stage_mid", "first_glue": "stage_first", "last_glue": "stage_last"}
LIVE_GLUE_NOTE = "; and the live engine's steps timed alone, the two sets at equal total weight (fit_layer_glue_live)"
WHOLE_GLUE_NOTE = "; its one-stage runs' only, the whole model in one stage (glue_whole, part 36)"


RING_OPS = ("ring_launch", "ring_return")  # by least absolute deviation with ``ring_lad`` (part 34; reverted by (c))
PATH_MULTI = ("return_multi", "schedule_multi", "update_multi")  # fitted only with ``path_multi`` (part 40)


def fit_all(
    rows: list[dict[str, Any]],
    stat: str = "median",
    attn_ctx: bool = False,
    ring_lad: bool = False,
    ring_own_schedule: bool = True,
    path_multi: bool = False,
) -> tuple[dict[str, OpFit], dict[str, dict[str, Any]]]:
    """Every operator's fit on its ``fit`` samples (``attn_ctx``: ``attn_prefill`` with its context term;
    ``ring_lad`` (:func:`analyse_and_write`'s default from part 34 (a) until (c) reverted it): :data:`RING_OPS` as a
    line by least absolute deviation over every recorded gap, else by relative least squares over the per-count
    medians as every other line; ``ring_own_schedule``, the default since part 35's verdict: ``ring_launch`` from its
    own samples, each launch from the step's own schedule; off, from the ``ring_launch_any`` samples where a
    calibration kept them, each launch from whichever schedule came last, as measured until part 35);
    ``path_multi``: :data:`PATH_MULTI` where the calibration measured them, which the simulator then charges at PP > 1
    (part 40: not adopted on its fresh readings, 0 for, 1 against, 5 level; recorded, not fitted, by default); off,
    the one-stage fits at every depth."""
    fits, stats = {}, {}
    for op, (form, x) in FORMS.items():
        sel = [r for r in rows if r["op"] == op and r["split"] == "fit"]
        if op in PATH_MULTI and not path_multi:
            continue
        if op == "ring_launch" and not ring_own_schedule:
            sel = [{**r, "op": op} for r in rows if r["op"] == "ring_launch_any"] or sel
        if not sel:
            continue
        form = "linear_lad" if ring_lad and op in RING_OPS else form
        forms = (form, "interp") if form == "linear_floor" else (form,)
        y = np.array([value(r, stat) for r in sel])
        fits[op], stats[op] = fit_select(op, forms, x, features(sel), y, attn_ctx)
    return fits, stats


def heldout_errors(cost: ProfiledCost, rows: list[dict[str, Any]], stat: str = "median") -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if r["op"] == "layer":
            pred = cost.layer_time(plan_of(r["items"]))
        elif r["op"] in KINDS:
            pred = cost.stage_time(stage_spec(r), plan_of(r["items"]))
        else:
            pred = predict(cost.f[r["op"]], features([r]), 0)
        measured = value(r, stat)
        out.append(
            {
                "op": r["op"],
                "plan": r.get("plan") or "",
                "tokens": r.get("tokens"),
                "measured_s": measured,
                "predicted_s": pred,
                "rel_err": (pred - measured) / measured,
            }
        )
    return out


def _median_abs(xs: list[dict[str, Any]]) -> float | None:
    return float(np.median([abs(x["rel_err"]) for x in xs])) if xs else None


def _timed_rows(
    prof: Any,
    tasks: Any,
    progress: Any,
    rounds: int,
    model: str,
    device: str,
    threads: int | None,
    quick: bool,
    log: Callable[[str], None],
    corun: Any = None,
) -> list[dict[str, Any]]:
    """Every timed row of a calibration but the link's: the operator grid, the micro-benchmarks, the
    live engine's core path and stage steps, and with ``corun`` (a :class:`calibration.corun.CoRunner`,
    CPU) one co-run reading at the start of every grid round and one after the live runs."""
    corun_rows: list[dict[str, Any]] = []

    def round_start(i: int, n: int, t: Any) -> None:
        if corun is not None and i % len(tasks) == 0:
            corun_rows.extend(corun.reading(1))
        progress(i, n, t)

    rows = prof.run(tasks, round_start, rounds)
    kind = "quick" if quick else "full"
    clock = prof.timer.clock
    log(f"scheduler CPU overheads over n={CPU_NS[kind]} requests (micro-benchmark, kept for reference)")
    from calibration.cpu_overheads import profile_cpu

    micro = profile_cpu(CPU_NS[kind], repeats=5, clock=clock if device == "cpu" else "wall")
    log("engine control path between two bare processes (micro-benchmark, kept for reference)")
    from calibration.control import profile_control

    micro += profile_control(CPU_NS[kind], repeats=15 if quick else 40)
    rows += [{**r, "split": "micro"} for r in micro]
    log("engine core and control path on the live engine (one stage, 32 requests)")
    from calibration.core_path import profile_core_path
    from calibration.stage_step import time_live_alone

    # each live run's stage steps timed again alone right after it (the live engine's factor)
    rows += profile_core_path(model, device, threads or 1, lambda live: time_live_alone(prof.stages, prof.timer, live))
    if corun is not None:
        n = corun.readings + 1
        log(f"a stage's steps while another stage computes on the host's cores, and alone (stage_corun, {n} readings)")
        corun_rows.extend(corun.reading(1))
    return rows + corun_rows


def model_inputs(model: str) -> dict[str, str]:
    """``--model`` as a path the calibration reads (a config.json or a directory holding one), else nothing:
    the profile written may not replace it."""
    from ppsim.models.shape import list_presets

    return {} if model in list_presets() else {"--model": model}


def calibrate(
    model: str,
    device: str,
    out: str,
    quick: bool = False,
    threads: int | None = 1,
    dtype: str | None = None,
    link: bool = True,
    log: Callable[[str], None] | None = None,
    clock: str = "auto",
    router_zipf: float = 0.0,
) -> dict[str, Any]:
    """Run the whole calibration and write the artifact to ``out``; returns ``meta``.

    ``clock`` "auto" times CPU operators by thread CPU time when one torch thread runs them (robust on
    a shared host), else by wall clock; CUDA always uses CUDA events; the link always wall clock.
    ``threads`` >= 1 sets torch's CPU threads (``None`` leaves torch's default). ``threads`` and ``out``
    are checked before any profiling. ``router_zipf``: a MoE model's router skew (``engine/moe.py``),
    under which the router's expert load is measured for the cost model.
    """
    if threads is not None and threads < 1:
        raise PPSimError(f"--threads: {threads} is not a thread count; use 1 or more (default 1)")
    if threads is not None and threads > MAX_THREADS_PER_STAGE:
        raise PPSimError(
            f"--threads: {threads} is more than {MAX_THREADS_PER_STAGE}, the most torch threads a stage process "
            "may run (the live engine's limit); give about the CPU cores, e.g. 4"
        )
    check_output_dir(out, inputs=model_inputs(model))
    import torch

    from calibration.core_path import shift_by_host
    from calibration.corun import CoRunner
    from calibration.layer import TORCH_DTYPES, Layer
    from calibration.link import profile_link
    from calibration.profile_ops import FULL, QUICK, OpProfiler
    from calibration.timer import Timer
    from engine.host_sampler import SAMPLER_KIND, model_sampler
    from engine.probe import model_probe, model_probe_fits, model_probe_kind, stage_probe

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if device == "cuda" and not torch.cuda.is_available():
        raise PPSimError("--device cuda: torch sees no CUDA device; use --device cpu")
    shape: ModelShape = load_model(model)
    if getattr(shape, "attention", "gqa") == "mla":
        raise PPSimError(
            f"--model {model}: the profiler times Llama-style layers, dense or MoE; MLA is not profiled yet"
        )
    if router_zipf < 0:
        raise PPSimError(f"--moe-router-zipf: {router_zipf} is negative; use 0 (router alone) or more")
    if router_zipf:
        refuse_skew_on_dense(shape, "--moe-router-zipf", shape.name, "--moe-router-zipf", "the router skew")
    dtype = shape.dtype if dtype is None else dtype
    if dtype not in TORCH_DTYPES:
        raise PPSimError(f"--dtype: {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    check_memory(shape, dtype, TORCH_DTYPES[dtype].itemsize, STACK_BYTES, device)
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    probes: list[float] = []  # the host's speed at the start of each round and at the end (CPU only)
    steps: list[float] = []  # the same for the engine's own step (engine/probe.py)
    wholes: list[float] = []  # and for this model's whole step, if it fits (engine/probe.py::model_probe)
    grid = QUICK if quick else FULL
    if clock == "auto":
        clock = "thread" if device == "cpu" and torch.get_num_threads() == 1 else "wall"
    if clock == "thread" and (device != "cpu" or torch.get_num_threads() != 1):
        raise PPSimError("--clock thread: needs --device cpu and --threads 1 (thread CPU time misses other threads)")
    timer = Timer(device, clock=clock, repeats=3, warmup=2, min_repeat_s=0.002 if quick else 0.005)
    rounds = 2 if quick else 6
    layer = Layer(shape, dtype, device, router_zipf=router_zipf)
    stack = max(1, min(shape.num_layers, STACK_BYTES // max(1, layer.weight_bytes())))
    prof = OpProfiler(layer, timer, stack=stack)
    tasks = prof.tasks(grid) + stage_layers.tasks(prof)

    def host_readings() -> None:
        probes.append(cpu_probe()[0])
        steps.append(stage_probe())
        if model_probe_fits(shape):
            wholes.append(model_probe(shape))

    def progress(i: int, n: int, t: Any) -> None:
        if device == "cpu" and i % len(tasks) == 0:  # the host guard's probes (ppsim/validate/host.py)
            host_readings()
        if i % 50 == 0 or i == n - 1:
            log(f"[{i + 1}/{n}] {t.op} {t.plan or t.feats}  ({time.perf_counter() - t0:.0f} s)")

    # the host's speed through the whole timing, by the in-run sampler (engine/host_sampler.py)
    cpu = device == "cpu"
    with (
        model_sampler(shape) if cpu else contextlib.nullcontext() as sampler,
        CoRunner(prof.stages, shape, dtype) if cpu else contextlib.nullcontext() as corun,
    ):
        rows = _timed_rows(prof, tasks, progress, rounds, model, device, threads, quick, log, corun)
    sampled = sampler.stats()["mean_s"] if sampler is not None else None
    shift_by_host(rows, sampler.samples() if sampler is not None else [])  # the live factor's host shift
    kind = "quick" if quick else "full"
    if probes:
        host_readings()
    backend = None
    if link:
        log(f"link ping-pong over {LINK_SIZES[kind]} bytes")
        lrows = profile_link(LINK_SIZES[kind], repeats=20 if quick else 50, device=device)
        backend = lrows[0]["backend"]
        rows += lrows
    # the profile is of this dtype: a scenario whose model runs another dtype must not load it
    nbytes = torch.empty(0, dtype=TORCH_DTYPES[dtype]).element_size()
    measured = shape.model_copy(
        update={"dtype": dtype, "dtype_bytes": nbytes, "weight_dtype": dtype, "kv_cache_dtype": dtype}
    )
    meta = base_meta(
        measured, "ppsim calibrate", device_name(device), dtype, torch.get_num_threads(), 1, torch.__version__
    )
    if shape.is_moe:
        from calibration.moe_ops import router_load

        meta["moe"] = {
            "router_zipf": router_zipf,
            "expert_load": router_load(shape, router_zipf),
            "note": "P(token picks expert e), engine-initialised routers on unit-RMS states",
        }
    meta.update(
        {
            "grid": kind,
            "clock": clock,
            "statistic": statistic(clock, device),
            "rounds": rounds,
            "link_backend": backend,
            "layer_stack": stack,
            **({"host_cpu": cpu_identity()} if device == "cpu" else {}),
            **({"host_probe_s": sum(probes) / len(probes), "host_probes_s": probes} if probes else {}),
            **({"host_stage_probe_s": sum(steps) / len(steps), "host_stage_probes_s": steps} if steps else {}),
            **(
                {
                    "host_model_probe_s": sum(wholes) / len(wholes),
                    "host_model_probes_s": wholes,
                    "host_model_probe": model_probe_kind(shape),
                }
                if wholes
                else {}
            ),
            **({"host_sampler_s": sampled, "host_sampler": SAMPLER_KIND} if sampled and sampled > 0 else {}),
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    )
    return analyse_and_write(rows, shape, meta, out)


def analyse_and_write(
    rows: list[dict[str, Any]],
    shape: ModelShape,
    meta: dict[str, Any],
    out: str,
    relative_glue: bool = True,
    charge_stage_layers: bool = False,
    glue_live: bool = True,
    turnaround_by_reqs: bool = False,
    turnaround_b2b: bool = False,
    turnaround_held: bool = False,
    turnaround_wide: bool = False,
    turnaround_wide_b2b: bool = False,
    charge_live: bool = False,
    glue_sq: bool = False,
    multi_items: bool = False,
    glue_per_decode: bool = False,
    glue_tok_prefill: bool = False,
    spread_by_gap: bool = False,
    attn_ctx: bool = False,
    glue_prefill_step: bool = False,
    glue_prefill_log: bool = False,
    ring_lad: bool = False,
    ring_own_schedule: bool = True,
    glue_whole: bool = True,
    path_multi: bool = False,
    last_live: bool = False,
    decode_batch: bool = True,
    decode_batch_shape: bool = False,
) -> dict[str, Any]:
    """Fit every operator, the stage glue, score the held-out samples, and write the artifact. ``stage_layers``
    (:mod:`calibration.stage_layers`) is recorded in ``meta.json`` (docs/validation.md parts 17 and 20: charged from
    part 19 until part 20's fresh readings reverted it). ``charge_stage_layers=True`` puts it in the fits, fitted before
    the glue, whose live steps' stages it prices; the profiled cost charges it and the live ratios are over that model.
    ``turnaround_by_reqs``: the turnaround by the step's requests (part 21: tried, not adopted;
    :func:`calibration.path_fits.fit_turnaround`);
    ``turnaround_b2b`` (the default from part 24's verdict until part 25 (a) reverted it on its fresh readings): the
    same line through the back-to-back restarts only, where the calibration kept them (else, and with it off, the
    constant); ``turnaround_held`` that line charged at no more requests than those restarts had (part 25 (c): not
    adopted); ``turnaround_wide`` the line through the restarts of calibration's wide run, 1-32 requests (the default
    from part 26's verdict until part 28 (a) reverted it on its fresh readings), ``turnaround_wide_b2b`` through its
    back-to-back ones only (part 28 (b): moot once (a) reverted the line).
    ``charge_live``: the simulator charges the live fits (level, depth ratio, co-run; meta ``live_charges``
    "charged"), as every calibration did until part 25 (b); by default they are fitted and recorded only
    ("recorded"). ``glue_sq``: ``layer_glue`` with a term on
    the plan's prefill items' tokens squared, else (1, tokens, requests); ``multi_items``: the glue also on the grid's
    stage plans of many prefill items, else without them, as calibrations before had none; ``glue_per_decode``: the
    glue's request term over decode requests only. The three were judged and not adopted (docs/validation.md, part 22);
    ``experiments/validation/glue_live.py refit --compare`` reproduces them on any calibration since.
    ``glue_tok_prefill``: the glue's token term from the grid's one-item prefill plans alone (part 27: not adopted).
    ``spread_by_gap``: ``stage_spread`` as two tables split by the gap before the step
    (:func:`calibration.live_fits.fit_spread`; the default
    from part 29's verdict until part 29 (b) reverted it on its fresh readings; by default one pooled table).
    ``attn_ctx``: ``attn_prefill`` with a term on each item's context, chunk + prefix (part 30 (a): adopted; (c):
    reverted on its fresh readings; by default the four-term form). ``glue_prefill_step``: ``layer_glue`` charges a step
    holding a prefill item once (``pstep``) and its decode requests (``dreq``), no token term (part 31 (a): adopted;
    (c): reverted on its fresh readings; by default the (1, tokens, requests) glue, as ``glue_sq``, ``glue_per_decode``
    and ``glue_tok_prefill`` each name their own form). ``glue_prefill_log``: that charge growing with log2 of the
    step's largest prefill item's tokens (``pstep`` + ``plog`` log2 M; part 32: not the default unless its fresh
    readings adopt it). ``ring_lad`` (the default from part 34 (a)'s verdict until (c) reverted it on its fresh
    readings): ``ring_launch`` and ``ring_return`` as lines by least absolute deviation over every recorded gap, each
    per-count median weighted by its repeats; off, by relative least squares over the per-count medians.
    ``ring_own_schedule`` (the default since part 35's verdict): ``ring_launch`` from launches measured
    from the step's own schedule (:func:`calibration.core_path.step_paths`); off, from ``ring_launch_any`` where the
    calibration kept it (launches from whichever schedule came last, an empty one included, as measured before part
    35; a calibration from before part 35 has only those, as ``ring_launch``). ``glue_whole`` (the default since
    part 36's verdict): ``layer_glue``'s live steps are the one-stage runs' alone
    (:func:`calibration.live_fits.whole_model_steps`: their
    stage holds every layer), so each stage's layers are priced as a layer costs when the whole model passes through
    the host's caches each step, as in a live pipeline whose stages share the host; off, the live steps of every
    depth, as before. ``path_multi``: :func:`fit_all`'s (part 40). ``last_live`` (part 42): fits ``last_live``, the
    live last stage's excess over its priced ends from calibration's two-stage steps timed alone
    (:func:`calibration.live_fits.fit_last_live`), which the profiled cost charges at PP > 1
    (``ProfiledCost._stage_parts``).
    ``decode_batch`` (the default since part 45's verdict): charges :func:`calibration.live_fits.fit_decode_batch`, the
    live decodes timed
    alone over the stage model by requests (recorded in ``meta.json`` ``decode_batch`` either way; off: only there);
    ``decode_batch_shape`` (part 46): its shape only, each bin over the median of the steps' ratios."""
    stat = meta.get("statistic", "median")
    fits, stats = fit_all(rows, stat, attn_ctx, ring_lad, ring_own_schedule, path_multi)
    layers = stage_layers.fit(rows, fits.get("prepare_inputs"), stat, value)
    if layers is not None and charge_stage_layers:  # before the glue: the live steps' stages are priced with it
        fits["stage_layers"] = layers
    if any(r["split"] == "stage" for r in rows):
        stage_rows = [r for r in rows if r["split"] == "stage" and (multi_items or not multi_item(r))]
        alone = timed_alone(rows) if glue_live else None
        if alone and glue_whole:
            alone = whole_model_steps(alone)
        glue, gaps = fit_stage_glue(
            fits,
            meta,
            shape,
            stage_rows,
            stat,
            relative_glue,
            alone,
            glue_sq,
            glue_per_decode,
            glue_tok_prefill,
            (glue_prefill_step or glue_prefill_log) and not (glue_sq or glue_per_decode or glue_tok_prefill),
            glue_prefill_log,
        )
        note = "relative least squares: the engine's stage steps minus the operators (calibration/stage_step.py)"
        if not relative_glue:
            note = "OLS of the engine's stage steps minus the operators' prediction (calibration/stage_step.py)"
    else:  # an artifact from before stage steps were timed
        alone = None
        cost = ProfiledCost(Profile(meta, fits), shape, None, 1)
        g, gaps = fit_glue(cost, [r for r in rows if r["split"] == "layer"], stat)
        glue, note = {"layer_glue": g}, "OLS of whole layer minus sum of operators"
    fits.update(glue)
    shift = fit_last_live(fits, meta, shape, rows) if last_live else None
    if shift is not None:  # charged by ProfiledCost at PP > 1 (its stages' shares of it sum to 0 at every depth)
        fits["last_live"] = OpFit("last_live", "linear", "", {"c0": shift, "c1": 0.0})
    batch = fit_decode_batch(fits, meta, shape, rows, decode_batch_shape)
    if batch is not None:
        meta["decode_batch"] = batch.coef  # recorded (part 45); charged with ``decode_batch``, the default
        if decode_batch:
            fits["decode_batch"] = batch
    idle = fit_idle([r for r in rows if r["split"] in ("idle", "idle_paired")], stat)
    if idle is not None:
        fits["stage_idle"] = idle
    handoff = fit_handoff(fits, [r for r in rows if r["op"] == "handoff"])
    if handoff is not None:
        fits["handoff"] = handoff
    turns = [r for r in rows if r["op"] in ("turnaround", "turnaround_waited", "turnaround_each", "turnaround_wide")]
    turnaround = fit_turnaround(
        turns, turnaround_by_reqs, turnaround_b2b, turnaround_held, turnaround_wide, turnaround_wide_b2b
    )
    if turnaround is not None:
        fits["turnaround"] = turnaround
    cost = ProfiledCost(Profile(meta, fits), shape, None, 1)
    held = heldout_errors(cost, [r for r in rows if r["split"] == "heldout"], stat)
    corun = fit_corun(rows)
    if corun is not None:
        fits["stage_corun"] = corun
    charged = corun_ratio(corun) if corun is not None else 1.0  # what the pipelines charge (PP > 1)
    if idle is not None and idle.coef.get("per") == "step":  # the paired table checked on the live runs: reported
        meta = {**meta, "stage_idle_live_scale": idle_live_scale(cost, rows, charged)}
    live = fit_live(cost, rows, charged)  # after the held-out scores: those are of stages timed alone
    if live is not None:
        fits["live_stage"] = live
        if any("host_shift" in r for r in rows):  # recorded, not charged (docs/calibration.md)
            shifted = fit_live(cost, rows, charged, shift=True)
            meta = {**meta, "live_stage_host_shifted": shifted.coef if shifted is not None else None}
    depth = fit_depth(cost, rows, charged)
    if depth is not None:
        fits["live_depth"] = depth
    spread = fit_spread(cost, rows, charged, spread_by_gap)
    if spread is not None:
        fits["stage_spread"] = spread
    whole = ("layer", *KINDS)
    meta = {k: v for k, v in meta.items() if k != "stage_layers"}  # a refit's earlier record: this fit's, or none
    if layers is not None and not charge_stage_layers:  # recorded (docs/validation.md, part 17)
        meta = {**meta, "stage_layers": {**layers.coef, "note": stage_layers.NOTE + "; recorded, not charged"}}
    meta = {
        **meta,
        "live_charges": LIVE_CHARGED if charge_live else LIVE_RECORDED,
        "layer_gap": {"median_abs_rel": _median_abs([{"rel_err": g["gap_rel"]} for g in gaps]), "plans": gaps},
        "heldout": {
            "median_abs_rel_err_ops": _median_abs([h for h in held if h["op"] not in whole]),
            "median_abs_rel_err_layer": _median_abs([h for h in held if h["op"] in whole]),
            "median_abs_rel_err_all": _median_abs(held),
            "points": held,
        },
    }
    fj = {op: fit_to_json(f, stats.get(op, {})) for op, f in fits.items()}
    if idle is not None:
        per = "step" if idle.coef.get("per") == "step" else "layer"
        fj["stage_idle"].update({"note": f"extra seconds of a stage step after an idle gap, per {per}"})
    if handoff is not None:
        fj["handoff"].update({"note": "live engine's stage transfer minus send_recv, seconds per transfer"})
    if turnaround is not None:
        how = "a constant, its input 1 ms early or more"
        if turnaround.x == "reqs":
            wide = turnaround_wide and any(r["op"] == "turnaround_wide" for r in turns)
            b2b = turnaround_b2b and not wide and bool(back_to_back(turns))
            how = "by the step's requests" + (", through its back-to-back restarts (part 24)" if b2b else "")
            how += ", through its wide run's restarts (part 26)" if wide else ""
            how += ", the back-to-back ones (part 28)" if wide and turnaround_wide_b2b else ""
        fj["turnaround"].update({"note": f"live engine's stage loop between computes, input waiting, seconds; {how}"})
    if "last_live" in fj:
        fj["last_live"].update({"note": LAST_LIVE_NOTE})
    if live is not None:
        fj["live_stage"].update({"note": "live engine's stage compute / the same steps alone, by pipeline stages"})
    if depth is not None:
        fj["live_depth"].update({"note": "live engine's stage compute at two stages / at one, each over the model"})
    if spread is not None:
        fj["stage_spread"].update({"note": "live engine's step-to-step stage compute spread at two stages, mean one"})
    if layers is not None and charge_stage_layers:
        fj["stage_layers"].update({"note": stage_layers.NOTE})
    if corun is not None:
        fj["stage_corun"].update({"note": "a stage's step while another stage computes on the host / alone"})
    for name in glue:
        fj[name].update({"n_samples": sum(1 for g in gaps if g["stage"] in ("layer", GLUE_KIND[name])), "note": note})
    if alone and "layer_glue" in glue:  # fit_layer_glue_live
        n_live = sum(1 for r in alone if int(r.get("layers", 0)) > 0)
        live_note = LIVE_GLUE_NOTE + (WHOLE_GLUE_NOTE if glue_whole else "")
        fj["layer_glue"].update({"n_live_samples": n_live, "note": note + live_note})
    write_artifact(out, meta, fj, rows)
    return meta


def refit(profile_dir: str, **options: bool) -> dict[str, Any]:
    """Re-fit an artifact from its own ``samples.csv`` (after a change to the fitting code), in place; ``options``
    are :func:`analyse_and_write`'s keywords (``relative_glue=False``: :func:`calibration.glue_fits.fit_stage_glue` in
    seconds, ...)."""
    import json
    from pathlib import Path

    from calibration.artifact import read_samples

    meta = json.loads((Path(profile_dir) / "meta.json").read_text())
    shape = ModelShape(**meta["model"])
    rows = read_samples(profile_dir)
    return analyse_and_write(rows, shape, meta, profile_dir, **options)
