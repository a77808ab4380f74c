import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def one_torch_thread():
    """One torch thread: the machine is shared, and OpenMP spinning on a busy core is slow."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run_cli(*args: str, cwd: str | None = None, timeout: float = 120):
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "ppsim.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def ppsim_cli():
    """Run ``ppsim`` in a subprocess; returns CompletedProcess."""
    return _run_cli


@pytest.fixture(scope="session")
def validated_without_profile(tmp_path_factory):
    """``ppsim validate`` of tiny without ``--profile``, once for the session: it calibrates this host
    (``ppsim calibrate --quick`` in a subprocess, the real thing, into OUTPUT/profile) and validates two
    requests against that profile. (output dir, CompletedProcess). The quick calibration's own tests
    (tests/test_calibration_live.py) read the same profile: one real calibration serves both, the
    slowest part of the suite."""
    out = tmp_path_factory.mktemp("validate") / "v"
    flags = ["--num-prompts", "2", "--random-input-len", "16", "--random-output-len", "3", "--repeats", "1"]
    r = _run_cli("validate", "--model", "tiny", *flags, "--host-guard", "off", "--output-dir", str(out), timeout=600)
    return out, r


def default_signals() -> None:
    """In a test's child process (``preexec_fn``): SIGINT and SIGTERM at their defaults. A shell's
    background job (``pytest &``, ``nohup``) starts with SIGINT ignored, which a child inherits; Python
    then never raises KeyboardInterrupt. Tests that send signals set up the disposition they rely on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first, then the parent's pid), None once the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False
