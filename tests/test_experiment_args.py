"""The experiment scripts refuse bad arguments, paths and data in one line, exit 2, before any long work.

Each test stops the script where its work would begin (a stub that fails the test if reached), so
none of them runs an engine, a sweep or a fit.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from experiments.validation import run as validation
from ppsim.errors import PPSimError
from tests.conftest import ROOT, alive, default_signals

PROFILE = str(ROOT / "profiles" / "tiny-cpu")
PUBLISHED = ROOT / "experiments" / "published"


def _no_work(*_a: object, **_k: object) -> None:
    raise AssertionError("the work started before the bad input was refused")


def _one_line(err: str, fragment: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err


# --- experiments/validation/run.py ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--repeats", "0"], "--repeats: 0"),
        (["--set", "foo"], "argument --set: invalid choice"),
        (["--heldout-seed", "-5"], "--heldout-seed: -5"),
        (["--num-prompts-scale", "inf"], "--num-prompts-scale: inf is not within"),
        (["--num-prompts-scale", "nan"], "--num-prompts-scale: nan is not within"),
        (["--num-prompts-scale", "0"], "--num-prompts-scale: 0.0 is not within"),
        (["--calibrate", "--profile", PROFILE], "--calibrate: calibrates this host, --profile uses"),
        (["--only"], "argument --only: expected at least one argument"),
        (["--profile", ""], "--profile: empty path"),
        (["--model", "dense-1024"], "no shipped profile"),
    ],
)
def test_validation_flags_are_one_line(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        validation.parse_args(argv)
    assert e.value.code == 2
    _one_line(capsys.readouterr().err, fragment)


@pytest.fixture
def stopped(monkeypatch):
    """The validation script with its work (calibration, planning, engine runs) replaced by a failure."""
    for name in ("plan_scenarios", "back_to_back", "interleaved", "write_results"):
        monkeypatch.setattr(validation, name, _no_work)
    return validation


def _paths(tmp_path: Path) -> list[str]:
    return ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]


@pytest.mark.parametrize(
    "only, fragment",
    [
        (["pp1-sync-offline", "typo-name"], "--only: no scenario 'typo-name' in --set development; the development"),
        (["h0-vllm-sync-pp1-offline"], "--only: no scenario 'h0-vllm-sync-pp1-offline' in --set development"),
    ],
)
def test_validation_unknown_only_name_before_any_work(stopped, tmp_path, capsys, only, fragment):
    """`--only pp1-sync-offline typo-name` dropped the typo; `--only` alone ran everything."""
    assert stopped.main(["--set", "development", "--only", *only, *_paths(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, fragment)
    assert not list(tmp_path.iterdir())


def test_validation_held_out_name_checked_once_drawn():
    """A held-out name of the right form that the seed did not draw is refused with the drawn ones."""
    args = validation.parse_args(["--set", "held-out", "--only", "h0-vllm-sync-pp1-offline"])
    validation.check_only(args)  # the form is right: checked again once drawn
    todo = [("held-out", "h0-vllm-sync-pp2-load0.50", {}, None)]
    with pytest.raises(PPSimError, match=r"'h0-vllm-sync-pp1-offline' .* there are h0-vllm-sync-pp2-load0.50"):
        validation.check_drawn(args, todo)


@pytest.mark.parametrize(
    "flag, path, fragment",
    [
        ("--out", "{d}/f", "--out: {d}/f exists and is not a directory"),
        ("--out", "{d}/f/x", "--out: cannot create {d}/f/x: {d}/f is a file"),
        ("--out", "", "--out: empty path"),
        ("--runs", "{d}/f", "--runs: {d}/f exists and is not a directory"),
        ("--runs", " ", "--runs: empty path"),
        ("--out", "/proc/ppsim-x", "--out: cannot create /proc/ppsim-x"),
    ],
)
def test_validation_paths_checked_before_any_work(stopped, tmp_path, capsys, flag, path, fragment):
    """`--out` a file failed after every scenario had run; `--runs ""` wrote into ./tiny/."""
    (tmp_path / "f").write_text("x")
    paths = {"--runs": str(tmp_path / "runs"), "--out": str(tmp_path / "out"), flag: path.replace("{d}", str(tmp_path))}
    argv = ["--set", "development", "--profile", PROFILE, *[x for kv in paths.items() for x in kv]]
    assert stopped.main(argv) == 2
    _one_line(capsys.readouterr().err, fragment.replace("{d}", str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("profile, fragment", [("missing", "is not a directory"), ("empty", "meta.json is missing")])
def test_validation_bad_profile_is_one_line(stopped, tmp_path, capsys, profile, fragment):
    """A missing or empty --profile ended in a PPSimError traceback."""
    (tmp_path / "empty").mkdir()
    argv = ["--set", "development", "--profile", str(tmp_path / profile), *_paths(tmp_path)]
    assert stopped.main(argv) == 2
    _one_line(capsys.readouterr().err, fragment)


# --- experiments/published/run_all.py ---------------------------------------------------------------


@pytest.fixture
def run_all(monkeypatch):
    monkeypatch.syspath_prepend(str(PUBLISHED))
    return importlib.import_module("run_all")


@pytest.mark.parametrize(
    "out, fragment",
    [
        ("", "--out: empty path"),
        ("{d}/f", "--out: {d}/f exists and is not a directory"),
        ("{d}/f/x", "{d}/f is a file, not a directory"),
        ("/proc/ppsim-x", "--out: cannot create /proc/ppsim-x"),
        ("{d}/set", "{d}/set/kv_capacity.md is a directory where the result file kv_capacity.md goes"),
    ],
)
def test_published_out_checked_first(run_all, monkeypatch, tmp_path, capsys, out, fragment):
    """`--out ""` overwrote the current folder's README.md; a file or /proc/x failed after the first script;
    a directory named kv_capacity.md ended in IsADirectoryError with a partial set written."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "set" / "kv_capacity.md").mkdir(parents=True)
    monkeypatch.setattr(run_all, "run_scripts", _no_work)
    code = None
    try:
        code = run_all.main(["--quick", "--out", out.replace("{d}", str(tmp_path))])
    except SystemExit as e:  # refused while parsing
        code = e.code
    assert code == 2
    _one_line(capsys.readouterr().err, fragment.replace("{d}", str(tmp_path)))
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["kv_capacity.md"]


def test_published_set_is_all_or_nothing(run_all, monkeypatch, tmp_path, capsys):
    """A script failing after others wrote their files leaves --out as it was; a complete set lands whole,
    beside what was there, without a ppsim result marker."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")

    def boom(argv: list[str]) -> None:
        raise PPSimError("boom: failed")

    monkeypatch.setitem(sys.modules, "boom", types.SimpleNamespace(main=boom))
    monkeypatch.setattr(run_all, "SCRIPTS", ("bubble_table", "boom"))
    assert run_all.main(["--quick", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: boom: failed"  # after the progress lines
    assert os.listdir(out) == ["mine.txt"]
    monkeypatch.setattr(run_all, "SCRIPTS", ("bubble_table",))
    assert run_all.main(["--quick", "--out", str(out)]) == 0
    written = ["README.md", "bubble_table.csv", "bubble_table.md", "bubble_table.png"]
    assert sorted(os.listdir(out)) == [*written, "mine.txt"]


# --- experiments/policies/run.py --------------------------------------------------------------------


@pytest.mark.parametrize("argv, code", [(["--help", "--bogus"], 0), (["--bogus"], 2)])
def test_policies_takes_no_arguments(monkeypatch, capsys, argv, code):
    """`--help --bogus` ignored its arguments and started the multi-minute sweep over the repo's results."""
    policies = importlib.import_module("experiments.policies.run")
    monkeypatch.setattr(policies, "sweep", _no_work)
    with pytest.raises(SystemExit) as e:
        policies.main(argv)
    assert e.value.code == code
    out, err = capsys.readouterr()
    if code == 0:
        assert out.startswith("usage: experiments/policies/run.py") and "results.csv" in out
    else:
        _one_line(err, "unrecognized arguments: --bogus")


# --- experiments/analytic_vs_vidur/{run,run_steps,fit}.py -------------------------------------------

TRUNCATED = "num_tensor_parallel_workers,num_tokens,time_stats.add.median\n1,1,0.01\n1,8\n"


def _vidur_root(tmp_path: Path, kind: str) -> Path:
    root = tmp_path / kind
    root.mkdir()
    if kind == "truncated":
        mlp = root / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
        mlp.parent.mkdir(parents=True)
        mlp.write_text(TRUNCATED)
    return root / "missing" if kind == "missing" else root


