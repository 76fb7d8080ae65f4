"""The up-front size check of a request: refuse, before compiling, a request whose KV cache cannot fit.

A million beams or return sequences would otherwise reach XLA and fail there (a tf2xla error, or an allocation of
tens of GiB that takes the machine down). The cache's size comes from the model itself: `init_cache` is traced
(not run) for one row at two lengths, which gives its bytes per row as `a * length + b` for any cache layout
the model protocol allows; the result is kept per model.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.decoding.strategies import strategy_for
from tfgen.memory import check_fits

# Per model and encoder width (None: decoder-only): (bytes per row per slot, bytes per row independent of the length).
_CACHE_COEFFICIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Bytes per vocabulary entry per row that a step holds at least: the logits and the processed scores (float32).
_LOGITS_BYTES_PER_ENTRY = 2 * 4
# Copies of the cache a compiled loop holds at once: the loop state and the next one (a beam step gathers the
# cache into a reordered copy; measured: 10**6 beams of a 17 GiB cache asked XLA for 24 GiB at once).
_CACHE_COPIES = 2


def cache_bytes(model, rows: int, length: int, encoder_length: int | None = None) -> int:
    """Bytes of `model.init_cache(rows, length)` (of an encoder-decoder model: with an encoder input of
    `encoder_length` columns), from two traced (never allocated) single-row caches."""
    per_width = _CACHE_COEFFICIENTS.setdefault(model, {})
    coefficients = per_width.get(encoder_length)
    if coefficients is None:
        one, two = (_traced_cache_bytes(model, length, encoder_length) for length in (1, 2))
        coefficients = (two - one, 2 * one - two)
        per_width[encoder_length] = coefficients
    per_slot, fixed = coefficients
    return rows * (per_slot * length + fixed)


def _traced_cache_bytes(model, length: int, encoder_length: int | None) -> int:
    extra = {} if encoder_length is None else {"encoder_length": encoder_length}
    traced = tf.function(lambda: model.init_cache(1, length, **extra), autograph=False).get_concrete_function()
    return sum(spec.shape.num_elements() * spec.dtype.size for spec in tf.nest.flatten(traced.structured_outputs))


def check_request_fits(model, config: GenerationConfig, mode: GenerationMode, prompts: int, length: int,
                       encoder_length: int | None = None) -> None:
    """ValueError unless two copies of the KV cache and the per-step logits of `prompts` rows decoding up to
    `length` positions in `mode` fit in the memory available (`tfgen.memory`); the message names the options to
    lower. `encoder_length`: an encoder-decoder model's encoder input columns (its cross-attention cache)."""
    strategy = strategy_for(mode)
    rows_per_prompt = strategy.cache_rows_per_prompt(config)
    rows = prompts * rows_per_prompt
    logits_bytes = rows * int(model.config.vocab_size) * _LOGITS_BYTES_PER_ENTRY
    needed = _CACHE_COPIES * cache_bytes(model, rows, length, encoder_length) + logits_bytes
    what = f"decoding {prompts} prompt row(s)"
    if rows_per_prompt > 1:
        what += f" × {rows_per_prompt} {strategy.rows_named}"
    check_fits(
        needed,
        f"{what} over {length} positions (KV cache and logits)",
        "lower num_beams, num_return_sequences, top_k (contrastive search), the batch size or max_new_tokens.",
    )
