"""Storage formats of weights and of the KV cache, and their bytes per element.

Weights: ``float32``, ``bfloat16``, ``float16``, ``fp8``, ``fp4``. Quantized formats carry scales:

- ``fp8``: DeepSeek-V3's block format (``quantization_config.weight_block_size: [128, 128]``),
  one fp32 scale per 128 x 128 block: 1 + 4 / 16384 bytes per weight. vLLM's dynamic per-tensor
  FP8 (``--quantization fp8``) has even less overhead; the difference is below 0.03 %.
- ``fp4``: NVFP4 (ModelOpt ``modelopt_fp4``, e.g. ``nvidia/DeepSeek-R1-FP4``): 16 e2m1 values share
  one fp8 (e4m3) scale, plus one fp32 scale per tensor: 0.5 + 1 / 16 bytes per weight.

Only the linear layers inside decoder layers are quantized (attention projections, dense MLP,
routed and shared experts). The embedding, lm_head, norms and the MoE router stay in the
activation dtype, as in the DeepSeek FP8 checkpoint and vLLM's ``Fp8LinearMethod`` /
``ModelOptNvFp4Config`` (which skip ``lm_head`` and the ``gate``).

KV cache: ``bfloat16`` / ``float16`` / ``float32`` or ``fp8`` (vLLM ``--kv-cache-dtype fp8``,
one byte per element, per-tensor scale).

A checkpoint's ``quantization_config`` in another format (AWQ, GPTQ, bitsandbytes, integer
compressed-tensors, ...) is refused rather than simulated as 16-bit weights.
"""

from __future__ import annotations

from typing import Literal

from ppsim.errors import PPSimError
from ppsim.fileio import short_repr
from ppsim.models.hf_fields import HfFieldError

WeightDtype = Literal["float32", "bfloat16", "float16", "fp8", "fp4"]
KvDtype = Literal["float32", "bfloat16", "float16", "fp8"]

FP8_BLOCK = 128 * 128  # weights per fp32 scale (DeepSeek-V3 weight_block_size [128, 128])
NVFP4_GROUP = 16  # weights per fp8 scale (NVFP4)

WEIGHT_BYTES: dict[str, float] = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0 + 4.0 / FP8_BLOCK,
    "fp4": 0.5 + 1.0 / NVFP4_GROUP,
}

KV_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}

# Names users and HF configs use -> canonical names (vLLM --dtype / --quantization / --kv-cache-dtype).
_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
    "nvfp4": "fp4",
    "modelopt_fp4": "fp4",
    "fp4": "fp4",
}


def canonical_dtype(name: str) -> str:
    """The canonical name of a dtype alias (``bf16`` -> ``bfloat16``, ``modelopt_fp4`` -> ``fp4``)."""
    key = str(name).strip().lower()
    return _ALIASES.get(key, key)


def weight_dtype(name: str, field: str = "weight_dtype") -> str:
    d = canonical_dtype(name)
    if d not in WEIGHT_BYTES:
        raise PPSimError(f"{field}: unknown weight dtype {name!r}; use bf16, fp16, fp32, fp8 or fp4")
    return d


def kv_dtype(name: str, field: str = "kv_cache_dtype") -> str:
    d = canonical_dtype(name)
    if d not in KV_BYTES:
        raise PPSimError(f"{field}: unknown KV cache dtype {name!r}; use auto, bf16, fp16 or fp8")
    return d


QUANT_FORMATS = "fp8 (quant_method fp8, ModelOpt FP8, FP8 compressed-tensors) and fp4 (ModelOpt NVFP4, MXFP4)"


def _compressed_tensors_dtype(q: dict) -> str | None:
    """fp8 / fp4 for compressed-tensors checkpoints whose every weight group is float8 / float4, else None."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    kinds: set[str] = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, dict) else None
        kinds.add(f"{w.get('type')}{w.get('num_bits')}" if isinstance(w, dict) else "?")
    return {"float8": "fp8", "float4": "fp4"}.get(kinds.pop()) if len(kinds) == 1 else None


def checkpoint_weight_dtype(cfg: dict, act_dtype: str) -> str:
    """The weight format a HF checkpoint ships in: its ``quantization_config`` if any, else ``torch_dtype``.

    Raises :class:`HfFieldError` for a quantization format ppsim does not model."""
    q = cfg.get("quantization_config")
    if q is None or q == {}:
        return act_dtype if act_dtype in WEIGHT_BYTES else "bfloat16"
    if not isinstance(q, dict):
        raise HfFieldError(f"quantization_config = {short_repr(q)} is not a table")
    tags = " ".join(str(q.get(k, "")) for k in ("quant_method", "quant_algo", "fmt")).lower()
    if "fp4" in tags:
        return "fp4"
    if "fp8" in tags or "e4m3" in tags:
        return "fp8"
    found = _compressed_tensors_dtype(q) if q.get("quant_method") == "compressed-tensors" else None
    if found:
        return found
    method = short_repr(q.get("quant_method", q.get("quant_algo")))
    bits = f" {short_repr(q['bits'])}-bit" if "bits" in q else ""
    raise HfFieldError(
        f"quantization_config: quant_method {method}{bits} is not a format ppsim models; it models "
        f"{QUANT_FORMATS}: remove quantization_config and pass -q/--quantization with the closest weight dtype"
    )
