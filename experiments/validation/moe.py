"""Mixture-of-experts validation: the live CPU engine vs the simulator on tiny-moe at PP=2.

tiny-moe (8 routed experts, top-2, one shared expert, 8 layers, hidden 256) on decode-heavy workloads
whose decode micro-batches hold 1, 8 and 32 requests (vllm-batch-queue with --pp-throttle, max_num_seqs = 2 x B, all
requests at t=0, 16-token prompts, 48 output tokens). For each size the script reports

- the distinct experts a decode micro-batch of B requests touches: the engine's router on the
  scenario's seed (decode steps run in-process on the same weights, counted per MoE layer) beside
  the profiled cost model's expectation from the router load measured at calibration;
- the median stage compute time of decode micro-batches, engine and simulator, and its share per
  request (a micro-batch of 1 reads k experts' weights for one token, one of 32 reads nearly all 8
  for 32 tokens);
- the step-level cost error, free of the batching feedback and of most host load: the engine's own
  stage 0 (layers 0-3 and the embedding) runs decode steps of B requests in-process, timed by
  thread CPU time (the clock the calibration uses), against the profiled model's ``stage_time``
  for the same plan;
- ``ppsim validate``'s errors (throughput, TTFT, TPOT, E2EL, bubble) with engine run-to-run spread.

Writes moe_results.md and moe_results.csv here; full validations under moe-runs/ (not committed).
Run (quiet host): PYTHONPATH=. .venv/bin/python experiments/validation/moe.py --repeats 3
Under load (as committed): --repeats 2 --quick (quick calibration grid).
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from pathlib import Path

import numpy as np

from ppsim.cli import Parser, run_main
from ppsim.config import build_scenario
from ppsim.metrics.io import atomic_write

HERE = Path(__file__).parent
RUNS = HERE / "moe-runs"
SIZES = (1, 8, 32)
MAX_REPEATS = 100  # engine runs per batch size
MAX_ZIPF = 8.0  # the scenario's moe_router_zipf bound
SHOWN = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_e2el_ms", "pipeline_bubble_fraction")


def scenario(batch: int, profile: str, zipf: float):
    return build_scenario(
        overrides={
            "model": "tiny-moe",
            "seed": 0,
            "moe_router_zipf": zipf,
            "cluster": {"pipeline_parallel_size": 2},
            # 2 x B requests over two micro-batches of B: the throttle (opt-in, vLLM PR #50410) splits them;
            # without it vLLM's batch queue puts every running request into one micro-batch
            "engine": {
                "policy": {"kind": "vllm-batch-queue", "pp_throttle": True},
                "max_num_seqs": 2 * batch,
                "max_num_batched_tokens": 512,
            },
            "workload": {
                "num_prompts": max(2 * batch, 4),
                "request_rate": "inf",
                "random_input_len": 16,
                "random_output_len": 48,
                "random_range_ratio": 0.0,
            },
            "cost": {"kind": "profile", "profile_dir": profile},
        }
    )


def engine_router_touched(batch: int, zipf: float, seed: int = 0, rounds: int = 4) -> float:
    """Mean distinct experts per MoE layer of decode steps of ``batch`` requests, the engine's weights."""
    import torch

    from engine.kvcache import PagedKVCache, build_batch
    from engine.model import build_stage
    from engine.transport import StepItem
    from ppsim.models.shape import load_model

    shape = load_model("tiny-moe")
    m = build_stage(shape, 0, shape.num_layers, True, True, seed, torch.float32, router_zipf=zipf)
    rng = np.random.default_rng([seed, batch])
    seen: list[int] = []
    with torch.inference_mode():
        for _ in range(rounds):
            kv = PagedKVCache(shape.num_layers, 8 * batch, 4, shape.num_kv_heads, shape.head_dim, torch.float32)
            items = [StepItem(r, 0, 16, True, tuple(range(8 * r, 8 * r + 8))) for r in range(batch)]
            b = build_batch(tuple(items), 4)
            m(b.positions, kv.attention(b), torch.tensor(rng.integers(0, shape.vocab_size, 16 * batch).tolist()))
            for pos in range(16, 24):  # eight decode steps
                b = build_batch(tuple(StepItem(r, pos, 1, True, it.block_table) for r, it in enumerate(items)), 4)
                m(b.positions, kv.attention(b), torch.tensor(rng.integers(0, shape.vocab_size, batch).tolist()))
                seen += list(m.experts_touched().values())
    return float(np.mean(seen))


