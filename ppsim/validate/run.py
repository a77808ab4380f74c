"""``ppsim validate``: the live engine and the simulator on the identical workload, compared.

Both sides are resolved from one scenario by :func:`ppsim.deployment.prepare` (same requests, same
arrival times, same partition and policy). The simulator uses the engine's KV pool size, so every
scheduling decision can match, and the cost model of a calibration artifact (``--profile DIR``)
measured on this machine. The engine runs ``repeats`` times; its run-to-run spread is reported
beside the simulator's error, and the host is read around every repeat (:mod:`ppsim.validate.host`).
The first figure to read is the step-level cost error (:mod:`ppsim.validate.steps`): the cost
model against the engine's own micro-batches, free of the batching feedback.
"""

from __future__ import annotations

import dataclasses
import json
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppsim.config import Scenario, scenario_json
from ppsim.cost.scaled import JitteredCompute, ScaledCompute
from ppsim.deployment import kv_figures, prepare
from ppsim.errors import PPSimError
from ppsim.metrics.io import run_files
from ppsim.metrics.summary import summarize
from ppsim.metrics.trace import chrome_trace
from ppsim.outputs import check_output_dir, write_result_set
from ppsim.report.dashboard import drawn_dashboards, series_files
from ppsim.sim.executor import simulate
from ppsim.validate.compare import compare_summaries, per_request_errors, verdict
from ppsim.validate.host import HostGuard, cpu_identity, host_line
from ppsim.validate.path import format_path, summarize_path
from ppsim.validate.preflight import check_repeats
from ppsim.validate.report import format_table, validation_files
from ppsim.validate.steps import corun_factor_of, format_steps, model_factor, step_costs, summarize_steps

ADJUSTED_SHOWN = ("output_throughput", "median_ttft_ms", "mean_tpot_ms", "median_e2el_ms")


def cpu_seconds() -> tuple[float, float]:
    """(this process: the engine core and its threads, reaped children: the stage processes), CPU s.

    Children count once they have exited and been waited for, so the stages' share includes their
    start-up (imports, weights, warm-up)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def cpu_of(run: Any, opts: Any) -> dict[tuple[int, int], float]:
    """The stages' compute CPU times; none on CUDA, where a stage's thread waits for the GPU."""
    return run.stage_cpu_s if opts.device == "cpu" else {}


def simulate_like_engine(s: Scenario, kv_num_blocks: int) -> tuple[Any, Any, dict[str, Any]]:
    """The simulator on the engine's scenario and KV pool size: (prepared, result, summary)."""
    prep = dataclasses.replace(prepare(s), num_blocks=kv_num_blocks)
    res = simulate(prep)
    summary = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    return prep, res, summary


def validate(
    s: Scenario,
    out_dir: str | Path,
    repeats: int = 3,
    engine_options: Any = None,
    log: Callable[[str], None] = print,
    host: HostGuard | None = None,
) -> dict[str, Any]:
    """Engine ``repeats`` times (host read before and after each), the simulator once, compared.

    ``host`` (default: a :class:`HostGuard` in ``flag`` mode) judges the host; in ``refuse`` mode a
    bad reading raises PPSimError before anything of the validation itself is written."""
    s, out, host = prepare_validation(s, out_dir, repeats, engine_options, host)
    runs, usage = engine_repeats(s, host, range(repeats), log)
    return finish_validation(s, out, runs, usage, host, log)


