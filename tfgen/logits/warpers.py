"""HF's sampling warpers as XLA-safe TF ops, numerically matching HF transformers 4.55.4's PyTorch ones, each declared
once (`tfgen.logits.spec.Processor`, stage "warper"): TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper, TypicalLogitsWarper, EpsilonLogitsWarper and EtaLogitsWarper, in `WARPERS`' order (HF's), run by
`apply_warpers` after the logits processors. Their values are per-row knobs (`tfgen.config.knobs`, `warper=True`), so
new values never recompile; which warpers run and the top-k candidate count are static (`ProcessorSpec`).

A warper's `apply` is `(static, scores, knobs, pool, keep)`: `pool` int32 `[B, N]` is, per row, token ids sorted by
descending score covering every finite score (None: the whole vocabulary), `keep` HF's `min_tokens_to_keep`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfgen.logits.context import NEG_INF, drop_tokens, per_row_knob, read_knob
from tfgen.logits.spec import BuildEnv, Processor, ProcessorSpec, float_option, int_option, per_row

# The smallest static top-k candidate count (a power of two); see `ProcessorSpec.top_k_cap`.
_MIN_TOP_K_CAP = 64


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
    row_max = tf.reduce_max(tf.where(finite, scores, NEG_INF), axis=-1, keepdims=True)
    return tf.where(overflowed, (scores - row_max) / temperature, divided)


def _when_any(asked: tf.Tensor, warp, scores: tf.Tensor) -> tf.Tensor:
    """`warp(scores)` when any row asks for it (`asked` bool `[B, 1]`), else `scores` unchanged. The sampling
    warpers are always in a sampling program (so switching them on is never a new program); this keeps a
    neutral top-p or typical-p at the cost of a test instead of a sort of the vocabulary."""
    return tf.cond(tf.reduce_any(asked), lambda: warp(scores), lambda: scores)


def _top_k_cap(value, env: BuildEnv) -> int:
    """The static top-k candidate count: the next power of two of the larger of top_k, min_tokens_to_keep and 64, so
    top-k values share a program within a power-of-two cap; 0 (the whole vocabulary) when it reaches the vocabulary."""
    wanted = max(value or 0, env.min_tokens_to_keep, _MIN_TOP_K_CAP)
    cap = 1 << (wanted - 1).bit_length()
    return 0 if cap >= env.vocab_size else cap


def _filter(name: str, asked: Callable, warp: Callable) -> Callable:
    """An `apply` running `warp(scores, pool, knob column, keep)` only when some row's knob value is `asked` (a
    neutral value in every row skips its sort, see `_when_any`)."""

    def apply(static, scores, knobs, pool, keep):
        value = per_row_knob(knobs, name)
        return _when_any(asked(value), lambda scores: warp(scores, pool, value, keep), scores)

    return apply


def _cutoff_apply(name: str, entropy_scaled: bool):
    return lambda static, scores, knobs, pool, keep: _cutoff(scores, per_row_knob(knobs, name), keep,
                                                               entropy_scaled=entropy_scaled)


def _warper(name: str, read, apply, presence: str = "sampling", **options) -> Processor:
    return Processor(name, read, apply, knobs=per_row(name), presence=presence, stage="warper", **options)


TEMPERATURE = _warper("temperature", float_option("temperature", lambda v: v != 1.0),
                      lambda static, scores, knobs, pool, keep: _divide_by_temperature(
                          scores, per_row_knob(knobs, "temperature")))
#: Its `apply` is unused: `apply_warpers` ranks the candidates itself (their ids become the other warpers' pool).
TOP_K = _warper("top_k", int_option("top_k", lambda v, env: v != 0), None, static=_top_k_cap)
TOP_P = _warper("top_p", float_option("top_p", lambda v: v < 1.0),
                _filter("top_p", lambda v: v < 1.0, _top_p))
MIN_P = _warper("min_p", float_option("min_p", lambda v: True),
                _filter("min_p", lambda v: v > 0.0, lambda scores, pool, min_p, keep: _min_p(scores, min_p, keep)))
TYPICAL_P = _warper("typical_p", float_option("typical_p", lambda v: v < 1.0),
                    _filter("typical_p", lambda v: v < 1.0, _typical_p))
EPSILON_CUTOFF = _warper("epsilon_cutoff", float_option("epsilon_cutoff", lambda v: 0 < v < 1),
                         _cutoff_apply("epsilon_cutoff", False), presence="built")
ETA_CUTOFF = _warper("eta_cutoff", float_option("eta_cutoff", lambda v: 0 < v < 1),
                     _cutoff_apply("eta_cutoff", True), presence="built")

#: The sampling warpers, in HF's order.
WARPERS: tuple[Processor, ...] = (TEMPERATURE, TOP_K, TOP_P, MIN_P, TYPICAL_P, EPSILON_CUTOFF, ETA_CUTOFF)
# What runs after top-k, in order; top-p and typical-p sort, and read top-k's candidates as their pool.
_FILTERS = WARPERS[2:]
_POOL_USERS = ("top_p", "typical_p")


def apply_warpers(spec: ProcessorSpec, scores: tf.Tensor, knobs) -> tuple[tf.Tensor, tf.Tensor | None]:
    """HF's sampling warpers that `spec` enables, in HF order: temperature, top-k, top-p, min-p, typical-p,
    epsilon, eta, on `scores` float32 [B, V] (V static); `knobs` maps knob names to tensors or arrays.

    Where HF sorts, the kept sets match up to the order of exactly tied scores (which torch leaves unspecified).
    Returns (scores, the top-k candidate ids int32 [B, top_k_cap] when top-k ran over part of the vocabulary,
    else None).
    """
    vocab_size = scores.shape[-1]
    keep = spec.min_tokens_to_keep
    if spec.is_on(TEMPERATURE.name):
        scores = TEMPERATURE.apply(True, scores, knobs, None, keep)

    def filter_distribution(scores, pool):
        for warper in _FILTERS:
            if spec.is_on(warper.name):
                scores = warper.apply(spec.static(warper.name), scores, knobs, pool, keep)
        return scores

    if not spec.is_on(TOP_K.name):
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
            lambda: (tf.fill(tf.shape(scores[:, :cap]), NEG_INF), tf.zeros_like(scores[:, :cap], tf.int32)),
        )
    kth = tf.gather(top_values, tf.clip_by_value(tf.maximum(top_k, keep), 1, cap)[:, None] - 1, batch_dims=1)
    scores = drop_tokens(scores, (top_k[:, None] > 0) & (scores < kth))
    if cap == vocab_size:
        return filter_distribution(scores, candidates), None
    if not any(spec.is_on(name) for name in _POOL_USERS):
        return filter_distribution(scores, None), candidates
    # The candidates hold every finite score only when every row is top-k filtered; then the later sorts can
    # skip the rest of the vocabulary.
    scores = tf.cond(
        tf.reduce_all(top_k > 0),
        lambda: filter_distribution(scores, candidates),
        lambda: filter_distribution(scores, None),
    )
    return scores, candidates
