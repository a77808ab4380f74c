"""``ppsim chunk-plan`` and ``ppsim fit-chunks``: SGLang's dynamic chunk sizes, shown and tuned.

``chunk-plan`` prints the chunk sizes SGLang's dynamic chunking (``ppsim.policy.chunking``) gives
one prompt, from ``--coefficients a,b,c`` or from the scenario's cost model (analytic, or profiled
with ``--profile DIR``) fitted the way SGLang profiles stage 0 at start-up.

``fit-chunks`` grid-searches the initial chunk size and the smoothing factor for the lowest mean
TTFT in simulated runs of the ``sglang-ring`` policy on the scenario's workload, reports the best
fixed chunk size as the baseline and plots TTFT against both.

Both take the scenario flags of ``ppsim simulate``; a flag the command would override or ignore
(fit-chunks' policy and chunking flags, chunk-plan's workload flags) is rejected, not dropped.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ppsim.config import MAX_TOKENS
from ppsim.errors import PPSimError
from ppsim.metrics.io import save_figure
from ppsim.outputs import OutputError


def _floats(text: str, flag: str, example: str = "1e-6,0.02,1.5") -> list[float]:
    """The comma-separated numbers of ``text``; an empty item (``''``, ``,,1``) is refused, not skipped."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise PPSimError(f"{flag}: use comma-separated numbers like {example} (got {text!r:.60})") from None


def _ints(text: str, flag: str) -> list[int]:
    vals = _floats(text, flag, "2048,4096")
    if not vals or any(not math.isfinite(v) or v < 1 or v != int(v) for v in vals):
        raise PPSimError(f"{flag}: use comma-separated positive integers like 2048,4096 (got {text!r:.60})")
    return [int(v) for v in vals]


def check_chunk_sizes(args: argparse.Namespace, scenario: Any, chunks: list[int]) -> None:
    """Each chunk size must make a valid scenario (the search applies it without validation): at least
    one KV block, at most MAX_TOKENS, and whatever else the scenario's checks say."""
    block = scenario.engine.block_size
    for c in chunks:
        if not block <= c <= MAX_TOKENS:
            raise PPSimError(
                f"--chunk-sizes: {c} tokens is outside [{block} (the KV block size), {MAX_TOKENS}]; "
                "give chunk sizes like 2048,4096"
            )
        saved = args.chunked_prefill_size
        args.chunked_prefill_size = c
        try:
            sglang_scenario(args)
        except PPSimError as err:
            raise PPSimError(f"--chunk-sizes: {c}: {err}") from None
        finally:
            args.chunked_prefill_size = saved


WORKLOAD_DESTS = (
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "trace",
    "abort_rate",
    "abort_window_s",
)

# dest -> why the command cannot honour the flag
CHUNK_PLAN_REJECTS: dict[str, str] = {
    "policy": "chunk-plan always plans sglang-ring's chunks; drop it",
    "enable_dynamic_chunking": "chunk-plan always plans dynamic chunking; drop it (--smooth-factor 0: fixed chunks)",
    **{d: "chunk-plan plans one prompt and runs no workload; drop it and give --prompt-len" for d in WORKLOAD_DESTS},
    "seed": "chunk-plan plans one given prompt and draws nothing at random; drop it",
    "max_num_seqs": "chunk-plan plans one prompt alone, so the batch limit never applies; drop it",
    "pp_max_micro_batch_size": "chunk-plan plans one prompt alone, so the batch limit never applies; drop it",
    "pp_async_batch_depth": "chunk-plan times stage 0's prefill, which extra micro-batch slots do not change; drop it",
    "link": "chunk-plan times stage 0's prefill, which sends nothing over the link between stages; drop it",
}
FIT_CHUNKS_REJECTS: dict[str, str] = {
    "policy": "fit-chunks always runs sglang-ring; drop it",
    "enable_dynamic_chunking": "fit-chunks runs every chunk size with and without dynamic chunking; drop it",
    "chunked_prefill_size": "fit-chunks searches the initial chunk; give the sizes to try with --chunk-sizes",
    "smooth_factor": "fit-chunks searches the smoothing factor; give the values to try with --smooth-factors",
}


def reject_flags(args: argparse.Namespace, rejects: dict[str, str]) -> None:
    """Raise for the first flag given that the command would override or ignore."""
    for dest, why in rejects.items():
        v = getattr(args, dest, None)
        if v is not None:
            flag = "--" + dest.replace("_", "-")
            if isinstance(v, bool) and not v:
                flag = "--no-" + dest.replace("_", "-")
            raise PPSimError(f"{flag}: {why}")


def sglang_scenario(args: argparse.Namespace):  # noqa: ANN201 - Scenario
    """The scenario of the flags, as an ``sglang-ring`` one (both commands are about its chunks)."""
    from ppsim.cli import scenario_from_args

    args.policy = "sglang-ring"
    try:
        return scenario_from_args(args)
    finally:
        args.policy = None