def prepare_validation(
    s: Scenario, out_dir: str | Path, repeats: int, engine_options: Any = None, host: HostGuard | None = None
) -> tuple[Scenario, Path, HostGuard]:
    """The checks :func:`validate` makes before any engine run: (scenario, output directory, host guard
    with its references). For a caller that runs the repeats itself (:func:`engine_repeats`), e.g.
    interleaved with other scenarios', then :func:`finish_validation`."""
    if s.cost.kind != "profile":
        raise PPSimError(
            "validate: needs a calibration artifact of this machine; pass --profile DIR "
            "(make one with `ppsim calibrate --model MODEL --device cpu`) or --calibrate"
        )
    check_repeats(repeats)
    out = check_output_dir(out_dir)
    if engine_options is not None:  # given beside the scenario: they replace its live_engine section
        s = s.model_copy(update={"live_engine": engine_options})
    host = host if host is not None else HostGuard()
    if host.reference_s is None:
        host.reference_s = calibration_probe(s.cost.profile_dir)
    if host.mode != "off" and s.live_engine.device == "cpu" and host.cpu is None:
        host.cpu = cpu_identity()
        ref = calibration_meta(s.cost.profile_dir).get("host_cpu")
        host.cpu_reference = ref if isinstance(ref, dict) else None
    if host.mode != "off" and s.live_engine.device == "cpu" and host.stage_probe is None:
        from engine.probe import stage_probe

        host.stage_probe = stage_probe
        host.stage_reference_s = calibration_probe(s.cost.profile_dir, "host_stage_probe_s")
    if host.mode != "off" and s.live_engine.device == "cpu":
        model_probe_of(s, host)
    if host.mode != "off" and s.live_engine.device == "cpu" and host.sampler is None:
        from engine.host_sampler import model_sampler
        from ppsim.models.shape import load_model

        shape = load_model(s.model)
        host.sampler = lambda: model_sampler(shape)
        host.sampler_reference_s = sampler_reference(s.cost.profile_dir)
    return s, out, host


def engine_repeats(
    s: Scenario,
    host: HostGuard,
    numbers: range | list[int],
    log: Callable[[str], None] = print,
    total: int | None = None,
) -> tuple[list[Any], list[dict[str, float]]]:
    """The engine once per repeat number (the host read before and after each): (runs, CPU usage).
    ``total``: the repeats of the whole validation, for the log (default: these)."""
    from engine.run import run_engine

    total = total if total is not None else len(numbers)

    runs, usage = [], []
    for i in numbers:
        host.read(f"before {i}")
        log(f"validate: engine run {i + 1}/{total}")
        before = cpu_seconds()
        with host.during():
            runs.append(run_engine(s, None))
        after = cpu_seconds()
        usage.append(
            {
                "engine_core_cpu_s": after[0] - before[0],  # with the freeze's collection before the run
                "core_freeze_s": float(runs[-1].info.get("core_gc", {}).get("freeze_s", 0.0)),  # engine/core_gc.py
                "stages_cpu_s": after[1] - before[1],
                "run_wall_s": runs[-1].info["wall_s"],
                "startup_s": runs[-1].info["startup_s"],
            }
        )
        host.read(f"after {i}")
    return runs, usage


