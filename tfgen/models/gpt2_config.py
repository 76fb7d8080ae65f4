"""`GPT2Config`: HF GPT-2's architecture fields, checked field by field when built, and the size of the weights they
describe, checked against the memory available before a single layer is built."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tfgen.memory import check_fits
from tfgen.models.layers import ACTIVATIONS
from tfgen.value_types import is_integer, is_real

# HF config options that change the architecture; accepted only at their (no-op) default.
_UNSUPPORTED_HF_OPTIONS = {"add_cross_attention": False, "is_encoder_decoder": False, "pruned_heads": {}}
# Layers are built one Python object at a time, so a config with a million of them would hang for hours even when
# its weights fit (tiny widths); the deepest published decoders have ~100-200 layers.
MAX_LAYERS = 1024

_POSITIVE_INTS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
_BOOLS = ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "tie_word_embeddings")
_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")


@dataclasses.dataclass
class GPT2Config:
    """HF `GPT2Config`'s architecture fields, with HF's names and defaults.

    Every field is checked when the config is built: a wrong type is a TypeError, a value out of range a ValueError,
    each naming the field. Sizes are positive ints (`n_layer` at most `MAX_LAYERS`) with `n_embd` divisible by
    `n_head`; dropout probabilities are in [0, 1); `layer_norm_epsilon` is a finite number > 0; token ids are None or
    ids of the vocabulary (`eos_token_id` may be a non-empty list of them).
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | list[int] | None = 50256
    pad_token_id: int | None = None

    def __post_init__(self):
        for name in _POSITIVE_INTS:
            _check_int(self, name, minimum=1)
        if self.n_inner is not None:
            _check_int(self, "n_inner", minimum=1)
        if self.n_layer > MAX_LAYERS:
            raise ValueError(f"GPT2Config.n_layer must be at most {MAX_LAYERS}, got {self.n_layer}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not isinstance(self.activation_function, str):
            raise TypeError(f"GPT2Config.activation_function must be a string, got {self.activation_function!r}")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"GPT2Config.activation_function={self.activation_function!r} is not implemented; "
                f"supported: {sorted(ACTIVATIONS)}"
            )
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GPT2Config.{name} must be true or false, got {getattr(self, name)!r}")
        if self.reorder_and_upcast_attn:
            raise ValueError("GPT2Config.reorder_and_upcast_attn=True is not implemented")
        for name in _DROPOUTS:
            if not 0.0 <= _finite_number(self, name) < 1.0:
                raise ValueError(f"GPT2Config.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not _finite_number(self, "layer_norm_epsilon") > 0:
            raise ValueError(f"GPT2Config.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}")
        if not _finite_number(self, "initializer_range") >= 0:
            raise ValueError(f"GPT2Config.initializer_range must be >= 0, got {self.initializer_range!r}")
        for name in ("bos_token_id", "pad_token_id"):
            self._check_token_id(name, getattr(self, name))
        if isinstance(self.eos_token_id, (list, tuple)):
            if not self.eos_token_id:
                raise ValueError("GPT2Config.eos_token_id must not be an empty list (use None for no eos)")
            for token_id in self.eos_token_id:
                self._check_token_id("eos_token_id", token_id)
        else:
            self._check_token_id("eos_token_id", self.eos_token_id)

    def _check_token_id(self, name: str, token_id: Any) -> None:
        if token_id is None:
            return
        if not is_integer(token_id):
            raise TypeError(f"GPT2Config.{name} must be an int token id or None, got {token_id!r}")
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"GPT2Config.{name}={token_id} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def max_position_embeddings(self) -> int:
        return self.n_positions

    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def inner_size(self) -> int:
        """Width of the MLP (HF: `n_inner`, defaulting to 4 * n_embd)."""
        return self.n_inner or 4 * self.n_embd

    def parameter_count(self) -> int:
        """How many weights the model has: embeddings, every block, the final norm and an untied LM head."""
        d, inner = self.n_embd, self.inner_size
        # ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj (kernels and biases).
        block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * inner + inner) + (inner * d + d)
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return (self.vocab_size + self.n_positions) * d + self.n_layer * block + 2 * d + head

    def check_fits_in_memory(self, dtype=None) -> None:
        """Raises ValueError, naming the size fields, when the weights in `dtype` (a Keras dtype or policy name,
        default the global policy; its variable dtype counts) need more than the memory available
        (`tfgen.memory`). Answers in microseconds, before anything is allocated."""
        policy = keras.config.dtype_policy() if dtype is None else keras.dtype_policies.get(dtype)
        variable_dtype = tf.as_dtype(policy.variable_dtype)
        count = self.parameter_count()
        sizes = ", ".join(
            f"{name}={getattr(self, name)}" for name in ("vocab_size", "n_positions", "n_embd", "n_layer")
        )
        check_fits(
            count * variable_dtype.size,
            f"a GPT-2 of {count:,} {variable_dtype.name} weights ({sizes}, n_inner={self.inner_size})",
            "make vocab_size, n_positions, n_embd, n_inner or n_layer smaller, or load the model in a smaller dtype",
        )

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> GPT2Config:
        """Builds a config from an HF `config.json` dict; bookkeeping keys are ignored, architecture options
        we do not implement raise `ValueError` unless they hold their default."""
        if not isinstance(config_dict, Mapping):
            raise TypeError(f"config_dict must be a mapping, got {type(config_dict).__name__}")
        model_type = config_dict.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise ValueError(f"config_dict has model_type={model_type!r}, expected 'gpt2'")
        for key, default in _UNSUPPORTED_HF_OPTIONS.items():
            if config_dict.get(key, default) not in (default, None):
                raise ValueError(f"GPT2 option {key}={config_dict[key]!r} is not implemented")
        field_names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in config_dict.items() if key in field_names})

    def to_dict(self) -> dict[str, Any]:
        """The HF-compatible `config.json` content."""
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **dataclasses.asdict(self)}


def _check_int(config: GPT2Config, name: str, minimum: int) -> None:
    value = getattr(config, name)
    # JSON has one number type: 12.0 or "12" for a size is a mistake to report, not to round.
    if not is_integer(value):
        raise TypeError(f"GPT2Config.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"GPT2Config.{name} must be a positive int, got {value!r}")


def _finite_number(config: GPT2Config, name: str) -> float:
    value = getattr(config, name)
    if not is_real(value):
        raise TypeError(f"GPT2Config.{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"GPT2Config.{name} must be a finite number, got {value!r}")
    return value
