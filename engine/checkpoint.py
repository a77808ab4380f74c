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
from ppsim.models.shape import ModelShape

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


def _read_index(ckpt: Path, flag: str) -> dict[str, Path]:
    """Tensor name -> shard file of ``model.safetensors.index.json``; damage is one PPSimError."""
    where = f"{flag}: {ckpt / INDEX}"
    try:
        data = json.loads((ckpt / INDEX).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise PPSimError(f"{where}: not UTF-8 text (byte {err.start}); re-download the checkpoint") from None
    except (OSError, ValueError) as err:
        raise PPSimError(f"{where}: unreadable ({err}); re-download the checkpoint") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise PPSimError(f"{where}: no weight_map table of tensor name -> shard file; re-download the checkpoint")
    out = {}
    for k, f in weight_map.items():
        if not isinstance(f, str) or not f or Path(f).is_absolute() or ".." in Path(f).parts:
            raise PPSimError(f"{where}: tensor {k!r:.80} maps to {f!r:.80}, not a shard file name in {ckpt}")
        out[k] = ckpt / f
    return out


def _shard_header(shard: Path, flag: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a safetensors file's header (the tensors themselves are not read)."""
    if not shard.is_file():
        raise PPSimError(f"{flag}: {shard} is missing; re-download the checkpoint")
    try:
        with safe_open(str(shard), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - no __iter__
    except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: any unreadable header
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PPSimError(
            f"{flag}: {shard} is not a readable safetensors file ({why:.120}); re-download or re-save the checkpoint"
        ) from None


def check_checkpoint(ckpt_dir: str | Path, flag: str = "--checkpoint", shape: ModelShape | None = None) -> None:
    """Read the index and every shard's header in the parent, before any stage is spawned, so a damaged
    checkpoint, or one of another model (``shape``: every tensor the stages load, by name and shape), is
    one line naming the file or the tensor (exit 2), not a stage dying on it."""
    ckpt = Path(ckpt_dir)
    held: dict[str, tuple[int, ...]] = {}
    if (ckpt / INDEX).is_file():
        files = _read_index(ckpt, flag)
        for shard in sorted(set(files.values())):
            header = _shard_header(shard, flag)
            lost = next((k for k, f in files.items() if f == shard and k not in header), None)
            if lost is not None:
                raise PPSimError(
                    f"{flag}: {INDEX} puts tensor {lost!r:.80} in {shard.name}, which does not hold it; "
                    "re-download the checkpoint"
                )
            held.update({k: s for k, s in header.items() if files.get(k) == shard})
    elif (ckpt / SINGLE).is_file():
        held = _shard_header(ckpt / SINGLE, flag)
        if not held:
            raise PPSimError(f"{flag}: {ckpt / SINGLE} holds no tensors; re-save the checkpoint")
    else:
        raise PPSimError(f"{flag}: {ckpt} has neither {SINGLE} nor {INDEX}")
    if shape is not None:
        need = model_tensors(shape)
        if shape.tie_word_embeddings and "lm_head.weight" not in held:
            need.pop("lm_head.weight", None)  # read from model.embed_tokens.weight
        _check_tensors(held, need, ckpt, flag, shape.name, shape.name)


def model_tensors(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the whole model as its stages build it (on the meta device: no memory)."""
    with torch.device("meta"):
        m = StageModel(shape, 0, shape.num_layers, True, True)
    return {k: tuple(p.shape) for k, p in m.named_parameters()}


def _check_tensors(
    held: dict[str, tuple[int, ...]], need: dict[str, tuple[int, ...]], ckpt: Path, flag: str, model: str, who: str
) -> None:
    """Every tensor of ``need`` (checkpoint key -> shape) is in ``held`` with its shape; the first one that is
    not is named, in ``need``'s order. The one check of the parent (:func:`check_checkpoint`: ``who`` is the
    whole ``model``) and of each stage (:func:`load_stage_weights`: ``who`` is the stage)."""
    missing = [k for k in need if k not in held]
    for k, dims in need.items():
        if k not in held:
            raise PPSimError(
                f"{flag}: {ckpt} lacks tensor {k!r} ({len(missing)} of the {len(need)} that {who} loads are "
                f"missing); is it a checkpoint of {model}?"
            )
        if held[k] != dims:
            raise PPSimError(
                f"{flag}: {ckpt} holds tensor {k!r} with shape {held[k]}, {who} needs {dims}; is it a "
                f"checkpoint of {model}?"
            )


def _key_files(ckpt: Path) -> dict[str, Path]:
    if (ckpt / INDEX).is_file():
        return _read_index(ckpt, "checkpoint")  # the index as the parent checked it
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
    keys: dict[str, str] = {}  # parameter name -> checkpoint key
    for name in params:
        tied = name == "lm_head.weight" and model.shape.tie_word_embeddings and name not in files
        keys[name] = "model.embed_tokens.weight" if tied else name
    need = {keys[name]: tuple(p.shape) for name, p in params.items()}
    held: dict[str, tuple[int, ...]] = {}
    for shard in sorted({files[k] for k in need if k in files}):  # the headers of this stage's shards only
        held.update({k: s for k, s in _shard_header(shard, "checkpoint").items() if files.get(k) == shard})
    who = f"the stage of layers {model.start}-{model.end - 1}"
    _check_tensors(held, need, ckpt, "checkpoint", model.shape.name, who)
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name, key in keys.items():
        by_file.setdefault(files[key], []).append((name, key))
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as f:
            for name, key in names:
                p = params[name]
                p.copy_(f.get_tensor(key).to(dtype=p.dtype, device=p.device))
