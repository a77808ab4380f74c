"""More bad inputs (sweep spaces, run directories read back, fit-chunks and chunk-plan, the engine, output paths), in
the form of :mod:`tests.bad_inputs`: each must end in exit 2, one ``error:`` line, nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs import ENGINE, TINY, Case, _dir, _files

# --- sweep spaces ----------------------------------------------------------------------------------------


def _space(axis: str, workload: str = "num_prompts = 4\nrandom_input_len = 16\nrandom_output_len = 4\n") -> str:
    return (
        f'name = "x"\n[base]\nmodel = "tiny"\n[base.workload]\n{workload}[space]\n{axis}\n'
        "[slo]\np99_ttft_ms = 1000\n[search]\nmax_steps = 1\n"
    )


def _sweep(case_id: str, axis: str, fragment: str, **workload: str) -> Case:
    return Case(
        case_id,
        ["sweep", "--space", "{d}/s.toml", "--no-progress", "--workers", "1", "--output-dir", "{d}/out"],
        fragment,
        _files(**{"s.toml": _space(axis, **workload)}),
    )


SWEEP = ["sweep", "--space", "{d}/s.toml", "--no-progress", "--workers", "1", "--output-dir"]


def _space_reading(base_extra: str, model: str = "tiny") -> Callable[[Path], None]:
    """``d/s.toml``: a one-configuration space whose runs read ``d/p`` (a copy of profiles/tiny-cpu) and
    ``d/m`` (a directory holding tiny's config.json); ``{d}`` in ``base_extra`` and ``model`` is ``d``."""

    def make(d: Path) -> None:
        import shutil

        root = Path(__file__).resolve().parents[1]
        shutil.copytree(root / "profiles" / "tiny-cpu", d / "p")
        (d / "m").mkdir()
        shutil.copy(root / "ppsim" / "models" / "presets" / "tiny.json", d / "m" / "config.json")
        space = _space("pp = [1]").replace('model = "tiny"\n', f'model = "{model}"\n')
        head, tail = space.split("[base.workload]", 1)
        (d / "s.toml").write_text((head + base_extra + "[base.workload]" + tail).replace("{d}", str(d)))

    return make


# --- run directories (ppsim plot / compare) -------------------------------------------------------------

GOOD_RUN = {
    "summary.json": json.dumps(
        {
            "completed": 2,
            "request_throughput": 1.0,
            "output_throughput": 4.0,
            "median_ttft_ms": 10.0,
            "median_tpot_ms": 2.0,
            "pipeline_bubble_fraction": 0.1,
            "stage_busy_fraction": [0.9, 0.8],
        }
    ),
    "config.json": json.dumps(
        {
            "model": "tiny",
            "workload": {"request_rate": 1.0},
            "cluster": {"pipeline_parallel_size": 2, "tensor_parallel_size": 1},
            "engine": {"policy": {"kind": "vllm-sync"}},
        }
    ),
    "requests.csv": "request_id,status,ttft_ms,tpot_ms,e2el_ms\n0,finished,10.0,2.0,16.0\n1,finished,12.0,2.5,19.5\n",
    "timeline.csv": (
        "track,kind,start_s,end_s\nwindow,window,0.0,0.1\nstage0,compute,0.0,0.01\nlink0->1,send,0.01,0.02\n"
    ),
    "timeseries.csv": (
        "t_start_s,t_end_s,stage0_busy,stage1_busy,kv_blocks_mean,kv_blocks_max\n0.0,0.5,0.9,0.8,3,4\n0.5,1.0,0.7,0.9,2,4\n"
    ),
}


def run_dir(**damage: str | bytes | None) -> Callable[[Path], None]:
    """A small run directory ``{d}/run`` (the files ppsim plot reads); ``damage``: ``summary_json="[1]"``
    replaces ``summary.json``, ``stage_ops_csv=...`` adds ``stage_ops.csv``, ``timeseries_csv=None`` drops it."""
    files = {**GOOD_RUN, **{".".join(k.rsplit("_", 1)): v for k, v in damage.items()}}
    return _files(**{f"run__{name}": content for name, content in files.items() if content is not None})


def _json(name: str, **fields: object) -> str:
    """``name`` of GOOD_RUN with ``fields`` replaced (the workload table for ``request_rate``)."""
    data = json.loads(GOOD_RUN[name])
    if "request_rate" in fields:
        data["workload"] = {**data["workload"], **fields}
    else:
        data.update(fields)
    return json.dumps(data)


HUGE = 10**400  # an int JSON reads back whole; past a float's range
REQUESTS_HEAD = "request_id,status,ttft_ms,tpot_ms,e2el_ms\n"
SERIES_HEAD = "t_start_s,t_end_s,stage0_busy,stage1_busy,kv_blocks_mean,kv_blocks_max\n"


def _plot(case_id: str, fragment: str, **damage: str | bytes) -> Case:
    return Case(case_id, ["plot", "{d}/run", "--output", "{d}/out/p.png"], fragment, run_dir(**damage))


def _compare(case_id: str, fragment: str, **damage: str | bytes) -> Case:
    return Case(case_id, ["compare", "{d}/run", "{d}/run", "--output-dir", "{d}/out"], fragment, run_dir(**damage))


def _both(setup: Callable[[Path], None], other: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        setup(d)
        other(d)

    return make


def _loop(d: Path) -> None:
    (d / "loopA").symlink_to("loopB")
    (d / "loopB").symlink_to("loopA")


def _checkpoint_without(d: Path) -> None:
    """A sharded checkpoint whose index puts a tensor in a shard that does not hold it."""
    import numpy as np
    from safetensors.numpy import save_file

    (d / "ck").mkdir()
    save_file({"model.norm.weight": np.zeros(4, dtype=np.float32)}, str(d / "ck" / "model-00001.safetensors"))
    index = {
        "weight_map": {"model.norm.weight": "model-00001.safetensors", "lm_head.weight": "model-00001.safetensors"}
    }
    (d / "ck" / "model.safetensors.index.json").write_text(json.dumps(index))


def _checkpoint_of(**tensors: tuple[int, ...]) -> Callable[[Path], None]:
    """A single-file checkpoint ``ck`` holding zero tensors of these names and shapes (``__`` for ``.``)."""

    def make(d: Path) -> None:
        import numpy as np
        from safetensors.numpy import save_file

        (d / "ck").mkdir()
        arrays = {k.replace("__", "."): np.zeros(dims, dtype=np.float32) for k, dims in tensors.items()}
        save_file(arrays, str(d / "ck" / "model.safetensors"))

    return make


ENG = [*ENGINE, "--output-dir", "{d}/out"]
OUT = ["--output-dir", "{d}/out"]
LATE_TRACE = "arrival_s,input_tokens,output_tokens\n0,16,4\n100000,16,4\n"
FIT = ["fit-chunks", *TINY, "--smooth-factors", "0.5", "--plot", ""]
PLAN = ["chunk-plan", "--model", "tiny"]
# a prompt past tiny's context (4096 tokens), planned under a --max-model-len that covers it
LONG_PROMPT = ["--prompt-len", "100000", "--max-model-len", "100000"]
VAL = ["validate", *TINY, "--profile", "profiles/tiny-cpu", "--repeats", "1", *OUT]

CASES_RUNS: list[Case] = [
    # --- sweep: configurations resolved at load time -------------------------------------------------
    _sweep("sweep-axis-unknown-model", 'model = ["no-such-model"]', "space: model = no-such-model: model:"),
    _sweep("sweep-axis-pp-too-deep", "pp = [100]", "space: pp = 100:"),
    _sweep("sweep-axis-tp-not-divisor", "tp = [3]", "space: tp = 3: tensor_parallel_size"),
    _sweep(
        "sweep-axis-missing-profile", '"cost.profile_dir" = ["/nonexistent"]', "space: cost.profile_dir = /nonexistent"
    ),
    _sweep("sweep-one-bad-axis-value", "pp = [1, 100]\nmax_num_seqs = [4, 8]", "space: pp = 100:"),
    _sweep(
        "sweep-axis-request-rate",
        '"workload.request_rate" = [1, 2]',
        "space.workload.request_rate: the sweep searches the request rate; remove this axis",
    ),
    _sweep("sweep-table-axis-request-rate", "workload = [{request_rate = 1}]", "space.workload.request_rate"),
    _sweep(
        "sweep-base-trace",
        "pp = [1]",
        "base.workload.trace: the sweep searches the request rate of a synthetic workload",
        workload='trace = "t.csv"\n',
    ),
    _sweep(
        "sweep-space-too-large",
        "\n".join(
            f"{k} = [{', '.join(str(i) for i in range(1, 8))}]" for k in ("seed", "pp", "tp", "batch", "block_size")
        ),
        "s.toml has 16,807 configurations (seed 7 x pp 7 x tp 7 x batch 7 x block_size 7 values), more than the 10,000",
    ),
    # --- sweep: a section that is not a table (the placeholder request rate replaced it) ---------------
    Case(
        "sweep-base-section-not-table",
        ["sweep", "--space", "{d}/s.toml", "--no-progress", "--workers", "1", "--output-dir", "{d}/out"],
        "s.toml sets workload to 'garbage', not a table",
        _files(
            **{"s.toml": '[base]\nmodel = "tiny"\nworkload = "garbage"\n[space]\npp = [1]\n[slo]\np99_ttft_ms = 100\n'}
        ),
    ),
    _sweep("sweep-axis-section-not-table", 'workload = ["garbage"]', "s.toml sets workload to"),
    # --- sweep: an output folder that is or lies inside a path its runs read (results went into it) ----
    Case(
        "sweep-outdir-is-profile",
        [*SWEEP, "{d}/p"],
        "/p is also cost.profile_dir of --space; the results would be written into it",
        _space_reading('[base.cost]\nprofile_dir = "{d}/p"\n'),
    ),
    Case(
        "sweep-outdir-inside-profile",
        [*SWEEP, "{d}/p/out"],
        "/p/out lies inside cost.profile_dir of --space ",
        _space_reading('[base.cost]\nprofile_dir = "{d}/p"\n'),
    ),
    Case(
        "sweep-outdir-is-model-dir",
        [*SWEEP, "{d}/m"],
        "/m is also model of --space; the results would be written into it",
        _space_reading("", model="{d}/m"),
    ),
    _sweep(
        "sweep-axis-subsection-not-table",
        '"engine.cpu" = [5]\n"engine.cpu.schedule_us" = [1]',
        "s.toml sets engine.cpu to 5, not a table",
    ),
    # --- plot / compare: damaged run directories --------------------------------------------------------
    _plot("plot-summary-list", "run/summary.json: a JSON list, not an object", summary_json="[1]\n"),
    _plot(
        "plot-summary-text-number", "run/summary.json: request_throughput", summary_json='{"request_throughput": "x"}'
    ),
    _plot("plot-config-list", "run/config.json: a JSON list", config_json="[1]\n"),
    _plot("plot-config-rate-text", "workload.request_rate", config_json='{"workload": {"request_rate": "fast"}}'),
    _plot(
        "plot-requests-short-row",
        "run/requests.csv: line 2 has 2 fields",
        requests_csv="request_id,status,ttft_ms,tpot_ms,e2el_ms\n1,finished\n",
    ),
    _plot(
        "plot-requests-text-latency",
        "run/requests.csv: line 2: ttft_ms",
        requests_csv="request_id,status,ttft_ms,tpot_ms,e2el_ms\n1,finished,fast,1,2\n",
    ),
    _plot(
        "plot-requests-not-utf8",
        "run/requests.csv: not UTF-8",
        requests_csv=b"request_id,status,ttft_ms,tpot_ms,e2el_ms\n1,finished,1,1,\xe9\n",
    ),
    _plot("plot-timeline-no-start", "run/timeline.csv: no start_s", timeline_csv="track,kind\nx,y\n"),
    _plot("plot-timeline-text", "run/timeline.csv: line 2: end_s", timeline_csv="track,kind,start_s,end_s\nw,w,0,x\n"),
    _plot("plot-timeseries-ragged", "run/timeseries.csv: line 2 has 1 fields", timeseries_csv="t_start_s,t_end_s\n1\n"),
    _plot("plot-timeseries-empty", "run/timeseries.csv: empty", timeseries_csv=""),
    _plot("plot-timeseries-text", "run/timeseries.csv: line 2", timeseries_csv="t_start_s,t_end_s\n0,x\n"),
    _plot("plot-timeseries-bad-stage", "stageN_busy", timeseries_csv="t_start_s,t_end_s,stageX_busy\n0,1,0.5\n"),
    _compare("compare-summary-list", "run/summary.json", summary_json="[1]\n"),
    # huge ints (math.isfinite raised OverflowError) and values past the ranges a run can hold (the plots
    # raised on limits near a float's maximum, or printed numpy/matplotlib warnings)
    _plot(
        "plot-summary-huge-int",
        "run/summary.json: completed is an integer of 401 digits, not a finite number",
        summary_json=_json("summary.json", completed=HUGE),
    ),
    _plot(
        "plot-summary-busy-huge-int",
        "run/summary.json: stage_busy_fraction[1] is an integer of 401 digits",
        summary_json=_json("summary.json", stage_busy_fraction=[0.5, HUGE]),
    ),
    _plot(
        "plot-config-rate-huge-int",
        "run/config.json: workload.request_rate is an integer of 401 digits",
        config_json=_json("config.json", request_rate=HUGE),
    ),
    _compare(
        "compare-summary-duration-huge-int",
        "run/summary.json: duration is an integer of 401 digits",
        summary_json=_json("summary.json", duration=HUGE),
    ),
    _compare(
        "compare-summary-mean-ttft-huge-int",
        "run/summary.json: mean_ttft_ms is an integer",
        summary_json=_json("summary.json", mean_ttft_ms=HUGE),
    ),
    _compare(
        "compare-summary-throughput-past-range",
        "run/summary.json: request_throughput is 1e+308, not within [0, 1e+30]",
        summary_json=_json("summary.json", request_throughput=1e308),
    ),
    _plot(
        "plot-summary-bubble-above-one",
        "run/summary.json: pipeline_bubble_fraction is 1.5, not within [0, 1]",
        summary_json=_json("summary.json", pipeline_bubble_fraction=1.5),
    ),
    _plot(
        "plot-timeline-window-huge",
        "run/timeline.csv: line 2: start_s is '-1e308', not within [0, 1e+30]",
        timeline_csv="track,kind,start_s,end_s\nwindow,window,-1e308,1e308\nstage0,compute,0.0,0.01\n",
    ),
    _plot(
        "plot-timeseries-huge-times",
        "run/timeseries.csv: line 2: t_start_s is '-1e308'",
        timeseries_csv=SERIES_HEAD + "-1e308,1e308,0.1,0.1,1,1\n",
    ),
    _plot(
        "plot-timeseries-huge-busy",
        "run/timeseries.csv: line 3: stage0_busy is '1e308', not within [0, 1]",
        timeseries_csv=SERIES_HEAD + "0,1,0.5,0.5,1,1\n1,2,1e308,0.5,1,1\n",
    ),
    _plot(
        "plot-timeseries-negative-kv",
        "run/timeseries.csv: line 2: kv_blocks_mean is '-1e308'",
        timeseries_csv=SERIES_HEAD + "0,1,0.5,0.5,-1e308,1\n",
    ),
    _plot(
        "plot-timeseries-empty-bin",
        "run/timeseries.csv: line 2: the bin [1, 1) s is empty",
        timeseries_csv=SERIES_HEAD + "1,1,0.5,0.5,1,1\n",
    ),
    _plot(
        "plot-timeseries-bins-backwards",
        "run/timeseries.csv: line 3: the bin [0, 1) s is empty or starts before 2 s",
        timeseries_csv=SERIES_HEAD + "1,2,0.5,0.5,1,1\n0,1,0.5,0.5,1,1\n",
    ),
    _plot(
        "plot-requests-huge-latency",
        "run/requests.csv: line 2: ttft_ms is '1e308', not within [0, 1e+30]",
        requests_csv=REQUESTS_HEAD + "0,finished,1e308,1e308,1e308\n1,finished,-1e308,-1e308,-1e308\n",
    ),
    _compare(
        "compare-requests-negative-latency",
        "run/requests.csv: line 2: e2el_ms is '-5'",
        requests_csv=REQUESTS_HEAD + "0,finished,1,1,-5\n",
    ),
    _plot(
        "plot-stage-ops-huge-end",
        "run/stage_ops.csv: line 2: end_s is '1e308', not within [0, 1e+30]",
        timeseries_csv=None,
        stage_ops_csv="track,kind,start_s,end_s\nstage0,compute,0,1e308\n",
    ),
    _compare("compare-requests-short-row", "run/requests.csv", requests_csv="status,ttft_ms,tpot_ms,e2el_ms\nx\n"),
    # --- plot / compare: output paths, checked before drawing --------------------------------------------
    Case(
        "plot-output-is-dir",
        ["plot", "{d}/run", "--output", "{d}/dir.png"],
        "--output:",
        _both(run_dir(), _dir("dir.png")),
    ),
    Case("plot-output-in-proc", ["plot", "{d}/run", "--output", "/proc/ppsim-x.png"], "--output:", run_dir()),
    Case("plot-output-empty", ["plot", "{d}/run", "--output", ""], "--output: empty path; name the PNG", run_dir()),
    Case("compare-output-blank", ["compare", "{d}/run", "--output", " "], "--output: empty path", run_dir()),
    Case(
        "compare-output-and-output-dir",
        ["compare", "{d}/run", "--output", "{d}/out/c.png", "--output-dir", "/dev/null/x"],
        "--output-dir: --output names the PNG itself",
        run_dir(),
    ),
    Case(
        "compare-outdir-is-file",
        ["compare", "{d}/run", "{d}/run", "--output-dir", "{d}/f"],
        "--output-dir:",
        _both(run_dir(), _files(f="x")),
    ),
    # --- compare: compare.png goes beside the runs, not into one (that changed a run's set) ----------------
    Case(
        "compare-outdir-is-run",
        ["compare", "{d}/run", "--output-dir", "{d}/run"],
        "/run is also RUN_DIR; the results would be written into it",
        run_dir(),
    ),
    Case(
        "compare-outdir-inside-run",
        ["compare", "{d}/run", "{d}/run", "--output-dir", "{d}/run/plots"],
        "/run/plots lies inside RUN_DIR #1 ",
        run_dir(),
    ),
    Case(
        "compare-output-in-proc",
        ["compare", "{d}/run", "{d}/run", "--output", "/proc/ppsim-x.png"],
        "--output:",
        run_dir(),
    ),
    # --- fit-chunks ------------------------------------------------------------------------------------
    Case("fit-chunks-inf", [*FIT, "--chunk-sizes", "inf"], "--chunk-sizes"),
    Case("fit-chunks-nan", [*FIT, "--chunk-sizes", "nan"], "--chunk-sizes"),
    Case("fit-chunks-below-block", [*FIT, "--chunk-sizes", "1"], "--chunk-sizes: 1 tokens"),
    Case("fit-chunks-empty-item", [*FIT, "--chunk-sizes", "64,,128"], "like 2048,4096 (got '64,,128')"),
    Case("fit-chunks-absurd", [*FIT, "--chunk-sizes", "1000000000000000"], "--chunk-sizes: 1000000000000000"),
    Case("fit-chunks-plot-blank", [*FIT, "--plot", " "], "--plot: empty path; give a PNG file such as plot.png"),
    Case(
        "fit-chunks-plot-in-proc",
        ["fit-chunks", *TINY, "--chunk-sizes", "64", "--smooth-factors", "0.5", "--plot", "/proc/ppsim-x.png"],
        "--plot:",
    ),
    # --- chunk-plan: coefficients that plan nothing meaningful, flags it ignored, a prompt past the context ---
    Case(
        "coefficients-overflow",
        [*PLAN, "--coefficients", "1e308,1e308,1e308", *LONG_PROMPT],
        "--coefficients: a=1e+308, b=1e+308 overflow the chunk-size solver",
    ),
    Case(
        "coefficients-gamma-negative",
        [*PLAN, "--coefficients", "1,1,1,-1e6", *LONG_PROMPT],
        "--coefficients: gamma=-1e+06 must be >= 0",
    ),
    *(
        Case(
            f"coefficients-constant-{i}",
            [*PLAN, "--coefficients", c, *LONG_PROMPT],
            "--coefficients: a=0 and b=0 give every length the same time",
        )
        for i, c in enumerate(["0,0,0", "0,0,-5", "0,0,1e308"])
    ),
    Case(
        "coefficients-empty",
        [*PLAN, "--coefficients", "", "--prompt-len", "100"],
        "--coefficients: use comma-separated numbers",
    ),
    Case(
        "coefficients-empty-items",
        [*PLAN, "--coefficients", ",,,1,2,3", "--prompt-len", "100"],
        "(got ',,,1,2,3')",
    ),
    Case(
        "coefficients-and-refined",
        [*PLAN, "--coefficients", "1e-6,0.02,1.5", "--refined", "--prompt-len", "100"],
        "--refined: picks the form fitted from the cost model",
    ),
    Case(
        "chunk-plan-page-above-chunk",
        [*PLAN, "--page-size", "100000000", "--prompt-len", "100000"],
        "engine.policy.page_size 100000000 is above a prefill batch's budget",
    ),
    Case(
        "chunk-plan-prompt-above-max-model-len",
        [*PLAN, "--prompt-len", "100000", "--max-model-len", "50"],
        "--prompt-len: 100000 tokens exceed --max-model-len 50",
    ),
    # without --max-model-len the context is tiny's max_position_embeddings, 4096 (the prompt was planned)
    Case(
        "chunk-plan-prompt-above-model-context",
        [*PLAN, "--prompt-len", "5000"],
        "--prompt-len: 5000 tokens exceed the context of tiny, 4096 tokens (its max_position_embeddings, "
        "which SGLang serves by default); shorten the prompt or pass --max-model-len 5000",
    ),
    *(
        Case(
            f"chunk-plan-ignored-{flag[2:]}",
            [*PLAN, "--prompt-len", "100", flag, value],
            f"{flag}: chunk-plan",
        )
        for flag, value in [("--seed", "3"), ("--max-num-seqs", "2"), ("--link", "ethernet")]
    ),
    # --- engine: refused before the stages are spawned ---------------------------------------------------
    Case(
        "engine-startup-timeout-huge", [*ENG, "--startup-timeout-s", "1e300"], "--startup-timeout-s", needs_torch=True
    ),
    Case("engine-stage-timeout-huge", [*ENG, "--stage-timeout-s", "1e9"], "--stage-timeout-s", needs_torch=True),
    Case("engine-threads-huge", [*ENG, "--threads-per-stage", "100000"], "--threads-per-stage", needs_torch=True),
    Case(
        "engine-checkpoint-index-not-table",
        [*ENG, "--checkpoint", "{d}/ck"],
        "--checkpoint: ",
        _files(**{"ck__model.safetensors.index.json": '{"weight_map": 5}'}),
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-random-bytes",
        [*ENG, "--checkpoint", "{d}/ck"],
        "not a readable safetensors file",
        _files(**{"ck__model.safetensors": bytes(range(256)) * 4}),
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-empty",
        [*ENG, "--checkpoint", "{d}/ck"],
        "not a readable safetensors file",
        _files(**{"ck__model.safetensors": b""}),
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-shard-missing",
        [*ENG, "--checkpoint", "{d}/ck"],
        "is missing",
        _files(**{"ck__model.safetensors.index.json": '{"weight_map": {"a": "model-00001.safetensors"}}'}),
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-index-lists-absent-tensor",
        [*ENG, "--checkpoint", "{d}/ck"],
        "'lm_head.weight' in model-00001.safetensors, which does not hold it",
        _checkpoint_without,
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-of-another-model",  # tiny's embedding, none of its layers (another model's names)
        [*ENG, "--checkpoint", "{d}/ck"],
        "lacks tensor 'model.layers.0.self_attn.q_proj.weight' (74 of the 75 that tiny loads are missing)",
        _checkpoint_of(model__embed_tokens__weight=(2048, 256), model__layers__0__mlp__experts__0__w1=(4, 4)),
        needs_torch=True,
    ),
    Case(
        "engine-checkpoint-wrong-shape",
        [*ENG, "--checkpoint", "{d}/ck"],
        "holds tensor 'model.embed_tokens.weight' with shape (4, 256), tiny needs (2048, 256)",
        _checkpoint_of(model__embed_tokens__weight=(4, 256)),
        needs_torch=True,
    ),
    Case("engine-checkpoint-empty-path", [*ENG, "--checkpoint", ""], "--checkpoint: empty", needs_torch=True),
    # --- engine: dtypes it does not run, knobs that change nothing, sizes and timeouts -----------------------
    Case(
        "engine-weights-fp8",
        [*ENG, "-q", "fp8"],
        "weight_dtype: the engine runs tiny in its torch_dtype float32",
        needs_torch=True,
    ),
    Case("engine-weights-bf16", [*ENG, "-q", "bf16"], "not bfloat16; drop -q/--quantization", needs_torch=True),
    Case(
        "engine-kv-fp8",
        [*ENG, "--kv-cache-dtype", "fp8"],
        "kv_cache_dtype: the engine runs tiny in its torch_dtype",
        needs_torch=True,
    ),
    Case(
        "engine-router-zipf-dense",
        [*ENG, "--moe-router-zipf", "2"],
        "moe_router_zipf: 'tiny' is a dense model",
        needs_torch=True,
    ),
    Case("simulate-router-zipf-dense", ["simulate", *TINY, "--moe-router-zipf", "1", *OUT], "drop --moe-router-zipf"),
    Case(
        "engine-routing-skew-dense",
        [*ENG, "--moe-routing-skew", "4"],
        "cost.moe_routing_skew: 'tiny' is a dense",
        needs_torch=True,
    ),
    Case(
        "engine-max-kv-gib-tiny", [*ENG, "--max-kv-gib", "1e-300"], "--max-kv-gib: the cap is in GiB", needs_torch=True
    ),
    Case(
        "engine-max-kv-gib-huge",
        [*ENG, "--max-kv-gib", "1e300", "--kv-blocks", "100000000"],
        "--max-kv-gib: ",
        needs_torch=True,
    ),
    Case(
        "engine-kv-above-the-cap-in-tib",
        [*ENG, "--max-kv-gib", "4096", "--kv-blocks", "100000000"],
        "kv cache: 100000000 blocks need 5.96 TiB on a stage, above --max-kv-gib 4096 (4.00 TiB)",
        needs_torch=True,
    ),
    Case(
        "engine-kv-above-a-small-cap",
        [*ENG, "--max-kv-gib", "0.001", "--kv-blocks", "100"],
        "need 6.31 MiB on a stage, above --max-kv-gib 0.001 (1.02 MiB)",
        needs_torch=True,
    ),
    Case(
        "engine-stage-timeout-tiny",
        [*ENG, "--stage-timeout-s", "1e-9"],
        "--stage-timeout-s: at least 1 s",
        needs_torch=True,
    ),
    Case(
        "engine-stage-timeout-tiny-in-file",
        [*ENG, "--config", "{d}/c.toml"],
        "live_engine.stage_timeout_s: at least 1 s",
        _files(**{"c.toml": "[live_engine]\nstage_timeout_s = 1e-300\n"}),
        needs_torch=True,
    ),
    Case(
        "engine-startup-timeout-tiny",
        [*ENG, "--startup-timeout-s", "0.5"],
        "--startup-timeout-s: at least 1 s",
        needs_torch=True,
    ),
    # --- engine: the fault-injection hook --------------------------------------------------------------------
    Case("engine-fault-empty", [*ENG, "--inject-fault", ""], "--inject-fault: empty", needs_torch=True),
    Case(
        "engine-fault-unknown-kind",
        [*ENG, "--inject-fault", "boom:0:1"],
        "--inject-fault: unknown kind 'boom'",
        needs_torch=True,
    ),
    Case(
        "engine-fault-negative-step",
        [*ENG, "--inject-fault", "kill:0:-5"],
        "step '-5' is neither start",
        needs_torch=True,
    ),
    Case(
        "engine-fault-step-never-reached",
        [*ENG, "--inject-fault", "kill:0:" + "9" * 20],
        "is never reached",
        needs_torch=True,
    ),
    Case(
        "engine-fault-two-fields",
        [*ENG, "--inject-fault", "kill:0"],
        "'kill:0' is not KIND:STAGE:STEP",
        needs_torch=True,
    ),
    Case(
        "engine-fault-no-such-stage",
        [*ENG, "--inject-fault", "stall:2:start"],
        "--inject-fault: there is no stage 2: the run has 2 (0 to 1)",
        needs_torch=True,
    ),
    Case(
        "engine-trace-arrives-late",
        ["engine", "--model", "tiny", "-pp", "2", "--trace", "{d}/t.csv", *OUT],
        "--trace: its last request arrives at 100000 s",
        _files(**{"t.csv": LATE_TRACE}),
        needs_torch=True,
    ),
    Case(
        "engine-rate-spreads-past-an-hour",
        [*ENG, "--num-prompts", "100", "--request-rate", "0.001"],
        "--request-rate: 0.001 req/s",
        needs_torch=True,
    ),
    # --- output and input paths ----------------------------------------------------------------------------
    Case("outdir-symlink-loop", ["simulate", *TINY, "--output-dir", "{d}/loopA"], "--output-dir: ", _loop),
    Case("outdir-under-symlink-loop", ["simulate", *TINY, "--output-dir", "{d}/loopA/x"], "symlink loop", _loop),
    Case("outdir-name-too-long", ["simulate", *TINY, "--output-dir", "{d}/" + "a" * 300], "--output-dir: a name in"),
    Case("trace-path-newline", ["simulate", "--model", "tiny", "--trace", "{d}/no\nsuch.csv", *OUT], "no\\nsuch.csv"),
    Case("config-path-newline", ["simulate", *TINY, "--config", "{d}/c\n.toml", *OUT], "c\\n.toml"),
    Case("profile-path-newline", ["simulate", *TINY, "--profile", "{d}/p\nq", *OUT], "p\\nq"),
    Case(
        "outdir-newline-under-file",
        ["simulate", *TINY, "--output-dir", "{d}/f/a\nb"],
        "--output-dir: ",
        _files(f="x"),
    ),
    # --- validate: host-guard limits, repeats, a workload of which no request would be served -------------
    Case("validate-host-max-drift-inf", [*VAL, "--host-max-drift", "inf"], "--host-max-drift: inf must be in (0, 10]"),
    Case("validate-host-max-drift-huge", [*VAL, "--host-max-drift", "1e9"], "--host-max-drift: 1e+09 must be in"),
    Case(
        "validate-host-max-drift-guard-off",
        [*VAL, "--host-guard", "off", "--host-max-drift", "0.5"],
        "--host-max-drift: the host guard is off",
    ),
    Case(
        "validate-host-min-core-share-guard-off",
        [*VAL, "--host-guard", "off", "--host-min-core-share", "0.5"],
        "--host-min-core-share: the host guard is off",
    ),
    Case("validate-repeats-huge", [*VAL, "--repeats", "1000000"], "--repeats: 1000000 must be in [1, 100]"),
    Case(
        "validate-every-request-rejected",
        [*VAL, "--kv-blocks", "1"],
        "4 of 4 requests rejected: 4 need up to 2 KV blocks, the cache has 1",
        needs_torch=True,
    ),
]
