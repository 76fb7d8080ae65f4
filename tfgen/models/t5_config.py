"""`T5Config`: the architecture fields of HF's `t5` config (original T5, T5 v1.1, FLAN-T5), checked field by field when
built, with the size of the weights they describe checked against the memory available before a layer is built.

`feed_forward_proj` is HF's `"<act>"` (one `wi`, original T5's `"relu"`) or `"gated-<act>"` (`act(wi_0) * wi_1`,
T5 v1.1's and FLAN-T5's `"gated-gelu"`), where `<act>` is an HF activation name; as in HF, `"gated-gelu"` means the
tanh-approximated `gelu_new` (every published checkpoint was trained with it), and a `dense_act_fn` / `is_gated_act`
written in `config.json` overrides what `feed_forward_proj` says (HF sets them after parsing it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfgen.models import config_checks as checks
from tfgen.models.layers import ACTIVATIONS

MODEL_TYPES = ("t5",)
ARCHITECTURE = "T5ForConditionalGeneration"

# The config.json keys HF's T5Config reads (plus the token ids of PretrainedConfig); HF ignores the others, as we do.
_KEYS = (
    "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
    "relative_attention_num_buckets", "relative_attention_max_distance", "dropout_rate", "layer_norm_epsilon",
    "initializer_factor", "feed_forward_proj", "dense_act_fn", "is_gated_act", "tie_word_embeddings",
    "is_encoder_decoder", "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id",
)
# HF options tfgen does not implement for T5, refused unless at their no-op default. `is_encoder_decoder` overrides
# the decoder-only default of `config_checks.UNSUPPORTED_HF_OPTIONS`: a T5 without its encoder is not a T5.
_UNSUPPORTED = {"is_encoder_decoder": True, "quantization_config": None, "tie_encoder_decoder": False}
_SIZE_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads")


def parse_feed_forward_proj(feed_forward_proj: Any) -> tuple[str, bool]:
    """(activation name, gated) of HF's `feed_forward_proj` (`"relu"`, `"gated-gelu"`, `"gated-silu"`, ...); a
    ValueError naming `T5Config.feed_forward_proj` for any other form or an activation tfgen does not implement."""
    name = "T5Config.feed_forward_proj"
    if not isinstance(feed_forward_proj, str):
        raise TypeError(f"{name} must be a string, got {feed_forward_proj!r}")
    parts = feed_forward_proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"{name}={feed_forward_proj!r} must be '<activation>' or 'gated-<activation>', "
                         "e.g. 'relu' or 'gated-gelu'")
    # HF's backward compatibility: T5 v1.1 / FLAN-T5 were trained with the tanh approximation.
    activation = "gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1]
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}={feed_forward_proj!r}: activation {activation!r} is not implemented; "
                         f"supported: {sorted(ACTIVATIONS)}")
    return activation, parts[0] == "gated"


@dataclasses.dataclass(frozen=True)
class T5Config:
    """HF's T5 architecture fields, with HF's names and defaults (`decoder_start_token_id` defaults to the pad id 0,
    which every T5 checkpoint uses; HF's class leaves it None).

    Every field is checked when the config is built: a wrong type is a TypeError, a value out of range a ValueError,
    each naming the field. `num_decoder_layers` defaults to `num_layers`; `dense_act_fn` / `is_gated_act` default to
    what `feed_forward_proj` says. `dropout_rate` is kept (HF writes it) but inference runs without dropout.
    `relative_attention_max_distance` must exceed `relative_attention_num_buckets // 2` (below that HF's bucket
    function divides by zero or stops being monotone).
    """

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"
    dense_act_fn: str | None = None
    is_gated_act: bool | None = None
    tie_word_embeddings: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    bos_token_id: int | None = None
    decoder_start_token_id: int | None = 0

    model_type = "t5"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads"):
            checks.check_int(self, name)
        checks.check_int(self, "num_layers", maximum=checks.MAX_LAYERS)
        if self.num_decoder_layers is None:
            object.__setattr__(self, "num_decoder_layers", self.num_layers)
        checks.check_int(self, "num_decoder_layers", maximum=checks.MAX_LAYERS)
        buckets = checks.check_int(self, "relative_attention_num_buckets", minimum=4)
        if checks.check_int(self, "relative_attention_max_distance") <= buckets // 2:
            raise ValueError(f"T5Config.relative_attention_max_distance ({self.relative_attention_max_distance}) must "
                             f"be > relative_attention_num_buckets // 2 ({buckets // 2})")
        checks.check_probability(self, "dropout_rate")
        checks.check_positive_number(self, "layer_norm_epsilon")
        checks.check_positive_number(self, "initializer_factor")
        activation, gated = parse_feed_forward_proj(self.feed_forward_proj)
        if self.dense_act_fn is None:
            object.__setattr__(self, "dense_act_fn", activation)
        if self.is_gated_act is None:
            object.__setattr__(self, "is_gated_act", gated)
        checks.check_activation(self, "dense_act_fn")
        for name in ("is_gated_act", "tie_word_embeddings"):
            checks.check_bool(self, name)
        if self.is_encoder_decoder is not True:
            raise ValueError(f"T5Config.is_encoder_decoder must be true, got {self.is_encoder_decoder!r}")
        if isinstance(self.eos_token_id, list):  # a frozen dataclass: keep a list field from being shared
            object.__setattr__(self, "eos_token_id", list(self.eos_token_id))
        checks.check_token_ids(self)

    # HF's attribute_map aliases, so code written for decoder-only configs reads the same sizes.
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_attention_heads(self) -> int:
        return self.num_heads

    @property
    def num_hidden_layers(self) -> int:
        """The decoder's layers: the ones the KV cache holds."""
        return self.num_decoder_layers

    @property
    def head_dim(self) -> int:
        return self.d_kv

    @property
    def max_position_embeddings(self) -> None:
        """None: T5 has no position table (relative position buckets), so no sequence length limit."""
        return None

    @property
    def inner_dim(self) -> int:
        """Width of the attention projections: `num_heads * d_kv`."""
        return self.num_heads * self.d_kv

    def parameter_count(self) -> int:
        """How many weights the model has: the shared embedding, both stacks (with their relative position biases and
        final norms) and an untied LM head."""
        d, inner = self.d_model, self.inner_dim
        attention = 4 * d * inner
        feed_forward = (3 if self.is_gated_act else 2) * d * self.d_ff
        bias = self.relative_attention_num_buckets * self.num_heads
        encoder = self.num_layers * (attention + feed_forward + 2 * d) + bias + d
        decoder = self.num_decoder_layers * (2 * attention + feed_forward + 3 * d) + bias + d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + encoder + decoder + head

    def check_fits_in_memory(self, dtype=None) -> None:
        """Raises ValueError, naming the size fields, when the weights in `dtype` (a Keras dtype or policy name,
        default the global policy; its variable dtype counts) need more than the memory available
        (`tfgen.memory`). Answers in microseconds, before anything is allocated."""
        checks.check_weights_fit(
            self, dtype, "a T5 model", _SIZE_FIELDS,
            "make vocab_size, d_model, d_ff or the layer counts smaller, or load the model in a smaller dtype",
        )

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> T5Config:
        """Builds a config from an HF `config.json` dict of a `t5` model, with HF's defaults for absent keys. Keys HF's
        T5 does not read are ignored; options tfgen does not implement raise `ValueError` unless at their default."""
        checks.check_config_dict(config_dict, MODEL_TYPES, _UNSUPPORTED)
        return cls(**{key: config_dict[key] for key in _KEYS if key in config_dict})

    def to_dict(self) -> dict[str, Any]:
        """The HF-compatible `config.json` content."""
        values = {key: getattr(self, key) for key in _KEYS}
        return {"model_type": self.model_type, "architectures": [ARCHITECTURE], **values}
