"""`LlamaConfig`: the architecture fields of HF's `llama`, `mistral`, `qwen2` and `qwen3` configs (one decoder
family: RMSNorm, RoPE, grouped-query attention, a gated MLP), checked field by field when built, with the size of the
weights they describe checked against the memory available before a single layer is built.

The families differ only in a few switches, all decided by `model_type` as HF 4.55 decides them:

| model_type | q/k/v bias      | o bias          | MLP bias | q/k RMSNorm | sliding window                          |
| ---------- | --------------- | --------------- | -------- | ----------- | --------------------------------------- |
| llama      | attention_bias  | attention_bias  | mlp_bias | no          | none                                    |
| mistral    | no              | no              | no       | no          | every layer when `sliding_window` is set |
| qwen2      | yes             | no              | no       | no          | layers marked `sliding_attention`       |
| qwen3      | attention_bias  | attention_bias  | no       | per head    | layers marked `sliding_attention`       |

For qwen2/qwen3, `layer_types` defaults as HF's: `sliding_attention` from layer `max_window_layers` on when
`use_sliding_window`, else every layer full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfgen.models import config_checks as checks
from tfgen.models.rope import RopeParameters, check_rope_scaling, rope_parameters

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
LAYER_TYPES = ("full_attention", "sliding_attention")

# The config.json keys each family's HF class reads beyond the common ones; HF ignores the others, and so do we.
_COMMON_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
    "rope_theta", "rope_scaling", "attention_dropout", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    "pad_token_id",
)
_WINDOW_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
_FAMILY_KEYS = {
    "llama": ("attention_bias", "mlp_bias"),
    "mistral": ("sliding_window",),
    "qwen2": _WINDOW_KEYS,
    "qwen3": ("attention_bias", *_WINDOW_KEYS),
}
# HF's defaults where a family's differ from LlamaConfig's (the dataclass defaults).
_QWEN_DEFAULTS = dict(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
                      bos_token_id=None, eos_token_id=None, sliding_window=4096)
_FAMILY_DEFAULTS = {
    "llama": {},
    "mistral": dict(intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                    sliding_window=4096),
    "qwen2": _QWEN_DEFAULTS,
    "qwen3": {**_QWEN_DEFAULTS, "head_dim": 128},
}
# HF options none of these families implements in tfgen; refused unless at their no-op default.
# `rope_parameters` is transformers v5's home for rope_theta/rope_scaling: dropping it would silently decode with
# the default RoPE, so it is refused unless empty.
_UNSUPPORTED = {"quantization_config": None, "partial_rotary_factor": 1.0, "rope_parameters": None}


@dataclasses.dataclass
class LlamaConfig:
    """HF's Llama-family architecture fields, with HF's names and (LlamaConfig's) defaults.

    Every field is checked when the config is built: a wrong type is a TypeError, a value out of range a ValueError,
    each naming the field. `num_key_value_heads` (default: `num_attention_heads`) must divide the heads; `head_dim`
    (default: hidden_size // num_attention_heads) must be even (RoPE rotates pairs); a field that `model_type` does
    not have (e.g. `mlp_bias` for qwen2) must keep its default.
    """

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    sliding_window: int | None = None
    use_sliding_window: bool = False
    max_window_layers: int = 28
    layer_types: list[str] | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None

    def __post_init__(self):
        if not isinstance(self.model_type, str) or self.model_type not in MODEL_TYPES:
            raise ValueError(f"LlamaConfig.model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                     "max_position_embeddings"):
            checks.check_int(self, name)
        checks.check_int(self, "num_hidden_layers", maximum=checks.MAX_LAYERS)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if checks.check_int(self, "num_key_value_heads") > self.num_attention_heads or (
            self.num_attention_heads % self.num_key_value_heads
        ):
            raise ValueError(f"LlamaConfig.num_key_value_heads ({self.num_key_value_heads}) must divide "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if checks.check_int(self, "head_dim", minimum=2) % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        checks.check_activation(self, "hidden_act")
        checks.check_positive_number(self, "rms_norm_eps")
        checks.check_positive_number(self, "rope_theta")
        if not checks.finite_number(self, "initializer_range") >= 0:
            raise ValueError(f"LlamaConfig.initializer_range must be >= 0, got {self.initializer_range!r}")
        check_rope_scaling(self)
        for name in ("attention_bias", "mlp_bias", "use_sliding_window", "tie_word_embeddings"):
            checks.check_bool(self, name)
        checks.check_probability(self, "attention_dropout")
        self._check_family_fields()
        checks.check_token_ids(self)

    def _check_family_fields(self) -> None:
        """Fields that `model_type` lacks keep their defaults; windows and layer types are consistent."""
        own = set(_FAMILY_KEYS[self.model_type])
        for name in ("attention_bias", "mlp_bias", *_WINDOW_KEYS):
            default = next(item for item in dataclasses.fields(self) if item.name == name).default
            if name not in own and getattr(self, name) != default:
                raise ValueError(f"{checks.field(self, name)}={getattr(self, name)!r}: model_type {self.model_type!r} "
                                 f"has no such option (leave it at {default!r})")
        if self.sliding_window is not None:
            checks.check_int(self, "sliding_window")
        if self.model_type in ("qwen2", "qwen3"):
            self._resolve_layer_types()

    def _resolve_layer_types(self) -> None:
        """HF's Qwen rule: without `use_sliding_window` there is no window; `layer_types` defaults to sliding layers
        from `max_window_layers` on when there is one."""
        checks.check_int(self, "max_window_layers", minimum=0)
        if not self.use_sliding_window:
            self.sliding_window = None
        if self.layer_types is None:
            self.layer_types = [
                "sliding_attention" if self.sliding_window is not None and index >= self.max_window_layers
                else "full_attention"
                for index in range(self.num_hidden_layers)
            ]
        name = checks.field(self, "layer_types")
        if not isinstance(self.layer_types, (list, tuple)) or len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"{name} must be a list of {self.num_hidden_layers} layer types, got {self.layer_types!r}")
        if any(kind not in LAYER_TYPES for kind in self.layer_types):
            raise ValueError(f"{name} entries must be in {LAYER_TYPES}, got {self.layer_types!r}")
        self.layer_types = list(self.layer_types)
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError(f"{name} has sliding_attention layers but there is no sliding_window "
                             "(use_sliding_window is false or sliding_window is None)")

    @property
    def num_key_value_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def qkv_bias(self) -> bool:
        return {"llama": self.attention_bias, "mistral": False, "qwen2": True, "qwen3": self.attention_bias}[
            self.model_type]

    @property
    def output_bias(self) -> bool:
        return self.attention_bias and self.model_type in ("llama", "qwen3")

    @property
    def qk_norm(self) -> bool:
        """Whether queries and keys get a per-head RMSNorm before RoPE (Qwen3)."""
        return self.model_type == "qwen3"

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer, the sliding window (a query sees itself and the `window - 1` slots before it) or None."""
        if self.model_type == "mistral":
            return (self.sliding_window,) * self.num_hidden_layers
        if self.model_type == "llama":
            return (None,) * self.num_hidden_layers
        return tuple(self.sliding_window if kind == "sliding_attention" else None for kind in self.layer_types)

    def rope(self) -> RopeParameters:
        """The inverse frequencies and cos/sin scaling of `rope_scaling` (see `tfgen.models.rope`)."""
        return rope_parameters(self.rope_scaling, self.rope_theta, self.head_dim, self.max_position_embeddings)

    def parameter_count(self) -> int:
        """How many weights the model has: embeddings, every layer, the final norm and an untied LM head."""
        d, hd, inner = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attention = d * (q + 2 * kv) + q * d + (q + 2 * kv if self.qkv_bias else 0) + (d if self.output_bias else 0)
        mlp = 3 * d * inner + (2 * inner + d if self.mlp_bias else 0)
        layer = attention + mlp + 2 * d + (2 * hd if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_hidden_layers * layer + d + head

    def check_fits_in_memory(self, dtype=None) -> None:
        """Raises ValueError, naming the size fields, when the weights in `dtype` (a Keras dtype or policy name,
        default the global policy; its variable dtype counts) need more than the memory available
        (`tfgen.memory`). Answers in microseconds, before anything is allocated."""
        checks.check_weights_fit(
            self, dtype, f"a {self.model_type} model",
            ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"),
            "make vocab_size, hidden_size, intermediate_size or num_hidden_layers smaller, or load the model in a "
            "smaller dtype",
        )

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> LlamaConfig:
        """Builds a config from an HF `config.json` dict of a `llama`, `mistral`, `qwen2` or `qwen3` model, with that
        family's HF defaults for absent keys. Keys the family's HF class does not read are ignored (as HF ignores
        them); options tfgen does not implement raise `ValueError` unless they hold their default."""
        model_type = checks.check_config_dict(config_dict, MODEL_TYPES, _UNSUPPORTED)
        keys = (*_COMMON_KEYS, *_FAMILY_KEYS[model_type])
        values = {**_FAMILY_DEFAULTS[model_type], **{key: config_dict[key] for key in keys if key in config_dict}}
        if model_type == "qwen3" and values.get("head_dim", 0) is None:
            raise ValueError("LlamaConfig.head_dim: a qwen3 config needs an int head_dim (HF fails on null)")
        return cls(model_type=model_type, **values)

    def to_dict(self) -> dict[str, Any]:
        """The HF-compatible `config.json` content: the common fields and those of `model_type`."""
        keys = (*_COMMON_KEYS, *_FAMILY_KEYS[self.model_type])
        values = {key: getattr(self, key) for key in keys}
        return {"model_type": self.model_type, "architectures": [ARCHITECTURES[self.model_type]], **values}
