"""The table of bad inputs a new user might give, and how a run of ``ppsim`` ends on each.

Each case is a command line (``{d}`` is replaced by a scratch directory) plus the files it needs,
and a fragment the one-line error must contain. :func:`run_case` calls ``ppsim.cli.main`` in
process and sorts the ending into one of:

- ``refused``: exit 2, one line on stderr starting ``error:``, nothing written to ``{d}/out``;
- ``traceback``: an exception escaped ``main``;
- ``accepted``: exit 0 (the bad input was silently taken);
- ``usage``: exit 2 with more than one line (argparse's usage block);
- ``other``: any other exit code or message.

``python tests/bad_inputs.py`` prints every case's ending and the counts (the figure quoted in
docs/reliability.md), this table's and those of ``tests/bad_inputs_config.py`` (model configs, traces,
bounds), ``tests/bad_inputs_profiles.py`` (profiles, Vidur files, calibrate) and ``tests/bad_inputs_runs.py``
(sweeps, run directories, fit-chunks, engine, paths); ``tests/test_bad_inputs.py`` asserts that every case
of the four is ``refused``.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TINY = ["--model", "tiny", "-pp", "2", "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "4"]
ENGINE = ["engine", *TINY, "--request-rate", "inf"]


def _files(**named: str | bytes) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        for name, content in named.items():
            p = d / name.replace("__", "/")
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                p.write_bytes(content)
            else:
                p.write_text(content)

    return make


def _dir(name: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        (d / name).mkdir(parents=True)

    return make


def _profile_copy(name: str, **more: str) -> Callable[[Path], None]:
    """``d/name``: a copy of profiles/tiny-cpu, plus the files ``more``."""

    def make(d: Path) -> None:
        shutil.copytree(Path(__file__).resolve().parents[1] / "profiles" / "tiny-cpu", d / name)
        _files(**more)(d)

    return make


HF_BAD = (
    '{"hidden_size": -64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, '
    '"vocab_size": 100}'
)
LATIN1 = "# r\xe9sum\xe9\nseed = 1\n".encode("latin-1")
TRACE_LATIN1 = "arrival_s,input_tokens,output_tokens\n0,16,4 # caf\xe9\n".encode("latin-1")
TRACE = "arrival_s,input_tokens,output_tokens\n0,16,4\n0.1,16,4\n"
SPACE = (
    'name = "tiny"\n[base]\nmodel = "tiny"\n[base.workload]\nnum_prompts = 4\nrandom_input_len = 16\n'
    "random_output_len = 4\n[space]\npp = [1]\n[slo]\np99_ttft_ms = 1000\n[search]\nmax_steps = 1\n"
)
TINY_MEM = 'hardware = {name = "tiny-gpu", peak_tflops = 10, hbm_bandwidth_gbps = 100, memory_gib = 1}\n'

HW_INF = 'hardware = {name = "inf-gpu", peak_tflops = inf, hbm_bandwidth_gbps = 100, memory_gib = 80}\n'


def _trace_in_result_dir(d: Path) -> None:
    """``d/r``: an earlier result set (its marker) that now holds the trace ``c.toml`` names."""
    _files(**{"r__.ppsim-result": "", "r__t.csv": TRACE, "c.toml": f'[workload]\ntrace = "{d}/r/t.csv"\n'})(d)


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    fragment: str  # the error line must contain this
    setup: Callable[[Path], None] | None = field(default=None, compare=False)
    needs_torch: bool = False


CASES: list[Case] = [
    # --- output paths -------------------------------------------------------------------------
    Case("outdir-is-file", ["simulate", *TINY, "--output-dir", "{d}/f"], "not a directory", _files(f="x")),
    Case("outdir-under-file", ["simulate", *TINY, "--output-dir", "{d}/f/out"], "not a directory", _files(f="x")),
    Case("outdir-in-proc", ["simulate", *TINY, "--output-dir", "/proc/ppsim-out"], "/proc"),
    Case("outdir-empty-string", ["simulate", *TINY, "--output-dir", ""], "--output-dir: empty"),
    Case(
        "result-name-is-dir", ["simulate", *TINY, "--output-dir", "{d}/out"], "summary.json", _dir("out/summary.json")
    ),
    Case(
        "outdir-holds-user-files",
        ["simulate", *TINY, "--output-dir", "{d}/out"],
        "not a ppsim result",
        _files(out__notes="mine"),
    ),
    Case(
        "outdir-known-names-hold-user-files",
        ["simulate", *TINY, "--output-dir", "{d}/proj"],
        "it holds profile/notes.txt, results/paper.csv)",
        _files(**{"proj__results__paper.csv": "a", "proj__profile__notes.txt": "n", "proj__config.json": "{}"}),
    ),
    Case(
        "import-vidur-outdir-engine-dir-holds-user-file",
        ["import-vidur", "--model", "llama-2-7b", "--output-dir", "{d}/proj"],
        "it holds engine-0/my.txt",
        _files(**{"proj__engine-0__my.txt": "mine"}),
    ),
    Case(
        "engine-outdir-is-profile",
        [*ENGINE, "--profile", "{d}/p", "--output-dir", "{d}/p"],
        "/p is also --profile; the results would replace it",
        _profile_copy("p"),
        needs_torch=True,
    ),
    Case(
        "validate-outdir-is-profile",
        ["validate", *TINY, "--profile", "{d}/p", "--output-dir", "{d}/p"],
        "/p is also --profile; the results would replace it",
        _profile_copy("p"),
    ),
    Case(
        "outdir-inside-profile",
        ["simulate", *TINY, "--profile", "{d}/p", "--output-dir", "{d}/p/out"],
        "/p/out lies inside --profile ",
        _profile_copy("p"),
    ),
    Case(
        "outdir-holds-trace-of-config",
        ["simulate", "--model", "tiny", "--config", "{d}/c.toml", "--output-dir", "{d}/r"],
        "/r holds workload.trace ",
        _trace_in_result_dir,
    ),
    Case("engine-outdir-is-file", [*ENGINE, "--output-dir", "{d}/f"], "not a directory", _files(f="x")),
    Case(
        "validate-outdir-is-file",
        ["validate", *TINY, "--profile", "profiles/tiny-cpu", "--output-dir", "{d}/f"],
        "not a directory",
        _files(f="x"),
    ),
    Case(
        "sweep-outdir-is-file",
        ["sweep", "--space", "{d}/s.toml", "--no-progress", "--output-dir", "{d}/f"],
        "not a directory",
        _files(f="x", **{"s.toml": SPACE}),
    ),
    Case(
        "calibrate-output-under-file",
        ["calibrate", "--quick", "--output", "{d}/f/p"],
        "not a directory",
        _files(f="x"),
        needs_torch=True,
    ),
    Case(
        "import-vidur-output-is-file",
        ["import-vidur", "--model", "llama-2-7b", "--output", "{d}/f"],
        "not a directory",
        _files(f="x"),
    ),
    Case(
        "fit-chunks-plot-is-dir",
        ["fit-chunks", *TINY, "--chunk-sizes", "64", "--smooth-factors", "0.5", "--plot", "{d}/out"],
        "--plot",
        _dir("out"),
    ),
    # --- values -------------------------------------------------------------------------------
    Case("negative-seed-flag", ["simulate", *TINY, "--seed", "-1", "--output-dir", "{d}/out"], "seed"),
    Case(
        "negative-seed-config",
        ["simulate", *TINY, "--config", "{d}/c.toml", "--output-dir", "{d}/out"],
        "seed",
        _files(**{"c.toml": "seed = -3\n"}),
    ),
    Case(
        "profile-dir-with-analytic-kind",
        ["simulate", *TINY, "--config", "{d}/c.toml", "--output-dir", "{d}/out"],
        "profile_dir is set but kind is 'analytic'",
        _files(**{"c.toml": '[cost]\nkind = "analytic"\nprofile_dir = "p"\n'}),
    ),
    Case(
        "profile-dir-alone-is-a-profile",
        ["simulate", *TINY, "--config", "{d}/c.toml", "--output-dir", "{d}/out"],
        "is not a directory",
        _files(**{"c.toml": '[cost]\nprofile_dir = "missing-profile"\n'}),
    ),
    Case(
        "config-not-utf8",
        ["simulate", *TINY, "--config", "{d}/c.toml", "--output-dir", "{d}/out"],
        "UTF-8",
        _files(**{"c.toml": LATIN1}),
    ),
    Case(
        "trace-not-utf8",
        ["simulate", "--model", "tiny", "--trace", "{d}/t.csv", "--output-dir", "{d}/out"],
        "UTF-8",
        _files(**{"t.csv": TRACE_LATIN1}),
    ),
    Case(
        "hf-config-not-utf8",
        ["simulate", "--model", "{d}/config.json", "--output-dir", "{d}/out"],
        "UTF-8",
        _files(**{"config.json": b'{"name": "\xe9"}'}),
    ),
    Case(
        "num-prompts-absurd",
        ["simulate", *TINY, "--num-prompts", "1000000000000", "--output-dir", "{d}/out"],
        "workload.num_prompts",
    ),
    Case(
        "input-len-absurd",
        ["simulate", *TINY, "--random-input-len", "1000000000000", "--output-dir", "{d}/out"],
        "workload.random_input_len",
    ),
    Case(
        "chunk-plan-prompt-len-absurd",
        ["chunk-plan", "--model", "tiny", "-pp", "2", "--coefficients", "1e-6,0.01,1", "--prompt-len", "1000000000000"],
        "--prompt-len",
    ),
    Case(
        "burstiness-inf", ["simulate", *TINY, "--burstiness", "inf", "--output-dir", "{d}/out"], "workload.burstiness"
    ),
    Case(
        "burstiness-nan", ["simulate", *TINY, "--burstiness", "nan", "--output-dir", "{d}/out"], "workload.burstiness"
    ),
    Case(
        "abort-window-inf",
        ["simulate", *TINY, "--abort-rate", "0.5", "--abort-window-s", "inf", "--output-dir", "{d}/out"],
        "workload.abort_window_s",
    ),
    Case(
        "request-rate-nan",
        ["simulate", *TINY, "--request-rate", "nan", "--output-dir", "{d}/out"],
        "workload.request_rate",
    ),
    Case(
        "moe-skew-inf",
        ["simulate", *TINY, "--moe-routing-skew", "inf", "--output-dir", "{d}/out"],
        "cost.moe_routing_skew",
    ),
    Case(
        "engine-stage-timeout-inf",
        [*ENGINE, "--stage-timeout-s", "inf", "--output-dir", "{d}/out"],
        "--stage-timeout-s",
        needs_torch=True,
    ),
    Case(
        "engine-startup-timeout-zero",
        [*ENGINE, "--startup-timeout-s", "0", "--output-dir", "{d}/out"],
        "--startup-timeout-s",
        needs_torch=True,
    ),
    Case(
        "hardware-table-inf",
        ["simulate", *TINY, "--config", "{d}/h.toml", "--output-dir", "{d}/out"],
        "hardware.peak_tflops",
        _files(**{"h.toml": HW_INF}),
    ),
    Case(
        "max-model-len-zero",
        ["simulate", *TINY, "--max-model-len", "0", "--output-dir", "{d}/out"],
        "engine.max_model_len",
    ),
    Case(
        "trace-with-num-prompts",
        ["simulate", "--model", "tiny", "--trace", "{d}/t.csv", "--num-prompts", "9", "--output-dir", "{d}/out"],
        "num_prompts",
        _files(**{"t.csv": TRACE}),
    ),
    Case(
        "trace-with-request-rate",
        ["simulate", "--model", "tiny", "--trace", "{d}/t.csv", "--request-rate", "3", "--output-dir", "{d}/out"],
        "request_rate",
        _files(**{"t.csv": TRACE}),
    ),
    Case(
        "validate-calibrate-and-profile",
        ["validate", *TINY, "--calibrate", "--profile", "profiles/tiny-cpu", "--output-dir", "{d}/out"],
        "--calibrate",
    ),
    Case(
        "validate-repeats-zero",
        ["validate", *TINY, "--profile", "profiles/tiny-cpu", "--repeats", "0", "--output-dir", "{d}/out"],
        "--repeats",
    ),
    Case(
        "sweep-top-negative",
        ["sweep", "--space", "experiments/spaces/llama2-70b-small.toml", "--top", "-1", "--output-dir", "{d}/out"],
        "--top",
    ),
    Case(
        "hf-config-bad-value",
        ["simulate", "--model", "{d}/config.json", "--output-dir", "{d}/out"],
        "hidden_size",
        _files(**{"config.json": HF_BAD}),
    ),
    Case(
        "coefficients-inf",
        ["chunk-plan", "--model", "tiny", "--coefficients", "inf,0,0", "--prompt-len", "100"],
        "--coefficients",
    ),
    Case(
        "coefficients-negative",
        ["chunk-plan", "--model", "tiny", "--coefficients", "-1,0,0", "--prompt-len", "100"],
        "--coefficients",
    ),
    Case(
        "tiny-memory-hardware",
        ["simulate", *TINY, "--config", "{d}/h.toml", "--output-dir", "{d}/out"],
        "hardware.memory_gib",
        _files(**{"h.toml": TINY_MEM}),
    ),
    # --- argparse -----------------------------------------------------------------------------
    Case("num-prompts-not-int", ["simulate", "--num-prompts", "abc", "--output-dir", "{d}/out"], "--help"),
    Case("typo-flag", ["simulate", "--num-promts", "3", "--output-dir", "{d}/out"], "--help"),
    Case("unknown-command", ["simulat", "--model", "tiny"], "--help"),
    Case("bad-choice", ["simulate", "--pp-broadcast", "sometimes", "--output-dir", "{d}/out"], "--help"),
    Case("sweep-missing-space", ["sweep", "--output-dir", "{d}/out"], "--space"),
]


@dataclass
class Ending:
    kind: str  # refused | traceback | accepted | usage | other
    code: int | None
    stderr: str


def run_case(case: Case, d: Path) -> Ending:
    """Run ``case`` in process with ``{d}`` -> ``d``; classify how it ended."""
    from ppsim.cli import main

    if case.setup:
        case.setup(d)
    argv = [a.replace("{d}", str(d)) for a in case.argv]
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    except BaseException as e:  # noqa: BLE001 - what a user would see as a traceback
        return Ending("traceback", None, f"{type(e).__name__}: {e}")
    text = err.getvalue()
    lines = text.strip().splitlines()
    if code == 0:
        return Ending("accepted", 0, text)
    if code == 2 and len(lines) > 1:
        return Ending("usage", 2, text)
    written = (
        d / "out"
        if case.id not in ("result-name-is-dir", "outdir-holds-user-files", "fit-chunks-plot-is-dir")
        else None
    )
    if code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not (written and written.exists()):
        return Ending("refused", 2, text)
    return Ending("other", code, text)


def all_cases() -> list[Case]:
    """This table and the three of the second hunt (imported here: they build on this module's Case)."""
    from tests.bad_inputs_config import CASES_CONFIG
    from tests.bad_inputs_profiles import CASES_PROFILES
    from tests.bad_inputs_runs import CASES_RUNS

    return CASES + CASES_CONFIG + CASES_PROFILES + CASES_RUNS


def main() -> int:
    import os
    import tempfile

    counts: dict[str, int] = {}
    start, skip = os.environ.get("BAD_INPUTS_FROM"), set(os.environ.get("BAD_INPUTS_SKIP", "").split(","))
    every = all_cases()
    cases = every[[c.id for c in every].index(start) :] if start else every
    for case in cases:
        if case.id in skip:
            print(f"{case.id:<34}skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            end = run_case(case, Path(tmp))
        ok = end.kind == "refused" and case.fragment in end.stderr
        kind = end.kind if end.kind != "refused" or ok else "refused-unclear"
        counts[kind] = counts.get(kind, 0) + 1
        print(f"{case.id:<34}{kind:<16}{end.stderr.strip().splitlines()[0][:110] if end.stderr.strip() else ''}")
    print(f"{len(cases)} bad inputs: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