def step_level(batch: int, profile_cost, zipf: float, seed: int = 0, steps: int = 12) -> tuple[float, float]:
    """(measured, predicted) seconds of stage 0 for a decode step of ``batch`` requests at context 17..28,
    timed alone in-process: the prediction without the live engine's level (``level_factor``), which is what
    the live stage loop adds beyond a step alone."""
    import time

    import torch

    from engine.kvcache import PagedKVCache, build_batch
    from engine.model import build_stage
    from engine.transport import StepItem
    from ppsim.cost.base import StageSpec
    from ppsim.models.shape import load_model
    from ppsim.policy.plan import PlanItem, make_plan

    shape = load_model("tiny-moe")
    torch.set_num_threads(1)
    m = build_stage(shape, 0, 4, True, False, seed, torch.float32, router_zipf=zipf)
    rng = np.random.default_rng([seed, batch])
    kv = PagedKVCache(4, 8 * batch, 4, shape.num_kv_heads, shape.head_dim, torch.float32)
    items = [StepItem(r, 0, 16, True, tuple(range(8 * r, 8 * r + 8))) for r in range(batch)]
    meas, pred = [], []
    with torch.inference_mode():
        b = build_batch(tuple(items), 4)
        m(b.positions, kv.attention(b), torch.tensor(rng.integers(0, shape.vocab_size, 16 * batch).tolist()))
        for pos in range(16, 16 + steps):
            dec = tuple(StepItem(r, pos, 1, True, it.block_table) for r, it in enumerate(items))
            ids = torch.tensor(rng.integers(0, shape.vocab_size, batch).tolist())
            t0 = time.thread_time()
            b = build_batch(dec, 4)
            m(b.positions, kv.attention(b), ids)
            meas.append(time.thread_time() - t0)
            plan = make_plan(0, [PlanItem(r, pos, 1, False, True) for r in range(batch)])
            pred.append(profile_cost.stage_time(StageSpec(0, 0, 4, True, False), plan) / profile_cost.level_factor)
    return statistics.median(meas[2:]), statistics.median(pred[2:])


def decode_compute(run_dir: Path) -> tuple[float, float]:
    """(median requests, median seconds) of decode-only stage compute ops in a run's stage_ops.csv."""
    reqs, secs = [], []
    with open(run_dir / "stage_ops.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "compute" and int(r["num_prefill_tokens"]) == 0 and int(r["num_decode_tokens"]) > 0:
                reqs.append(int(r["num_reqs"]))
                secs.append(float(r["end_s"]) - float(r["start_s"]))
    return statistics.median(reqs), statistics.median(secs)


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/moe.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, help="engine runs per batch size (default 3)")
    ap.add_argument("--quick", action="store_true", help="quick calibration grid (under load, for a smoke run)")
    ap.add_argument("--profile", help="an existing tiny-moe calibration of this host (default: calibrate now)")
    ap.add_argument("--moe-router-zipf", type=float, default=0.0)
    ap.add_argument(
        "--step-only",
        action="store_true",
        help="only the router counts and the step-level check (no engine processes; needs --profile)",
    )
    args = ap.parse_args(argv)
    if args.step_only and args.repeats is not None:
        ap.error("--repeats: --step-only runs no engine; drop one")
    args.repeats = 3 if args.repeats is None else args.repeats
    checks = [
        (not 1 <= args.repeats <= MAX_REPEATS, f"--repeats: {args.repeats} is not within [1, {MAX_REPEATS}]"),
        (
            not 0 <= args.moe_router_zipf <= MAX_ZIPF,  # nan and inf too
            f"--moe-router-zipf: {args.moe_router_zipf:g} is not within [0, {MAX_ZIPF:g}]; 0 routes uniformly",
        ),
        (args.step_only and args.profile is None, "--step-only: needs --profile (it calibrates nothing)"),
        (
            args.quick and args.profile is not None,
            "--quick: sets the calibration's grid; with --profile nothing is calibrated, drop one",
        ),
        (args.profile is not None and not args.profile.strip(), "--profile: empty path; give a tiny-moe calibration"),
    ]
    problem = next((why for bad, why in checks if bad), None)
    if problem:
        ap.error(problem)
    return run_main(lambda: moe(args))


