"""What the engine refuses before it spawns a stage (engine/preflight.py, engine/checkpoint.py): memory the
host or GPU does not have, dtypes the stages do not run, checkpoints of another model. Memory is never
allocated to test it: the host's and the GPU's sizes are monkeypatched."""

from __future__ import annotations

import json
import multiprocessing
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import engine.preflight as pf  # noqa: E402
import ppsim.hostmem as hostmem  # noqa: E402
from engine.checkpoint import check_checkpoint, save_checkpoint  # noqa: E402
from engine.model import build_stage  # noqa: E402
from engine.run import EngineOptions, run_engine  # noqa: E402
from ppsim.cli import main  # noqa: E402
from ppsim.config import build_scenario  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402
from ppsim.models.shape import load_hf_config, load_model  # noqa: E402
from ppsim.units import MIB  # noqa: E402

TINY = {"model": "tiny", "cluster": {"pipeline_parallel_size": 2}, "workload": {"num_prompts": 2}}


def _host_has(monkeypatch, tmp_path, kib: int) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       99999999 kB\nMemFree:           1 kB\nMemAvailable:   {kib} kB\n")
    monkeypatch.setattr(hostmem, "MEMINFO", meminfo)  # read by engine/preflight.py check_memory


def _refused(match: str, options: EngineOptions | None = None, **scenario) -> None:
    with pytest.raises(PPSimError, match=match):
        run_engine(build_scenario(None, {**TINY, **scenario}), options=options)
    assert not multiprocessing.active_children()


def test_weights_beyond_the_host_name_the_model(monkeypatch, tmp_path):
    _host_has(monkeypatch, tmp_path, 1024)
    _refused(r"--model: the weights of tiny take 26.\d MiB, and the host has 1.00 MiB available \(MemAvailable\)")


def test_kv_blocks_beyond_the_host_name_the_flag(monkeypatch, tmp_path):
    _host_has(monkeypatch, tmp_path, 100 * 1024)
    _refused(
        r"--kv-blocks: 10000 KV blocks take 1.22 GiB beside 26.\d MiB of weights, and the host has 100 MiB",
        EngineOptions(kv_num_blocks=10000),
    )
    _host_has(monkeypatch, tmp_path, 27 * 1024)  # the weights fit, the workload's own pool does not
    _refused(r"kv cache: \d+ KV blocks take .*, and the host has 27.0 MiB .*; use fewer/shorter requests or a smaller")


def test_a_large_model_on_a_small_host_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    """``--model llama-2-70b -pp 2``: 257 GiB of float32 weights (drawn in float32, then cast to float16)
    reached a stage that died allocating them, exit 1 after the spawn."""
    _host_has(monkeypatch, tmp_path, 64 * 1024**2)
    argv = ["engine", "--model", "llama-2-70b", "-pp", "2", "--num-prompts", "2", "--output-dir", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model: the weights of llama-2-70b take 257 GiB (drawn in float32)"), err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "gpus, backend, where", [(1, "gloo", r"cuda:0 \(stages \[0, 1\]\)"), (2, "nccl", r"cuda:0 \(stages \[0\]\)")]
)
def test_each_gpu_holds_the_stages_placed_on_it(monkeypatch, gpus, backend, where):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: SimpleNamespace(total_memory=MIB))
    _refused(
        f"--model: the weights of tiny take .*, and {where} has 1.00 MiB; use a smaller model or more GPUs",
        EngineOptions(device="cuda", backend=backend),
    )


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"weight_dtype": "fp8"}, "weight_dtype: the engine runs tiny in its torch_dtype float32 .* not fp8; drop -q"),
        ({"weight_dtype": "bf16"}, "not bfloat16; drop -q/--quantization"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype: the engine runs tiny .* not fp8; drop --kv-cache-dtype"),
        ({"kv_cache_dtype": "fp16"}, "kv_cache_dtype: .* not float16"),
    ],
)
def test_dtypes_the_engine_does_not_run_are_refused(flags, words):
    """They were ignored: the stages ran float32 while config.json recorded fp8."""
    _refused(words, **flags)