def finish_validation(
    s: Scenario,
    out: Path,
    runs: list[Any],
    usage: list[dict[str, float]],
    host: HostGuard,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The simulator on the engine's KV pool, compared with ``runs``; every file written at once."""
    from engine.run import engine_files

    repeats, opts = len(runs), s.live_engine
    blocks = int(runs[0].info["kv_num_blocks"])
    log("validate: simulating the same workload")
    prep, res, sim_summary = simulate_like_engine(s, blocks)
    files: dict[str, str | bytes] = {}
    for i, run in enumerate(runs):
        files.update({f"engine-{i}/{k}": v for k, v in engine_files(run).items()})
    sim = {
        **run_files(scenario_json(s), sim_summary, res.requests, res.ops, chrome_trace(res.ops)),
        **series_files(res.series),
    }
    files.update({f"sim/{k}": v for k, v in sim.items()})
    rows = compare_summaries([r.summary for r in runs], sim_summary)
    steps = [
        row
        for i, r in enumerate(runs)
        for row in step_costs(prep.cost, prep.topology.stages, r.plans, r.ops, i, cpu_of(r, opts), r.stage_preempted)
    ]
    payload = {
        "scenario": json.loads(scenario_json(s)),
        "repeats": repeats,
        "step_cost": summarize_steps(steps),
        "rows": [r.to_dict() for r in rows],
        "speed_adjusted": speed_adjusted(prep, steps, [r.summary for r in runs]),
        "host_conditioned": host_conditioned(prep, host, [r.summary for r in runs]),
        "probe_conditioned": probe_conditioned(prep, host, [r.summary for r in runs]),
        "probe_fixed": probe_fixed(prep, host, [r.summary for r in runs]),
        "depth_factor": depth_factor_of(prep.cost),
        "level_factor": level_factor_of(prep.cost),
        "corun_factor": corun_factor_of(prep.cost),
        "per_request": per_request_errors([r.requests for r in runs], res.requests),
        "path": summarize_path([r.ops for r in runs], res.ops),
        "verdict": verdict(rows),
        "host": host.to_dict(),
        "engine_cpu": usage,
        "engine_summaries": [r.summary for r in runs],
        "sim_summary": sim_summary,
    }
    files.update(validation_files(payload, runs[0].requests, res.requests, runs[0].ops, res.ops, steps))
    dashboards = drawn_dashboards("sim", *(f"engine-{i}" for i in range(len(runs))))
    write_result_set(out, {**files, **profile_files(s, out)}, derived=dashboards)
    return payload


def depth_factor_of(cost: Any) -> float:
    """``depth_factor`` (``live_stage`` at this depth over one stage, charged at PP > 1): ``validation.json``
    records it, as its ``step_costs.csv`` predictions include it."""
    return model_factor(cost, "depth_factor")


def level_factor_of(cost: Any) -> float:
    """``level_factor`` (``live_stage`` at one stage held at 1 or more, charged at every depth):
    ``validation.json`` records it, as its ``step_costs.csv`` predictions include it."""
    return model_factor(cost, "level_factor")


def speed_adjusted(prep: Any, steps: list[dict[str, Any]], engine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The simulator again with the host's compute speed during the engine runs (:mod:`ppsim.cost.scaled`):
    ``factor`` = the engine's stage time over the prediction, summed over every micro-batch of every
    run. Its error is the scheduling, pipeline and control path alone; not a prediction (``factor``
    comes from the runs it is compared with). None without step records."""
    measured, predicted = sum(r["measured_s"] for r in steps), sum(r["predicted_s"] for r in steps)
    if not steps or predicted <= 0 or measured <= 0:
        return None
    factor = measured / predicted
    return at_speed(prep, factor, engine)


def host_conditioned(prep: Any, host: HostGuard, engine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The prediction at the host's speed during the runs as the in-run sampler read it: every stage
    compute scaled by ``factor`` = the sampler's mean over the repeats over its mean through calibration
    (:meth:`HostGuard.sampler_ratio`). No engine figure enters it: the sampler is a process beside the
    engine timing its own matmul. None when the sampler was not read or the profile has no reference."""
    factor = host.sampler_ratio()
    if factor is None:
        return None
    return at_speed(prep, factor, engine)


def probe_conditioned(prep: Any, host: HostGuard, engine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The prediction at the host's speed on this model as the whole-model probe read it just before each
    repeat: every stage compute scaled by ``factor`` = the mean of those readings over the profile's price
    of the probe's step. The probe is the model on the predicted run's own decode step
    (``host.shaped_step``, :func:`shaped_step`; :meth:`HostGuard.shaped_factor`; ``probe`` "shaped",
    ``step`` [requests, context]; adopted by docs/validation.md part 44), else the fixed 4 requests at 134
    tokens (:meth:`HostGuard.probe_factor`; ``probe`` "fixed"). What a user can do before a run (probe the
    host on the model, then predict): no engine figure and nothing read after a run starts. None when no
    probe was read or priced."""
    shaped = host.shaped_factor()
    if shaped is not None and host.shaped_step is not None:
        return {"probe": "shaped", "step": list(host.shaped_step), **at_speed(prep, shaped, engine)}
    factor = host.probe_factor()
    return None if factor is None else {"probe": "fixed", **at_speed(prep, factor, engine)}


def probe_fixed(prep: Any, host: HostGuard, engine: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The prediction scaled by the fixed probe (4 requests at 134 tokens, :meth:`HostGuard.probe_factor`)
    where :func:`probe_conditioned` read the shaped one: the prediction part 37 adopted, kept beside as a
    diagnostic (part 44). None otherwise."""
    factor = host.probe_factor()
    if factor is None or host.shaped_factor() is None:
        return None
    return at_speed(prep, factor, engine)


def shaped_step(s: Scenario) -> tuple[int, int] | None:
    """The predicted run's own decode step, before any engine run: the plain prediction of ``s`` (its KV pool
    as :func:`ppsim.deployment.prepare` sizes it) gives (the median decode requests of the first stage's
    computes that decode, the mean context of a decode: each request's prompt plus half its output, weighted
    by its output). None when nothing decodes."""
    import statistics

    res = simulate(prepare(s))
    decodes = [o.num_decode_tokens for o in res.ops if o.kind == "compute" and o.track == "stage0"]
    decodes = [d for d in decodes if d > 0]
    weight = sum(r.output_tokens for r in res.requests)
    if not decodes or weight <= 0:
        return None
    ctx = sum(r.output_tokens * (r.input_tokens + r.output_tokens / 2) for r in res.requests) / weight
    return int(statistics.median_low(decodes)), max(1, round(ctx))


def at_speed(prep: Any, factor: float, engine: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulator with every stage compute scaled by ``factor``, compared with the engine runs: ``factor``,
    rows and verdict (the replay and the host- and probe-conditioned predictions differ only in the factor)."""
    return {"factor": factor, **replay_with(prep, ScaledCompute(prep.cost, factor), engine)}


def jittered(prep: Any, steps: list[dict[str, Any]], engine: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """The replay with each stage compute scaled by one of the engine's own measured / predicted ratios
    (:class:`ppsim.cost.scaled.JitteredCompute`, draw ``seed``): the host's step-time spread on top of
    its mean speed. A diagnostic, like :func:`speed_adjusted`."""
    ratios = [r["measured_s"] / r["predicted_s"] for r in steps if r["predicted_s"] > 0 and r["measured_s"] > 0]
    return replay_with(prep, JitteredCompute(prep.cost, ratios, seed), engine)


def replay_with(prep: Any, cost: Any, engine: list[dict[str, Any]]) -> dict[str, Any]:
    """Simulate ``prep`` with ``cost`` and compare with the engine runs' summaries: rows and verdict."""
    res = simulate(dataclasses.replace(prep, cost=cost))
    summary = summarize(res.requests, res.ops, len(prep.topology.stages), kv_figures(prep, res.peak_blocks_used))
    rows = compare_summaries(engine, summary)
    return {"rows": [r.to_dict() for r in rows], "verdict": verdict(rows)}


def model_probe_of(s: Scenario, host: HostGuard) -> None:
    """The whole-model probe of ``s``'s model (unless one is given, or the model is too big to build), with
    what the profile charges for its step and the profile's own reading of it (same kind only); where it builds
    that probe, the shaped probe beside it (:func:`shaped_step`, part 44)."""
    from engine.probe import model_price, model_probe, model_probe_fits, model_probe_kind
    from ppsim.models.shape import load_model

    shape = load_model(s.model)
    built = host.model_probe is None and model_probe_fits(shape)
    if built:
        host.model_probe = lambda: model_probe(shape)
    if host.model_probe is None:
        return
    meta = calibration_meta(s.cost.profile_dir)
    same = meta.get("host_model_probe") == model_probe_kind(shape)
    host.model_reference_s = _positive(meta.get("host_model_probe_s")) if same else None
    if host.model_price_s is None:
        host.model_price_s = _positive(model_price(s.cost.profile_dir or "", shape))
    if built and host.shaped_probe is None:  # part 44: the probe at the run's own step
        host.shaped_step = shaped_step(s)
        if host.shaped_step is not None:
            batch, ctx = host.shaped_step
            host.shaped_probe = lambda: model_probe(shape, batch=batch, ctx=ctx)
            host.shaped_price_s = _positive(model_price(s.cost.profile_dir or "", shape, batch, ctx))


def calibration_meta(profile_dir: str | None) -> dict[str, Any]:
    """The profile's ``meta.json`` ({}: none, or not readable)."""
    try:
        meta = json.loads((Path(profile_dir or "") / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def sampler_reference(profile_dir: str | None) -> float | None:
    """The in-run sampler's mean through calibration, if it timed the same work as today's sampler
    (``meta.json`` ``host_sampler`` = :data:`engine.host_sampler.SAMPLER_KIND`); None otherwise."""
    from engine.host_sampler import SAMPLER_KIND

    meta = calibration_meta(profile_dir)
    return _positive(meta.get("host_sampler_s")) if meta.get("host_sampler") == SAMPLER_KIND else None


def calibration_probe(profile_dir: str | None, key: str = "host_probe_s") -> float | None:
    """A host probe ``ppsim calibrate`` recorded with the profile (None: a profile without one)."""
    return _positive(calibration_meta(profile_dir).get(key))


def _positive(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and v > 0 else None


def profile_files(s: Scenario, out: Path) -> dict[str, str | bytes]:
    """A profile calibrated into ``OUT/profile`` (``--calibrate``) joins the result set, so it survives
    the replacement of ``OUT``."""
    prof = Path(s.cost.profile_dir or "")
    if s.cost.kind != "profile" or prof.resolve() != (out / "profile").resolve():
        return {}
    return {f"profile/{p.name}": p.read_bytes() for p in prof.iterdir() if p.is_file()}


def rescaled_line(label: str, d: dict[str, Any]) -> str:
    """One report line for a simulation at a rescaled compute speed (replay or host-conditioned)."""
    shown = ", ".join(f"{r['metric']} {r['error']:+.1%}" for r in d["rows"] if r["metric"] in ADJUSTED_SHOWN)
    return f"{label}: median |error| {d['verdict']['median_abs_error']:.1%}, {shown}"


def format_report(payload: dict[str, Any]) -> str:
    from ppsim.validate.compare import MetricRow

    rows = [MetricRow(**r) for r in payload["rows"]]
    lines = [format_steps(payload.get("step_cost") or {}), format_table(rows)]
    pr = payload["per_request"]
    for key in ("ttft", "e2el"):
        d = pr.get(key) or {}
        if d:
            lines.append(
                f"per-request {key.upper():<5} median |error| {d['median_abs_error']:.1%}, "
                f"KS statistic {d['ks_statistic']:.3f} (p = {d['ks_pvalue']:.3f}), "
                f"{pr['matched_requests']} requests over {pr.get('repeats', 1)} engine runs"
            )
    v = payload["verdict"]
    bubble = v.get("bubble_error_points")
    lines.append(
        f"median |error| over latency/throughput metrics {v['median_abs_error']:.1%}; "
        f"bubble error {'-' if bubble is None else f'{bubble:+.3f}'} points, worst busy/bubble "
        f"{v.get('max_abs_fraction_points', 0.0):.3f} points; outside target (10%, 5% for "
        f"throughput/TPOT, 0.05 points for fractions): {', '.join(v['misses']) or 'none'}"
    )
    adj, hc = payload.get("speed_adjusted"), payload.get("host_conditioned")
    if adj:
        lines.append(
            rescaled_line(
                f"speed-adjusted replay (the engine's stages ran x{adj['factor']:.3f} the "
                "profile's time; not a prediction: the scheduling and path alone)",
                adj,
            )
        )
    if hc:
        lines.append(
            rescaled_line(
                f"host-conditioned prediction (the in-run sampler read the host at "
                f"x{hc['factor']:.3f} its calibration time; no engine figure used)",
                hc,
            )
        )
    pc = payload.get("probe_conditioned")
    if pc:
        on = "its step"
        if pc.get("probe") == "shaped":
            on = f"the predicted decode step, {pc['step'][0]} requests at {pc['step'][1]} tokens,"
        lines.append(
            rescaled_line(
                f"probe-conditioned prediction (the whole-model probe before each repeat ran {on} at "
                f"x{pc['factor']:.3f} the profile's price; no engine figure used)",
                pc,
            )
        )
    pf = payload.get("probe_fixed")
    if pf:
        lines.append(
            rescaled_line(
                f"fixed-probe prediction (4 requests at 134 tokens before each repeat: x{pf['factor']:.3f} the "
                "profile's price; part 37's, a diagnostic)",
                pf,
            )
        )
    if payload.get("path"):
        lines.append(format_path(payload["path"]))
    if "host" in payload:
        lines.append(host_line(payload["host"]))
    return "\n".join(lines)
