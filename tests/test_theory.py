"""Theory checks on whole runs: Little's law, conservation, determinism."""

import numpy as np
import pytest

from ppsim.config import build_scenario
from ppsim.run import run_scenario


def _scenario(engine=None, **workload):
    wl = {
        "num_prompts": 600,
        "request_rate": 20.0,
        "random_input_len": 256,
        "random_output_len": 64,
        "random_range_ratio": 0.5,
        **workload,
    }
    return build_scenario(
        overrides={
            "model": "llama-3-8b",
            "cluster": {"pipeline_parallel_size": 2},
            "workload": wl,
            "seed": 3,
            "engine": engine or {},
        }
    )


def test_littles_law_on_stationary_run():
    lam = 20.0
    out = run_scenario(_scenario(request_rate=lam))
    recs = [r for r in out.result.requests if r.status == "finished"]
    sent = np.array([r.sent_s for r in recs])
    fin = np.array([r.finish_s for r in recs])
    t0, t1 = np.percentile(sent, 20), np.percentile(sent, 80)  # stationary middle of the run
    grid = np.linspace(t0, t1, 4000)
    L = np.mean([np.sum((sent <= t) & (fin > t)) for t in grid])  # time-average number in system
    in_window = (sent >= t0) & (sent <= t1)
    W = np.mean(fin[in_window] - sent[in_window])
    assert L == pytest.approx(lam * W, rel=0.12)


def test_conservation_every_request_once_and_tokens_add_up():
    s = _scenario(num_prompts=300, request_rate="inf")
    out = run_scenario(s, save_detailed=True)
    recs = out.result.requests
    assert sorted(r.req_id for r in recs) == list(range(300))
    assert all(r.status == "finished" for r in recs)
    assert all(len(r.token_times) == r.output_tokens for r in recs)
    assert all(a <= b for r in recs for a, b in zip(r.token_times, r.token_times[1:], strict=False))
    assert out.summary["total_output_tokens"] == sum(r.output_tokens for r in recs)
    assert out.summary["total_input_tokens"] == sum(r.input_tokens for r in recs)
    assert out.summary["completed"] == 300
    # every prompt token was computed at least once on each stage
    for stage in ("stage0", "stage1"):
        pre = sum(o.num_prefill_tokens for o in out.result.ops if o.track == stage)
        assert pre >= out.summary["total_input_tokens"]


@pytest.mark.parametrize("policy", ["vllm-batch-queue", "no-pp"])
def test_closed_loop_never_exceeds_max_concurrency(policy):
    out = run_scenario(_scenario({"policy": policy}, num_prompts=80, request_rate="inf", max_concurrency=5))
    recs = out.result.requests
    events = sorted([(r.sent_s, 1) for r in recs] + [(r.finish_s, -1) for r in recs], key=lambda x: (x[0], x[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 5


def test_determinism_byte_identical_summary(tmp_path, ppsim_cli):
    args = [
        "simulate",
        "--save-detailed",
        "--model",
        "llama-3-8b",
        "-pp",
        "2",
        "--num-prompts",
        "50",
        "--random-range-ratio",
        "0.3",
        "--seed",
        "7",
    ]
    a = ppsim_cli(*args, "--output-dir", str(tmp_path / "a"))
    b = ppsim_cli(*args, "--output-dir", str(tmp_path / "b"))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    for name in ("summary.json", "requests.csv", "trace.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    c = ppsim_cli(*args[:-1], "8", "--output-dir", str(tmp_path / "c"))
    assert c.returncode == 0, c.stderr
    assert (tmp_path / "a" / "summary.json").read_bytes() != (tmp_path / "c" / "summary.json").read_bytes()