def _hf_config(tmp_path, **fields) -> str:
    cfg, _ = load_hf_config("tiny")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **fields}))
    return str(path)


def test_a_quantized_checkpoint_config_is_refused(tmp_path):
    model = _hf_config(tmp_path, quantization_config={"quant_method": "fp8"})
    _refused("weight_dtype: .* not fp8; remove quantization_config from its config.json", model=model)


def test_an_fp8_activation_dtype_is_refused(tmp_path):
    _refused(
        "--model: .*torch_dtype is fp8; the engine computes in float32", model=_hf_config(tmp_path, torch_dtype="fp8")
    )


def test_the_models_own_dtypes_pass():
    pf.check_dtypes(SimpleNamespace(shape=load_model("tiny"), scenario=build_scenario(None, {"model": "tiny"})))


# --- checkpoints: the parent compares every tensor the stages load with the shard headers ---------------------


def _small(name: str, layers: int = 2):
    return load_model(name).model_copy(update={"num_layers": layers})


def _save(tmp_path, shape, drop: str = "") -> str:
    full = build_stage(shape, 0, shape.num_layers, True, True, 0, torch.float32)
    if drop:
        for layer in list(full.model.layers):
            if layer == drop:
                del full.model.layers[layer]
    save_checkpoint(full, tmp_path, {"model_type": "llama"})
    return str(tmp_path)


def test_a_checkpoint_of_another_model_is_named(tmp_path):
    """A tiny-moe checkpoint for tiny failed only inside stage 0 (``lacks tensor ...``), exit 1 after the spawn."""
    ck = _save(tmp_path, _small("tiny-moe"))
    with pytest.raises(PPSimError, match=r"lacks tensor 'model.layers.0.mlp.gate_proj.weight' \(6 of the 21"):
        check_checkpoint(ck, "--checkpoint", _small("tiny"))


def test_a_checkpoint_missing_a_layer_is_named(tmp_path):
    ck = _save(tmp_path, _small("tiny", 3), drop="1")
    with pytest.raises(PPSimError, match="lacks tensor 'model.layers.1.self_attn.q_proj.weight'"):
        check_checkpoint(ck, "--checkpoint", _small("tiny", 3))


def test_a_checkpoint_with_other_widths_is_named(tmp_path):
    ck = _save(tmp_path, _small("tiny").model_copy(update={"intermediate_size": 64}))
    with pytest.raises(PPSimError, match=r"'model.layers.0.mlp.gate_proj.weight' with shape \(64, 256\), tiny needs"):
        check_checkpoint(ck, "--checkpoint", _small("tiny"))


@pytest.mark.parametrize("tied", [False, True])
def test_the_models_own_checkpoint_passes(tmp_path, tied):
    shape = _small("tiny").model_copy(update={"tie_word_embeddings": tied})
    check_checkpoint(_save(tmp_path, shape), "--checkpoint", shape)  # tied: no lm_head.weight in the file


def test_a_wrong_checkpoint_is_refused_before_the_stages_spawn(tmp_path):
    ck = _save(tmp_path, load_model("tiny").model_copy(update={"num_layers": 4}))
    _refused("--checkpoint: .* lacks tensor 'model.layers.4.self_attn.q_proj.weight'", EngineOptions(checkpoint=ck))


def test_a_stage_peaks_at_its_float32_build_or_at_its_weights_and_kv_not_both():
    """A CPU stage of a bf16 model draws float32 weights, casts them, then allocates its KV cache: the peak
    is the larger phase (400 built, or 100 + 100 run), not their sum (500)."""
    opts = SimpleNamespace(device="cpu", kv_num_blocks=None)
    pf._check_fits(None, opts, [(400.0, 100, 100.0)], 450, "the host", "")  # fits: no prep needed to pass
    with pytest.raises(AttributeError):  # past the fit test it reads the prep for its message: refused
        pf._check_fits(None, opts, [(400.0, 100, 100.0)], 399, "the host", "")