@pytest.mark.parametrize("script", ["run", "run_steps", "fit"])
@pytest.mark.parametrize(
    "kind, fragment",
    [
        ("missing", "/missing is not a directory; set PPSIM_VIDUR_ROOT to Vidur's profiling data"),
        ("empty", "holds no compute/<device>/<org>/<model>/mlp.csv"),
        ("truncated", "Llama-2-7b-hf/mlp.csv line 3 has fewer cells than the header (truncated?)"),
    ],
)
def test_vidur_experiments_name_the_root(tmp_path, script, kind, fragment):
    """IndexError, ValueError and TypeError tracebacks before; nothing is written beside the scripts."""
    root = _vidur_root(tmp_path, kind)
    env = {**os.environ, "PPSIM_VIDUR_ROOT": str(root)}
    path = ROOT / "experiments" / "analytic_vs_vidur" / f"{script}.py"
    r = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    _one_line(r.stderr, f"error: PPSIM_VIDUR_ROOT: {root}")
    assert fragment in r.stderr


def test_validation_sigterm_is_one_line_and_leaves_nothing(tmp_path):
    """SIGTERM (``timeout``, Slurm) while the engine runs: exit 143, one line, no --out / --runs, no stage left."""
    import signal
    import time

    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["--set", "development", "--repeats", "1", "--only", "pp1-sync-offline"]
    p = subprocess.Popen(
        [sys.executable, "experiments/validation/run.py", *argv, "--out", str(out), "--runs", str(runs)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=default_signals,
    )
    try:
        line = p.stdout.readline()
        assert "pp1-sync-offline" in line, line + p.stderr.read()
        deadline = time.monotonic() + 60
        while len(_descendants(p.pid)) < 2 and time.monotonic() < deadline:  # into the engine run
            time.sleep(0.2)
        time.sleep(1)
        family = _descendants(p.pid)
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert err.splitlines()[-1] == "terminated (SIGTERM)", err
    assert not out.exists() and not runs.exists()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert family and not any(alive(pid) for pid in family), "a process of the run outlived it"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (/proc's children lists), the engine's stages and host sampler among them."""
    found, todo = [], [pid]
    while todo:
        for tasks in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(k) for k in tasks.read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


# --- experiments/validation/{glue_fit,gpu_h200,host_drift,moe,path_diff,replay_adjusted,repredict,stage_check}.py


def _code(main, argv: list[str]) -> int:
    """The exit status of ``main(argv)``, refused while parsing (SystemExit) or after (returned)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _refused(main, argv: list[str], tmp_path: Path, capsys, fragment: str, before: list[str]) -> None:
    """Exit 2, one line naming ``fragment`` (the flag), nothing on stdout, ``tmp_path`` holding only ``before``."""
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert _code(main, argv) == 2
    out, err = capsys.readouterr()
    _one_line(err, fragment.replace("{d}", str(tmp_path)))
    assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)


def _run_dir(d: Path, steps: bool = True) -> Path:
    """A stand-in for a finished ``ppsim validate`` dir: the files the scripts look for (not read: stubbed)."""
    for sub in ("engine-0", "sim"):
        (d / sub).mkdir(parents=True)
        (d / sub / "stage_ops.csv").write_text("kind\n")
    (d / "validation.json").write_text('{"scenario": {"model": "tiny"}}')
    (d / "step_costs.csv").write_text("measured_s,predicted_s\n" + ("0.1,0.1\n" if steps else ""))
    return d


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """tmp_path with a run dir ``run``, a file ``f``, an empty dir ``empty`` and a JSON scenario ``tiny.json``."""
    _run_dir(tmp_path / "run")
    (tmp_path / "f").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "tiny.json").write_text('{"model": "tiny"}')
    return tmp_path


INPUTS = ["empty", "f", "run", "tiny.json"]


def _script(monkeypatch, name: str, *stubbed: str) -> types.ModuleType:
    mod = importlib.import_module(f"experiments.validation.{name}")
    for attr in stubbed:
        target, _, attr = attr.rpartition(".")
        monkeypatch.setattr(importlib.import_module(target) if target else mod, attr, _no_work)
    return mod


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--profile", "{d}/missing", "{d}/run"], "--profile: {d}/missing: no samples.csv or meta.json"),
        (["--profile", PROFILE, "{d}/empty"], "runs: {d}/empty: no validation.json or step_costs.csv"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/f"], "--work: {d}/f exists and is not a directory"),
        (["--profile", PROFILE, "{d}/run", "--work", ""], "--work: empty path"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/run"], "--work: {d}/run is also runs"),
    ],
)
def test_glue_fit_inputs_checked_before_the_refit(monkeypatch, inputs, capsys, argv, fragment):
    """A missing profile or run dir was a bare print; --work was rmtree'd and refitted into unchecked."""
    glue_fit = _script(monkeypatch, "glue_fit", "refit_copy")
    _refused(glue_fit.main, argv, inputs, capsys, fragment, INPUTS)


def test_glue_fit_work_may_not_replace_the_profile(monkeypatch, inputs, capsys):
    """--work DIR replaces DIR/seconds and DIR/relative whole: the profile there was deleted before its copy."""
    import shutil

    shutil.copytree(PROFILE, inputs / "seconds")
    glue_fit = _script(monkeypatch, "glue_fit", "refit_copy")
    argv = ["--profile", "{d}/seconds", "{d}/run", "--work", "{d}"]
    _refused(glue_fit.main, argv, inputs, capsys, "--work: {d}/seconds is also --profile", [*INPUTS, "seconds"])


def _live_profile(d: Path) -> str:
    """The shipped profile with one live-engine step timed alone among its samples (``glue_live.py`` needs one)."""
    import shutil

    from calibration.artifact import read_samples, samples_csv

    shutil.copytree(PROFILE, d)
    row = {"op": "stage_full", "split": "live1", "items": "99:1", "layers": 2, "start_layer": 0, "alone_s": 0.001}
    (d / "samples.csv").write_text(samples_csv([*read_samples(d), {**row, "median_s": 0.0011, "mean_s": 0.0011}]))
    return str(d)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--profile", "{d}/missing", "{d}/run"], "--profile: {d}/missing: no samples.csv or meta.json"),
        (["--profile", PROFILE, "{d}/empty"], "runs: {d}/empty: no validation.json"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/f"], "--work: {d}/f exists and is not a directory"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/run"], "--work: {d}/run is also runs"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/w", "--csv", "{d}/empty"], "--csv: {d}/empty is a directory"),
        (["--profile", PROFILE, "{d}/run", "--work", "{d}/w"], "has no live steps timed alone"),
    ],
)
def test_glue_live_inputs_checked_before_the_refit(monkeypatch, inputs, capsys, argv, fragment):
    """A profile without live runs (the shipped one) would refit both copies alike and compare nothing."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    _refused(glue_live.main, ["refit", *argv], inputs, capsys, fragment, INPUTS)


def test_glue_live_good_arguments_reach_the_refit(monkeypatch, tmp_path):
    _run_dir(tmp_path / "run")
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--profile", _live_profile(tmp_path / "p"), str(tmp_path / "run"), "--work", str(tmp_path / "w")]
    with pytest.raises(AssertionError, match="the work started"):
        glue_live.main(argv)


@pytest.mark.parametrize("compare", ["waited:b2b", "b2b:held", "waited:held", "live:bareheld"])
def test_glue_live_compares_the_b2b_turnaround_only_on_a_calibration_with_its_restarts(
    monkeypatch, inputs, capsys, compare
):
    """--compare waited:b2b (and the held line's, part 25 (c)) needs the restarts one by one that calibration keeps
    since part 24."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", compare, "--profile", _live_profile(inputs / "p"), "{d}/run", "--work", "{d}/w"]
    _refused(glue_live.main, argv, inputs, capsys, "has no back-to-back restarts one by one", [*INPUTS, "p"])


def test_glue_live_compares_the_wide_turnaround_only_on_a_calibration_with_its_wide_run(monkeypatch, inputs, capsys):
    """--compare waited:wide needs the wide run's restarts that calibration keeps since part 26."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", "waited:wide", "--profile", _live_profile(inputs / "p"), "{d}/run", "--work", "{d}/w"]
    _refused(glue_live.main, argv, inputs, capsys, "has no wide run's restarts (turnaround_wide)", [*INPUTS, "p"])


def test_glue_live_compares_the_two_stage_path_only_on_a_calibration_that_measured_it(monkeypatch, inputs, capsys):
    """--compare before40:multi needs the control path at two stages that calibration measures since part 40."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", "before40:multi", "--profile", _live_profile(inputs / "p"), "{d}/run"]
    fragment = "has no control path measured at two stages (return_multi)"
    _refused(glue_live.main, [*argv, "--work", "{d}/w"], inputs, capsys, fragment, [*INPUTS, "p"])


