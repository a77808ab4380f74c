"""A decoder-only transformer described by the fields of its HF ``config.json``.

Numbers are facts: presets are the models' published ``config.json`` files, shipped in
``ppsim/models/presets``. All sizes are per model (not per GPU); tensor parallelism divides them
in :mod:`ppsim.cost.layers`.

Layers are dense (Llama: attention + gated MLP) or mixture-of-experts (attention + router +
``n_routed_experts`` experts of ``moe_intermediate_size``, of which ``num_experts_per_tok`` run per
token, plus optional always-on shared experts); a model may start with dense layers
(DeepSeek ``first_k_dense_replace``). Attention is MHA, GQA or DeepSeek's multi-head latent
attention (MLA), whose KV cache is one ``kv_lora_rank + qk_rope_head_dim`` latent per token.
Weights and KV cache have their own storage dtypes (:mod:`ppsim.models.dtypes`); ``dtype`` is the
activation dtype (``torch_dtype``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ppsim.config import MAX_TOKENS
from ppsim.errors import PPSimError
from ppsim.fileio import loads_json, os_error, read_text, short_repr
from ppsim.models.dtypes import (
    KV_BYTES,
    WEIGHT_BYTES,
    KvDtype,
    WeightDtype,
    canonical_dtype,
    checkpoint_weight_dtype,
)
from ppsim.models.dtypes import kv_dtype as canonical_kv_dtype
from ppsim.models.dtypes import weight_dtype as canonical_weight_dtype
from ppsim.models.hf_fields import (
    MAX_LAYERS,
    HfFieldError,
    hf_bool,
    hf_float,
    hf_int,
    hf_num_layers,
    mla_fields,
    moe_fields,
)

PRESET_DIR = Path(__file__).parent / "presets"

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}

# Upper bounds on a shape's counts, far beyond any published model (widths: Llama-3-405B's MLP is 53,248 wide;
# vocabularies: Gemma's 262,144; heads: 128; experts: Kimi-K2's 384), so that a typo of a few digits is one
# line naming the field instead of a float overflow deep in the cost model. Sequence length: MAX_TOKENS.
MAX_WIDTH = 2**20  # hidden, MLP, expert, head and latent dimensions
MAX_VOCAB = 2**24
MAX_HEADS = 2**14  # query and KV heads
MAX_EXPERTS = 2**16  # routed (and shared) experts per MoE layer


class ModelShape(BaseModel):
    """The shape of a decoder-only transformer; every count is for the whole model."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    hidden_size: int = Field(gt=0, le=MAX_WIDTH)
    intermediate_size: int = Field(gt=0, le=MAX_WIDTH, description="dense MLP width (dense layers)")
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    num_heads: int = Field(gt=0, le=MAX_HEADS)
    num_kv_heads: int = Field(gt=0, le=MAX_HEADS, description="KV heads; 1 for MLA (one latent per token)")
    head_dim: int = Field(gt=0, le=MAX_WIDTH, description="query/key head dim; MLA: qk_nope + qk_rope head dims")
    vocab_size: int = Field(gt=0, le=MAX_VOCAB)
    max_position_embeddings: int = Field(gt=0, le=MAX_TOKENS, description="the default --max-model-len")
    dtype: str = "bfloat16"
    dtype_bytes: int = Field(default=2, gt=0, description="activation bytes per element")
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    rms_norm_eps: float = Field(default=1e-5, gt=0, lt=1)
    rope_theta: float = Field(default=10000.0, gt=0)
    # --- attention kind; MLA dims (DeepSeek) ------------------------------------------------------
    attention: Literal["mha", "gqa", "mla"] | None = None  # None: mha if kv heads == heads, else gqa
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    q_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    kv_lora_rank: int = Field(default=0, ge=0, le=MAX_WIDTH)
    qk_nope_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH)
    qk_rope_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH)
    v_head_dim: int = Field(default=0, ge=0, le=MAX_WIDTH)
    # --- mixture of experts (0 experts: a dense model) ----------------------------------------------
    n_routed_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    num_experts_per_tok: int = Field(default=0, ge=0, description="top-k")
    n_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    moe_intermediate_size: int = Field(default=0, ge=0, le=MAX_WIDTH, description="width of one routed expert")
    shared_expert_intermediate_size: int = Field(
        default=0, ge=0, le=MAX_WIDTH, description="all shared experts together"
    )
    first_k_dense_replace: int = Field(
        default=0, ge=0, le=MAX_LAYERS, description="dense layers before the first MoE layer"
    )
    moe_layer_freq: int = Field(default=1, ge=1, le=MAX_LAYERS)
    mlp_only_layers: tuple[int, ...] = ()  # further dense layers (Qwen-MoE)
    # --- storage dtypes (None: the activation dtype) ------------------------------------------------
    weight_dtype: WeightDtype | None = None
    kv_cache_dtype: KvDtype | None = None

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        act = canonical_dtype(str(data.get("dtype", "bfloat16")))
        act = act if act in KV_BYTES else "bfloat16"
        if data.get("weight_dtype") is None:
            data["weight_dtype"] = act
        if data.get("kv_cache_dtype") is None:
            data["kv_cache_dtype"] = act
        if data.get("attention") is None:
            mla = bool(data.get("kv_lora_rank"))
            same = data.get("num_kv_heads") == data.get("num_heads")
            data["attention"] = "mla" if mla else ("mha" if same else "gqa")
        return data

    @model_validator(mode="after")
    def _check(self) -> ModelShape:
        name = self.name
        if self.attention == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim and self.v_head_dim):
            raise ValueError(f"model {name}: MLA needs kv_lora_rank, qk_rope_head_dim and v_head_dim")
        if self.attention != "mla" and self.num_heads % self.num_kv_heads:
            # GQA shares each KV head among num_heads / num_kv_heads query heads (HF num_key_value_groups)
            raise ValueError(
                f"model {name}: num_key_value_heads {self.num_kv_heads} must divide "
                f"num_attention_heads {self.num_heads}"
            )
        if self.n_routed_experts:
            if not 0 < self.num_experts_per_tok <= self.n_routed_experts or not self.moe_intermediate_size:
                raise ValueError(
                    f"model {name}: MoE needs 0 < num_experts_per_tok <= n_routed_experts and moe_intermediate_size"
                )
        return self

    # --- sizes -------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Cached K (or latent) width per token per layer: MLA ``kv_lora_rank + qk_rope_head_dim``."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per quantizable (linear-layer) weight, scales included."""
        return WEIGHT_BYTES[self.weight_dtype or "bfloat16"]

    @property
    def kv_dtype_bytes(self) -> int:
        return KV_BYTES[self.kv_cache_dtype or "bfloat16"]

    def with_dtypes(self, weight_dtype: str | None = None, kv_cache_dtype: str | None = None) -> ModelShape:
        """This shape with other storage dtypes (``None`` keeps the current one)."""
        upd: dict[str, str] = {}
        if weight_dtype is not None:
            upd["weight_dtype"] = canonical_weight_dtype(weight_dtype)
        if kv_cache_dtype is not None:
            upd["kv_cache_dtype"] = canonical_kv_dtype(kv_cache_dtype)
        return self.model_validate({**self.model_dump(), **upd}) if upd else self

    def layer_is_moe(self, layer: int) -> bool:
        """Whether global layer ``layer`` has routed experts (vLLM's per-family rule)."""
        return (
            self.n_routed_experts > 0
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
            and layer not in self.mlp_only_layers
        )

    def num_moe_layers(self, start: int = 0, end: int | None = None) -> int:
        """MoE layers among global layers [start, end)."""
        end = self.num_layers if end is None else end
        return sum(self.layer_is_moe(i) for i in range(start, end))

    # --- parameters per component ----------------------------------------------------------------
    def attention_linear_params(self) -> int:
        """Projection weights of one attention block (quantizable)."""
        h = self.hidden_size
        if self.attention == "mla":
            H, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
            qh = H * (nope + rope)
            q = h * self.q_lora_rank + self.q_lora_rank * qh if self.q_lora_rank else h * qh
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank * H * (nope + self.v_head_dim)
            return q + kv + H * self.v_head_dim * h
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    def attention_other_params(self) -> int:
        """Biases and norms inside attention (kept in the activation dtype)."""
        if self.attention == "mla":
            return (self.q_lora_rank or 0) + self.kv_lora_rank
        return (self.q_dim + 2 * self.kv_dim) * self.attention_bias + 2 * self.head_dim * self.qk_norm

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def shared_expert_params(self) -> int:
        return 3 * self.hidden_size * self.shared_expert_intermediate_size

    def router_params(self) -> int:
        return self.n_routed_experts * self.hidden_size

    def _layer_counts(self, layer: int | None) -> tuple[int, int]:
        """(quantizable, other) parameters of one layer; ``None``: the heaviest layer kind."""
        moe = self.is_moe if layer is None else self.layer_is_moe(layer)
        lin = self.attention_linear_params()
        other = self.attention_other_params() + 2 * self.hidden_size  # two RMSNorm weights
        if moe:
            lin += self.n_routed_experts * self.expert_params() + self.shared_expert_params()
            other += self.router_params()
        else:
            lin += self.dense_mlp_params()
        return lin, other

    def layer_params(self, layer: int | None = None) -> int:
        """Parameters of one decoder layer (all experts); ``None``: the heaviest layer kind."""
        lin, other = self._layer_counts(layer)
        return lin + other

    def layer_active_params(self, layer: int | None = None) -> int:
        """Parameters one token uses in a layer: attention, router, shared and top-k experts."""
        if not (self.is_moe if layer is None else self.layer_is_moe(layer)):
            return self.layer_params(layer)
        return self.layer_params(layer) - (self.n_routed_experts - self.num_experts_per_tok) * self.expert_params()

    def layer_weight_bytes(self, layer: int | None = None) -> float:
        """Bytes of one layer's weights (quantized linear layers, the rest in the activation dtype)."""
        lin, other = self._layer_counts(layer)
        wb = self.weight_bytes_per_param
        if wb == self.dtype_bytes:
            return (lin + other) * self.dtype_bytes
        return lin * wb + other * self.dtype_bytes

    def embedding_bytes(self) -> int:
        return self.vocab_size * self.hidden_size * self.dtype_bytes

    def lm_head_bytes(self) -> int:
        """lm_head plus the final norm (a tied lm_head still occupies the last stage's memory)."""
        return (self.vocab_size + 1) * self.hidden_size * self.dtype_bytes

    def total_params(self) -> int:
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return layers + (2 * self.vocab_size + 1) * self.hidden_size

    def active_params(self) -> int:
        layers = sum(self.layer_active_params(i) for i in range(self.num_layers))
        return layers + (2 * self.vocab_size + 1) * self.hidden_size

    def total_weight_bytes(self) -> float:
        if not self.is_moe and self.weight_bytes_per_param == self.dtype_bytes:
            return self.num_layers * self.layer_weight_bytes() + self.embedding_bytes() + self.lm_head_bytes()
        layers = sum(self.layer_weight_bytes(i) for i in range(self.num_layers))
        return layers + self.embedding_bytes() + self.lm_head_bytes()

    def kv_bytes_per_token_per_layer(self) -> int:
        """KV cache of one token in one layer: K and V of all KV heads, or MLA's one latent."""
        if self.attention == "mla":
            return self.kv_dim * self.kv_dtype_bytes
        return 2 * self.kv_dim * self.kv_dtype_bytes

    def seam_bytes(self, num_tokens: int, tp: int = 1) -> float:
        """hidden_states + residual crossing a stage boundary: 2 x tokens x hidden x dtype bytes.

        Both vLLM and SGLang shard the seam tensor across the TP group (each rank sends 1/tp and
        the receiver all-gathers), so the bytes on one rank's wire are divided by ``tp``.
        """
        return 2 * num_tokens * self.hidden_size * self.dtype_bytes / tp


