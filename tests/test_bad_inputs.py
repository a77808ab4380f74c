"""Every bad input of tests/bad_inputs.py ends in one line naming the field, exit 2, nothing written;
result directories are written whole or not at all; requests that cannot be served are named."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ppsim.cli import main
from ppsim.errors import PPSimError
from ppsim.outputs import MARKER, check_apart, write_result_set
from tests.bad_inputs import TINY, all_cases, run_case
from tests.conftest import default_signals

CASES = all_cases()  # tests/bad_inputs.py and the tables of tests/bad_inputs_{config,profiles,runs}.py


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line(case, tmp_path):
    if case.needs_torch:
        pytest.importorskip("torch")
    end = run_case(case, tmp_path)
    assert end.kind == "refused", f"{end.kind} (exit {end.code}): {end.stderr}"
    assert case.fragment in end.stderr, end.stderr
    assert len(end.stderr) < 1000, end.stderr[:300]  # a value quoted in the line is cut short
    assert not list(tmp_path.glob(".*.tmp*")) and not list(tmp_path.glob(".*.old-*"))


def _simulate(out: Path, *extra: str) -> int:
    return main(["simulate", *TINY, "--output-dir", str(out), *extra])


def test_previous_results_survive_a_failed_write(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert _simulate(out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = Path.write_text

    def full_disk(self, text, *a, **k):
        if self.name == "summary.json":  # a file every run writes (trace.json only with --save-detailed)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    capsys.readouterr()
    assert _simulate(out, "--seed", "7") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}/summary.json" in err and "No space left on device" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old set, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directory left


def test_full_disk_on_a_small_tmpfs(tmp_path, capsys):
    """The real thing where the host allows a mount (root): a 64 KiB tmpfs."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        out = disk / "run"
        assert _simulate(out, "--no-dashboard") == 0  # a dashboard PNG alone would not fit in 64 KiB
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        capsys.readouterr()
        assert main(["simulate", *TINY, "--num-prompts", "60", "--no-dashboard", "--output-dir", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --output-dir: cannot write {out}/") and "No space left" in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert os.listdir(disk) == ["run"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# a run whose write stalls once its first files are staged, until a signal comes (the moment the
# temporary directory is half-written, without depending on the host's speed)
STALLED_WRITE = """
import sys, time
import ppsim.outputs
from ppsim.cli import main

real = ppsim.outputs._write_tree

def stalled(root, files):
    real(root, files)
    print("staged", flush=True)
    time.sleep(120)

ppsim.outputs._write_tree = stalled
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "sig, code, last", [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_while_writing_leaves_the_previous_results(tmp_path, sig, code, last):
    """SIGTERM (``timeout``, Slurm, Kubernetes) cleans up as Ctrl-C does: it left ``.out.tmp-PID`` behind."""
    out = tmp_path / "out"
    assert _simulate(out, "--no-dashboard") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["simulate", *TINY, "--seed", "7", "--no-dashboard", "--quiet", "--output-dir", str(out)]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.Popen(
        [sys.executable, "-c", STALLED_WRITE, *args],
        cwd=root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,
    )
    try:
        lines = iter(p.stdout.readline, "")  # ends if the child exits
        assert "staged\n" in lines, p.stderr.read()
        assert [d.name for d in tmp_path.glob(".out.tmp-*")] == [f".out.tmp-{p.pid}"]  # half-written now
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == code and err.splitlines()[-1] == last, err
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary directory left
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_new_run_replaces_another_commands_results(tmp_path):
    out = tmp_path / "out"
    write_result_set(out, {"engine.json": "{}\n", "tokens.json": "{}\n", "summary.json": "{}\n"})
    assert _simulate(out) == 0
    names = {p.name for p in out.iterdir()}
    assert "engine.json" not in names and "tokens.json" not in names
    assert {"summary.json", "requests.csv", "config.json", MARKER} <= names


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


LEGACY = {  # every kind of entry a result set held before the marker: all of it ppsim's
    "engine.json": "{}",
    "engine-0/summary.json": "{}",
    "engine-12/tokens.json": "{}",
    "sim/requests.csv": "x\n",
    "profile/fits.json": "{}",
    "results/0123456789abcdef.json": "{}",
    "results/.0123456789abcdef.json.tmp77": "",
    ".out.tmp-123/summary.json": "{}",
}


def test_legacy_result_dir_without_marker_is_replaced(tmp_path):
    out = tmp_path / "out"
    _tree(out, LEGACY)
    (out / "engine-1").mkdir()
    assert _simulate(out) == 0
    assert not (out / "engine.json").exists() and not (out / "engine-0").exists() and MARKER in os.listdir(out)


@pytest.mark.parametrize(
    "mine",
    [
        {"results/paper.csv": "a", "profile/notes.txt": "n", "config.json": "{}"},
        {"engine-0/my.txt": "mine"},
        {"sim/sub/summary.json": "{}"},  # a folder where ppsim writes none
        {"summary.json/notes.txt": "a directory of a result file's name"},
        {"results/draft.json": "{}"},  # not a sweep's KEY.json
    ],
)
@pytest.mark.parametrize("command", ["simulate", "import-vidur"])
def test_hand_made_folder_of_ppsim_names_is_kept(tmp_path, capsys, mine, command):
    """Only the top-level names were checked: `proj/{results/paper.csv, profile/notes.txt, config.json}`
    was deleted by any command writing there."""
    out = tmp_path / "proj"
    _tree(out, {**dict(list(LEGACY.items())[:2]), **mine})
    before = _contents(out)
    args = ["simulate", *TINY] if command == "simulate" else ["import-vidur", "--model", "llama-2-7b"]
    assert main([*args, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a ppsim result directory (it holds " in err, err
    assert next(iter(mine)).split("/")[0] in err
    assert _contents(out) == before


def test_a_link_in_a_result_folder_is_not_ppsim_s(tmp_path, capsys):
    out, mine = tmp_path / "out", tmp_path / "mine"
    _tree(mine, {"a.txt": "a"})
    _tree(out, {"summary.json": "{}"})
    (out / "engine-0").symlink_to(mine, target_is_directory=True)
    assert _simulate(out) == 2
    assert "(it holds engine-0)" in capsys.readouterr().err and (out / "engine-0" / "a.txt").exists()


@pytest.mark.parametrize("command", ["simulate", "validate"])
def test_output_dir_apart_from_the_profile(tmp_path, capsys, command):
    """`--output-dir` equal to `--profile` replaced the calibration with the run's results."""
    prof = tmp_path / "r" / "p"  # in an earlier result set (its marker), replaced whole
    shutil.copytree(Path(__file__).resolve().parents[1] / "profiles" / "tiny-cpu", prof)
    (tmp_path / "r" / MARKER).write_text("")
    before = _contents(prof)
    for out in (prof, prof / "run", tmp_path / "r"):
        code = main([command, *TINY, "--profile", str(prof), "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "--profile" in err and "--output-dir" in err, err
        assert _contents(prof) == before and not (prof / "run").exists()


def test_commands_that_add_files_may_hold_their_inputs(tmp_path, capsys):
    """compare and sweep only add files to their folder (compare.png; sweep.csv, space.json, pareto.png,
    results/): a folder holding the runs compared or the sweep's profile is fine, unless a file written
    would overwrite the input; being or lying inside an input is refused."""
    from tests.bad_inputs_runs import run_dir

    run_dir()(tmp_path)
    assert main(["compare", str(tmp_path / "run"), "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "compare.png").is_file() and capsys.readouterr().err == ""
    names = ("sweep.csv", "space.json", "pareto.png", "results")
    check_apart(tmp_path, "--output-dir", {"cost.profile_dir": tmp_path / "p"}, replace=False, names=names)
    for name in ("space.json", "results/p"):
        with pytest.raises(PPSimError, match=re.escape(f"holds x {tmp_path / name}; the results would overwrite it")):
            check_apart(tmp_path, "--output-dir", {"x": tmp_path / name}, replace=False, names=names)
    with pytest.raises(PPSimError, match="is also x; the results would be written into it"):
        check_apart(tmp_path, "--output-dir", {"x": tmp_path}, replace=False, names=names)
    with pytest.raises(PPSimError, match="holds x .*; the results would replace it"):
        check_apart(tmp_path, "--output-dir", {"x": tmp_path / "p"})  # a set that replaces the folder whole
    check_apart(tmp_path, "--output-dir", {"x": ""})  # an empty path is its reader's to refuse, not the cwd


def test_import_vidur_output_apart_from_the_root_of_the_environment(tmp_path, capsys, monkeypatch):
    """The data root from $PPSIM_VIDUR_ROOT is named as such (the flag --root was not given)."""
    (tmp_path / "vr" / "compute").mkdir(parents=True)
    monkeypatch.setenv("PPSIM_VIDUR_ROOT", str(tmp_path / "vr"))
    out = tmp_path / "vr" / "profile"
    assert main(["import-vidur", "--model", "llama-2-7b", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} lies inside PPSIM_VIDUR_ROOT {tmp_path / 'vr'};" in err, err
    assert not out.exists()


def test_fit_chunks_plot_leaves_no_temp_file(tmp_path, capsys):
    plot = tmp_path / "plots" / "fit.png"
    args = ["fit-chunks", *TINY, "--chunk-sizes", "64", "--smooth-factors", "0.5", "--plot", str(plot)]
    assert main(args) == 0
    assert plot.stat().st_size > 1000 and os.listdir(plot.parent) == ["fit.png"]


def test_merge_mode_keeps_other_files(tmp_path):
    out = tmp_path / "sweep"
    (out / "results").mkdir(parents=True)
    (out / "results" / "a.json").write_text("{}")
    write_result_set(out, {"sweep.csv": "x\n"}, replace=False)
    assert (out / "results" / "a.json").exists() and (out / "sweep.csv").read_text() == "x\n"


# --- requests that cannot be served --------------------------------------------------------------------


def test_rejected_requests_are_named_with_the_fix(tmp_path, capsys):
    # tiny has max_position_embeddings 4096 (see ppsim/models/presets/tiny.json)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,16,4\n0,5000,4\n0.1,16,4\n")
    assert (
        main(["simulate", "--model", "tiny", "-pp", "2", "--trace", str(trace), "--output-dir", str(tmp_path / "out")])
        == 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: 1 of 3 requests rejected: 1 longer than max_model_len")
    assert "--max-model-len" in err[0]


def test_every_request_rejected_exits_1(tmp_path, capsys):
    out = tmp_path / "out"
    assert _simulate(out, "--max-model-len", "10") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 4 of 4 requests rejected: 4 longer than max_model_len 10")
    assert json.loads((out / "summary.json").read_text())["completed"] == 0


def test_kv_cache_too_small_names_blocks(tmp_path, capsys):
    pytest.importorskip("torch")
    assert (
        main(
            [
                "engine",
                *TINY,
                "--request-rate",
                "inf",
                "--kv-blocks",
                "1",
                "--block-size",
                "4",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 4 of 4 requests rejected: 4 need up to 5 KV blocks, the cache has 1"), err


def test_max_model_len_extends_past_the_config(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,5000,4\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "simulate",
                "--model",
                "tiny",
                "-pp",
                "2",
                "--trace",
                str(trace),
                "--max-model-len",
                "8192",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["completed"] == 1
    assert capsys.readouterr().err == ""


def test_output_dir_that_is_a_mount_point(tmp_path):
    """Renaming a mount point fails (EBUSY): the set is moved into it instead."""
    import subprocess

    out = tmp_path / "mnt"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(out)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        (out / "engine.json").write_text("{}")
        assert _simulate(out) == 0
        assert _simulate(out, "--seed", "3") == 0
        names = {p.name for p in out.iterdir()}
        assert "engine.json" not in names and {"summary.json", MARKER} <= names
        assert not [n for n in names if ".tmp" in n] and sorted(os.listdir(tmp_path)) == ["mnt"]
    finally:
        subprocess.run(["umount", str(out)], capture_output=True)


def test_read_only_parent_stages_inside(tmp_path, monkeypatch):
    """Only the directory itself is writable (a user's folder in a root-owned one): staged inside it."""
    import ppsim.outputs as outputs

    out = tmp_path / "out"
    assert _simulate(out) == 0
    real = outputs._can_create
    monkeypatch.setattr(
        outputs, "_can_create", lambda where: OSError(13, "Permission denied") if where == tmp_path else real(where)
    )
    (out / "engine.json").write_text("{}")
    assert _simulate(out, "--seed", "5") == 0
    names = {p.name for p in out.iterdir()}
    assert "engine.json" not in names and not [n for n in names if ".tmp" in n] and "summary.json" in names
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_run_re_run_in_place_from_its_own_config(tmp_path, capsys):
    """``--config RUN/config.json --output-dir RUN``: the config is read whole before any work, so the run
    may replace its own directory (docs/engine.md re-runs an engine run from its config.json)."""
    run = tmp_path / "run"
    assert main(["simulate", *TINY, "--no-dashboard", "--quiet", "--output-dir", str(run)]) == 0
    config = (run / "config.json").read_text()
    assert (
        main(["simulate", "--config", str(run / "config.json"), "--no-dashboard", "--quiet", "--output-dir", str(run)])
        == 0
    )
    assert (run / "config.json").read_text() == config


def test_validate_may_reuse_the_profile_it_calibrated_into_its_output(tmp_path, monkeypatch, capsys):
    """``validate --profile OUT/profile --output-dir OUT``: that profile joins the new result set
    (``ppsim.validate.run.profile_files``), so it is not refused as an input the results would replace."""
    import ppsim.validate.run as vrun

    out = tmp_path / "v"
    shutil.copytree(Path(__file__).resolve().parents[1] / "profiles" / "tiny-cpu", out / "profile")
    (out / MARKER).write_text("")

    class Reached(Exception):
        pass

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(vrun, "validate", reached)
    with pytest.raises(Reached):
        main(["validate", *TINY, "--repeats", "1", "--profile", str(out / "profile"), "--output-dir", str(out)])
