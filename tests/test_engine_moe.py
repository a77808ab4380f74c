"""The engine's mixture-of-experts model in one process: routing, grouped experts, split stages,
paged batches against the reference forward, and HF-layout checkpoints (no stage processes, no timing)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.checkpoint import load_stage_weights, save_checkpoint  # noqa: E402
from engine.model import build_stage, reference_generate  # noqa: E402
from engine.moe import MoE, grouped_experts, route, zipf_bias  # noqa: E402
from ppsim.models.shape import from_hf_config, load_hf_config, load_model  # noqa: E402
from tests.engine_paged import paged_generate  # noqa: E402

SHAPE = load_model("tiny-moe")
F32 = torch.float32


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_preset_reads_deepseek_moe_fields():
    assert (SHAPE.n_routed_experts, SHAPE.num_experts_per_tok, SHAPE.n_shared_experts) == (8, 2, 1)
    assert SHAPE.moe_intermediate_size == 256 and SHAPE.shared_expert_intermediate_size == 256
    assert SHAPE.num_moe_layers() == SHAPE.num_layers == 8 and SHAPE.attention == "gqa"


def test_grouped_experts_equal_the_per_token_sum():
    g = torch.Generator().manual_seed(0)
    moe = MoE(SHAPE)
    for p in moe.parameters():
        p.data = torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5
    x = torch.randn(13, SHAPE.hidden_size, generator=g)
    ids, w = route(moe.gate(x), moe.router_bias, 2)
    out, touched = grouped_experts(x, ids, w, moe.experts)
    ref = torch.stack([sum(w[t, j] * moe.experts[int(ids[t, j])](x[t]) for j in range(2)) for t in range(13)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert touched == len(set(ids.reshape(-1).tolist()))
    torch.testing.assert_close(moe(x), ref + moe.shared_experts(x), rtol=1e-5, atol=1e-5)


def test_router_picks_k_distinct_experts_and_zipf_skews_the_load():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 8, generator=g)
    for s in (0.0, 1.5):
        ids, w = route(logits, zipf_bias(8, s), 2)
        assert (ids[:, 0] != ids[:, 1]).all() and (w[:, 0] >= w[:, 1]).all()
        load = torch.bincount(ids.reshape(-1), minlength=8)
        if s == 0:
            assert load.max() < 1.25 * load.min()
        else:
            assert load[0] > 4 * load[7] and (load[:-1] >= load[1:]).all()


def test_split_keeps_global_names_and_weights():
    full = build_stage(SHAPE, 0, 8, True, True, 0, F32).state_dict()
    a, b = build_stage(SHAPE, 0, 3, True, False, 0, F32), build_stage(SHAPE, 3, 8, False, True, 0, F32)
    sa, sb = a.state_dict(), b.state_dict()
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in sb and "model.layers.0.mlp.gate.weight" in sa
    assert "model.layers.0.mlp.shared_experts.up_proj.weight" in sa
    assert not any("router_bias" in k for k in full)  # the skew knob is not a checkpoint tensor
    assert set(sa) | set(sb) == set(full) and not set(sa) & set(sb)
    for k, v in {**sa, **sb}.items():
        assert torch.equal(v, full[k]), k


@pytest.mark.parametrize("zipf", [0.0, 1.0])
def test_pp2_paged_batches_match_reference(zipf):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, SHAPE.vocab_size, (n,), generator=g).tolist() for n in (37, 5, 20, 1)]
    full = build_stage(SHAPE, 0, 8, True, True, 0, F32, router_zipf=zipf)
    ref = [reference_generate(full, p, 5) for p in prompts]
    stages = [
        build_stage(SHAPE, 0, 4, True, False, 0, F32, router_zipf=zipf),
        build_stage(SHAPE, 4, 8, False, True, 0, F32, router_zipf=zipf),
    ]
    assert paged_generate(stages, SHAPE, prompts, 5, chunk=16) == ref
    assert set(stages[1].experts_touched()) == {4, 5, 6, 7}


def test_checkpoint_round_trip_with_dense_first_layer(tmp_path):
    """A 3-layer DeepSeek-MoE checkpoint whose first layer is dense (``first_k_dense_replace``)."""
    cfg, _ = load_hf_config("tiny-moe")
    cfg = {**cfg, "num_hidden_layers": 3, "first_k_dense_replace": 1}
    shape = from_hf_config(cfg, "moe3")
    assert [shape.layer_is_moe(i) for i in range(3)] == [False, True, True]
    full = build_stage(shape, 0, 3, True, True, 7, F32)
    save_checkpoint(full, tmp_path, cfg)
    a = build_stage(shape, 0, 2, True, False, 99, F32)  # other seed: every tensor must come from the file
    b = build_stage(shape, 2, 3, False, True, 99, F32)
    load_stage_weights(a, tmp_path)
    load_stage_weights(b, tmp_path)
    ref = full.state_dict()
    assert "model.layers.0.mlp.up_proj.weight" in ref and "model.layers.1.mlp.experts.3.up_proj.weight" in ref
    for k, v in {**a.state_dict(), **b.state_dict()}.items():
        assert torch.equal(v, ref[k]), k
    assert load_model(str(tmp_path)).num_moe_layers() == 2
    prompt = [5, 9, 200, 31]
    assert paged_generate([a, b], SHAPE, [prompt], 3, chunk=4) == [reference_generate(full, prompt, 3)]
