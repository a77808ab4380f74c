"""The simulator imports and runs without torch (only engine/ and calibration/ need it)."""

import subprocess
import sys

from tests.conftest import ROOT

BLOCK_TORCH = "import sys; sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"


def test_simulate_runs_with_torch_unimportable(tmp_path):
    code = BLOCK_TORCH + (
        "from ppsim.cli import main\n"
        f"rc = main(['simulate', '--num-prompts', '5', '--output-dir', r'{tmp_path}'])\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "sys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "summary.json").exists()


def test_no_arguments_runs_the_default_scenario(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "ppsim.cli"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert "Serving Benchmark Result" in r.stdout and "Successful requests:" in r.stdout
    assert (tmp_path / "ppsim-results" / "summary.json").exists()
