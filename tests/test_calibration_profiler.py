"""The operator profiler's tasks: operators that read weights (and attention, which reads each layer's
KV) are timed over a stack of distinct layers and reported per layer; the token grid covers every count
up to 16. Closures run on the engine's code; no timing is asserted."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibration.layer import Layer  # noqa: E402
from calibration.profile_ops import OpProfiler  # noqa: E402
from calibration.timer import Timer  # noqa: E402
from ppsim.models.shape import load_model  # noqa: E402

SHAPE = load_model("tiny")


def test_weight_operators_and_attention_run_on_every_layer_of_the_stack():
    """GEMMs, lm_head and attention are timed over the stack's distinct layers in turn (an engine stage
    reads each layer's weights and KV once per step; one layer repeated ran from the CPU's caches) and
    reported per layer; elementwise operators run on one layer."""
    from calibration.profile_ops import FULL, STACKED_OPS

    layer = Layer(SHAPE, "float32", "cpu")
    prof = OpProfiler(layer, Timer("cpu", clock="wall", repeats=1, warmup=0, min_repeat_s=0.0), stack=3)
    tasks = prof.tasks(FULL)
    by_op = {t.op: t.layers for t in tasks}
    assert {op: by_op[op] for op in (*STACKED_OPS, "lm_head", "attn_decode", "attn_prefill")} == dict.fromkeys(
        (*STACKED_OPS, "lm_head", "attn_decode", "attn_prefill"), 3
    )
    assert by_op["input_layernorm"] == by_op["mlp_act"] == by_op["sampling"] == 1
    with torch.inference_mode():
        gemm = next(t for t in tasks if t.op == "mlp_gate_up" and t.feats["tokens"] == 3).make()()
        attn = next(t for t in tasks if t.op == "attn_decode").make()()
    assert len(gemm) == len(attn) == 3  # one result per layer
    assert not torch.equal(gemm[0][0], gemm[1][0])  # each layer its own weights
    tokens = {t.feats["tokens"] for t in tasks if t.op == "mlp_down" and t.split == "fit"}
    assert set(range(1, 17)) <= tokens


def test_a_stacked_task_reports_time_per_layer(monkeypatch):
    from calibration import profile_ops

    layer = Layer(SHAPE, "float32", "cpu")
    prof = OpProfiler(layer, Timer("cpu", clock="wall", repeats=2, warmup=0, min_repeat_s=0.0), stack=2)
    monkeypatch.setattr(prof.timer.__class__, "samples", lambda self, fn: ([0.004, 0.006], 1))
    all_tasks = prof.tasks(profile_ops.QUICK)
    tasks = [next(t for t in all_tasks if t.op == op) for op in ("mlp_down", "mlp_act")]
    rows = prof.run(tasks, lambda *a: None)
    per = {r["op"]: r["mean_s"] for r in rows}
    assert per == {"mlp_down": pytest.approx(0.0025), "mlp_act": pytest.approx(0.005)}
