"""A Llama-style dense decoder described by the fields of its HF ``config.json``.

Numbers are facts: presets are the models' published ``config.json`` files, shipped in
``ppsim/models/presets``. All sizes are per model (not per GPU); tensor parallelism divides them
in :mod:`ppsim.models.ops` and :mod:`ppsim.cost`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ppsim.errors import PPSimError

PRESET_DIR = Path(__file__).parent / "presets"

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}


class ModelShape(BaseModel):
    """The shape of a decoder-only transformer; every count is for the whole model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    dtype: str = "bfloat16"
    dtype_bytes: int = Field(default=2, gt=0)
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    # --- sizes -------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer: QKV, O, gate/up/down, two RMSNorm weights."""
        h, i = self.hidden_size, self.intermediate_size
        qkv = h * (self.q_dim + 2 * self.kv_dim) + (self.q_dim + 2 * self.kv_dim) * self.attention_bias
        return qkv + self.q_dim * h + 3 * h * i + 2 * h

    def layer_weight_bytes(self) -> int:
        return self.layer_params() * self.dtype_bytes

    def embedding_bytes(self) -> int:
        return self.vocab_size * self.hidden_size * self.dtype_bytes

    def lm_head_bytes(self) -> int:
        """lm_head plus the final norm (a tied lm_head still occupies the last stage's memory)."""
        return (self.vocab_size + 1) * self.hidden_size * self.dtype_bytes

    def total_weight_bytes(self) -> int:
        return self.num_layers * self.layer_weight_bytes() + self.embedding_bytes() + self.lm_head_bytes()

    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V of one token in one layer, all KV heads."""
        return 2 * self.kv_dim * self.dtype_bytes

    def seam_bytes(self, num_tokens: int, tp: int = 1) -> float:
        """hidden_states + residual crossing a stage boundary: 2 x tokens x hidden x dtype bytes.

        Both vLLM and SGLang shard the seam tensor across the TP group (each rank sends 1/tp and
        the receiver all-gathers), so the bytes on one rank's wire are divided by ``tp``.
        """
        return 2 * num_tokens * self.hidden_size * self.dtype_bytes / tp


def from_hf_config(cfg: dict, name: str) -> ModelShape:
    """Read the fields ppsim needs from a HF ``config.json`` dict."""
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return ModelShape(
            name=name,
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            dtype=dtype,
            dtype_bytes=DTYPE_BYTES.get(dtype, 2),
            attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
        )
    except KeyError as err:
        raise PPSimError(f"model config {name}: missing field {err.args[0]!r} in config.json") from None
    except (TypeError, ValueError) as err:
        first = str(err).splitlines()[0]
        raise PPSimError(f"model config {name}: bad value ({first}); fix config.json") from None


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_hf_config(model: str) -> tuple[dict, str]:
    """The raw ``config.json`` dict of a preset name, a ``config.json`` path or a directory holding one."""
    preset = PRESET_DIR / f"{model}.json"
    path = preset if preset.is_file() else Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PPSimError(
            f"model: unknown preset or missing file {model!r}; use one of {', '.join(list_presets())} "
            "or a path to a HF config.json"
        )
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PPSimError(f"model: cannot read {path}: {err}") from None
    if not isinstance(cfg, dict):
        raise PPSimError(f"model: {path} is not a JSON object")
    return cfg, (model if path == preset else path.parent.name or str(path))


def load_model(model: str) -> ModelShape:
    """A preset name (``llama-3-8b``), a ``config.json`` path or a directory holding one."""
    cfg, name = load_hf_config(model)
    return from_hf_config(cfg, name)