@pytest.mark.parametrize("flag", ["--replay", "--probed"])
def test_glue_live_replays_only_where_the_two_ways_price_the_computes_alike(monkeypatch, inputs, capsys, flag):
    """--replay takes the runs' speed over the recorded predictions, --probed the probe's over the profile's price of
    its step: a glue comparison would change what either factor scales."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", "live:tokfix", flag, "--profile", _live_profile(inputs / "p"), "{d}/run"]
    _refused(glue_live.main, [*argv, "--work", "{d}/w"], inputs, capsys, f"{flag}: live:tokfix changes", [*INPUTS, "p"])


@pytest.mark.parametrize("compare", ["before42:lastlive", "before4142:widelast"])
def test_glue_live_compares_the_last_stage_only_on_a_calibration_with_two_stage_steps_timed_alone(
    monkeypatch, inputs, capsys, compare
):
    """Part 42 fits the live last stage's excess from calibration's two-stage steps timed alone at both stages."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", compare, "--profile", _live_profile(inputs / "p"), "{d}/run", "--work", "{d}/w"]
    fragment = "has no wide run's restarts" if "wide" in compare else "has no two-stage live steps timed alone"
    _refused(glue_live.main, argv, inputs, capsys, fragment, [*INPUTS, "p"])


def test_glue_live_own_factor_takes_the_runs_speed_over_their_predictions_moved_to_the_new_prices():
    """Part 42's replay: measured over (recorded + new price - old price of each step's plan), summed over steps."""
    from ppsim.cost.base import StageSpec

    glue_live = importlib.import_module("experiments.validation.glue_live")

    class Priced:
        def __init__(self, last_s: float) -> None:
            self.last_s = last_s

        def stage_time(self, spec, plan) -> float:
            return 1e-3 * plan.num_reqs + (self.last_s if spec.is_last else 0.0)

    stages = (StageSpec(0, 0, 4, True, False), StageSpec(1, 4, 8, False, True))
    steps = [
        {
            "stage": s,
            "num_tokens": 2,
            "num_reqs": 2,
            "num_prefill_tokens": 0,
            "decode_ctx_tokens": 200,
            "measured_s": 3e-3,
            "predicted_s": 2e-3,
        }
        for s in (0, 1)
    ]
    assert glue_live.own_factor(steps, stages, Priced(0.0), Priced(0.0)) == pytest.approx(6 / 4)
    assert glue_live.own_factor(steps, stages, Priced(0.0), Priced(1e-3)) == pytest.approx(6 / 5)
    with pytest.raises(glue_live.PPSimError, match="no stage computes"):
        glue_live.own_factor([], stages, Priced(0.0), Priced(0.0))


def test_glue_live_takes_one_speed_at_a_time(monkeypatch, inputs, capsys):
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", "waited:wide", "--replay", "--probed", "--profile", _live_profile(inputs / "p")]
    _refused(
        glue_live.main,
        [*argv, "{d}/run"],
        inputs,
        capsys,
        "--probed: not allowed with argument --replay",
        [
            *INPUTS,
            "p",
        ],
    )


def test_glue_live_probed_prediction_scales_by_the_probe_the_run_recorded(monkeypatch, tmp_path):
    """--probed (part 41): the probe-conditioned prediction at the factor ``validation.json`` recorded; a run without
    it is refused in one line naming the run."""
    glue_live = _script(monkeypatch, "glue_live")
    seen = []
    engine = [{"m": 1}]

    def at_speed(prep, factor, eng):
        seen.append((prep, factor, eng))
        return {"rows": [{"metric": "mean_tpot_ms", "error": 0.03}]}

    v = {"engine_summaries": engine, "probe_conditioned": {"factor": 1.07}}
    monkeypatch.setattr(glue_live, "prepared", lambda run, profile: (v, "prep"))
    monkeypatch.setattr(glue_live, "at_speed", at_speed)
    monkeypatch.setattr(glue_live, "pick", lambda rows: {r["metric"]: r["error"] for r in rows})
    assert glue_live.predicted(tmp_path, tmp_path, probed=True) == {"mean_tpot_ms": 0.03}
    assert seen == [("prep", 1.07, engine)]
    del v["probe_conditioned"]
    with pytest.raises(glue_live.PPSimError, match="no probe-conditioned prediction in validation.json"):
        glue_live.predicted(tmp_path, tmp_path, probed=True)


def test_glue_live_compares_the_turnaround_only_on_a_calibration_that_has_it(monkeypatch, inputs, capsys):
    """--compare waited:reqs needs the restarts by requests that calibration records since part 21."""
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    argv = ["refit", "--compare", "waited:reqs", "--profile", _live_profile(inputs / "p"), "{d}/run", "--work", "{d}/w"]
    _refused(glue_live.main, argv, inputs, capsys, "has no turnaround samples by requests", [*INPUTS, "p"])


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["{d}/missing"], "{d}/missing: not a directory"),
        (["{d}/empty"], "{d}/empty: no engine-*/ or sim/ run inside"),
        (["{d}/run"], "{d}/run/engine-0/stage_ops.csv: not a stage_ops.csv"),
    ],
)
def test_restarts_refuses_what_is_not_a_validate_run(inputs, capsys, argv, fragment):
    from experiments.validation import restarts

    _refused(restarts.main, argv, inputs, capsys, fragment, INPUTS)


def test_restarts_reports_the_restarts_by_margin_and_requests(tmp_path, capsys):
    """Stage 1 restarts 0.2 ms after step 9 (step 0's input 2 ms early, 1 request) and 0.3 ms after step 0
    (step 1's 0.5 ms early, 3 requests); step 2 reached a free stage 1 (a hand-over, not counted)."""
    from experiments.validation import restarts

    head = "track,kind,step_id,start_s,end_s,num_tokens,num_reqs\n"
    rows = [(0, 0, 0, 4, 1), (1, 9, 3, 6, 1), (1, 0, 6.2, 9, 1), (0, 1, 4, 8.5, 3), (1, 1, 9.3, 12, 3)]
    rows += [(0, 2, 8.5, 13, 1), (1, 2, 13.4, 15, 1)]
    text = head + "".join(f"stage{s},compute,{i},{a / 1e3},{b / 1e3},1,{n}\n" for s, i, a, b, n in rows)
    (tmp_path / "run" / "engine-0").mkdir(parents=True)
    (tmp_path / "run" / "engine-0" / "stage_ops.csv").write_text(text)
    assert restarts.main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "by margin (ms): 0.4: 0.30 (1)  2.0: 0.20 (1)" in out and "by requests:    1: 0.20 (1)  3: 0.30 (1)" in out


def test_restarts_splits_the_restarts_by_step_kind_and_pools_them_by_run_name(tmp_path, capsys):
    """Stage 1 restarts on step 0 (a 16-token prefill) 0.2 ms after step 9, on step 1 (a decode right after that
    prefill) 0.3 ms after it, on step 2 (a decode after a decode) 0.5 ms after that; the same run twice under two
    rounds' ``b1`` pools into one line of two restarts each."""
    from experiments.validation import restarts

    head = "track,kind,step_id,start_s,end_s,num_tokens,num_reqs,num_prefill_tokens,num_decode_tokens\n"
    rows = [(0, 0, 0, 1, 16), (0, 1, 1, 2, 0), (0, 2, 2, 3, 0), (1, 9, 0, 4, 0), (1, 0, 4.2, 6, 16)]
    rows += [(1, 1, 6.3, 8, 0), (1, 2, 8.5, 10, 0)]
    text = head + "".join(
        f"stage{s},compute,{i},{a / 1e3},{b / 1e3},{p or 1},1,{p},{0 if p else 1}\n" for s, i, a, b, p in rows
    )
    for r in ("r1", "r2"):
        (tmp_path / r / "b1" / "engine-0").mkdir(parents=True)
        (tmp_path / r / "b1" / "engine-0" / "stage_ops.csv").write_text(text)
    assert restarts.main(["--pool", str(tmp_path / "r1" / "b1"), str(tmp_path / "r2" / "b1")]) == 0
    out = capsys.readouterr().out
    assert "by step kind:   prefill: 0.20 (1)  decode after a prefill: 0.30 (1)  decode: 0.50 (1)" in out
    pooled = out.split("== pooled by run name")[1]
    assert "b1 engine" in pooled and "prefill: 0.20 (2) 0.20-0.20" in pooled and "decode: 0.50 (2)" in pooled
    assert "sim" not in pooled


