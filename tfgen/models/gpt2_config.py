"""`GPT2Config`: HF GPT-2's architecture fields, checked field by field when built, and the size of the weights they
describe, checked against the memory available before a single layer is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfgen.models.config_checks import (
    MAX_LAYERS,
    check_activation,
    check_bool,
    check_config_dict,
    check_int,
    check_positive_number,
    check_probability,
    check_token_ids,
    check_weights_fit,
    finite_number,
)

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
            check_int(self, name, maximum=MAX_LAYERS if name == "n_layer" else None)
        if self.n_inner is not None:
            check_int(self, "n_inner")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        check_activation(self, "activation_function")
        for name in _BOOLS:
            check_bool(self, name)
        if self.reorder_and_upcast_attn:
            raise ValueError("GPT2Config.reorder_and_upcast_attn=True is not implemented")
        for name in _DROPOUTS:
            check_probability(self, name)
        check_positive_number(self, "layer_norm_epsilon")
        if not finite_number(self, "initializer_range") >= 0:
            raise ValueError(f"GPT2Config.initializer_range must be >= 0, got {self.initializer_range!r}")
        check_token_ids(self)

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
        check_weights_fit(
            self, dtype, "a GPT-2", ("vocab_size", "n_positions", "n_embd", "n_layer", "inner_size"),
            "make vocab_size, n_positions, n_embd, n_inner or n_layer smaller, or load the model in a smaller dtype",
        )

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any]) -> GPT2Config:
        """Builds a config from an HF `config.json` dict; bookkeeping keys are ignored, architecture options
        we do not implement raise `ValueError` unless they hold their default."""
        check_config_dict(config_dict, ("gpt2",), {})
        field_names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in config_dict.items() if key in field_names})

    def to_dict(self) -> dict[str, Any]:
        """The HF-compatible `config.json` content."""
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **dataclasses.asdict(self)}
