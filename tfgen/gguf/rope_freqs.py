"""Llama 3.1-style RoPE scaling, which llama.cpp's converter stores as a `rope_freqs.weight` tensor (one divisor per
rotary frequency) rather than as metadata, recovered as HF's `llama3` `rope_scaling` and checked to reproduce the
divisors through tfgen's own RoPE code."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# llama.cpp's converter computes the divisors with this original context (Llama 3.x's); only the ratios
# context / low_freq_factor and context / high_freq_factor shape the frequencies, so it fixes the other two.
ASSUMED_ORIGINAL_CONTEXT = 8192
# Relative error allowed between the file's divisors (float32) and the ones the recovered scaling gives.
_TOLERANCE = 1e-4


def llama3_rope_scaling(divisors: np.ndarray, theta: float, head_dim: int, max_positions: int) -> dict[str, Any] | None:
    """HF's `rope_scaling` (`rope_type` "llama3") whose frequencies are llama.cpp's: frequency i of heads of
    `head_dim` (base `theta`) divided by `divisors[i]` (`[head_dim // 2]`; 1 for short wavelengths, `factor` for
    long ones, a blend between). None when every divisor is 1. ValueError when no such scaling reproduces them."""
    from tfgen.models.rope import rope_parameters  # lazy: the model package is heavier than this one

    divisors = np.asarray(divisors, np.float64).reshape(-1)
    if divisors.shape != (head_dim // 2,) or not np.all(np.isfinite(divisors)) or divisors.min() <= 0:
        raise ValueError(f"rope_freqs.weight must hold {head_dim // 2} positive divisors (one per rotary frequency), "
                         f"got shape {divisors.shape}")
    if np.allclose(divisors, 1.0, rtol=_TOLERANCE, atol=0):
        return None
    factor = float(divisors.max())
    inverse = np.float64(theta) ** -(np.arange(0, head_dim, 2) / head_dim)
    wavelength = 2 * math.pi / inverse
    kept = np.isclose(divisors, 1.0, rtol=_TOLERANCE, atol=0)
    scaled = np.isclose(divisors, factor, rtol=_TOLERANCE, atol=0)
    blended = ~kept & ~scaled
    smooth = (1 / divisors[blended] - 1 / factor) / (1 - 1 / factor)
    if blended.sum() >= 2:
        # HF blends 1 / divisor = (1 - s) / factor + s with s = (context / wavelength - low) / (high - low): a line
        # in 1 / wavelength whose slope and intercept give the two wavelength thresholds.
        slope, intercept = np.polyfit(1 / wavelength[blended], smooth, 1)
        high_wavelength, low_wavelength = 1 / ((1 - intercept) / slope), 1 / (-intercept / slope)
    elif blended.sum() == 1:
        # One equation for two thresholds: take Llama 3.x's high_freq_factor / low_freq_factor of 4.
        low_wavelength = float(wavelength[blended][0] * (3 * smooth[0] + 1))
        high_wavelength = low_wavelength / 4
    else:
        # Without blended frequencies any thresholds in the gap between the kept and the scaled wavelengths do.
        shortest = wavelength[scaled].min()
        longest = wavelength[kept].max() if kept.any() else shortest / 2
        high_wavelength = longest * (shortest / longest) ** (1 / 3)
        low_wavelength = longest * (shortest / longest) ** (2 / 3)
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": ASSUMED_ORIGINAL_CONTEXT / low_wavelength,
        "high_freq_factor": ASSUMED_ORIGINAL_CONTEXT / high_wavelength,
        "original_max_position_embeddings": ASSUMED_ORIGINAL_CONTEXT,
    }
    if not 0 < scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError(f"rope_freqs.weight does not follow Llama 3.1's RoPE scaling (divisors {divisors.tolist()})")
    frequencies = rope_parameters(scaling, theta, head_dim, max_positions).inverse_frequencies
    if not np.allclose(frequencies, inverse / divisors, rtol=_TOLERANCE, atol=0):
        raise ValueError(f"rope_freqs.weight does not follow Llama 3.1's RoPE scaling (divisors {divisors.tolist()})")
    return scaling