def moe(args: argparse.Namespace) -> int:
    """Calibrate (unless ``--profile``, checked first), then each batch size's validation or step check."""
    from ppsim.cost.profiled import load_profiled_cost
    from ppsim.hardware.presets import resolve_link
    from ppsim.models.shape import load_model
    from ppsim.validate.run import validate

    if args.profile is not None:  # missing, damaged or of another model: one line before any work
        s = scenario(SIZES[0], args.profile, args.moe_router_zipf)
        load_profiled_cost(args.profile, load_model("tiny-moe"), s, resolve_link(s.cluster.link, "cluster.link"))
    profile = args.profile
    if profile is None:
        from calibration.calibrate import calibrate

        profile = str(RUNS / "profile")
        print("== calibrating tiny-moe on this CPU", flush=True)
        calibrate("tiny-moe", "cpu", profile, quick=args.quick, router_zipf=args.moe_router_zipf, log=lambda m: None)
    rows = []
    for batch in SIZES:
        s = scenario(batch, profile, args.moe_router_zipf)
        if args.step_only:
            cost = load_profiled_cost(profile, load_model("tiny-moe"), s, resolve_link(s.cluster.link, "cluster.link"))
            meas, pred = step_level(batch, cost, args.moe_router_zipf)
            print(
                {
                    "batch": batch,
                    "experts_engine_router": engine_router_touched(batch, args.moe_router_zipf),
                    "experts_cost_model": cost.experts_touched(batch),
                    "step_ms_measured": 1e3 * meas,
                    "step_ms_predicted": 1e3 * pred,
                    "step_error": (pred - meas) / meas,
                },
                flush=True,
            )
            continue
        print(f"== decode micro-batches of {batch} request(s)", flush=True)
        out = RUNS / f"b{batch}"
        payload = validate(s, out, args.repeats, log=lambda m: None)
        cost = load_profiled_cost(profile, load_model("tiny-moe"), s, resolve_link(s.cluster.link, "cluster.link"))
        by = {r["metric"]: r for r in payload["rows"]}
        e_reqs, e_s = decode_compute(out / "engine-0")
        s_reqs, s_s = decode_compute(out / "sim")
        row = {
            "batch": batch,
            "engine_decode_reqs": e_reqs,
            "sim_decode_reqs": s_reqs,
            "experts_engine_router": round(engine_router_touched(batch, args.moe_router_zipf), 2),
            "experts_cost_model": round(cost.experts_touched(batch), 2),
            "decode_stage_ms_engine": round(1e3 * e_s, 3),
            "decode_stage_ms_sim": round(1e3 * s_s, 3),
        }
        meas, pred = step_level(batch, cost, args.moe_router_zipf)
        row.update(
            step_ms_measured=round(1e3 * meas, 3),
            step_ms_predicted=round(1e3 * pred, 3),
            step_error=round((pred - meas) / meas, 4),
        )
        adj = payload.get("speed_adjusted") or {}
        replay = {r["metric"]: r for r in adj.get("rows", [])}
        row["speed_factor"] = round(adj["factor"], 3) if adj else None
        for m in SHOWN:
            row[f"{m}_error"] = round(by[m]["error"], 4)
            row[f"{m}_spread"] = round(by[m]["engine_spread"], 4)
            row[f"{m}_replay"] = round(replay[m]["error"], 4) if m in replay else None
        rows.append(row)
        print(row, flush=True)
    if rows:
        write(rows, args, profile)
    return 0


def write(rows: list[dict], args: argparse.Namespace, profile: str) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(HERE / "moe_results.csv", buf.getvalue())
    md = [
        "# MoE validation: CPU engine vs simulator (tiny-moe, PP=2, vllm-batch-queue, --pp-throttle)",
        "",
        f"Profile: {'calibrated just before the runs' if args.profile is None else profile}"
        f"{' (quick grid)' if args.quick and args.profile is None else ''}; router zipf "
        f"{args.moe_router_zipf:g}; engine repeats {args.repeats}. Error = (sim - engine) / engine "
        "(bubble: fraction points); spread = engine run-to-run (max - min) / mean; after the slash, the "
        "speed-adjusted replay (the simulator with every stage compute scaled by the engine's measured "
        "stage time over the prediction, `speed factor`; not a prediction: it removes the host's speed "
        "during the runs).",
        "",
        "| B | decode reqs/mb (eng, sim) | experts touched (engine router, cost model) | "
        "decode stage ms (eng, sim) | step-level stage 0 ms (thread CPU, predicted, error) | speed factor | "
        + " | ".join(SHOWN)
        + " |",
        "|---" * (6 + len(SHOWN)) + "|",
    ]
    for r in rows:
        cells = []
        for m in SHOWN:
            fmt = "{:+.3f}" if m == "pipeline_bubble_fraction" else "{:+.1%}"
            rep = r.get(f"{m}_replay")
            cells.append(
                fmt.format(r[f"{m}_error"])
                + f" (±{r[f'{m}_spread']:.0%})"
                + ("" if rep is None else " / " + fmt.format(rep))
            )
        factor = "-" if r.get("speed_factor") is None else f"{r['speed_factor']:.3f}"
        md.append(
            f"| {r['batch']} | {r['engine_decode_reqs']:g}, {r['sim_decode_reqs']:g} | "
            f"{r['experts_engine_router']:.2f}, {r['experts_cost_model']:.2f} | "
            f"{r['decode_stage_ms_engine']:.2f}, {r['decode_stage_ms_sim']:.2f} | "
            f"{r['step_ms_measured']:.2f}, {r['step_ms_predicted']:.2f}, {r['step_error']:+.1%} | {factor} | "
            + " | ".join(cells)
            + " |"
        )
    atomic_write(HERE / "moe_results.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
