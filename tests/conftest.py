import os
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


@pytest.fixture
def ppsim_cli():
    """Run ``ppsim`` in a subprocess; returns CompletedProcess."""
    import subprocess

    def run(*args: str, cwd: str | None = None, timeout: float = 120):
        return subprocess.run(
            [sys.executable, "-m", "ppsim.cli", *args],
            capture_output=True,
            text=True,
            cwd=cwd or ROOT,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    return run