def _each_restart_profile(d: Path, restarts_ms: list[tuple[int, float, float, int]]) -> Path:
    """A calibration dir whose samples.csv holds ``turnaround_each`` rows: (requests, restart ms, compute
    before ms, prefill tokens of that compute) each, and one fitted row that is not a restart."""
    from calibration.artifact import samples_csv

    rows = [{"op": "send_recv", "split": "fit", "bytes": 8, "median_s": 1e-4}]
    for i, (reqs, t, prev, pre) in enumerate(restarts_ms):
        rows.append(
            {"op": "turnaround_each", "split": "record", "run": 3, "step_id": i, "reqs": reqs, "tokens": reqs,
             "chunk": 0, "gap_s": 1e-3, "median_s": t / 1e3, "prev_s": prev / 1e3, "prev_prefill": pre,
             "at_s": 0.1 * i, "core_lag_s": -2e-3, "repeats": 1}
        )  # fmt: skip
    d.mkdir(parents=True)
    (d / "samples.csv").write_text(samples_csv(rows))
    return d


def test_restarts_splits_a_calibrations_restarts_into_its_two_modes(tmp_path, capsys):
    """Two fast restarts (0.2 ms, after 10 ms decodes) and two slow ones (0.6 / 0.8 ms, after 3 ms prefills):
    each side's medians, and the fast share by requests."""
    from experiments.validation import restarts

    each = [(1, 0.2, 10.0, 0), (2, 0.6, 3.0, 16), (2, 0.2, 10.0, 0), (4, 0.8, 3.0, 16)]
    prof = _each_restart_profile(tmp_path / "p", each)
    assert restarts.main(["--calibration", str(prof)]) == 0
    out = capsys.readouterr().out
    assert "restarts 4; fast (< 0.4 ms) 2" in out
    early = "input early by 1.000 ms"
    assert f"fast: 2  restart 0.200 ms  reqs 1.500  {early}  compute before 10.000 ms  after a prefill 0.00" in out
    assert f"slow: 2  restart 0.700 ms  reqs 3.000  {early}  compute before 3.000 ms  after a prefill 1.00" in out
    assert "core schedule end after free -2.000 ms" in out
    assert "fast share by requests: 1: 1.00 (1)  2: 0.50 (2)  4: 0.00 (1)" in out
    assert "back-to-back (3, fast 1) by requests: 2: 0.40 (2)  4: 0.80 (1)" in out  # the step before a restart
    assert "after a hand-over (1, fast 1) by requests: 1: 0.20 (1)" in out


def test_restarts_shows_the_parts_a_calibration_recorded(tmp_path, capsys):
    """Calibrations since 2026-12-06 carry each restart's parts from the stage-loop record: the medians by
    requests, and the restarts whose hand-on was switched out apart."""
    from calibration.artifact import read_samples, samples_csv
    from experiments.validation import restarts

    prof = _each_restart_profile(tmp_path / "p", [(8, 1.2, 10.0, 0), (8, 0.4, 10.0, 0), (8, 0.5, 10.0, 0)])
    rows = read_samples(prof)
    each = [r for r in rows if r["op"] == "turnaround_each"]
    for r, (out, sw) in zip(each, [(0.8, 1), (0.1, 0), (0.2, 0)], strict=True):
        r.update(out_s=out / 1e3, out_switched=sw, ctrl_s=0.1e-3, recv_wait_s=0.05e-3)
    (prof / "samples.csv").write_text(samples_csv(rows))
    assert restarts.main(["--calibration", str(prof)]) == 0
    out = capsys.readouterr().out
    assert "parts at 8 requests (3): restart 0.500 ms = hand-on 0.200 + control messages 0.100 + receive 0.050" in out
    assert "hand-on switched out in 1 (restart 1.200), not in 2 (restart 0.450)" in out


def test_restarts_refuses_a_calibration_without_its_restarts_one_by_one(inputs, capsys):
    from experiments.validation import restarts

    no_samples = "--calibration {d}/empty: no samples.csv"
    _refused(restarts.main, ["--calibration", "{d}/empty"], inputs, capsys, no_samples, INPUTS)
    _each_restart_profile(inputs / "p", [])
    before = [*INPUTS, "p"]
    _refused(restarts.main, ["--calibration", "{d}/p"], inputs, capsys, "no turnaround_each rows", before)
    _refused(restarts.main, [], inputs, capsys, "give ppsim validate output dirs, --calibration DIR, or both", before)


def _readings(d: Path, rows: list[tuple[str, str, str, float, float]], compare: str = "grid:live") -> Path:
    """A ``refit --csv`` file: a MoE round's runs each a reading, a draw's runs (``d/...``) one together."""
    f = d / "r.csv"
    lines = [f"{compare},{run if p.startswith('moe') else p},{p},{run},{m},{g},{v}\n" for p, run, m, g, v in rows]
    f.write_text("compare,reading,profile,run,metric,base,new\n" + "".join(lines))
    return f


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a,b\n1,2\n",
        "compare,reading,profile,run,metric,base,new\ngrid:live,d,p,r,mean_tpot_ms,x,0.1\n",
        "compare,reading,profile,run,metric,base,new\ngrid:live,d,p,r,mean_tpot_ms,0.1,0.1\n"
        "live:layers,d,p,r,mean_tpot_ms,0.1,0.1\n",
    ],
)
def test_glue_live_judge_refuses_a_file_it_did_not_write(tmp_path, capsys, text):
    from experiments.validation import glue_live

    (tmp_path / "r.csv").write_text(text)
    assert _code(glue_live.main, ["judge", str(tmp_path / "r.csv")]) == 2
    _one_line(capsys.readouterr().err, f"judge: {tmp_path / 'r.csv'}")


def test_glue_live_judge_counts_readings_and_vetoes_a_target_that_worsens(tmp_path, capsys):
    """Two MoE runs closer on TPOT and one dense draw (the median of its two runs) further: adopted, unless another
    target's median |error| over the readings worsens by more than a point."""
    from experiments.validation import glue_live

    rows = [("moe1/p", "moe1/b1", "mean_tpot_ms", 0.10, -0.02), ("moe1/p", "moe1/b8", "mean_tpot_ms", 0.05, 0.04)]
    rows += [("d/p", f"d/h{i}", "mean_tpot_ms", 0.02, 0.05) for i in range(2)]
    assert glue_live.main(["judge", str(_readings(tmp_path, rows))]) == 0
    out = capsys.readouterr().out
    assert "for 2, against 1, level 0" in out and out.rstrip().endswith(": adopted")
    rows += [(p, r, "p99_ttft_ms", 0.05, 0.07) for p, r, _, _, _ in rows]
    assert glue_live.main(["judge", str(_readings(tmp_path, rows))]) == 0
    assert "other targets worse: p99_ttft_ms: not adopted" in capsys.readouterr().out


def test_glue_live_judges_the_many_item_comparisons_on_median_ttft(tmp_path, capsys):
    """``live:items`` and ``items:sq`` (part 22) are judged on median TTFT, fixed before their readings: TPOT
    further on both readings does not count against them, but vetoes where its median worsens by over a point."""
    from experiments.validation import glue_live

    rows = [(p, f"{p[:4]}/b1", "median_ttft_ms", 0.20, 0.05) for p in ("moe1/p", "moe2/p")]
    rows += [(p, f"{p[:4]}/b1", "mean_tpot_ms", 0.020, 0.024) for p in ("moe1/p", "moe2/p")]
    for compare in ("live:items", "items:sq"):
        assert glue_live.main(["judge", str(_readings(tmp_path, rows, compare))]) == 0
        out = capsys.readouterr().out
        assert "median_ttft_ms |error| 20.0% -> 5.0% for" in out and out.rstrip().endswith(": adopted")
    rows[2:] = [(p, f"{p[:4]}/b1", "mean_tpot_ms", 0.02, 0.04) for p in ("moe1/p", "moe2/p")]
    assert glue_live.main(["judge", str(_readings(tmp_path, rows, "items:sq"))]) == 0
    assert "other targets worse: mean_tpot_ms: not adopted" in capsys.readouterr().out


