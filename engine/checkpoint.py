"""Safetensors checkpoints in the HF layout: ``config.json`` + ``model.safetensors`` (or shards
listed in ``model.safetensors.index.json``), keys ``model.embed_tokens.weight``,
``model.layers.N.self_attn.q_proj.weight``, ..., ``model.norm.weight``, ``lm_head.weight``.

A stage reads only the tensors it owns (its global layer indices are in its parameter names),
like vLLM's loader skipping ``PPMissingLayer`` weights. A tied ``lm_head`` is read from
``model.embed_tokens.weight`` when the checkpoint has no ``lm_head.weight``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.model import StageModel
from ppsim.errors import PPSimError
from ppsim.metrics.io import atomic_write

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def has_checkpoint(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / INDEX).is_file() or (p / SINGLE).is_file())


def save_checkpoint(model: StageModel, out_dir: str | Path, hf_config: dict) -> Path:
    """Write a whole model (one stage holding every layer) as an HF-layout checkpoint."""
    if not (model.is_first and model.is_last):
        raise ValueError("save_checkpoint needs a model holding every layer")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.shape.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / SINGLE), metadata={"format": "pt"})
    atomic_write(out / "config.json", json.dumps(hf_config, indent=2) + "\n")
    return out


def _key_files(ckpt: Path) -> dict[str, Path]:
    if (ckpt / INDEX).is_file():
        weight_map = json.loads((ckpt / INDEX).read_text())["weight_map"]
        return {k: ckpt / f for k, f in weight_map.items()}
    if (ckpt / SINGLE).is_file():
        with safe_open(str(ckpt / SINGLE), framework="pt") as f:
            return {k: ckpt / SINGLE for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    raise PPSimError(f"checkpoint: {ckpt} has neither {SINGLE} nor {INDEX}")


@torch.no_grad()
def load_stage_weights(model: StageModel, ckpt_dir: str | Path) -> None:
    """Copy this stage's tensors from the checkpoint; every parameter of the stage must be found."""
    ckpt = Path(ckpt_dir)
    files = _key_files(ckpt)
    params = dict(model.named_parameters())
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name in params:
        key = name
        if key not in files and name == "lm_head.weight" and model.shape.tie_word_embeddings:
            key = "model.embed_tokens.weight"
        if key not in files:
            raise PPSimError(f"checkpoint: {ckpt} lacks tensor {key!r}; is it a checkpoint of this model?")
        by_file.setdefault(files[key], []).append((name, key))
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name, key in names:
                t = f.get_tensor(key)
                p = params[name]
                if tuple(t.shape) != tuple(p.shape):
                    raise PPSimError(f"checkpoint: {key} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}")
                p.copy_(t.to(dtype=p.dtype, device=p.device))
