"""Rotary position embeddings (RoPE) of HF's Llama-family configs: the checks of `rope_scaling` and the inverse
frequencies of each implemented `rope_type`, computed once on the host in float32 as HF 4.55 computes them.

Implemented: `default`, `linear`, `llama3` and `yarn` (all fixed frequencies). Refused: `dynamic` (HF recomputes its
frequencies at every call from the largest position id in the batch, so one row's output would depend on the other
rows and on where a compiled program stands) and `longrope` (it switches frequency tables once a sequence passes a
length, also per call), and any other type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tfgen.models.config_checks import field, finite_number
from tfgen.value_types import is_integer

# rope_type -> (required keys, optional keys) besides `rope_type` / `type`.
_KEYS = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "yarn": (
        {"factor"},
        {"attention_factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "mscale",
         "mscale_all_dim", "truncate"},
    ),
}
_REFUSED = {
    "dynamic": "HF recomputes its frequencies at every call from the largest position id in the batch, so a row's "
    "tokens would depend on the other rows",
    "longrope": "HF switches its frequency tables per call once a sequence passes original_max_position_embeddings",
}


class RopeParameters(NamedTuple):
    """inverse_frequencies: float32 `[head_dim // 2]`; attention_scaling: the factor HF applies to cos and sin."""

    inverse_frequencies: np.ndarray
    attention_scaling: float


def rope_type(rope_scaling: Mapping[str, Any] | None) -> str:
    """HF's `rope_type` of a (checked) `rope_scaling`: its `rope_type`, else its older `type` key."""
    if rope_scaling is None:
        return "default"
    return rope_scaling.get("rope_type", rope_scaling.get("type"))


def check_rope_scaling(config: Any) -> None:
    """Refuses a `config.rope_scaling` that is not None or a dict of an implemented type with its keys and sane
    values (TypeError/ValueError naming `rope_scaling` and the key)."""
    scaling = config.rope_scaling
    if scaling is None:
        return
    name = field(config, "rope_scaling")
    if not isinstance(scaling, Mapping):
        raise TypeError(f"{name} must be a dict or None, got {scaling!r}")
    if "rope_type" in scaling and "type" in scaling and scaling["rope_type"] != scaling["type"]:
        raise ValueError(f"{name} has rope_type={scaling['rope_type']!r} and type={scaling['type']!r}; give one")
    kind = rope_type(scaling)
    if kind is None:
        raise ValueError(f"{name} needs a 'rope_type' (or 'type') key, got {dict(scaling)}")
    if kind in _REFUSED:
        raise ValueError(f"{name} rope_type={kind!r} is not implemented: {_REFUSED[kind]}")
    if kind not in _KEYS:
        raise ValueError(f"{name} rope_type={kind!r} is not implemented; supported: {sorted(_KEYS)}")
    required, optional = _KEYS[kind]
    given = set(scaling) - {"rope_type", "type"}
    if required - given or given - required - optional:
        raise ValueError(
            f"{name} of rope_type {kind!r} needs the keys {sorted(required)} (optional: {sorted(optional)}); "
            f"missing {sorted(required - given)}, unknown {sorted(given - required - optional)}"
        )

    def number(key: str, above: float | None = None) -> None:
        value = scaling.get(key)
        if value is None:
            return
        finite_number(config, f"rope_scaling['{key}']", value)
        if above is not None and not value > above:
            raise ValueError(f"{name}['{key}'] must be > {above}, got {value!r}")

    number("factor", 0)
    number("attention_factor", 0)
    number("mscale")
    number("mscale_all_dim")
    number("beta_fast")
    number("beta_slow")
    if kind == "llama3":
        number("low_freq_factor")
        number("high_freq_factor")
        if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ValueError(f"{name}['high_freq_factor'] must be greater than low_freq_factor, got {dict(scaling)}")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and not (is_integer(original) and original > 0):
        raise ValueError(f"{name}['original_max_position_embeddings'] must be a positive int, got {original!r}")
    if not isinstance(scaling.get("truncate", True), bool):
        raise TypeError(f"{name}['truncate'] must be true or false, got {scaling['truncate']!r}")


def rope_parameters(rope_scaling: Mapping[str, Any] | None, theta: float, head_dim: int,
                    max_position_embeddings: int) -> RopeParameters:
    """The inverse frequencies and cos/sin scaling of a checked `rope_scaling` (None: plain RoPE) for heads of
    `head_dim` (even) and base `theta`, in HF's float32 arithmetic."""
    exponents = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
    powers = np.float32(theta) ** exponents
    inverse = np.float32(1.0) / powers
    kind = rope_type(rope_scaling)
    if kind == "linear":
        return RopeParameters(inverse / np.float32(rope_scaling["factor"]), 1.0)
    if kind == "llama3":
        return RopeParameters(_llama3_frequencies(inverse, rope_scaling), 1.0)
    if kind == "yarn":
        return _yarn_parameters(powers, rope_scaling, theta, head_dim, max_position_embeddings)
    return RopeParameters(inverse, 1.0)


def _llama3_frequencies(inverse: np.ndarray, scaling: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's rule: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = np.float32(2 * math.pi) / inverse
    scaled = np.where(wavelength > context / low, inverse / np.float32(factor), inverse)
    smooth = (np.float32(context) / wavelength - np.float32(low)) / np.float32(high - low)
    blended = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(medium, blended, scaled).astype(np.float32)


def _yarn_parameters(powers: np.ndarray, scaling: Mapping[str, Any], theta: float, head_dim: int,
                     max_position_embeddings: int) -> RopeParameters:
    """YaRN: interpolated low frequencies, extrapolated high ones, a linear ramp between, and a cos/sin scale."""
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings")
    if original is not None:
        # HF 4.55 then derives the factor from the two lengths, whatever `factor` says.
        factor = max_position_embeddings / original
    else:
        original = max_position_embeddings

    def magnitude(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (magnitude(factor, mscale) / magnitude(factor, mscale_all_dim) if mscale and mscale_all_dim
                     else magnitude(factor))
    # HF reads these with `or`, so 0 means the default too.
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolated = 1 - ramp
    inverse = (np.float32(1.0) / (np.float32(factor) * powers)) * (1 - extrapolated) + (
        np.float32(1.0) / powers
    ) * extrapolated
    return RopeParameters(inverse.astype(np.float32), float(attention))