def test_gpu_h200_without_cuda_refuses_before_the_first_step(monkeypatch, inputs, capsys):
    """--device cuda (the default) where torch sees no GPU: every step failed alike, minutes later."""
    gpu = _script(monkeypatch, "gpu_h200", "run")
    monkeypatch.setattr(gpu, "cuda_available", lambda: False)
    argv = ["--mid-model", "tiny", "--out", "{d}/out"]
    _refused(gpu.main, argv, inputs, capsys, "--device: cuda, but torch sees no CUDA device here", INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--budget-s", "0"], "--budget-s: 0 is not within (20, 86400]"),
        (["--budget-s", "nan"], "--budget-s: nan is not within"),
        (["--budget-s", "inf"], "--budget-s: inf is not within"),
        (["--mid-dtype", "int8"], "argument --mid-dtype: invalid choice: 'int8'"),
        (["--mid-model", "llama-typo"], "--mid-model: unknown preset or missing file 'llama-typo'"),
        (["--out", "{d}/f"], "--out: {d}/f exists and is not a directory"),
        (["--out", "{d}/f/x"], "--out: cannot create {d}/f/x: {d}/f is a file"),
    ],
)
def test_gpu_h200_refuses_before_the_first_step(monkeypatch, inputs, capsys, argv, fragment):
    """A typo in --mid-model failed as a step after the tiny model's; --out a file raised FileExistsError."""
    gpu = _script(monkeypatch, "gpu_h200", "run")
    argv = ["--device", "cpu", "--out", "{d}/out", *argv]
    _refused(gpu.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--cycles", "0"], "--cycles: 0 is not within [1, 100]"),
        (["--cycles", "101"], "--cycles: 101 is not within [1, 100]"),
        (["--pp", "0"], "--pp: 0; give distinct pipeline depths of 1 or more"),
        (["--pp", "1", "1"], "--pp: 1 1; give distinct"),
        (["--pp", "1", "9"], "--pp 9: "),
        (["--profile", "{d}/missing"], "--profile: {d}/missing is not a directory"),
        (["--profile", "{d}/empty"], "meta.json is missing"),
        (["--config", "{d}/missing.json"], "{d}/missing.json"),
        (["--out", "{d}/f"], "--out: {d}/f exists and is not a directory"),
        (["--out", "{d}/run/validation.json"], "--out: {d}/run/validation.json exists and is not a directory"),
    ],
)
def test_host_drift_refuses_before_the_first_cycle(monkeypatch, inputs, capsys, argv, fragment):
    """--pp 9 on an 8-layer model, a duplicate depth or a bad --profile surfaced after the first reading."""
    drift = _script(monkeypatch, "host_drift", "_reading", "calibration.stage_step.EngineStages")
    paths = {"--config": "{d}/tiny.json", "--profile": PROFILE, "--out": "{d}/out"}
    paths.update(dict(zip(argv[::2], argv[1::2], strict=False)) if argv[0] in paths else {})
    rest = [] if argv[0] in paths else argv
    argv = [*[x for kv in paths.items() for x in kv], *rest]
    _refused(drift.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--repeats", "0"], "--repeats: 0 is not within [1, 100]"),
        (["--repeats", "101"], "--repeats: 101 is not within [1, 100]"),
        (["--moe-router-zipf", "-1"], "--moe-router-zipf: -1 is not within [0, 8]"),
        (["--moe-router-zipf", "nan"], "--moe-router-zipf: nan is not within"),
        (["--moe-router-zipf", "inf"], "--moe-router-zipf: inf is not within"),
        (["--step-only"], "--step-only: needs --profile"),
        (["--step-only", "--repeats", "3", "--profile", "{d}/empty"], "--repeats: --step-only runs no engine"),
        (["--quick", "--profile", "{d}/empty"], "--quick: sets the calibration's grid; with --profile nothing"),
        (["--profile", ""], "--profile: empty path"),
        (["--profile", "{d}/missing"], "--profile: {d}/missing is not a directory"),
        (["--profile", "{d}/empty", "--step-only"], "--profile: {d}/empty/meta.json is missing"),
        (["--profile", PROFILE], "--profile: " + PROFILE + " (measured for 'tiny') does not match model 'tiny-moe'"),
    ],
)
def test_moe_refuses_before_calibrating_or_running(monkeypatch, inputs, capsys, argv, fragment):
    """--step-only without --profile, a negative zipf or another model's profile surfaced after minutes."""
    moe = _script(
        monkeypatch,
        "moe",
        "calibration.calibrate.calibrate",
        "ppsim.validate.run.validate",
        "step_level",
        "engine_router_touched",
    )
    monkeypatch.setattr(moe, "HERE", inputs)
    monkeypatch.setattr(moe, "RUNS", inputs / "moe-runs")
    _refused(moe.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["{d}/run", "{d}/missing"], "dirs: {d}/missing is not a directory"),
        (["{d}/run", "{d}/empty"], "dirs: {d}/empty: no engine-N/stage_ops.csv or sim/stage_ops.csv"),
        (["{d}/run", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_path_diff_checks_every_dir_first(monkeypatch, inputs, capsys, argv, fragment):
    """A bad dir after a good one was a bare SystemExit message (exit 1) after the good one's table."""
    path_diff = _script(monkeypatch, "path_diff", "read_ops")
    _refused(path_diff.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--jitter-draws", "-1", "{d}/run"], "--jitter-draws: -1 is not within [0, 100]"),
        (["--jitter-draws", "101", "{d}/run"], "--jitter-draws: 101 is not within [0, 100]"),
        (["{d}/run", "{d}/empty"], "dirs: {d}/empty: no validation.json or step_costs.csv"),
        (["{d}/run", "{d}/idle"], "dirs: {d}/idle: step_costs.csv has no engine steps"),
    ],
)
def test_replay_adjusted_checks_before_any_replay(monkeypatch, inputs, capsys, argv, fragment):
    _run_dir(inputs / "idle", steps=False)
    replay = _script(monkeypatch, "replay_adjusted", "replay")
    _refused(replay.main, argv, inputs, capsys, fragment, [*INPUTS, "idle"])


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["{d}/run"], "the following arguments are required: --profile"),
        (["--profile", PROFILE, "--profile", "{d}/missing", "{d}/run"], "--profile: {d}/missing is not a directory"),
        (["--profile", "{d}/empty", "{d}/run"], "--profile: {d}/empty/meta.json is missing"),
        (["--profile", PROFILE, "{d}/run", "{d}/empty"], "dirs: {d}/empty: no validation.json"),
    ],
)
def test_repredict_checks_before_any_replay(monkeypatch, inputs, capsys, argv, fragment):
    """A missing profile or run dir was a traceback, after the dirs before it had been printed."""
    repredict = _script(monkeypatch, "repredict", "errors")
    _refused(repredict.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "tiny-typo", PROFILE], "--model: unknown preset or missing file 'tiny-typo'"),
        ([PROFILE, "{d}/missing"], "profiles: {d}/missing is not a directory"),
        ([PROFILE, "{d}/empty"], "profiles: {d}/empty/meta.json is missing"),
        (["--model", "tiny-moe", PROFILE], "profiles: " + PROFILE + " (measured for 'tiny') does not match"),
    ],
)
def test_stage_check_refuses_before_timing(monkeypatch, inputs, capsys, argv, fragment):
    """A bad profile was a traceback after the model's stages were built; another model's was compared."""
    stage_check = _script(monkeypatch, "stage_check", "calibration.stage_step.EngineStages")
    _refused(stage_check.main, argv, inputs, capsys, fragment, INPUTS)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--model", "tiny-typo"], "--model: unknown preset or missing file 'tiny-typo'"),
        (["--model", "tiny", "--layers", "1,x"], "--layers: '1,x' is not comma-separated integers"),
        (["--model", "tiny", "--layers", "0,2"], "--layers: '0,2' must be within 1..8"),
        (["--model", "tiny", "--layers", "4,9"], "--layers: '4,9' must be within 1..8"),
        (["--model", "tiny", "--rounds", "0"], "--rounds: 0 is not within 1..20"),
    ],
)
def test_stage_size_refuses_before_timing(monkeypatch, inputs, capsys, argv, fragment):
    stage_size = _script(monkeypatch, "stage_size", "calibration.stage_step.EngineStages")
    _refused(stage_size.main, argv, inputs, capsys, fragment, INPUTS)


def test_stage_size_default_counts_are_powers_of_two_and_the_whole_model():
    from experiments.validation.stage_size import sizes

    assert sizes(None, 8) == [1, 2, 4, 8] and sizes(None, 6) == [1, 2, 4, 6]
    assert sizes("4,2,2", 8) == [2, 4]


@pytest.mark.parametrize(
    "name, stubbed, argv",
    [
        ("stage_size", ["calibration.stage_step.EngineStages"], ["--model", "tiny", "--layers", "2,4"]),
        ("glue_fit", ["refit_copy"], ["--profile", PROFILE, "{d}/run", "--work", "{d}/work"]),
        ("gpu_h200", ["run"], ["--device", "cpu", "--mid-model", "tiny", "--out", "{d}/out"]),
        (
            "host_drift",
            ["calibration.stage_step.EngineStages"],
            ["--config", "{d}/tiny.json", "--profile", PROFILE, "--out", "{d}/out"],
        ),
        ("moe", ["calibration.calibrate.calibrate"], ["--repeats", "1", "--moe-router-zipf", "1.5"]),
        ("path_diff", ["read_ops"], ["{d}/run"]),
        ("replay_adjusted", ["replay"], ["--jitter-draws", "2", "{d}/run"]),
        ("repredict", ["errors"], ["--profile", PROFILE, "{d}/run"]),
        ("stage_check", ["calibration.stage_step.EngineStages"], ["--model", "tiny", PROFILE]),
    ],
)
def test_validation_scripts_good_arguments_reach_the_work(monkeypatch, inputs, name, stubbed, argv):
    """The checks refuse nothing that is fine: each script gets to its work (stubbed) with good arguments."""
    script = _script(monkeypatch, name, *stubbed)
    if name == "moe":
        monkeypatch.setattr(script, "RUNS", inputs / "moe-runs")
    with pytest.raises(AssertionError, match="the work started"):
        script.main([a.replace("{d}", str(inputs)) for a in argv])


