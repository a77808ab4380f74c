"""Bad input: one clear line on stderr, non-zero exit, nothing written."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--num-prompts", "0"], "workload.num_prompts"),
        (["--max-num-seqs", "-1"], "engine.max_num_seqs"),
        (["-pp", "0"], "cluster.pipeline_parallel_size"),
        (["--request-rate", "-2"], "workload.request_rate"),
        (["--block-size", "0"], "engine.block_size"),
        (["--model", "llama-3-8b", "--layer-partition", "10,10,10"], "layer_partition"),
        (["--model", "llama-3-8b", "-pp", "4", "--layer-partition", "8,8,8,9"], "sums to 33"),
        (["--model", "gpt-17"], "unknown preset"),
        (["--hardware", "tpu-v9"], "hardware: unknown preset"),
        (["--link", "carrier-pigeon"], "cluster.link: unknown preset"),
        (["--config", "/nonexistent/scenario.toml"], "--config: cannot read"),
        (["--gpu-memory-utilization", "1.5"], "engine.gpu_memory_utilization"),
        (["--model", "llama-3-70b", "-pp", "1"], "memory: stage 0"),
        (["--model", "llama-3-8b", "-tp", "3"], "tensor_parallel_size: 32 attention heads"),
        (
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "512", "--random-input-len", "1024"],
            "engine.max_num_batched_tokens: 512 is below a 1024-token prompt",
        ),
    ],
)
def test_bad_input_one_line_exit_2(ppsim_cli, tmp_path, args, fragment):
    out = tmp_path / "out"
    r = ppsim_cli("simulate", *args, "--output-dir", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert not out.exists()


def test_unparseable_config(ppsim_cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("cluster = [[[\n")
    r = ppsim_cli("simulate", "--config", str(bad))
    assert r.returncode == 2 and "cannot parse" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_field_in_config(ppsim_cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  max_num_seq: 4\n")
    r = ppsim_cli("simulate", "--config", str(bad))
    assert r.returncode == 2 and "engine.max_num_seq" in r.stderr


def test_bad_model_config_json(ppsim_cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"hidden_size": 64}')
    r = ppsim_cli("simulate", "--model", str(cfg))
    assert r.returncode == 2 and "missing field" in r.stderr


@pytest.mark.parametrize(
    "rows,fragment",
    [
        ("inf,100,10", "arrival_s must be finite"),
        ("nan,100,10", "arrival_s must be finite"),
        ("0,100,10,20", "abort_after_tokens must be in"),
    ],
)
def test_bad_trace_rows(ppsim_cli, tmp_path, rows, fragment):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens,abort_after_tokens\n" + rows + "\n")
    out = tmp_path / "out"
    r = ppsim_cli("simulate", "--model", "tiny", "--trace", str(trace), "--output-dir", str(out))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_custom_hardware_error_names_the_field(ppsim_cli, tmp_path):
    cfg = tmp_path / "h.toml"
    cfg.write_text('hardware = {name = "x", peak_tflops = -5, hbm_bandwidth_gbps = 100, memory_gib = 80}\n')
    r = ppsim_cli("simulate", "--config", str(cfg))
    assert r.returncode == 2 and r.stderr.startswith("error: hardware.peak_tflops:")


def _run_unprivileged(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Python with ``args`` in ``cwd``, as ``nobody`` when the tests run as root (whom file modes do not
    stop): through ``setpriv``, which also starts an interpreter installed under root's home."""
    who = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*who, sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(cwd / "home"), "MPLCONFIGDIR": str(cwd / "home")},
    )


@pytest.fixture(scope="module")
def locked_dir():
    """A scratch directory holding ``locked/``, a directory of mode 000, as seen by a process that its
    mode stops (``nobody`` when the tests run as root); skipped where no such process can be made."""
    d = Path(tempfile.mkdtemp(prefix="ppsim-locked-"))
    d.chmod(0o777)  # nobody writes its outputs here
    (d / "home").mkdir(mode=0o777)
    (d / "locked").mkdir(mode=0)
    try:
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: no process here is denied a mode-000 directory")
        probe = "import os, ppsim.cli\ntry:\n    os.listdir('locked')\nexcept PermissionError:\n    print('denied')"
        r = _run_unprivileged("-c", probe, cwd=d)
        if r.stdout.strip() != "denied":
            pytest.skip(f"no process here is denied a mode-000 directory ({r.stdout}{r.stderr[-300:]})")
        yield d
    finally:
        (d / "locked").chmod(0o700)
        shutil.rmtree(d)


SMALL = ["--model", "tiny", "-pp", "2", "--num-prompts", "2", "--random-input-len", "16", "--random-output-len", "4"]
DENIED = "Permission denied; fix the permissions of it or of a directory above it"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["simulate", *SMALL, "--output-dir", "locked"], "error: --output-dir: cannot access {d}/locked: "),
        (["simulate", *SMALL, "--output-dir", "locked/run"], "error: --output-dir: cannot access {d}/locked/run: "),
        (
            ["fit-chunks", *SMALL, "--chunk-sizes", "64", "--smooth-factors", "0.5", "--plot", "locked/p.png"],
            "error: --plot: cannot access {d}/locked/p.png: ",
        ),
        (
            ["simulate", "--model", "tiny", "--trace", "locked/t.csv", "--output-dir", "out"],
            "error: workload.trace: cannot read locked/t.csv: ",
        ),
        (["simulate", *SMALL, "--config", "locked/c.toml", "--output-dir", "out"], "error: --config: cannot read"),
        (["simulate", "--model", "locked", "--output-dir", "out"], "error: --model: cannot read locked: "),
        (
            ["simulate", "--model", "{d}/locked/config.json", "--output-dir", "out"],
            "error: --model: cannot read {d}/locked/config.json: ",
        ),
        (["plot", "locked"], "error: run directory: cannot read locked: "),
        (["compare", "locked", "--output", "c.png"], "error: run directory: cannot read locked: "),
    ],
    ids=[
        *("output-dir", "output-dir-below", "fit-chunks-plot", "trace", "config"),
        *("model", "model-abs", "plot", "compare"),
    ],
)
def test_a_path_behind_a_directory_without_permission(locked_dir, args, fragment):
    r = _run_unprivileged("-m", "ppsim.cli", *(a.format(d=locked_dir) for a in args), cwd=locked_dir)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(fragment.format(d=locked_dir)), r.stderr
    assert DENIED in r.stderr, r.stderr
    assert sorted(os.listdir(locked_dir)) == ["home", "locked"]  # nothing written, no temporary directory left


def test_a_permission_error_no_command_names_is_bad_input(monkeypatch, capsys):
    """The last resort in main() (a path read where no flag is known): the path, the fix, exit status 2."""
    from ppsim import cli

    def denied(args):
        raise PermissionError(13, "Permission denied", "runs/a/summary.json")

    monkeypatch.setitem(cli.COMMANDS, "bubble", (denied, "help"))
    assert cli.main(["bubble"]) == 2
    assert capsys.readouterr().err == f"error: runs/a/summary.json: {DENIED}\n"
