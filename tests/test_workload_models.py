import numpy as np
import pytest

from ppsim.config import WorkloadConfig
from ppsim.errors import PPSimError
from ppsim.models.shape import list_presets, load_model
from ppsim.workload import build_workload, read_trace


def test_presets_present_and_param_counts():
    assert {"llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "tiny"} <= set(list_presets())
    expected_b = {
        "llama-2-7b": 6.74,
        "llama-2-70b": 68.98,
        "llama-3-8b": 8.03,
        "llama-3-70b": 70.55,
        "qwen2.5-7b": 7.62,
    }
    for name, b in expected_b.items():
        m = load_model(name)
        assert m.total_weight_bytes() / m.dtype_bytes / 1e9 == pytest.approx(b, rel=0.01), name


def test_seam_and_kv_bytes():
    m = load_model("llama-3-70b")
    assert m.seam_bytes(1) == 2 * 8192 * 2 == 32 * 1024  # 32 KiB per token per seam
    assert m.seam_bytes(64, tp=8) == 64 * 32 * 1024 / 8
    assert m.kv_bytes_per_token_per_layer() == 2 * 8 * 128 * 2


def test_poisson_arrivals_first_at_zero_and_rate():
    wl = build_workload(WorkloadConfig(num_prompts=4000, request_rate=10.0), seed=1)
    t = np.array([r.arrival_s for r in wl])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.05)
    gaps = np.diff(t)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.08)  # exponential: CV = 1


def test_burstiness_and_lengths():
    wl = build_workload(
        WorkloadConfig(
            num_prompts=4000, request_rate=10.0, burstiness=4.0, random_input_len=100, random_range_ratio=0.2
        ),
        seed=2,
    )
    gaps = np.diff([r.arrival_s for r in wl])
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(0.5, rel=0.1)  # gamma CV = 1/sqrt(shape)
    ins = [r.prompt_len for r in wl]
    assert min(ins) == 80 and max(ins) == 120


def test_inf_rate_and_same_seed():
    a = build_workload(WorkloadConfig(num_prompts=10, request_rate=float("inf"), random_range_ratio=0.5), seed=3)
    b = build_workload(WorkloadConfig(num_prompts=10, request_rate=float("inf"), random_range_ratio=0.5), seed=3)
    assert a == b and all(r.arrival_s == 0 for r in a)


def test_trace_replay(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0.5,100,10\n0.0,20,3\n")
    reqs = read_trace(str(p))
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in reqs] == [(0.0, 20, 3), (0.5, 100, 10)]
    p.write_text("\ufeffarrival_s,input_tokens,output_tokens,abort_after_s\n0.0,20,3,0.25\n")  # BOM, as Excel writes
    (r,) = read_trace(str(p))
    assert r.abort_after_s == 0.25 and r.abort_after_tokens is None
    p.write_text("arrival,input\n1,2\n")
    with pytest.raises(PPSimError, match="needs a header"):
        read_trace(str(p))