@pytest.mark.parametrize(
    "name, argv",
    [
        ("path_diff", ["{d}/run"]),
        ("replay_adjusted", ["{d}/run"]),
        ("repredict", ["--profile", PROFILE, "{d}/run"]),
    ],
)
def test_validation_scripts_name_a_damaged_run_dir(inputs, capsys, name, argv):
    """The stand-in run dir's files lack what the scripts read (a truncated validation.json, a CSV without its
    columns): one line naming the dir, where a KeyError traceback ended the script."""
    (inputs / "run" / "engine-0" / "stage_ops.csv").write_text("track,kind\nstage0,compute\n")  # no times
    script = importlib.import_module(f"experiments.validation.{name}")
    _refused(script.main, argv, inputs, capsys, "dirs: {d}/run holds a damaged validation.json or CSV", INPUTS)


def test_glue_live_stage_layers_comparison_needs_their_samples(monkeypatch, tmp_path, capsys):
    """``--compare live:layers`` on a calibration from before ``stage_layers`` was timed: two equal copies."""
    _run_dir(tmp_path / "run")
    glue_live = _script(monkeypatch, "glue_live", "refit_copy")
    profile = _live_profile(tmp_path / "p")
    argv = ["refit", "--compare", "live:layers", "--profile", profile, str(tmp_path / "run"), "--work", str(tmp_path)]
    assert _code(glue_live.main, argv) == 2
    _one_line(capsys.readouterr().err, f"--profile: {profile} has no stage_layers samples")


