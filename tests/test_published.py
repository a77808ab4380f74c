"""Smoke tests of the published-result scripts: they run, write md/csv, and land near the published values."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "experiments" / "published"


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(HERE))
    yield lambda name: importlib.import_module(name)
    sys.path.remove(str(HERE))


def _files(out: Path, name: str) -> None:
    assert (out / f"{name}.csv").read_text().count("\n") > 1
    assert "| " in (out / f"{name}.md").read_text()


def test_bubble_table(scripts, tmp_path):
    rows = scripts("bubble_table").main(["--out", str(tmp_path)])
    assert len(rows) == 15 and max(r["abs_diff"] for r in rows) < 1e-9
    _files(tmp_path, "bubble_table")
    assert (tmp_path / "bubble_table.png").exists()


def test_layer_partition(scripts, tmp_path):
    rows = {r["P"]: r for r in scripts("layer_partition").main(["--out", str(tmp_path)])}
    assert rows[6]["partition"] == "13/13/13/14/14/13"
    assert rows[6]["published_loss"] == pytest.approx(1 - (80 / 6) / 14)
    # 8.3% since the analytic model charges the last stage Vidur's measured sampler (0.6 ms a step)
    assert 0.02 < rows[6]["ppsim_loss"] < 0.09
    _files(tmp_path, "layer_partition")


def test_kv_capacity(scripts, tmp_path):
    rows = {r["layout"]: r for r in scripts("kv_capacity").main(["--out", str(tmp_path)])}
    assert rows["TP=16 PP=1"]["reference_derivation_gain"] == pytest.approx(0.16, abs=0.01)
    assert rows["TP=8 PP=2"]["reference_derivation_gain"] == pytest.approx(1.32, abs=0.01)
    assert rows["TP=16 PP=1"]["ppsim_gain"] == pytest.approx(0.16, abs=0.02)
    assert rows["TP=8 PP=2"]["ppsim_gain"] == pytest.approx(1.32, abs=0.03)
    _files(tmp_path, "kv_capacity")


def test_chunked_prefill(scripts, tmp_path):
    rows = scripts("chunked_prefill_ttft").main(["--out", str(tmp_path)])
    for r in rows:
        for k in r:
            if k.endswith("_speedup") and k != "published_speedup":
                assert 1.0 < r[k] <= r["published_speedup"] * 1.02
                # P=8, S=500: 0.66 of the formula: attention at its measured efficiency (0.22 of peak) makes
                # later chunks, which attend to more cached tokens, much slower than the first
                assert r[k] > 0.6 * r["published_speedup"]
    _files(tmp_path, "chunked_prefill_ttft")


def test_decode_concurrency_quick(scripts, tmp_path):
    rows = scripts("decode_concurrency").main(["--out", str(tmp_path), "--quick"])
    for r in rows:
        b = r["vllm-batch-queue-throttle_bubble"]
        if r["C_over_P"] < 1:
            assert b >= r["bound_1_minus_C_over_P"] - 0.02
        # vLLM's default admits the burst into one micro-batch: never less bubble than the throttled cap
        assert r["vllm-batch-queue_bubble"] >= b - 0.02
    low = [r["vllm-batch-queue-throttle_bubble"] for r in rows if r["C_over_P"] < 1]
    high = [r["vllm-batch-queue-throttle_bubble"] for r in rows if r["C_over_P"] >= 1]
    assert min(low) > max(high)
    _files(tmp_path, "decode_concurrency")
