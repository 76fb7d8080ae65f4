"""XLA-safe sampling warpers, numerically matching HF transformers 4.55.4's PyTorch ones.

HF's TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper,
EpsilonLogitsWarper and EtaLogitsWarper, run by `apply_warpers` in HF's order after the logits processors
(`tfgen.logits.processors.apply_processors`). Their values are per-row knobs, so new values never recompile; which
warpers run and the top-k candidate count are static (`ProcessorSpec`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
    from tfgen.logits.processors import ProcessorSpec

_NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------------------
# Shared with the logits processors (`tfgen.logits.processors`) and the structured-output mask (`tfgen.logits.grammar`)


def read_knob(knobs, name: str, dtype) -> tf.Tensor:
    """`knobs[name]` (a tensor or array of any shape) cast to `dtype`; ValueError when `knobs` lacks it."""
    if name not in knobs:
        raise ValueError(f"knobs is missing {name!r}, which an enabled processor needs")
    return tf.cast(knobs[name], dtype)


def per_row_knob(knobs, name: str, dtype=tf.float32) -> tf.Tensor:
    """A per-row knob [B] as a column [B, 1] that broadcasts against scores [B, V]."""
    return tf.reshape(read_knob(knobs, name, dtype), [-1, 1])


def id_mask(token_ids: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """bool [V]: which vocabulary entries appear in `token_ids` int32 [N] (-1 entries match nothing), e.g. the eos
    ids of a knob."""
    return tf.reduce_any(tf.range(vocab_size)[:, None] == token_ids[None, :], axis=1)


def drop_tokens(scores: tf.Tensor, removed: tf.Tensor) -> tf.Tensor:
    """`scores` float32 [B, V] with -inf where `removed` (bool, broadcasting to [B, V]) is true."""
    return tf.where(removed, _NEG_INF, scores)


# ----------------------------------------------------------------------------------------------------------
# Warpers


def _kth_largest(scores: tf.Tensor, k: int) -> tf.Tensor:
    """[B, 1]: each row's k-th largest score (k static)."""
    if k == 1:
        return tf.reduce_max(scores, axis=-1, keepdims=True)
    return tf.math.top_k(scores, k).values[:, -1:]


def _top_p(scores, pool, top_p, min_tokens_to_keep: int) -> tf.Tensor:
    """HF's TopPLogitsWarper. `pool` int32 [B, N]: per row, token ids sorted by descending score that cover every
    finite score (None = the whole vocabulary, sorted here)."""
    if pool is None:
        ranked = tf.math.top_k(scores, scores.shape[-1]).values
    else:
        ranked = tf.gather(scores, pool, batch_dims=1)
    # HF sorts ascending and cumsums; walking from the smallest, mass "at or below" a token is its reverse cumsum.
    mass_at_or_below = tf.math.cumsum(tf.nn.softmax(ranked), axis=-1, reverse=True)
    kept = tf.reduce_sum(tf.cast(mass_at_or_below > 1.0 - top_p, tf.int32), axis=-1, keepdims=True)
    last_kept = tf.gather(ranked, tf.maximum(kept, min_tokens_to_keep) - 1, batch_dims=1)
    return drop_tokens(scores, (top_p < 1.0) & (scores < last_kept))


def _min_p(scores, min_p, min_tokens_to_keep: int) -> tf.Tensor:
    """HF's MinPLogitsWarper."""
    probs = tf.nn.softmax(scores)
    too_unlikely = probs < min_p * tf.reduce_max(probs, axis=-1, keepdims=True)
    return drop_tokens(scores, too_unlikely & (scores < _kth_largest(scores, min_tokens_to_keep)))


def _typical_p(scores, pool, mass, min_tokens_to_keep: int) -> tf.Tensor:
    """HF's TypicalLogitsWarper; `pool` as in `_top_p` (here only its membership matters)."""
    log_probs = tf.nn.log_softmax(scores)
    terms = log_probs * tf.exp(log_probs)
    entropy = -tf.reduce_sum(tf.where(tf.math.is_nan(terms), 0.0, terms), axis=-1, keepdims=True)
    surprise_gap = tf.abs(-log_probs - entropy)
    pool_gap, pool_scores = surprise_gap, scores
    if pool is not None:
        pool_gap = tf.gather(surprise_gap, pool, batch_dims=1)
        pool_scores = tf.gather(scores, pool, batch_dims=1)
    negative_sorted_gap, order = tf.math.top_k(-pool_gap, pool_gap.shape[-1])
    sorted_gap = -negative_sorted_gap
    cumulative = tf.math.cumsum(tf.nn.softmax(tf.gather(pool_scores, order, batch_dims=1)), axis=-1)
    last = tf.minimum(
        tf.reduce_sum(tf.cast(cumulative < mass, tf.int32), axis=-1, keepdims=True), pool_gap.shape[-1] - 1
    )
    protected_gap = sorted_gap[:, min_tokens_to_keep - 1 : min_tokens_to_keep]
    threshold = tf.maximum(tf.gather(sorted_gap, last, batch_dims=1), protected_gap)
    return drop_tokens(scores, (mass < 1.0) & (surprise_gap > threshold))


