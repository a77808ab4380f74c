"""engine/ model, paged KV and checkpoints, in one process (no stage processes): fast and exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.checkpoint import load_stage_weights, save_checkpoint  # noqa: E402
from engine.kvcache import CUDNN_SDPA_ENV, build_batch, set_attention_backends  # noqa: E402
from engine.model import build_stage, reference_generate  # noqa: E402
from engine.transport import StepItem  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.models.shape import load_hf_config, load_model  # noqa: E402
from tests.engine_paged import paged_generate  # noqa: E402

SHAPE = load_model("tiny")
F32 = torch.float32


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _full(seed: int = 0):
    return build_stage(SHAPE, 0, SHAPE.num_layers, True, True, seed, F32)


def _split(cut: int, seed: int = 0):
    return (
        build_stage(SHAPE, 0, cut, True, False, seed, F32),
        build_stage(SHAPE, cut, SHAPE.num_layers, False, True, seed, F32),
    )


def test_split_keeps_global_names_and_weights():
    full = _full().state_dict()
    a, b = _split(3)
    sa, sb = a.state_dict(), b.state_dict()
    assert "model.layers.3.self_attn.q_proj.weight" in sb and "model.layers.3.mlp.up_proj.weight" not in sa
    assert set(sa) | set(sb) == set(full) and not set(sa) & set(sb)
    for k, v in {**sa, **sb}.items():
        assert torch.equal(v, full[k]), k


@pytest.mark.parametrize("batched", [False, True], ids=["decodes-looped", "decodes-grouped"])
@pytest.mark.parametrize("cut", [None, 3])
def test_paged_chunked_mixed_batches_match_reference(cut, batched):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, SHAPE.vocab_size, (n,), generator=g).tolist() for n in (37, 5, 20, 1)]
    full = _full()
    ref = [reference_generate(full, p, 5) for p in prompts]
    stages = [full] if cut is None else list(_split(cut))
    assert paged_generate(stages, SHAPE, prompts, 5, chunk=16, expect_mixed=True, batched=batched) == ref


def test_build_batch_rejects_short_block_table():
    with pytest.raises(ValueError, match="block table"):
        build_batch((StepItem(0, 0, 9, True, (0, 1)),), 4)


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_round_trip(tmp_path, tied):
    shape = SHAPE.model_copy(update={"tie_word_embeddings": tied})
    full = build_stage(shape, 0, shape.num_layers, True, True, 7, F32)
    cfg, _ = load_hf_config("tiny")
    save_checkpoint(full, tmp_path, {**cfg, "tie_word_embeddings": tied})
    a = build_stage(shape, 0, 5, True, False, 99, F32)  # other seed: every tensor must come from the file
    b = build_stage(shape, 5, shape.num_layers, False, True, 99, F32)
    load_stage_weights(a, tmp_path)
    load_stage_weights(b, tmp_path)
    ref = full.state_dict()
    for k, v in {**a.state_dict(), **b.state_dict()}.items():
        assert torch.equal(v, ref[k]), k
    assert load_model(str(tmp_path)).tie_word_embeddings is tied
    assert sorted(f.name for f in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # no temp files


def test_checkpoint_of_other_model_is_rejected(tmp_path):
    cfg, _ = load_hf_config("tiny")
    save_checkpoint(_full(), tmp_path, cfg)
    bigger = SHAPE.model_copy(update={"num_layers": SHAPE.num_layers + 1})
    m = build_stage(bigger, 0, bigger.num_layers, True, True, 0, F32)
    with pytest.raises(PPSimError, match="lacks tensor 'model.layers.8"):
        load_stage_weights(m, tmp_path)


def test_cuda_attention_stays_off_cudnn_unless_asked(monkeypatch):
    """cuDNN's SDPA plans a graph per new shape (a grouped decode's context grows each step): the CUDA
    engine and calibration turn it off; CPU flags are left alone; PPSIM_SDPA_CUDNN=1 keeps torch's default."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert set_attention_backends("cpu") is True and torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.delenv(CUDNN_SDPA_ENV, raising=False)
        assert set_attention_backends("cuda") is False and not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        monkeypatch.setenv(CUDNN_SDPA_ENV, "1")
        assert set_attention_backends(torch.device("cuda", 0)) is True and torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_warm_up_step_splits_its_tokens_over_requests_as_vllms_dummy_run():
    """``min(tokens, max_num_seqs)`` prefill items of ``tokens // k`` tokens, the last the rest (vLLM's
    ``_dummy_run``), each on blocks of its own, fewer items where their blocks would not fit."""
    from engine.worker import warm_items

    items = warm_items(256, 8, 16, 64)
    assert [it.num_tokens for it in items] == [32] * 8 and all(it.start == 0 and it.samples for it in items)
    assert [it.block_table for it in items[:2]] == [(0, 1), (2, 3)] and len({it.req_id for it in items}) == 8
    assert [it.num_tokens for it in warm_items(100, 3, 16, 64)] == [33, 33, 34]
    assert [it.num_tokens for it in warm_items(4, 32, 16, 64)] == [1, 1, 1, 1]  # never more requests than tokens
    assert len(warm_items(64, 64, 16, 8)) == 8  # 64 one-token items would need 64 blocks: as many as fit
    one = warm_items(256, 1, 16, 64)
    assert len(one) == 1 and one[0].block_table == tuple(range(16))
