"""Engine faults: a killed or stalled stage ends the run within the timeout, with no orphans;
the CLI exits non-zero and names the unfinished requests; Ctrl-C shuts down cleanly."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from engine.launcher import StageFault, StageGroup, startup_message  # noqa: E402
from engine.run import EngineFault, EngineOptions, run_engine  # noqa: E402
from ppsim.cli import main  # noqa: E402
from ppsim.config import build_scenario, step_budget_fields  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from tests.conftest import alive, default_signals, proc_stat  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = [
    "--model",
    "tiny",
    "-pp",
    "2",
    "--num-prompts",
    "6",
    "--request-rate",
    "inf",
    "--random-input-len",
    "40",
    "--random-output-len",
    "200",
    "--max-num-batched-tokens",
    "64",
]


def scenario(policy: str = "vllm-batch-queue"):
    return build_scenario(
        None,
        {
            "model": "tiny",
            "cluster": {"pipeline_parallel_size": 2},
            "engine": {"policy": policy, **step_budget_fields(policy, 64)},
            "workload": {
                "num_prompts": 6,
                "request_rate": float("inf"),
                "random_input_len": 40,
                "random_output_len": 30,
            },
        },
    )


@pytest.mark.parametrize(
    "fault, words, policy",
    [
        ("kill:1:4", "stage 1 died", "vllm-batch-queue"),
        ("stall:1:4", "stalled", "vllm-batch-queue"),
        # the policies' own data paths: rank 0 waits on the ring return (its forwarder thread) or on the
        # last rank's token broadcast; the core still sees the dead or stalled stage
        ("kill:1:4", "stage 1 died", "sglang-ring"),
        ("stall:1:4", "stalled", "trtllm-slots"),
        ("stall:1:4", "stalled", "vllm-mrv2"),
    ],
)
def test_stage_fault_stops_every_process(tmp_path, fault, words, policy):
    t0 = time.monotonic()
    with pytest.raises(EngineFault, match=words) as err:
        run_engine(scenario(policy), tmp_path, EngineOptions(inject_fault=fault, stage_timeout_s=1.5))
    info = (tmp_path / "engine.json").read_text()
    pids = [int(p) for p in re.search(r'"stage_pids": \[([\d,\s]+)\]', info).group(1).split(",")]
    startup = float(re.search(r'"startup_s": ([\d.]+)', info).group(1))
    # every wait is bounded: detection (1.5 s + a 0.2 s slice) and shutdown (join 3 s, terminate 1 s, kill 3 s);
    # the bound is loose so that it holds on a busy host: it catches a hang, not slowness
    assert time.monotonic() - t0 < startup + 1.5 + 30.0
    assert not multiprocessing.active_children() and not any(alive(p) for p in pids)
    res = err.value.result
    unfinished = [r.req_id for r in res.requests if r.status == "unfinished"]
    assert unfinished and "unfinished" in str(err.value)
    assert json.loads(info)["unfinished_requests"] == unfinished  # all of them, not the first 20
    assert "unfinished" in (tmp_path / "requests.csv").read_text()


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ppsim.cli", "engine", *FLAGS, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        preexec_fn=default_signals,
    )


def _pids(line: str) -> list[int]:
    return [int(p) for p in re.search(r"pids \[([\d,\s]+)\]", line).group(1).split(",")]


def test_cli_killed_stage_exits_nonzero(tmp_path):
    p = _cli("--inject-fault", "kill:0:3", "--stage-timeout-s", "2", "--output-dir", str(tmp_path))
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 1, errs
    assert "stage 0 died" in errs and "requests unfinished: [" in errs
    assert not any(alive(pid) for pid in _pids(out))


@pytest.mark.parametrize(
    "sig, code, fault", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")]
)
def test_cli_ctrl_c_is_clean(tmp_path, sig, code, fault):
    p = _cli("--output-dir", str(tmp_path))
    try:
        line = p.stdout.readline()
        assert "stages ready" in line, line + p.stderr.read()
        time.sleep(0.3)
        p.send_signal(sig)
        p.wait(timeout=15)
    finally:
        p.kill()
    assert p.returncode == code
    assert "partial results written to" in p.stderr.read()
    assert json.loads((tmp_path / "engine.json").read_text())["fault"] == fault
    assert "requests.csv" in os.listdir(tmp_path)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in _pids(line)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in _pids(line))


def test_startup_stall_names_the_stage(tmp_path, capsys):
    # 20 s: time enough for stage 0 to import torch and reach the rendezvous on a busy host
    code = main(
        [
            "engine",
            *FLAGS,
            "--inject-fault",
            "stall:1:start",
            "--startup-timeout-s",
            "20",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("error: stage 1 did not come up within 20 s") and err.count("\n") == 1, err
    assert "stage(s) [0] were waiting for it" in err
    assert not (tmp_path / "out").exists() and not multiprocessing.active_children()


def test_startup_message_names_the_stage_furthest_behind():
    msg = startup_message({0: "joined", 1: "started", 2: "spawning", 3: "spawning"}, {0}, 30)
    assert msg.startswith("stages [2, 3] did not come up within 30 s (stuck starting its process")
    assert "stage(s) [1] were waiting" in msg


def test_stage_error_at_startup_is_reported(tmp_path, monkeypatch):
    """A stage that fails while loading is named with its error. The parent refuses a checkpoint of another
    model before the spawn (tests/test_engine_preflight.py); here its check is skipped, so the stage meets it."""
    import torch

    import engine.run
    from engine.checkpoint import save_checkpoint
    from engine.model import build_stage
    from ppsim.models.shape import load_hf_config, load_model

    cfg, _ = load_hf_config("tiny")
    small = load_model("tiny").model_copy(update={"num_layers": 4})
    save_checkpoint(build_stage(small, 0, 4, True, True, 0, torch.float32), tmp_path, {**cfg, "num_hidden_layers": 4})
    monkeypatch.setattr(engine.run, "check_checkpoint", lambda *_args: None)
    with pytest.raises(StageFault, match="lacks tensor 'model.layers.4"):
        run_engine(scenario(), options=EngineOptions(checkpoint=str(tmp_path)))
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    "available, count, backend, words",
    [
        (False, 0, "gloo", "no CUDA device"),
        (True, 1, "nccl", "2 stages need 2 GPU"),
    ],
)
def test_cuda_is_checked_before_spawning(monkeypatch, available, count, backend, words):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(PPSimError, match=words):
        run_engine(scenario(), options=EngineOptions(device="cuda", backend=backend))
    assert not multiprocessing.active_children()


class _Dead:
    exitcode = 1


def test_dead_stage_names_its_error():
    group = StageGroup([])
    try:
        group.procs = [_Dead()]
        group.results.put(("ready", 0, 0.0, 0.0))
        group.results.put(("error", 0, "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA oom\n"))
        with pytest.raises(StageFault, match=r"stage 0 died \(exit code 1\): RuntimeError: CUDA oom$"):
            group.check_alive()
    finally:
        for q in [*group.ctrls, group.results]:
            q.close()


@pytest.mark.parametrize(
    "flag, value", [("--threads-per-stage", "0"), ("--stage-timeout-s", "-1"), ("--max-kv-gib", "0")]
)
def test_cli_bad_engine_option_is_one_line(capsys, tmp_path, flag, value):
    assert main(["engine", *FLAGS, flag, value, "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: ") and err.count("\n") == 1, err


def test_cli_killed_outright_leaves_no_stage_or_fork_server_behind(tmp_path):
    """SIGKILL skips every clean-up of the CLI: its stages (children of the fork server that preloads torch,
    engine/launcher.py::stage_context) and the fork server itself are gone within seconds: the server exits
    when the CLI's end of its pipe closes, and the stages die with it (``PR_SET_PDEATHSIG``)."""
    p = _cli("--output-dir", str(tmp_path))
    try:
        line = p.stdout.readline()
        assert "stages ready" in line, line + p.stderr.read()
        stages = _pids(line)
        servers = {int(proc_stat(pid)[1]) for pid in stages}
        assert len(servers) == 1  # the fork server (the CLI itself where stages are spawned)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=15)
    finally:
        p.kill()
    left = [*stages, *(servers - {p.pid})]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in left)
