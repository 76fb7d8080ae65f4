"""Checks shared by the model configs (`GPT2Config`, `LlamaConfig`): each refuses a field with a TypeError (wrong
type) or a ValueError (out of range) that names it as `ConfigClass.field`, when the config is built; and the
up-front memory check of the weights a config describes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tfgen.memory import check_fits
from tfgen.models.layers import ACTIVATIONS
from tfgen.value_types import is_integer, is_real

# Layers are built one Python object at a time, so a config with a million of them would hang for hours even when
# its weights fit (tiny widths); the deepest published decoders have ~100-200 layers.
MAX_LAYERS = 1024

# HF `PretrainedConfig` options that change any architecture; accepted only at their (no-op) default.
UNSUPPORTED_HF_OPTIONS = {"add_cross_attention": False, "is_encoder_decoder": False, "pruned_heads": {}}


def field(config: Any, name: str) -> str:
    """`ConfigClass.name`, how every message names a field."""
    return f"{type(config).__name__}.{name}"


def check_int(config: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """The int field `name`, in `[minimum, maximum]`."""
    value = getattr(config, name)
    # JSON has one number type: 12.0 or "12" for a size is a mistake to report, not to round.
    if not is_integer(value):
        raise TypeError(f"{field(config, name)} must be an int, got {value!r}")
    if value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{field(config, name)} must be {kind}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{field(config, name)} must be at most {maximum}, got {value!r}")
    return value


def finite_number(config: Any, name: str, value: Any = None) -> float:
    """The finite real field `name` (or `value`, reported as that field)."""
    value = getattr(config, name) if value is None else value
    if not is_real(value):
        raise TypeError(f"{field(config, name)} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{field(config, name)} must be a finite number, got {value!r}")
    return value


def check_positive_number(config: Any, name: str) -> float:
    value = finite_number(config, name)
    if not value > 0:
        raise ValueError(f"{field(config, name)} must be > 0, got {value!r}")
    return value


def check_probability(config: Any, name: str) -> float:
    """A dropout probability: in [0, 1)."""
    if not 0.0 <= finite_number(config, name) < 1.0:
        raise ValueError(f"{field(config, name)} must be in [0, 1), got {getattr(config, name)!r}")
    return getattr(config, name)


def check_bool(config: Any, name: str) -> bool:
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise TypeError(f"{field(config, name)} must be true or false, got {value!r}")
    return value


def check_activation(config: Any, name: str) -> None:
    """An HF activation name that `layers.ACTIVATIONS` implements."""
    value = getattr(config, name)
    if not isinstance(value, str):
        raise TypeError(f"{field(config, name)} must be a string, got {value!r}")
    if value not in ACTIVATIONS:
        raise ValueError(f"{field(config, name)}={value!r} is not implemented; supported: {sorted(ACTIVATIONS)}")


def check_token_ids(config: Any) -> None:
    """`bos_token_id` / `pad_token_id` (and an encoder-decoder config's `decoder_start_token_id`): None or an id of the
    vocabulary; `eos_token_id` may also be a non-empty list of them."""
    for name in ("bos_token_id", "pad_token_id", "decoder_start_token_id"):
        _check_token_id(config, name, getattr(config, name, None))
    if isinstance(config.eos_token_id, (list, tuple)):
        if not config.eos_token_id:
            raise ValueError(f"{field(config, 'eos_token_id')} must not be an empty list (use None for no eos)")
        for token_id in config.eos_token_id:
            _check_token_id(config, "eos_token_id", token_id)
    else:
        _check_token_id(config, "eos_token_id", config.eos_token_id)


def _check_token_id(config: Any, name: str, token_id: Any) -> None:
    if token_id is None:
        return
    if not is_integer(token_id):
        raise TypeError(f"{field(config, name)} must be an int token id or None, got {token_id!r}")
    if not 0 <= token_id < config.vocab_size:
        raise ValueError(f"{field(config, name)}={token_id} is outside the vocabulary [0, {config.vocab_size})")


def check_config_dict(config_dict: Any, model_types: tuple[str, ...], unsupported: Mapping[str, Any]) -> str:
    """Returns the `model_type` of an HF `config.json` dict (one of `model_types`; the first when absent) after
    refusing, with a ValueError naming it, each key of `unsupported` that holds other than its default."""
    if not isinstance(config_dict, Mapping):
        raise TypeError(f"config_dict must be a mapping, got {type(config_dict).__name__}")
    model_type = config_dict.get("model_type", model_types[0])
    if not isinstance(model_type, str) or model_type not in model_types:
        expected = " or ".join(repr(name) for name in model_types)
        raise ValueError(f"config_dict has model_type={model_type!r}, expected {expected}")
    for key, default in {**UNSUPPORTED_HF_OPTIONS, **unsupported}.items():
        if config_dict.get(key, default) not in (default, None):
            raise ValueError(f"{model_type} option {key}={config_dict[key]!r} is not implemented")
    return model_type


def check_weights_fit(config: Any, dtype, what: str, size_fields: tuple[str, ...], advice: str) -> None:
    """Raises ValueError, naming `size_fields` and their values, when `config.parameter_count()` weights in `dtype`
    (a Keras dtype or policy name, default the global policy; its variable dtype counts) need more than the memory
    available (`tfgen.memory`). `what` names the model ("a GPT-2"), `advice` says what to shrink."""
    policy = keras.config.dtype_policy() if dtype is None else keras.dtype_policies.get(dtype)
    variable_dtype = tf.as_dtype(policy.variable_dtype)
    count = config.parameter_count()
    sizes = ", ".join(f"{name}={getattr(config, name)}" for name in size_fields)
    check_fits(count * variable_dtype.size, f"{what} of {count:,} {variable_dtype.name} weights ({sizes})", advice)
