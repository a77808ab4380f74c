"""``ppsim sweep --executor ray --ray-address`` against a real Ray head, started the way a user does.

The head runs on loopback (``ray start --head --node-ip-address 127.0.0.1 --block``) in its own
process group with its own temp dir, ports and token; the sweep is a separate ``ppsim`` process. Its
results must equal the local executor's. The head is stopped by its process group (never a
machine-wide ``ray stop``, which would also stop other Ray instances on the host), and the test
fails if any process of that head survives.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ppsim.errors import PPSimError
from ppsim.sweep.runner import run_sweep
from ppsim.sweep.space import load_space

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
SPACE = """\
[base]
model = "tiny"
hardware = "h100-sxm"
[base.workload]
num_prompts = 24
random_input_len = 64
random_output_len = 8
[space]
pp = [1, 2]
max_num_seqs = [8, 16]
[slo]
p99_ttft_ms = 8
p99_tpot_ms = 5
[search]
rel_tolerance = 0.1
max_steps = 4
"""
START_TIMEOUT_S = 120
SWEEP_TIMEOUT_S = 300
STOP_TIMEOUT_S = 20


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ray_cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())", *args]


def _processes_of(head_pgid: int, marker: str) -> list[int]:
    """PIDs in the head's process group or naming its temp dir (raylet workers) on their command line."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            pgid = os.getpgid(int(d.name))
        except (OSError, ProcessLookupError):
            continue
        if pgid == head_pgid or marker in cmd:
            found.append(int(d.name))
    return found


def _stop_head(head: subprocess.Popen, marker: str) -> list[int]:
    """SIGTERM the head's group, then SIGKILL it; returns the PIDs still alive after that."""
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (head.poll() is None or _processes_of(head.pid, marker)):
            time.sleep(0.2)
        if head.poll() is not None and not _processes_of(head.pid, marker):
            return []
    left = _processes_of(head.pid, marker)
    for pid in left:  # outside the group (e.g. a worker that called setsid): ours by its temp dir
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _results(out: Path) -> dict[str, dict]:
    return {
        p.name: {k: v for k, v in json.loads(p.read_text()).items() if k != "wall_s"}
        for p in sorted((out / "results").glob("*.json"))
    }


def test_an_address_nobody_answers_is_one_line_not_a_hang(tmp_path: Path):
    (port,) = _free_ports(1)  # closed again: nothing listens there
    space_file = tmp_path / "space.toml"
    space_file.write_text(SPACE)
    with pytest.raises(PPSimError, match=rf"--ray-address: nothing answers at 127.0.0.1:{port} .*ray start --head"):
        run_sweep(
            load_space(space_file), tmp_path / "out", executor="ray", ray_address=f"127.0.0.1:{port}", progress=False
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a Ray head takes 10-20 s to start and to drain on a loaded 2-core host
def test_sweep_on_a_real_ray_head_equals_the_local_executor(tmp_path: Path):
    space_file = tmp_path / "space.toml"
    space_file.write_text(SPACE)
    local = run_sweep(load_space(space_file), tmp_path / "local", executor="local", workers=1, progress=False)
    assert local.evaluated == 4 and all(r["status"] == "ok" for r in local.results)

    ray_tmp = tempfile.mkdtemp(prefix="ppsim-ray-")  # short: Ray's socket paths must fit 107 bytes
    gcs, dash, agent, agent_grpc, env_agent, metrics, obj, node = _free_ports(8)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        # hermetic token authentication: Ray 2.5x turns it on for `ray start` when ~/.ray/auth_token exists
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    log = open(Path(ray_tmp) / "head.log", "w")  # noqa: SIM115 - closed in finally
    head = subprocess.Popen(
        _ray_cli(
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(gcs),
            "--num-cpus",
            "1",
            "--object-store-memory",
            str(100 * 2**20),
            "--temp-dir",
            ray_tmp,
            "--include-dashboard",
            "false",
            "--disable-usage-stats",
            "--dashboard-port",
            str(dash),
            "--dashboard-agent-listen-port",
            str(agent),
            "--dashboard-agent-grpc-port",
            str(agent_grpc),
            "--runtime-env-agent-port",
            str(env_agent),
            "--metrics-export-port",
            str(metrics),
            "--object-manager-port",
            str(obj),
            "--node-manager-port",
            str(node),
        ),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    left: list[int] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in (Path(ray_tmp) / "head.log").read_text():
            assert head.poll() is None, "ray start --head exited:\n" + (Path(ray_tmp) / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no Ray head within {START_TIMEOUT_S} s"
            time.sleep(0.5)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "ppsim.cli",
                "sweep",
                "--space",
                str(space_file),
                "--output-dir",
                str(tmp_path / "ray"),
                "--executor",
                "ray",
                "--ray-address",
                f"127.0.0.1:{gcs}",
                "--no-progress",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=SWEEP_TIMEOUT_S,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert "4 evaluated" in r.stdout
    finally:
        left = _stop_head(head, ray_tmp)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left, f"Ray processes survived the head's stop: {left}"
    assert _results(tmp_path / "ray") == _results(tmp_path / "local")
    assert (tmp_path / "ray" / "sweep.csv").read_text() == (tmp_path / "local" / "sweep.csv").read_text()