def given_coefficients(args: argparse.Namespace):  # noqa: ANN201 - ChunkModel
    """The model of ``--coefficients``, checked as ``engine.policy.dynamic_chunking_coefficients`` is."""
    from ppsim.policies import chunk_coefficients_problem
    from ppsim.policy.chunking import ChunkModel

    if args.refined or args.dynamic_chunking_form is not None:
        flag = "--refined" if args.refined else "--dynamic-chunking-form"
        raise PPSimError(
            f"{flag}: picks the form fitted from the cost model, and --coefficients replaces that fit; "
            "drop one (a,b,c,gamma in --coefficients is the refined form)"
        )
    vals = _floats(args.coefficients, "--coefficients")
    if len(vals) not in (3, 4):
        raise PPSimError("--coefficients: give a,b,c (or a,b,c,gamma for the refined form), e.g. 1e-6,0.02,1.5")
    why = chunk_coefficients_problem(vals)
    if why:
        raise PPSimError(f"--coefficients: {why}")
    return ChunkModel(*vals)


def resolve_model(args: argparse.Namespace, scenario: Any):  # noqa: ANN201 - ChunkModel
    """(the chunk model, its form): ``--coefficients``, else fitted from the scenario's cost model."""
    if args.coefficients is not None:
        model = given_coefficients(args)
        return model, "refined" if model.gamma else "quadratic"
    from ppsim.cost.chunk_fit import fit_from_cost, fit_refined_from_cost
    from ppsim.deployment import prepare

    prep = prepare(scenario, requests=[])
    stage0 = prep.topology.stages[0]
    c = scenario.engine.policy.chunked_prefill_size
    if args.refined or scenario.engine.policy.dynamic_chunking_form == "refined":
        return fit_refined_from_cost(prep.cost, stage0, c, max(args.prompt_len, c)), "refined"
    return fit_from_cost(prep.cost, stage0, c), "quadratic"


def check_prompt_len(args: argparse.Namespace, scenario: Any) -> None:
    """--prompt-len within [1, MAX_TOKENS] and within the context: --max-model-len when that is given (it may
    exceed the model's max_position_embeddings, as ``simulate`` takes it), else the model's
    max_position_embeddings, the context SGLang and vLLM serve by default."""
    from ppsim.models.shape import load_model

    if args.prompt_len is None or not 1 <= args.prompt_len <= MAX_TOKENS:
        raise PPSimError(f"--prompt-len: give the prompt length in tokens, 1 to {MAX_TOKENS}")
    context = scenario.engine.max_model_len
    if context is not None and args.prompt_len > context:
        raise PPSimError(
            f"--prompt-len: {args.prompt_len} tokens exceed --max-model-len {context} (SGLang refuses such a "
            "prompt); shorten it or raise --max-model-len"
        )
    if context is None:
        model_context = load_model(scenario.model).max_position_embeddings
        if args.prompt_len > model_context:
            raise PPSimError(
                f"--prompt-len: {args.prompt_len} tokens exceed the context of {scenario.model}, "
                f"{model_context} tokens (its max_position_embeddings, which SGLang serves by default); "
                f"shorten the prompt or pass --max-model-len {args.prompt_len} to plan it past that context"
            )


def cmd_chunk_plan(args: argparse.Namespace) -> int:
    from ppsim.policy.chunking import chunk_plan

    reject_flags(args, CHUNK_PLAN_REJECTS)
    s = sglang_scenario(args)
    check_prompt_len(args, s)
    e = s.engine.policy
    model, form = resolve_model(args, s)
    sizes = chunk_plan(
        args.prompt_len, e.chunked_prefill_size, model, e.smooth_factor, e.page_size, e.max_prefill_tokens
    )
    if args.json:
        print(json.dumps(sizes))
        return 0
    print(
        f"model ({form}, ms): a={model.a:.4g} b={model.b:.4g} c={model.c:.4g}"
        + (f" gamma={model.gamma:.4g}" if model.gamma else "")
    )
    print(
        f"prompt {args.prompt_len} tokens, initial chunk {e.chunked_prefill_size}, "
        f"smooth factor {e.smooth_factor}, page size {e.page_size}: {len(sizes)} chunks"
    )
    done = 0
    print(f"{'chunk':>6}{'prefix':>9}{'tokens':>8}")
    for i, n in enumerate(sizes):
        print(f"{i:>6}{done:>9}{n:>8}")
        done += n
    return 0


def _ttft(scenario: Any, chunk: int, smooth: float | None) -> float:
    from ppsim.run import run_scenario

    pol = scenario.engine.policy.model_copy(
        update={
            "chunked_prefill_size": chunk,
            "enable_dynamic_chunking": smooth is not None,
            "smooth_factor": smooth if smooth is not None else 0.75,
        }
    )
    eng = scenario.engine.model_copy(update={"policy": pol})
    out = run_scenario(scenario.model_copy(update={"engine": eng}))
    if not out.summary["completed"]:
        raise PPSimError(
            "fit-chunks: no request completed (prompts longer than the model's context?); "
            "lower --random-input-len or raise --num-prompts"
        )
    return float(out.summary["mean_ttft_ms"])