@pytest.mark.parametrize(
    "name, verdict",
    [
        ("glue_live_readings", "for 21, against 6, level 6; other targets worse: none: adopted"),  # part 18
        ("stage_layers_readings", "for 10, against 7, level 7; other targets worse: none: adopted"),  # part 19
        ("multi_item_readings_items", "for 3, against 4, level 5; other targets worse: none: not adopted"),  # part 22
        ("multi_item_readings_sq", "for 2, against 6, level 4; other targets worse: none: not adopted"),
        ("multi_item_readings_dec", "for 3, against 3, level 3; other targets worse: none: not adopted"),
        ("multi_item_readings_items_warm", "for 7, against 7, level 6; other targets worse: p99_ttft_ms: not adopted"),
        ("turnaround_b2b_readings", "for 5, against 4, level 7; other targets worse: none: adopted"),  # part 24
        # part 24's line kept or reverted on the fresh readings after its verdict (rounds 43-50, seeds 76-77), 25 (a)
        ("turnaround_b2b_readings_after", "for 7, against 8, level 11; other targets worse: none: not adopted"),
        ("live_charges_readings", "for 16, against 4, level 0; other targets worse: none: adopted"),  # 25 (b)
        ("turnaround_held_readings_b2b", "for 1, against 1, level 8; other targets worse: none: not adopted"),  # (c)
        ("turnaround_held_readings_waited", "for 1, against 1, level 8; other targets worse: none: not adopted"),
        (  # 25 (d)
            "bare_held_readings",
            "for 7, against 3, level 0; other targets worse: pipeline_bubble_fraction: not adopted",
        ),
        ("turnaround_wide_readings_replay", "for 4, against 3, level 3; other targets worse: none: adopted"),  # 26
        ("turnaround_wide_readings_plain", "for 4, against 3, level 3; other targets worse: none: adopted"),
        (
            "turnaround_wide_readings_after",
            "for 2, against 5, level 2; other targets worse: median_ttft_ms: not adopted",
        ),
        ("turnaround_wideb2b_readings", "for 3, against 0, level 6; other targets worse: none: adopted"),  # 28 (b)
        ("spread_gap_readings_replay", "for 4, against 3, level 3; other targets worse: none: adopted"),  # 29
        (
            "spread_gap_readings_plain",
            "for 3, against 4, level 3; other targets worse: median_ttft_ms: not adopted",
        ),
        ("spread_gap_readings_insample", "for 7, against 3, level 8; other targets worse: none: adopted"),
        ("spread_gap_readings_after", "for 3, against 3, level 3; other targets worse: none: not adopted"),  # 29 (b)
        (
            "spread_gap_readings_after_plain",
            "for 2, against 3, level 4; other targets worse: median_e2el_ms, p99_e2el_ms: not adopted",
        ),
        ("attn_ctx_readings", "for 17, against 12, level 16; other targets worse: none: adopted"),  # part 30 (a)
        ("glue_tokfix_readings_again", "for 17, against 15, level 13; other targets worse: none: adopted"),  # (b)
        ("attn_ctx_tokfix_readings", "for 14, against 20, level 11; other targets worse: none: not adopted"),
        ("attn_ctx_readings_after", "for 2, against 2, level 3; other targets worse: none: not adopted"),  # (c)
        ("attn_ctx_tokfix_readings_after", "for 1, against 2, level 4; other targets worse: none: not adopted"),
        ("prestep_readings", "for 25, against 23, level 4; other targets worse: none: adopted"),  # part 31 (a)
        ("prelog_readings", "for 25, against 27, level 7; other targets worse: none: not adopted"),  # part 32 (a)
        ("ringlad_readings", "for 6, against 2, level 11; other targets worse: none: adopted"),  # part 34 (a)
        ("ringlad_readings_plain", "for 8, against 2, level 9; other targets worse: none: adopted"),
        # (c): tiny 61, dense-1024 85, tiny 62: reverted (the replay's median TTFT 1.6 points worse)
        ("ringlad_readings_after", "for 1, against 0, level 6; other targets worse: median_ttft_ms: not adopted"),
        ("ringlad_readings_after_plain", "for 2, against 1, level 4; other targets worse: none: adopted"),
        # part 35 (a): dense-1024 86, tiny 63-64, fresh calibrations keeping both measures
        ("ownsched_readings", "for 5, against 0, level 1; other targets worse: none: adopted"),
        ("ownsched_readings_plain", "for 5, against 0, level 1; other targets worse: p99_ttft_ms: not adopted"),
        # part 36: tiny 65-66, dense-1024 87-88, MoE rounds 75-76 (the plain prediction)
        ("whole_readings", "for 6, against 2, level 2; other targets worse: none: adopted"),
        # (b): tiny 67, dense-1024 89, MoE round 77, calibrated with it: kept
        ("whole_readings_after", "for 3, against 0, level 2; other targets worse: none: adopted"),
        # part 37: the probe-conditioned prediction against the plain one, tiny 70-95, dense-1024 91-109, MoE 79-108
        ("probe_conditioned_readings", "for 81, against 41, level 13; other targets worse: none: adopted"),
        # part 44: the shaped probe against the fixed one, tiny 86-88, dense-1024 104-105, MoE rounds 98-100
        ("shaped_probe_readings", "for 10, against 3, level 1; other targets worse: none: adopted"),
        # and since its adoption, the fixed probe against the shaped one: tiny 89-95, dense-1024 106-109, MoE 101-108
        ("shaped_since_readings", "for 25, against 7, level 3; other targets worse: none: adopted"),
        # part 45: decode_batch, the replay the rule's reading; seen: dense-1024 104-106, tiny 86-89, MoE 98-101
        ("decode_batch_seen_replay", "for 4, against 0, level 15; other targets worse: none: adopted"),
        ("decode_batch_seen_probed", "for 8, against 8, level 3; other targets worse: none: not adopted"),
        (
            "decode_batch_seen",
            "for 9, against 10, level 0; other targets worse: median_ttft_ms, p99_ttft_ms, p99_e2el_ms: not adopted",
        ),
        # and fresh after its rule: tiny 90-91, dense-1024 107, MoE rounds 102-103
        ("decode_batch_readings_replay", "for 3, against 0, level 6; other targets worse: none: adopted"),
        ("decode_batch_readings_probed", "for 3, against 1, level 5; other targets worse: none: adopted"),
        (
            "decode_batch_readings",
            "for 3, against 5, level 1; other targets worse: output_throughput, p99_ttft_ms, median_e2el_ms, "
            "p99_e2el_ms: not adopted",
        ),
        # (b): after the adoption, on profiles that charge it: tiny 92-95, dense-1024 108-109, MoE 104-108 (revert
        # if the replay or the probe-conditioned prediction has more against than for): kept
        ("decode_batch_after_replay", "for 5, against 1, level 15; other targets worse: none: adopted"),
        ("decode_batch_after_probed", "for 4, against 2, level 15; other targets worse: none: adopted"),
        (
            "decode_batch_after",
            "for 13, against 8, level 0; other targets worse: p99_e2el_ms: not adopted",
        ),
        # part 46: decode_batch's shape only, in-sample on part 45's draws (dense-1024 104-107, tiny 86-92, MoE 98-104)
        ("decode_shape_seen", "for 17, against 8, level 7; other targets worse: none: adopted"),
        ("decode_shape_seen_replay", "for 2, against 0, level 30; other targets worse: none: adopted"),
        ("decode_shape_seen_probed", "for 2, against 2, level 28; other targets worse: none: not adopted"),
        # and fresh after its rule: dense-1024 108-109, tiny 93-94, MoE rounds 105-107: not adopted
        (
            "decode_shape_readings",
            "for 5, against 7, level 1; other targets worse: median_ttft_ms, p99_ttft_ms: not adopted",
        ),
        ("decode_shape_readings_replay", "for 0, against 0, level 13; other targets worse: none: not adopted"),
        ("decode_shape_readings_probed", "for 1, against 0, level 12; other targets worse: none: adopted"),
        # part 40: the control path at two stages, tiny 76-77, dense-1024 95, MoE round 87 (the replay judged)
        ("multi_readings", "for 0, against 1, level 5; other targets worse: none: not adopted"),
        ("multi_readings_plain", "for 0, against 1, level 5; other targets worse: none: not adopted"),
        # part 41: the wide turnaround line again, in-sample on the kept MoE rounds 74-88 (probed: 79-88)
        ("turnaround_wide_again_insample_replay", "for 26, against 12, level 7; other targets worse: none: adopted"),
        (
            "turnaround_wide_again_insample_plain",
            "for 18, against 21, level 6; other targets worse: median_ttft_ms, p99_ttft_ms: not adopted",
        ),
        (
            "turnaround_wide_again_insample_probed",
            "for 13, against 14, level 3; other targets worse: none: not adopted",
        ),
        # part 41's fresh readings (MoE rounds 89-91, tiny 79, dense-1024 96): the replay holds, the probed fails (iii)
        ("turnaround_wide_again_readings_replay", "for 7, against 2, level 2; other targets worse: none: adopted"),
        (
            "turnaround_wide_again_readings_probed",
            "for 4, against 5, level 2; other targets worse: median_ttft_ms, p99_ttft_ms: not adopted",
        ),
        ("turnaround_wide_again_readings_plain", "for 4, against 5, level 2; other targets worse: none: not adopted"),
        # part 42 in-sample (tiny 75-79, dense-1024 94-96 PP=2; MoE rounds 86-91): last_live alone, and with the line
        ("lastlive_insample_replay", "for 11, against 7, level 8; other targets worse: none: adopted"),
        ("lastlive_insample_probed", "for 8, against 9, level 9; other targets worse: none: not adopted"),
        ("lastlive_insample_plain", "for 8, against 4, level 14; other targets worse: median_ttft_ms: not adopted"),
        ("widelast_insample_replay", "for 13, against 5, level 8; other targets worse: none: adopted"),
        ("widelast_insample_probed", "for 9, against 10, level 7; other targets worse: none: not adopted"),
        ("widelast_insample_plain", "for 10, against 8, level 8; other targets worse: median_ttft_ms: not adopted"),
        # part 42's fresh readings (MoE rounds 92-94, tiny 80, dense-1024 97): not adopted; last_live alone beside
        ("widelast_readings_replay", "for 3, against 3, level 5; other targets worse: none: not adopted"),
        ("widelast_readings_probed", "for 3, against 5, level 3; other targets worse: none: not adopted"),
        (
            "widelast_readings_plain",
            "for 4, against 4, level 3; other targets worse: output_throughput, median_ttft_ms, p99_ttft_ms, "
            "median_e2el_ms, p99_e2el_ms: not adopted",
        ),
        ("lastlive_readings_replay", "for 2, against 2, level 7; other targets worse: none: not adopted"),
        ("lastlive_readings_probed", "for 3, against 2, level 6; other targets worse: none: adopted"),
        ("lastlive_readings_plain", "for 3, against 1, level 7; other targets worse: none: adopted"),
        (  # part 31 (c)
            "prestep_readings_after",
            "for 3, against 3, level 1; other targets worse: median_e2el_ms: not adopted",
        ),
        (  # part 27
            "glue_tokfix_readings",
            "for 2, against 7, level 1; other targets worse: output_throughput, p99_ttft_ms, mean_tpot_ms, "
            "median_e2el_ms, p99_e2el_ms: not adopted",
        ),
    ],
)
def test_committed_readings_give_the_verdicts_docs_validation_reports(name, verdict, capsys):
    """The readings each part of docs/validation.md was judged on are committed; judged again, they give its verdict."""
    from experiments.validation import glue_live

    assert glue_live.main(["judge", str(Path(glue_live.__file__).parent / f"{name}.csv")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == verdict


def _refittable_profile(d: Path) -> Path:
    """:func:`_live_profile` with its live step given the fields a real refit reads."""
    from calibration.artifact import read_samples, samples_csv

    src = Path(_live_profile(d))
    rows = [{**r, "gap_s": 0.0, "repeats": 1} if r["split"] == "live1" else r for r in read_samples(src)]
    (src / "samples.csv").write_text(samples_csv(rows))
    return src


def test_glue_live_part_30_ways_fit_the_attention_context_term_and_the_glue_token_term_as_named(tmp_path):
    """Part 30's ways are explicit, whatever calibrate's defaults: ``before30`` and ``tokfix`` fit ``attn_prefill``
    without ``ctx``, ``ctx`` and ``both`` with it; ``tokfix`` and ``both`` take the glue's token term from the grid's
    one-item prefills (:func:`calibration.glue_fits.fit_layer_glue_live`'s ``tok_prefill``)."""
    import json

    glue_live = importlib.import_module("experiments.validation.glue_live")
    src = _refittable_profile(tmp_path / "p")
    for way, ctx in (("before30", False), ("ctx", True), ("tokfix", False), ("both", True)):
        d = glue_live.refit_copy(src, tmp_path / way, way)
        assert ("ctx" in json.loads((d / "fits.json").read_text())["attn_prefill"]["coef"]) is ctx, way
    assert glue_live.WAYS["today"] == {} and {"before30:ctx", "ctx:both"} <= set(glue_live.COMPARES)
    assert glue_live.PRIMARY_OF["before30:ctx"] == glue_live.PRIMARY_OF["ctx:both"] == "median_ttft_ms"


def test_glue_live_part_45_ways_charge_the_decode_batch_ratio_or_record_it(tmp_path):
    """Part 45: ``decbatch`` charges ``decode_batch`` (calibration's live decodes timed alone over the stage model by
    requests), ``before45`` fits the same profile without it; both record it in ``meta.json``."""
    import json

    from calibration.artifact import read_samples, samples_csv

    glue_live = importlib.import_module("experiments.validation.glue_live")
    src = _refittable_profile(tmp_path / "p")
    row = {"op": "stage_full", "split": "live1", "layers": 2, "start_layer": 0, "gap_s": 0.0, "repeats": 1}
    more = [
        {**row, "items": items, "alone_s": t, "median_s": t, "mean_s": t}
        for items, t in (("99:1", 0.0009), (";".join(["99:1"] * 5), 0.0013))
        for _ in range(3)
    ]
    (src / "samples.csv").write_text(samples_csv([*read_samples(src), *more]))
    for way, charged in (("before45", False), ("decbatch", True)):
        d = glue_live.refit_copy(src, tmp_path / way, way)
        assert ("decode_batch" in json.loads((d / "fits.json").read_text())) is charged, way
        assert json.loads((d / "meta.json").read_text())["decode_batch"]["xs"] == [1.0, 5.0], way
    assert "before45:decbatch" in glue_live.COMPARES and "before45:decbatch" not in glue_live.PRIMARY_OF
    assert "before45:decbatch" in glue_live.OWN_FACTOR  # a compute change: --replay and --probed at its own prices
    # part 46: its shape only, every bin over the median of the kept steps' ratios (a median among the bins')
    batch = json.loads((tmp_path / "decbatch" / "fits.json").read_text())["decode_batch"]["coef"]["ys"]
    d = glue_live.refit_copy(src, tmp_path / "decshape", "decshape")
    shaped = json.loads((d / "fits.json").read_text())["decode_batch"]["coef"]["ys"]
    assert shaped[1] / shaped[0] == pytest.approx(batch[1] / batch[0]) and min(shaped) <= 1.0 <= max(shaped)
    assert shaped != pytest.approx(batch)
    assert "decbatch:decshape" in glue_live.COMPARES and "decbatch:decshape" in glue_live.OWN_FACTOR


def test_glue_live_batch_ratio_reads_decode_batch_inside_the_cost_wrappers():
    """Part 45's ``--probed`` moves the probe's factor by each way's ``decode_batch`` at the probe step's requests:
    read through wrappers (``.inner``), 1 for a model without the method."""
    glue_live = importlib.import_module("experiments.validation.glue_live")

    class Profiled:
        def decode_batch_ratio(self, reqs: int) -> float:
            return 0.5 + reqs / 10

    class Wrapped:
        def __init__(self, inner) -> None:
            self.inner = inner

    assert glue_live.batch_ratio(Wrapped(Wrapped(Profiled())), 4) == pytest.approx(0.9)
    assert glue_live.batch_ratio(Profiled(), 1) == pytest.approx(0.6)
    assert glue_live.batch_ratio(object(), 8) == 1.0


def test_glue_live_part_31_ways_fit_the_glue_before_it_or_the_prefill_step_glue(tmp_path):
    """Part 31: ``prestep`` fits ``layer_glue`` with ``pstep`` and ``dreq`` and no token term; ``before31`` and every
    earlier way the (1, tokens, requests) glue their readings were taken with; ``today`` calibrate's default (part 31
    (c): the (1, tokens, requests) glue again)."""
    import json

    from calibration.calibrate import analyse_and_write
    from ppsim.cost.profiled import read_profile
    from tests.test_calibration_glue import PRESTEP, SHAPE, operator_rows, synthetic_rows
    from tests.test_calibration_profiled import _write

    glue_live = importlib.import_module("experiments.validation.glue_live")
    meta = dict(read_profile(_write(tmp_path / "ops")).meta, statistic="mean")
    src = tmp_path / "p"  # stage steps of the grid (the shipped profile has none)
    analyse_and_write(synthetic_rows(true=PRESTEP) + operator_rows(), SHAPE, meta, str(src))

    def glue(way: str) -> dict[str, float]:
        d = glue_live.refit_copy(src, tmp_path / way, way)
        return json.loads((d / "fits.json").read_text())["layer_glue"]["coef"]

    new = glue("prestep")
    assert "pstep" in new and "dreq" in new and new["tok"] == new["req"] == 0.0
    for way in ("before31", "live", "before30", "grid"):
        assert "pstep" not in glue(way), way
    assert "pstep" not in glue("today")  # the default again since part 31 (c)
    logged = glue("prelog")  # part 32: the step's charge growing with log2 of its largest prefill item
    assert "plog" in logged and "pstep" in logged and "plog" not in new
    assert glue_live.PRIMARY_OF["before31:prestep"] == "median_ttft_ms"


def test_glue_live_ways_charge_the_live_charges_or_record_them(tmp_path):
    """``--compare live:bare`` (part 25): the ``live`` copy is refitted with the live charges charged (as every
    calibration until part 25 (b)), ``bare`` and ``bareheld`` with them recorded only; the profile is untouched."""
    import json

    glue_live = importlib.import_module("experiments.validation.glue_live")
    src = _refittable_profile(tmp_path / "p")
    for way, kind in (("live", "charged"), ("bare", "recorded"), ("bareheld", "recorded")):
        d = glue_live.refit_copy(src, tmp_path / way, way)
        assert json.loads((d / "meta.json").read_text())["live_charges"] == kind
    assert "live_charges" not in json.loads((src / "meta.json").read_text())


# --- experiments/validation/class_balance.py ------------------------------------------------------------


def test_class_balance_reads_the_plans_the_engine_launched_into_stage_0(tmp_path):
    """``actions.csv`` as step id -> plan: a prefill plan's items are prefills, a mixed plan's one-token items after
    a prefix decodes, later stages' rows skipped."""
    cb = importlib.import_module("experiments.validation.class_balance")
    path = tmp_path / "actions.csv"
    path.write_text(
        "step,stage,kind,requests,tokens\n"
        "0,0,prefill,0:0:16 1:0:16,32\n"
        "1,0,mixed,0:16:1 2:0:8,9\n"
        "1,1,mixed,0:16:1 2:0:8,9\n"
        "2,0,decode,0:17:1 1:16:1,2\n"
    )
    plans = cb.launched_plans(path)
    assert sorted(plans) == [0, 1, 2]
    assert [it.is_prefill for it in plans[0].items] == [True, True]
    assert [it.is_prefill for it in plans[1].items] == [False, True] and plans[1].num_prefill_tokens == 8
    assert plans[2].num_prefill_tokens == 0 and plans[2].num_reqs == 2


def test_class_balance_is_each_ways_prefill_speed_over_its_decode_speed():
    """Measured over predicted per class, prefill over decode, each way's prediction the recorded one moved by its
    stage time minus the run profile's; a way that prices the prefill computes 2 ms dearer halves their speed here."""
    from calibration.samples import plan_of

    cb = importlib.import_module("experiments.validation.class_balance")

    class Cost:
        def __init__(self, prefill_s: float) -> None:
            self.prefill_s = prefill_s

        def stage_time(self, stage: int, plan) -> float:
            return self.prefill_s if plan.num_prefill_tokens else 0.001

    plans = {0: {0: plan_of("0:16"), 1: plan_of("16:1"), 2: plan_of("17:1")}}
    steps = [
        {
            "run": "0",
            "stage": "0",
            "step_id": "0",
            "num_prefill_tokens": "16",
            "measured_s": "0.004",
            "predicted_s": "0.002",
        },
        {
            "run": "0",
            "stage": "0",
            "step_id": "1",
            "num_prefill_tokens": "0",
            "measured_s": "0.002",
            "predicted_s": "0.001",
        },
        {
            "run": "0",
            "stage": "0",
            "step_id": "2",
            "num_prefill_tokens": "0",
            "measured_s": "0.002",
            "predicted_s": "0.001",
        },
        {
            "run": "1",
            "stage": "0",
            "step_id": "0",
            "num_prefill_tokens": "16",
            "measured_s": "9.0",
            "predicted_s": "1.0",
        },
    ]  # run 1 has no plans: skipped
    got = cb.balance(steps, plans, [0], {"same": Cost(0.002), "dearer": Cost(0.004)}, Cost(0.002))
    assert got["same"] == pytest.approx(1.0) and got["dearer"] == pytest.approx(0.5)
    assert cb.balance(steps[1:3], plans, [0], {"same": Cost(0.002)}, Cost(0.002)) == {"same": None}


def test_class_balance_refuses_a_run_without_its_engine_plans_before_any_refit(monkeypatch, inputs, capsys):
    """A run dir whose ``step_costs.csv`` names an engine repeat without ``actions.csv``: one line naming the run,
    exit 2, nothing written (no ``--work`` copies)."""
    cb = _script(monkeypatch, "class_balance", "refit_copy")
    (inputs / "run" / "step_costs.csv").write_text("run,measured_s,predicted_s\n0,0.1,0.1\n")
    argv = ["--profile", PROFILE, "--work", "{d}/w", "{d}/run"]
    _refused(cb.main, argv, inputs, capsys, "runs: {d}/run: no engine-0/actions.csv", INPUTS)


def test_class_balance_grid_prices_the_calibrations_own_stage_plans_each_way(tmp_path):
    """``--grid``: each way's (measured - predicted) / measured on the grid's middle stages. Stage steps made with a
    ``prestep`` glue: that way's refit prices every plan within rounding, the (1, tokens, requests) glue misses some."""
    from calibration.calibrate import analyse_and_write
    from ppsim.cost.profiled import read_profile
    from tests.test_calibration_glue import PLANS, PRESTEP, SHAPE, operator_rows, synthetic_rows
    from tests.test_calibration_profiled import _write

    cb = importlib.import_module("experiments.validation.class_balance")
    meta = dict(read_profile(_write(tmp_path / "ops")).meta, statistic="mean")
    src = tmp_path / "p"
    analyse_and_write(synthetic_rows(true=PRESTEP) + operator_rows(), SHAPE, meta, str(src))
    refits = {w: cb.refit_copy(src, tmp_path / w, w) for w in ("before31", "prestep")}
    got = cb.grid_errors(src, refits)
    assert [plan for plan, _, _ in got] == PLANS and not any(many for _, many, _ in got)
    assert max(abs(e["prestep"]) for _, _, e in got) < 1e-6
    assert max(abs(e["before31"]) for _, _, e in got) > 0.01


def test_class_balance_without_runs_or_grid_is_refused_in_one_line(monkeypatch, inputs, capsys):
    cb = _script(monkeypatch, "class_balance", "refit_copy")
    _refused(cb.main, ["--profile", PROFILE, "--work", "{d}/w"], inputs, capsys, "runs: none given", INPUTS)