def _cutoff(scores, epsilon, min_tokens_to_keep: int, *, entropy_scaled: bool) -> tf.Tensor:
    """HF's EpsilonLogitsWarper, or with `entropy_scaled` its EtaLogitsWarper (eta = min(eps, sqrt(eps) e^-H))."""
    probs = tf.nn.softmax(scores)
    cut = epsilon
    if entropy_scaled:
        # torch's Categorical.entropy clamps -inf log-probs to the float minimum, so 0 * log 0 counts as 0.
        log_probs = tf.maximum(tf.nn.log_softmax(scores), np.finfo(np.float32).min)
        entropy = -tf.reduce_sum(probs * log_probs, axis=-1, keepdims=True)
        cut = tf.minimum(epsilon, tf.sqrt(epsilon) * tf.exp(-entropy))
    return drop_tokens(scores, (probs < cut) & (scores < _kth_largest(scores, min_tokens_to_keep)))


def _divide_by_temperature(scores: tf.Tensor, temperature: tf.Tensor) -> tf.Tensor:
    """HF's `scores / temperature` (float32 `[B, V]` by `[B, 1]`), except in rows where that overflows float32 (a
    temperature such as 1e-40): there HF's softmax turns NaN, and this divides `scores - row maximum` instead —
    the same distribution wherever both are defined, and the greedy limit (the top score 0, the rest -inf) where
    HF's is not."""
    divided = scores / temperature
    finite = tf.math.is_finite(scores)
    overflowed = tf.reduce_any(tf.math.is_inf(divided) & finite, axis=-1, keepdims=True)
    row_max = tf.reduce_max(tf.where(finite, scores, _NEG_INF), axis=-1, keepdims=True)
    return tf.where(overflowed, (scores - row_max) / temperature, divided)


def _when_any(asked: tf.Tensor, warp, scores: tf.Tensor) -> tf.Tensor:
    """`warp(scores)` when any row asks for it (`asked` bool `[B, 1]`), else `scores` unchanged. The sampling
    warpers are always in a sampling program (so switching them on is never a new program); this keeps a
    neutral top-p or typical-p at the cost of a test instead of a sort of the vocabulary."""
    return tf.cond(tf.reduce_any(asked), lambda: warp(scores), lambda: scores)


def apply_warpers(spec: ProcessorSpec, scores: tf.Tensor, knobs) -> tuple[tf.Tensor, tf.Tensor | None]:
    """HF's sampling warpers that `spec` enables, in HF order: temperature, top-k, top-p, min-p, typical-p,
    epsilon, eta, on `scores` float32 [B, V] (V static); `knobs` maps knob names to tensors or arrays.

    Where HF sorts, the kept sets match up to the order of exactly tied scores (which torch leaves unspecified).
    Returns (scores, the top-k candidate ids int32 [B, top_k_cap] when top-k ran over part of the vocabulary,
    else None).
    """
    vocab_size = scores.shape[-1]
    keep = spec.min_tokens_to_keep
    if spec.temperature:
        scores = _divide_by_temperature(scores, per_row_knob(knobs, "temperature"))

    def filter_distribution(scores, pool):
        if spec.top_p:
            top_p = per_row_knob(knobs, "top_p")
            scores = _when_any(top_p < 1.0, lambda scores: _top_p(scores, pool, top_p, keep), scores)
        if spec.min_p:
            min_p = per_row_knob(knobs, "min_p")
            scores = _when_any(min_p > 0.0, lambda scores: _min_p(scores, min_p, keep), scores)
        if spec.typical_p:
            mass = per_row_knob(knobs, "typical_p")
            scores = _when_any(mass < 1.0, lambda scores: _typical_p(scores, pool, mass, keep), scores)
        if spec.epsilon_cutoff:
            scores = _cutoff(scores, per_row_knob(knobs, "epsilon_cutoff"), keep, entropy_scaled=False)
        if spec.eta_cutoff:
            scores = _cutoff(scores, per_row_knob(knobs, "eta_cutoff"), keep, entropy_scaled=True)
        return scores

    if not spec.top_k:
        return filter_distribution(scores, None), None
    cap = spec.top_k_cap if 0 < spec.top_k_cap < vocab_size else vocab_size
    top_k = read_knob(knobs, "top_k", tf.int32)
    if cap == vocab_size:
        # The full ranking doubles as top-p's and typical-p's sorted pool, so it is always computed.
        top_values, candidates = tf.math.top_k(scores, cap)
    else:
        # Top-k is in every sampling program: when no row asks for it, skip the ranking (the -inf values drop
        # nothing, and the placeholder ids are never used: see the pool choice below and `apply_processors`).
        top_values, candidates = tf.cond(
            tf.reduce_any(top_k > 0),
            lambda: tuple(tf.math.top_k(scores, cap)),
            lambda: (tf.fill(tf.shape(scores[:, :cap]), _NEG_INF), tf.zeros_like(scores[:, :cap], tf.int32)),
        )
    kth = tf.gather(top_values, tf.clip_by_value(tf.maximum(top_k, keep), 1, cap)[:, None] - 1, batch_dims=1)
    scores = drop_tokens(scores, (top_k[:, None] > 0) & (scores < kth))
    if cap == vocab_size:
        return filter_distribution(scores, candidates), None
    if not (spec.top_p or spec.typical_p):
        return filter_distribution(scores, None), candidates
    # The candidates hold every finite score only when every row is top-k filtered; then the later sorts can
    # skip the rest of the vocabulary.
    scores = tf.cond(
        tf.reduce_all(top_k > 0),
        lambda: filter_distribution(scores, candidates),
        lambda: filter_distribution(scores, None),
    )
    return scores, candidates
