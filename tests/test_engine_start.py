"""How the engine starts its stage processes: a fork server with torch loaded (engine/launcher.py), and what it
preloads of this project's own code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.launcher import server_preload, stage_context  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent)


def test_the_stage_code_is_preloaded_where_the_server_finds_this_checkout(tmp_path):
    with_code = ["torch", "torch.distributed", "engine.worker"]
    assert server_preload(ROOT, "") == with_code  # run from the checkout, as the README's commands are
    assert server_preload(str(tmp_path), ROOT) == with_code  # from elsewhere, the checkout on PYTHONPATH
    assert server_preload(str(tmp_path), os.pathsep.join(["", str(tmp_path / "none"), ROOT])) == with_code


def test_another_checkout_first_on_the_servers_path_keeps_the_stage_code_out(tmp_path):
    other = tmp_path / "other"
    (other / "engine").mkdir(parents=True)
    (other / "engine" / "__init__.py").write_text("")
    assert server_preload(str(other), ROOT) == ["torch", "torch.distributed"]  # the working directory wins
    assert server_preload(str(tmp_path), os.pathsep.join([str(other), ROOT])) == ["torch", "torch.distributed"]
    assert server_preload(str(tmp_path), "") == ["torch", "torch.distributed"]  # not found: not assumed


def test_stages_start_from_a_fork_server_on_linux_only():
    method = stage_context().get_start_method()
    assert method == ("forkserver" if sys.platform.startswith("linux") else "spawn")