def fit_chunks(scenario: Any, chunks: list[int], smooths: list[float]) -> dict[str, Any]:
    """Mean TTFT (ms) for each (chunk, smooth) pair with dynamic chunking and for each fixed chunk."""
    grid = [
        {"chunked_prefill_size": c, "smooth_factor": s, "mean_ttft_ms": _ttft(scenario, c, s)}
        for c in chunks
        for s in smooths
    ]
    fixed = [{"chunked_prefill_size": c, "mean_ttft_ms": _ttft(scenario, c, None)} for c in chunks]
    best = min(grid, key=lambda r: (r["mean_ttft_ms"], r["chunked_prefill_size"], r["smooth_factor"]))
    base = min(fixed, key=lambda r: (r["mean_ttft_ms"], r["chunked_prefill_size"]))
    return {"dynamic": grid, "fixed": fixed, "best": best, "baseline": base}


def plot_fit(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    chunks = sorted({r["chunked_prefill_size"] for r in result["dynamic"]})
    for c in chunks:
        rows = [r for r in result["dynamic"] if r["chunked_prefill_size"] == c]
        rows.sort(key=lambda r: r["smooth_factor"])
        (line,) = ax.plot(
            [r["smooth_factor"] for r in rows], [r["mean_ttft_ms"] for r in rows], "o-", label=f"dynamic, C={c}"
        )
        fixed = next(r["mean_ttft_ms"] for r in result["fixed"] if r["chunked_prefill_size"] == c)
        ax.axhline(fixed, linestyle="--", color=line.get_color(), label=f"fixed {c}")
    ax.set_xlabel("smoothing factor")
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("SGLang dynamic chunking: TTFT vs initial chunk and smoothing")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def check_plot_path(plot: str) -> None:
    """Refuse before the grid search a --plot path that cannot become a PNG file."""
    from ppsim.outputs import check_output_file

    check_output_file(plot, "--plot")


def cmd_fit_chunks(args: argparse.Namespace) -> int:
    reject_flags(args, FIT_CHUNKS_REJECTS)
    s = sglang_scenario(args)
    if args.plot:
        check_plot_path(args.plot)
    chunks = _ints(args.chunk_sizes, "--chunk-sizes")
    check_chunk_sizes(args, s, chunks)
    smooths = _floats(args.smooth_factors, "--smooth-factors", "0.5,0.75,1")
    if not smooths or any(not 0 <= x <= 1 for x in smooths):
        raise PPSimError("--smooth-factors: use comma-separated values in [0, 1] like 0.5,0.75,1")
    res = fit_chunks(s, chunks, smooths)
    if args.plot:
        try:
            plot_fit(res, Path(args.plot))
        except OSError as err:
            raise OutputError(f"--plot: cannot write {args.plot}: {err.strerror or err}") from None
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{'chunk':>7}{'smooth':>8}{'mean TTFT (ms)':>16}")
    for r in res["fixed"]:
        print(f"{r['chunked_prefill_size']:>7}{'fixed':>8}{r['mean_ttft_ms']:>16.2f}")
    for r in res["dynamic"]:
        print(f"{r['chunked_prefill_size']:>7}{r['smooth_factor']:>8.2f}{r['mean_ttft_ms']:>16.2f}")
    b, f = res["best"], res["baseline"]
    print(
        f"best: --chunked-prefill-size {b['chunked_prefill_size']} --smooth-factor {b['smooth_factor']} "
        f"(mean TTFT {b['mean_ttft_ms']:.2f} ms)"
    )
    print(
        f"fixed-chunk baseline: --chunked-prefill-size {f['chunked_prefill_size']} "
        f"(mean TTFT {f['mean_ttft_ms']:.2f} ms); dynamic/fixed = {b['mean_ttft_ms'] / f['mean_ttft_ms']:.3f}"
    )
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def add_chunk_parsers(sub: argparse._SubParsersAction) -> None:
    from ppsim.cli import add_scenario_flags

    p = sub.add_parser("chunk-plan", help="SGLang dynamic chunk sizes for one prompt")
    add_scenario_flags(p)
    p.add_argument("--prompt-len", type=int, help="prompt length in tokens")
    p.add_argument("--coefficients", help="a,b,c of f(l) = a l^2 + b l + c (or a,b,c,gamma); default: fitted")
    p.add_argument("--refined", action="store_true", help="fit the refined form t(L, x) with prefix work")
    p.add_argument("--json", action="store_true", help="print the chunk sizes as a JSON list")
    p.set_defaults(handler=cmd_chunk_plan)
    f = sub.add_parser("fit-chunks", help="grid-search initial chunk and smoothing factor for the lowest TTFT")
    add_scenario_flags(f)
    f.add_argument("--chunk-sizes", default="4096,8192,12288", help="initial chunk sizes to try")
    f.add_argument("--smooth-factors", default="0.5,0.75,1.0", help="smoothing factors to try")
    f.add_argument("--plot", default="fit-chunks.png", help="PNG of TTFT vs both (empty: no plot)")
    f.add_argument("--json", action="store_true")
    f.set_defaults(handler=cmd_fit_chunks)
