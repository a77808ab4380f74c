"""One engine run: scenario -> stage processes -> records -> the simulator's files.

``run_engine(scenario, out_dir)`` runs with the scenario's ``live_engine`` section
(:class:`ppsim.live_engine.LiveEngineConfig`; ``options``, if given, replaces it). It resolves the
scenario exactly as the simulator does
(:func:`ppsim.deployment.prepare`: model shape, partition, workload with the same seed), with one
change: the KV pool. The simulator sizes it from GPU memory, which on CPU would be absurd (tens of
GiB); the engine uses ``live_engine.kv_num_blocks`` if given, else ``min(simulator blocks, blocks the
workload can ever hold at once)`` - the largest ``min(max_num_seqs, max_concurrency)`` requests
at their full length. That cap never changes a scheduling decision (the pool cannot run out), and
both the policy's pool and the stages' caches use the same number. ``live_engine.max_kv_gib`` bounds
the memory a stage may allocate.

Prompt token ids are drawn per request from ``numpy.random.default_rng([seed, req_id])``.
Clock: stage processes report ``time.perf_counter`` readings; on Linux it is the system-wide
``CLOCK_MONOTONIC``, shared by all processes of the host. At start-up each stage's reading is
checked against the driver's clock bracket and, if outside it, shifted by the measured offset.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.checkpoint import check_checkpoint, has_checkpoint
from engine.core_gc import core_heap
from engine.executor import EngineExecutor, EngineResult, data_path
from engine.launcher import StageFault, StageGroup, init_method
from engine.preflight import check_cuda, check_kv_cap, check_memory, check_supported
from engine.transport import DataPath, switch_interval
from engine.worker import StageConfig
from ppsim.config import Scenario, scenario_json
from ppsim.deployment import Prepared, kv_figures, prepare
from ppsim.errors import PPSimError, Terminated
from ppsim.live_engine import FAULT_FORM, LiveEngineConfig, parse_fault
from ppsim.metrics.io import csv_chunks, dumps, run_files
from ppsim.metrics.records import LOOP_FIELDS
from ppsim.metrics.summary import summarize
from ppsim.metrics.trace import chrome_trace
from ppsim.models.shape import ModelShape
from ppsim.outputs import check_output_dir, write_result_set
from ppsim.policy.requests import Request
from ppsim.report.dashboard import drawn_dashboards, series_files

# a stage's own rendezvous timeout outlasts the parent's start-up timeout, so that on a stall the parent
# names the stage that did not come up instead of a peer that gave up waiting for it
DIST_TIMEOUT_MARGIN_S = 30.0
# the latest arrival the engine waits for: it replays a workload's arrival times in real time
MAX_REPLAY_S = 3600.0


# the engine's options are the scenario's ``live_engine`` section; the old name stays for callers
EngineOptions = LiveEngineConfig


class EngineFault(StageFault):
    """The run stopped on a fault; ``result`` holds the records up to it."""

    def __init__(self, message: str, result: EngineResult) -> None:
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class EngineRun:
    result: EngineResult
    summary: dict
    info: dict
    prep: Prepared
    plans: dict = dataclasses.field(default_factory=dict)  # step id -> the StepPlan launched (validate)
    stage_cpu_s: dict = dataclasses.field(default_factory=dict)  # (stage, step id) -> compute thread CPU s
    stage_preempted: dict = dataclasses.field(default_factory=dict)  # (stage, step id) -> involuntary switches

    @property
    def requests(self):  # noqa: ANN201
        return self.result.requests

    @property
    def ops(self):  # noqa: ANN201
        return self.result.ops


def make_prompts(requests: list[Request], vocab_size: int, seed: int) -> dict[int, list[int]]:
    return {
        r.req_id: np.random.default_rng([seed, r.req_id]).integers(0, vocab_size, r.prompt_len).tolist()
        for r in requests
    }


def engine_num_blocks(prep: Prepared, opts: EngineOptions) -> int:
    if opts.kv_num_blocks is not None:
        return opts.kv_num_blocks
    e, w = prep.scenario.engine, prep.scenario.workload
    pool = prep.block_pool()
    needs = sorted((pool.blocks_for(r.prompt_len + r.output_len) for r in prep.requests), reverse=True)
    at_once = min(e.max_num_seqs, w.max_concurrency or len(needs))
    return max(1, min(prep.num_blocks, sum(needs[:at_once])))


def _checkpoint(s: Scenario, shape: ModelShape, opts: EngineOptions) -> str | None:
    """The checkpoint the stages load (its index, headers and tensors checked here, before they spawn)."""
    if opts.checkpoint:
        if not has_checkpoint(opts.checkpoint):
            raise PPSimError(f"--checkpoint: {opts.checkpoint} holds no model.safetensors(.index.json)")
        check_checkpoint(opts.checkpoint, "--checkpoint", shape)
        return opts.checkpoint
    if has_checkpoint(s.model):
        check_checkpoint(s.model, "--model", shape)
        return s.model
    return None


def check_replay_time(prep: Prepared) -> None:
    """The engine sends requests at their arrival times in real time: refuse a workload whose last
    arrival is more than MAX_REPLAY_S away (a trace in milliseconds or epoch seconds, a tiny rate)."""
    arrivals = prep.requests.arrival_s
    last = float(arrivals.max()) if len(arrivals) else 0.0
    if last <= MAX_REPLAY_S:
        return
    w = prep.scenario.workload
    what = (
        f"--trace: its last request arrives at {last:.6g} s"
        if w.trace
        else f"--request-rate: {w.request_rate:g} req/s puts the last of {len(arrivals)} requests at {last:.6g} s"
    )
    fix = (
        "arrival_s must be seconds from the start; cut or rescale the trace"
        if w.trace
        else "raise --request-rate or lower --num-prompts"
    )
    raise PPSimError(
        f"{what}, and the engine replays arrivals in real time (at most {MAX_REPLAY_S:.0f} s, one hour); {fix}"
    )


def stage_configs(prep: Prepared, opts: EngineOptions) -> list[StageConfig]:
    s, shape = prep.scenario, prep.shape
    check_supported(prep)
    if s.cluster.tensor_parallel_size != 1:
        raise PPSimError("cluster.tensor_parallel_size: the engine runs TP=1 only; use -tp 1")
    if opts.backend == "nccl" and opts.device != "cuda":
        raise PPSimError("--backend nccl needs --device cuda")
    check_cuda(opts, len(prep.topology.stages))
    check_kv_cap(prep, opts)
    check_memory(prep, opts)
    url = init_method()
    ckpt = _checkpoint(s, shape, opts)
    return [
        StageConfig(
            st.index,
            len(prep.topology.stages),
            url,
            shape,
            st.start_layer,
            st.end_layer,
            prep.num_blocks + 1,  # + the scratch block (engine/executor.py block_table_for)
            s.engine.block_size,
            s.seed,
            ckpt,
            opts.backend,
            opts.device,
            opts.threads_per_stage,
            opts.startup_timeout_s + DIST_TIMEOUT_MARGIN_S,
            min(opts.warm_tokens, s.engine.step_token_budget),
            warm_reqs=s.engine.max_num_seqs or 1,
            router_zipf=s.moe_router_zipf,
            path=data_path(prep) if opts.data_path == "policy" else DataPath(),
        )
        for st in prep.topology.stages
    ]


def _clock_offsets(ready: dict[int, tuple[float, float]], t_spawn: float, t_ready: float) -> list[float]:
    out = []
    for r in sorted(ready):
        clock = ready[r][0]
        out.append(0.0 if t_spawn <= clock <= t_ready else t_ready - clock)
    return out


def fault_plan(opts: EngineOptions, cfgs: list[StageConfig]) -> list[StageConfig]:
    if opts.inject_fault is None:
        return cfgs
    kind, stage, step = parse_fault(opts.inject_fault)  # its form was checked with the options
    if stage >= len(cfgs):
        raise PPSimError(
            f"--inject-fault: there is no stage {stage}: the run has {len(cfgs)} (0 to {len(cfgs) - 1}); {FAULT_FORM}"
        )
    return [dataclasses.replace(c, fault=(kind, step)) if c.rank == stage else c for c in cfgs]


def run_engine(
    s: Scenario,
    out_dir: str | Path | None = None,
    options: EngineOptions | None = None,
    requests: list[Request] | None = None,
    log: Callable[[str], None] | None = None,
    dashboard: bool = True,
) -> EngineRun:
    """Run ``s`` on real stage processes; write the simulator's files to ``out_dir`` (also on a fault).

    ``options`` (a :class:`LiveEngineConfig`), if given, replaces ``s.live_engine``.

    Raises :class:`EngineFault` (a ``PPSimError``) when a stage dies, fails or stalls; its
    ``result`` has every record up to the fault, unfinished requests marked ``unfinished``.
    """
    if options is not None:  # given beside the scenario: they replace its section (config.json says so)
        s = s.model_copy(update={"live_engine": options})
    opts = s.live_engine
    if out_dir is not None:
        out_dir = check_output_dir(out_dir)
    prep0 = prepare(s, requests)
    check_replay_time(prep0)
    prep = dataclasses.replace(prep0, num_blocks=engine_num_blocks(prep0, opts))
    cfgs = fault_plan(opts, stage_configs(prep, opts))
    prompts = make_prompts(prep.requests, prep.shape.vocab_size, s.seed)
    t_spawn = time.perf_counter()
    with StageGroup(cfgs) as group, switch_interval():  # the core's feeder threads (engine/transport.py)
        ready = group.wait_ready(opts.startup_timeout_s)
        offsets = _clock_offsets(ready, t_spawn, time.perf_counter())
        warm = [ready[r][1] for r in sorted(ready)]
        budget = s.engine.step_token_budget / cfgs[0].warm_tokens
        timeout = opts.stage_timeout_s or 5.0 + 4.0 * sum(warm) * budget
        info = {
            "executor": "engine",
            "policy": s.engine.policy.kind,
            "backend": opts.backend,
            "device": opts.device,
            "threads_per_stage": opts.threads_per_stage,
            "stage_timeout_s": timeout,
            "warmup_step_s": warm,
            "clock_offsets_s": offsets,
            "kv_num_blocks": prep.num_blocks,
            "kv_num_blocks_simulator": prep0.num_blocks,
            "checkpoint": cfgs[0].checkpoint,
            "stage_pids": [p.pid for p in group.procs],
            "core_pid": os.getpid(),  # the engine core runs in this process (experiments/validation/steals.py)
            "startup_s": time.perf_counter() - t_spawn,
        }
        if log:
            log(
                f"engine: {len(cfgs)} stages ready in {info['startup_s']:.1f} s (pids {info['stage_pids']}), "
                f"KV {prep.num_blocks} blocks, stage timeout {timeout:.1f} s"
            )
        ex = EngineExecutor(prep, group, prompts, timeout, offsets, cfgs[0].path)
        try:
            with core_heap(info, lambda: ex.t0):  # the caller's heap frozen for the run, as vLLM's core
                ex.run()
                group.stop(ex.on_message, timeout)
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: keep what ran so far, as on a fault
            if out_dir is not None:
                why = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
                _finish(prep, ex.result(why), info, out_dir, dashboard)
                err.partial_results = str(out_dir)  # type: ignore[attr-defined]
            raise
        except StageFault as err:
            res = ex.result(str(err).splitlines()[0])
            run = _finish(prep, res, info, out_dir, dashboard)
            lost = run.info["unfinished_requests"]
            where = f" (all in {out_dir}/engine.json, unfinished_requests)" if out_dir is not None else ""
            raise EngineFault(
                f"{res.fault}; {len(lost)} requests unfinished: {lost[:20]}{' ...' if len(lost) > 20 else ''}{where}",
                run.result,
            ) from None
    run = _finish(prep, ex.result(), info, out_dir, dashboard)
    run.plans = dict(ex.launched)
    run.stage_cpu_s = {(rank, t.step_id): t.cpu_s for rank, ts in enumerate(ex.stage_times) for t in ts}
    run.stage_preempted = {(rank, t.step_id): t.preempted for rank, ts in enumerate(ex.stage_times) for t in ts}
    return run


def _finish(
    prep: Prepared, res: EngineResult, info: dict, out_dir: str | Path | None, dashboard: bool = True
) -> EngineRun:
    num_stages = len(prep.topology.stages)
    summary = summarize(res.requests, res.ops, num_stages, kv_figures(prep, res.peak_blocks_used))
    info = {
        **info,
        **res.extra,
        "fault": res.fault,
        "wall_s": res.end_s,
        "kv_blocks_used_at_end": res.blocks_used_at_end,
        "unfinished_requests": [r.req_id for r in res.requests if r.status == "unfinished"],
    }
    run = EngineRun(res, summary, info, prep)
    if out_dir is not None:
        write_result_set(out_dir, engine_files(run), derived=drawn_dashboards("") if dashboard else None)
    return run


def engine_files(run: EngineRun) -> dict[str, str | bytes]:
    """The files of an engine run: the simulator's set plus engine.json, tokens.json, stage_loop.csv and the
    series."""
    res = run.result
    return {
        **run_files(
            scenario_json(run.prep.scenario),
            run.summary,
            res.requests,
            res.ops,
            chrome_trace(res.ops, "ppsim engine"),
            res.actions,
        ),
        "engine.json": dumps(run.info),
        "tokens.json": dumps({str(k): v for k, v in res.tokens.items()}),
        "stage_loop.csv": csv_chunks(LOOP_FIELDS, res.loop),
        **series_files(res.series),
    }
