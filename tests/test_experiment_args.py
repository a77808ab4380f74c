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
from tests.conftest import ROOT

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


def _default_signals() -> None:
    """In the child: default SIGTERM (a background ``pytest &`` may start children with signals ignored)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
        preexec_fn=_default_signals,
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
    while any(_alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert family and not any(_alive(pid) for pid in family), "a process of the run outlived it"


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


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False