# ModelShape field -> its name in a HF config.json, for error messages
HF_NAMES = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "dtype": "torch_dtype",
}


def _act_dtype(cfg: dict) -> str:
    """The activation dtype's canonical name, from ``torch_dtype`` (or the newer ``dtype``); default bfloat16."""
    key = "torch_dtype" if cfg.get("torch_dtype") is not None else "dtype"
    raw = cfg.get(key)
    if raw is None:
        return "bfloat16"
    d = canonical_dtype(raw) if isinstance(raw, str) else ""
    if d not in DTYPE_BYTES:
        raise HfFieldError(
            f"{key} = {short_repr(raw)} is not an activation dtype ppsim models; use float32, float16 or "
            "bfloat16 (a quantized checkpoint states its weight format in quantization_config)"
        )
    return d


def _heads(cfg: dict, hidden: int) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim); an absent KV head count is MHA, an absent head dim hidden / heads."""
    heads = hf_int(cfg, "num_attention_heads")
    if heads < 1:
        raise HfFieldError(f"num_attention_heads = {heads} must be >= 1")
    kv = hf_int(cfg, "num_key_value_heads", heads)
    # HF's default head_dim hidden_size // heads would drop the rest (MLA sets its own head dims)
    if cfg.get("head_dim") is None and not cfg.get("kv_lora_rank") and hidden % heads:
        raise HfFieldError(
            f"hidden_size = {hidden} is not divisible by num_attention_heads = {heads}; "
            "give head_dim, or a hidden_size that divides evenly"
        )
    head_dim = hf_int(cfg, "head_dim", hidden // heads)
    return heads, kv, head_dim


def _hf_fields(cfg: dict, name: str) -> dict[str, Any]:
    """The :class:`ModelShape` fields of a HF ``config.json`` dict (dense, MoE and MLA families)."""
    hidden = hf_int(cfg, "hidden_size")
    heads, kv_heads, head_dim = _heads(cfg, hidden)
    dtype = _act_dtype(cfg)
    mt = str(cfg.get("model_type", ""))
    # Qwen (v1) states the two gated halves together: vLLM's QWenMLP is intermediate_size // 2 wide
    width = hf_int(cfg, "intermediate_size") // (2 if mt == "qwen" else 1)
    fields: dict[str, Any] = dict(
        name=name,
        hidden_size=hidden,
        intermediate_size=width,
        num_layers=hf_num_layers(cfg),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=hf_int(cfg, "vocab_size"),
        max_position_embeddings=hf_int(cfg, "max_position_embeddings", 4096),
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES[dtype],
        attention_bias=hf_bool(cfg, "attention_bias", mt in ("qwen", "qwen2", "qwen2_moe")),
        tie_word_embeddings=hf_bool(cfg, "tie_word_embeddings", False),
        # the older names are read only when the newer one is absent (a null beside a valid one is no matter)
        rms_norm_eps=hf_float(cfg, "rms_norm_eps", 0.0)
        if "rms_norm_eps" in cfg
        else hf_float(cfg, "layer_norm_epsilon", 1e-5),
        rope_theta=hf_float(cfg, "rope_theta", 0.0)
        if "rope_theta" in cfg
        else hf_float(cfg, "rotary_emb_base", 10000.0),
        qk_norm=mt.startswith("qwen3"),
        weight_dtype=checkpoint_weight_dtype(cfg, dtype),
    )
    fields.update(moe_fields(cfg))
    fields.update(mla_fields(cfg))
    return fields


def from_hf_config(cfg: dict, name: str) -> ModelShape:
    """Read the fields ppsim needs from a HF ``config.json`` dict; any bad value is one line naming its field."""
    try:
        return ModelShape(**_hf_fields(cfg, name))
    except KeyError as err:
        raise PPSimError(f"model config {name}: missing field {err.args[0]!r} in config.json") from None
    except HfFieldError as err:
        raise PPSimError(f"model config {name}: {err}; fix config.json") from None
    except ValidationError as err:
        e = err.errors()[0]
        msg = e["msg"].removeprefix("Value error, ").removeprefix(f"model {name}: ")
        if not e["loc"]:  # a check across fields: its message names them
            raise PPSimError(f"model config {name}: {msg}; fix config.json") from None
        field = HF_NAMES.get(str(e["loc"][0]), str(e["loc"][0]))
        raise PPSimError(
            f"model config {name}: field {field} = {short_repr(e.get('input'))}: {msg}; fix config.json"
        ) from None
    except (TypeError, ValueError, OverflowError) as err:
        first = str(err).splitlines()[0][:200]
        raise PPSimError(f"model config {name}: bad value ({first}); fix config.json") from None


def _json_error(text: str, err: Exception) -> str:
    """The parser's complaint, or for a whole number past Python's digit limit (which the parser reports
    without a position, advising ``sys.set_int_max_str_digits``) the field that holds it."""
    digits = re.search(rf"\d{{{sys.get_int_max_str_digits() + 1},}}", text)
    if "integer string conversion" not in str(err) or digits is None:
        return str(err)[:200]
    keys = re.findall(r'"([^"\\]{1,100})"\s*:', text[: digits.start()])
    where = f"field {keys[-1]}" if keys else "a number"
    return f"{where} has {digits.end() - digits.start()} digits, far above any model's size; fix config.json"


def _first_float(cfg: dict, keys: tuple[str, ...], default: float) -> float:
    """The number at the first of ``keys`` present (a newer name, then its older ones): an older name beside
    the newer is not read, so its null or junk is no matter."""
    key = next((k for k in keys if k in cfg), None)
    return default if key is None else hf_float(cfg, key, default)


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_hf_config(model: str) -> tuple[dict, str]:
    """The raw ``config.json`` dict of a preset name, a ``config.json`` path or a directory holding one."""
    preset = PRESET_DIR / f"{model}.json"  # a name only: an absolute path joined here would replace the dir
    try:
        path = preset if ("/" not in model and preset.is_file()) else Path(model)
        if path.is_dir():
            path = path / "config.json"
        found = path.is_file()
    except OSError as err:  # a directory on the way that cannot be searched
        raise os_error("--model", "read", model, err) from None
    if not found:
        raise PPSimError(
            f"model: unknown preset or missing file {short_repr(model)}; use one of {', '.join(list_presets())} "
            "or a path to a HF config.json"
        )
    text = read_text(path, "model")
    try:
        cfg = loads_json(text)
    except (ValueError, RecursionError) as err:  # json.JSONDecodeError is a ValueError
        raise PPSimError(f"model: cannot read {path}: {_json_error(text, err)}") from None
    if not isinstance(cfg, dict):
        raise PPSimError(f"model: {path} is not a JSON object")
    return cfg, (model if path == preset else path.parent.name or str(path))


def load_model(model: str) -> ModelShape:
    """A preset name (``llama-3-8b``), a ``config.json`` path or a directory holding one."""
    cfg, name = load_hf_config(model)
    return from_hf_config(cfg, name)


def refuse_skew_on_dense(shape: ModelShape, field: str, model: str, flag: str, skew: str = "the skew") -> None:
    """Refuse an expert-routing skew (``field``, set by ``flag``) on a dense model: with no experts to route to
    it changes nothing. ``model`` is the model as the message names it; ``skew`` what the message calls it.
    The one rule for the scenario (:mod:`ppsim.config`) and the profiler (:mod:`calibration.calibrate`)."""
    if not shape.is_moe:
        raise PPSimError(
            f"{field}: {model} is a dense model (no experts to route to), so {skew} changes nothing; "
            f"drop {flag} or pick a MoE model"
        )
