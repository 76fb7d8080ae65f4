"""XLA-safe logits processors and warpers, numerically matching HF transformers 4.55.4's PyTorch ones.

Which processors run (and in what order) follows HF's `GenerationMixin._get_logits_processor`. That choice,
plus a few sizes, is static (`ProcessorSpec`, part of the compiled program's cache key); every value that can
be a tensor is one (`knobs`, per row), so new values never recompile. Inside the graph there are no slices of
run-time length, no Python branches on tensor values and no host round trips: the token buffer is read through
masks over its full width, with `ProcessorContext` saying which columns HF's `input_ids` would hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

_NEG_INF = float("-inf")
_MIN_TOP_K_CAP = 64

# Options whose HF processors have no counterpart here (HF name -> is it set to a non-neutral value?).
_UNSUPPORTED_OPTIONS: dict[str, Callable[[Any], bool]] = {
    "guidance_scale": lambda value: value is not None and value != 1,
    "watermarking_config": lambda value: value is not None,
    "encoder_repetition_penalty": lambda value: value is not None and value != 1.0,
    "encoder_no_repeat_ngram_size": lambda value: value is not None and value > 0,
}


class ProcessorContext(NamedTuple):
    """Where HF's `input_ids` lives in the decode loop's token buffer at the current step.

    sequences: int32 [B, L]. HF's `input_ids` == `sequences[:, start:start + cur_len]`; columns before `start`
        are extra left padding HF never sees, columns from `start + cur_len` on are unwritten (arbitrary ids).
    start: int32 scalar.
    cur_len: int32 scalar, HF's `input_ids.shape[-1]` (the padded prompt plus the tokens generated so far).
    prompt_len: int32 scalar, HF's `input_ids_seq_length` (the caller's padded prompt length).
    max_length: int32 [B], per-row HF `max_length` (prompt_len + that row's max_new_tokens).
    """

    sequences: tf.Tensor
    start: tf.Tensor
    cur_len: tf.Tensor
    prompt_len: tf.Tensor
    max_length: tf.Tensor


@dataclass(frozen=True)
class ProcessorSpec:
    """Static part of the processor pipeline: which processors are active, plus the sizes that shape the graph.

    Boolean fields switch a processor on; its values come from the knobs (see `processor_knobs_from_config`). `sequence_bias` and `bad_words_ids` hold token-id sequences (the biases of
    `sequence_bias` are a knob; bad words always get -inf). `top_k_cap` is the static number of top-k candidates
    (0 = the whole vocabulary): a row asking for more keeps only `top_k_cap` tokens (plus ties with the last).
    """

    sequence_bias: tuple[tuple[int, ...], ...] = ()
    repetition_penalty: bool = False
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_length: bool = False
    min_new_tokens: bool = False
    forced_bos_token_id: bool = False
    forced_eos_token_id: bool = False
    remove_invalid_values: bool = False
    exponential_decay_length_penalty: bool = False
    suppress_tokens: bool = False
    begin_suppress_tokens: bool = False
    temperature: bool = False
    top_k: bool = False
    top_k_cap: int = 0
    top_p: bool = False
    min_p: bool = False
    typical_p: bool = False
    epsilon_cutoff: bool = False
    eta_cutoff: bool = False
    min_tokens_to_keep: int = 1
    renormalize_logits: bool = False


class LogitsProcessor:
    """Base class for user processors run inside the compiled loop, after the built-in ones, before the warpers.

    `__call__(input_ids, scores, cur_len)` gets the whole token buffer `input_ids` int32 [B, L], `scores`
    float32 [B, V] and `cur_len`, an int32 scalar tensor: the buffer index of the token being chosen (columns
    from `cur_len` on are unwritten). It returns float32 [B, V] and must use TF ops only (it is traced).
    """

    def __call__(self, input_ids: tf.Tensor, scores: tf.Tensor, cur_len: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(input_ids, scores, cur_len)")


# ----------------------------------------------------------------------------------------------------------
# Reading a config


def _option(config, name: str) -> Any:
    return getattr(config, name, None)


def _token_ids(value, name: str, vocab_size: int) -> tuple[int, ...]:
    """An int / list of ints / None as a tuple of ids, each checked to be in [0, vocab_size)."""
    if value is None:
        return ()
    ids = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got {value!r}")
    return tuple(int(i) for i in ids)


def _positive_int(value, name: str) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _token_sequences(value, name: str, vocab_size: int) -> list[tuple[int, ...]]:
    """A list of non-empty token-id lists as a de-duplicated list of tuples (first occurrence order)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be a non-empty list of lists of token ids, got {value!r}")
    sequences = []
    for sequence in value:
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise ValueError(f"{name} must be a non-empty list of non-empty lists of token ids, got {value!r}")
        sequences.append(_token_ids(list(sequence), name, vocab_size))
    return list(dict.fromkeys(sequences))


def _sequence_bias_items(value, vocab_size: int) -> dict[tuple[int, ...], float]:
    """HF's two `sequence_bias` forms ({(ids...): bias} or [[ids, bias], ...]) as {ids: bias}; later wins."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        pairs = [tuple(pair) for pair in value]
    else:
        raise ValueError(f"sequence_bias must be a dict {{(ids...): bias}} or a list of [ids, bias], got {value!r}")
    if not pairs:
        raise ValueError("sequence_bias must not be empty")
    items = {}
    for sequence, bias in pairs:
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise ValueError(f"sequence_bias keys must be non-empty token-id sequences, got {sequence!r}")
        items[_token_ids(list(sequence), "sequence_bias", vocab_size)] = float(bias)
    return items


_WARPERS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")

# name: (HF builds the processor when, the value is valid when, the valid range in words)
_FLOAT_OPTIONS: dict[str, tuple[Callable[[float], bool], Callable[[float], bool], str]] = {
    "repetition_penalty": (lambda v: v != 1.0, lambda v: v > 0, "> 0"),
    "temperature": (lambda v: v != 1.0, lambda v: v > 0, "> 0 (use do_sample=False for greedy decoding)"),
    "top_p": (lambda v: v < 1.0, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "min_p": (lambda v: True, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "typical_p": (lambda v: v < 1.0, lambda v: 0 < v < 1, "in (0, 1)"),
    "epsilon_cutoff": (lambda v: 0 < v < 1, lambda v: True, ""),
    "eta_cutoff": (lambda v: 0 < v < 1, lambda v: True, ""),
}


def _active_options(config, vocab_size: int) -> dict[str, Any]:
    """Each supported option's validated value when HF's `_get_logits_processor` would build its processor
    (ignoring `do_sample`, which only gates the warpers), else None. Like HF, warper values are only
    validated with `do_sample`."""
    for name, is_set in _UNSUPPORTED_OPTIONS.items():
        if is_set(_option(config, name)):
            raise ValueError(f"{name}={_option(config, name)!r} is not supported by tfgen's logits processors")
    do_sample = bool(_option(config, "do_sample"))
    eos = _token_ids(_option(config, "eos_token_id"), "eos_token_id", vocab_size)
    active: dict[str, Any] = {"eos_token_id": eos}

    for name, (builds, valid, valid_range) in _FLOAT_OPTIONS.items():
        value = _option(config, name)
        active[name] = None if value is None or not builds(value) else float(value)
        if active[name] is not None and (do_sample or name not in _WARPERS) and not valid(value):
            raise ValueError(f"{name} must be {valid_range}, got {value!r}")
    for name in ("no_repeat_ngram_size", "min_length", "min_new_tokens", "top_k"):
        value = _option(config, name)
        builds = value is not None and (value != 0 if name == "top_k" else value > 0)
        if name in ("min_length", "min_new_tokens"):
            builds = builds and bool(eos)
        checked = do_sample or name not in _WARPERS
        active[name] = (_positive_int(value, name) if checked else int(value)) if builds else None
    for name in ("forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens"):
        value = _option(config, name)
        active[name] = None if value is None else _token_ids(value, name, vocab_size)
    forced_bos = _option(config, "forced_bos_token_id")
    active["forced_bos_token_id"] = (
        None if forced_bos is None else _token_ids([forced_bos], "forced_bos_token_id", vocab_size)[0]
    )
    for name in ("remove_invalid_values", "renormalize_logits"):
        active[name] = True if _option(config, name) is True else None

    bias = _option(config, "sequence_bias")
    active["sequence_bias"] = None if bias is None else _sequence_bias_items(bias, vocab_size)
    bad_words = _option(config, "bad_words_ids")
    if bad_words is not None:
        # HF drops bans of a lone eos token (they would keep a row from ever finishing).
        eos_alone = {(token,) for token in eos}
        bad_words = tuple(s for s in _token_sequences(bad_words, "bad_words_ids", vocab_size) if s not in eos_alone)
        if not bad_words:
            raise ValueError("bad_words_ids only bans eos tokens, which are never banned: nothing is left")
    active["bad_words_ids"] = bad_words
    decay = _option(config, "exponential_decay_length_penalty")
    if decay is not None:
        if not isinstance(decay, (list, tuple)) or len(decay) != 2:
            raise ValueError(f"exponential_decay_length_penalty must be (start_index, decay_factor), got {decay!r}")
        if not eos:
            raise ValueError("exponential_decay_length_penalty needs an eos_token_id")
        decay = (int(decay[0]), float(decay[1]))
    active["exponential_decay_length_penalty"] = decay
    return active


def processor_spec_from_config(config, vocab_size: int, *, num_beams: int = 1) -> ProcessorSpec:
    """The static processor pipeline HF 4.55.4's `_get_logits_processor` builds for `config` (HF attribute
    names; `eos_token_id` int, list or None). Warpers only with `do_sample`; beam sampling sets HF's
    min_tokens_to_keep (number of eos ids + 1). Raises ValueError for unsupported options or invalid values."""
    active = _active_options(config, vocab_size)
    do_sample = bool(_option(config, "do_sample"))
    is_on = lambda name: active[name] is not None and (do_sample or name not in _WARPERS)  # noqa: E731
    min_tokens_to_keep = 1
    # Only the warpers read it, so it stays 1 (one program key) unless sampling: HF keeps a non-eos
    # continuation alive for every sampled beam.
    if num_beams > 1 and do_sample:
        min_tokens_to_keep = len(active["eos_token_id"]) + 1 if active["eos_token_id"] else 2
    top_k_cap = 0
    if is_on("top_k"):
        wanted = max(active["top_k"], min_tokens_to_keep, _MIN_TOP_K_CAP)
        top_k_cap = 1 << (wanted - 1).bit_length()
        top_k_cap = 0 if top_k_cap >= vocab_size else top_k_cap
    return ProcessorSpec(
        sequence_bias=tuple(active["sequence_bias"] or ()),
        no_repeat_ngram_size=active["no_repeat_ngram_size"] or 0,
        bad_words_ids=active["bad_words_ids"] or (),
        top_k_cap=top_k_cap,
        min_tokens_to_keep=min_tokens_to_keep,
        **{
            name: is_on(name)
            for name in (
                "repetition_penalty", "min_length", "min_new_tokens", "forced_bos_token_id", "forced_eos_token_id",
                "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
                "begin_suppress_tokens", "renormalize_logits", *_WARPERS,
            )
        },
    )


def processor_knobs_from_config(config, batch_size: int, vocab_size: int) -> dict[str, np.ndarray]:
    """The run-time values of every processor, as numpy arrays (neutral where the option is off).

    Per-row [batch_size]: temperature, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff, repetition_penalty,
    exponential_decay_factor (float32; neutral 1, 1, 0, 1, 0, 0, 1, 1) and top_k, min_length, min_new_tokens,
    exponential_decay_start (int32; neutral 0). sequence_bias float32 [batch_size, S] (S = number of biased
    sequences, in `ProcessorSpec.sequence_bias` order). Token ids: eos_token_ids and forced_eos_token_ids int32
    [E] (E a positive multiple of 4; -1 pads and never matches), forced_bos_token_id int32 scalar (-1 = none),
    suppress_tokens and begin_suppress_tokens bool [vocab_size] masks.
    """
    active = _active_options(config, vocab_size)

    def rows(name, neutral, dtype=np.float32):
        value = active[name]
        return np.full([batch_size], neutral if value is None else value, dtype)

    def ids(values):
        # Padded to a multiple of 4 so that configs with 1-4 ids share one knob shape (and one program).
        values = list(values or ())
        padded = np.full([max(4, -(-len(values) // 4) * 4)], -1, np.int32)
        padded[: len(values)] = values
        return padded

    def vocab_mask(values):
        mask = np.zeros([vocab_size], bool)
        mask[list(values or ())] = True
        return mask

    decay_start, decay_factor = active["exponential_decay_length_penalty"] or (0, 1.0)
    bias = active["sequence_bias"] or {}
    return {
        "temperature": rows("temperature", 1.0),
        "top_k": rows("top_k", 0, np.int32),
        "top_p": rows("top_p", 1.0),
        "min_p": rows("min_p", 0.0),
        "typical_p": rows("typical_p", 1.0),
        "epsilon_cutoff": rows("epsilon_cutoff", 0.0),
        "eta_cutoff": rows("eta_cutoff", 0.0),
        "repetition_penalty": rows("repetition_penalty", 1.0),
        "min_length": rows("min_length", 0, np.int32),
        "min_new_tokens": rows("min_new_tokens", 0, np.int32),
        "exponential_decay_start": np.full([batch_size], decay_start, np.int32),
        "exponential_decay_factor": np.full([batch_size], decay_factor, np.float32),
        "sequence_bias": np.tile(np.array(list(bias.values()), np.float32).reshape(1, -1), [batch_size, 1]),
        "eos_token_ids": ids(active["eos_token_id"]),
        "forced_bos_token_id": np.array(
            -1 if active["forced_bos_token_id"] is None else active["forced_bos_token_id"], np.int32
        ),
        "forced_eos_token_ids": ids(active["forced_eos_token_id"]),
        "suppress_tokens": vocab_mask(active["suppress_tokens"]),
        "begin_suppress_tokens": vocab_mask(active["begin_suppress_tokens"]),
    }


# ----------------------------------------------------------------------------------------------------------
# In-graph processors


def _knob(knobs, name: str, dtype) -> tf.Tensor:
    if name not in knobs:
        raise ValueError(f"knobs is missing {name!r}, which an enabled processor needs")
    return tf.cast(knobs[name], dtype)


def _per_row(knobs, name: str, dtype=tf.float32) -> tf.Tensor:
    """A per-row knob [B] as a column [B, 1] that broadcasts against scores [B, V]."""
    return tf.reshape(_knob(knobs, name, dtype), [-1, 1])


def _id_mask(token_ids: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """bool [V]: which vocabulary entries appear in `token_ids` int32 [N] (-1 entries match nothing)."""
    return tf.reduce_any(tf.range(vocab_size)[:, None] == token_ids[None, :], axis=1)


def _only(mask: tf.Tensor) -> tf.Tensor:
    """Scores forcing the tokens of `mask`: 0 there, -inf elsewhere."""
    return tf.where(mask, 0.0, _NEG_INF)


def _token_counts(token_ids: tf.Tensor, counted: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """int32 [B, V]: per row, how many of `token_ids` int32 [B, N] with `counted` bool [B, N] hold each id."""
    batch_size, width = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], [batch_size, width])
    # Uncounted entries (unwritten buffer columns may hold anything) are redirected to id 0 with weight 0.
    columns = tf.where(counted, token_ids, 0)
    return tf.scatter_nd(tf.stack([rows, columns], axis=-1), tf.cast(counted, tf.int32), [batch_size, vocab_size])


def _visible(ctx: ProcessorContext) -> tf.Tensor:
    """bool [L]: the buffer columns HF's `input_ids` holds."""
    positions = tf.range(tf.shape(ctx.sequences)[1])
    return (positions >= ctx.start) & (positions < ctx.start + ctx.cur_len)


def _buffer_columns(ctx: ProcessorContext, positions: tf.Tensor) -> tf.Tensor:
    """sequences[:, positions], with positions before the buffer clamped to column 0 (callers mask those)."""
    return tf.gather(ctx.sequences, tf.maximum(positions, 0), axis=1)


def _sequence_bias(ctx, sequences: tuple[tuple[int, ...], ...], biases: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """HF's SequenceBiasLogitsProcessor bias, float32 [B, V]: sequence s adds `biases[:, s]` to its last token in
    the rows whose visible tail equals its other tokens (length-1 sequences always; sequences longer than
    cur_len never)."""
    prefix_width = max(len(sequence) for sequence in sequences) - 1
    # Prefixes right-aligned in a [S, prefix_width] pattern; -1 marks "no token here, anything matches".
    pattern = np.full([len(sequences), prefix_width], -1, np.int32)
    for index, sequence in enumerate(sequences):
        pattern[index, prefix_width - len(sequence) + 1 :] = sequence[:-1]
    end = ctx.start + ctx.cur_len
    tail = _buffer_columns(ctx, end - prefix_width + tf.range(prefix_width))  # [B, prefix_width]
    matches = tf.reduce_all((tail[:, None, :] == pattern[None]) | (pattern < 0)[None], axis=-1)
    fits = tf.constant([[len(sequence) for sequence in sequences]], tf.int32) <= ctx.cur_len
    applied = tf.where(matches & fits, biases, 0.0)  # [B, S]
    batch_size = tf.shape(applied)[0]
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], tf.shape(applied))
    last_tokens = tf.broadcast_to(np.array([s[-1] for s in sequences], np.int32)[None, :], tf.shape(applied))
    # scatter_nd sums duplicates, as HF's `bias[:, last_token] +=` does for sequences sharing a last token.
    return tf.scatter_nd(tf.stack([rows, last_tokens], axis=-1), applied, [batch_size, vocab_size])


def _repeated_ngram_bans(ctx: ProcessorContext, ngram_size: int, vocab_size: int) -> tf.Tensor:
    """bool [B, V]: HF's NoRepeatNGram bans — the last token of every visible n-gram whose first n-1 tokens
    equal the last n-1 visible tokens."""
    window_starts = tf.range(tf.maximum(tf.shape(ctx.sequences)[1] - ngram_size + 1, 0))
    windows = tf.gather(ctx.sequences, window_starts[:, None] + tf.range(ngram_size)[None, :], axis=1)  # [B, W, n]
    end = ctx.start + ctx.cur_len
    inside = (window_starts >= ctx.start) & (window_starts + ngram_size <= end)
    last_tokens = _buffer_columns(ctx, end - (ngram_size - 1) + tf.range(ngram_size - 1))  # [B, n-1]
    repeats = tf.reduce_all(windows[:, :, :-1] == last_tokens[:, None, :], axis=-1) & inside[None, :]
    return _token_counts(windows[:, :, -1], repeats, vocab_size) > 0


def _kth_largest(scores: tf.Tensor, k: int) -> tf.Tensor:
    """[B, 1]: each row's k-th largest score (k static)."""
    if k == 1:
        return tf.reduce_max(scores, axis=-1, keepdims=True)
    return tf.math.top_k(scores, k).values[:, -1:]


def _drop(scores: tf.Tensor, removed: tf.Tensor) -> tf.Tensor:
    return tf.where(removed, _NEG_INF, scores)


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
    return _drop(scores, (top_p < 1.0) & (scores < last_kept))


def _min_p(scores, min_p, min_tokens_to_keep: int) -> tf.Tensor:
    """HF's MinPLogitsWarper."""
    probs = tf.nn.softmax(scores)
    too_unlikely = probs < min_p * tf.reduce_max(probs, axis=-1, keepdims=True)
    return _drop(scores, too_unlikely & (scores < _kth_largest(scores, min_tokens_to_keep)))


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
    return _drop(scores, (mass < 1.0) & (surprise_gap > threshold))


def _cutoff(scores, epsilon, min_tokens_to_keep: int, *, entropy_scaled: bool) -> tf.Tensor:
    """HF's EpsilonLogitsWarper, or with `entropy_scaled` its EtaLogitsWarper (eta = min(eps, sqrt(eps) e^-H))."""
    probs = tf.nn.softmax(scores)
    cut = epsilon
    if entropy_scaled:
        # torch's Categorical.entropy clamps -inf log-probs to the float minimum, so 0 * log 0 counts as 0.
        log_probs = tf.maximum(tf.nn.log_softmax(scores), np.finfo(np.float32).min)
        entropy = -tf.reduce_sum(probs * log_probs, axis=-1, keepdims=True)
        cut = tf.minimum(epsilon, tf.sqrt(epsilon) * tf.exp(-entropy))
    return _drop(scores, (probs < cut) & (scores < _kth_largest(scores, min_tokens_to_keep)))


def _apply_warpers(spec: ProcessorSpec, scores: tf.Tensor, knobs) -> tuple[tf.Tensor, tf.Tensor | None]:
    """HF's sampling warpers, in HF order: temperature, top-k, top-p, min-p, typical-p, epsilon, eta.

    Where HF sorts, the kept sets match up to the order of exactly tied scores (which torch leaves unspecified).
    Returns (scores, the top-k candidate ids int32 [B, top_k_cap] when top-k ran over part of the vocabulary,
    else None).
    """
    vocab_size = scores.shape[-1]
    keep = spec.min_tokens_to_keep
    if spec.temperature:
        scores = scores / _per_row(knobs, "temperature")

    def filter_distribution(scores, pool):
        if spec.top_p:
            scores = _top_p(scores, pool, _per_row(knobs, "top_p"), keep)
        if spec.min_p:
            scores = _min_p(scores, _per_row(knobs, "min_p"), keep)
        if spec.typical_p:
            scores = _typical_p(scores, pool, _per_row(knobs, "typical_p"), keep)
        if spec.epsilon_cutoff:
            scores = _cutoff(scores, _per_row(knobs, "epsilon_cutoff"), keep, entropy_scaled=False)
        if spec.eta_cutoff:
            scores = _cutoff(scores, _per_row(knobs, "eta_cutoff"), keep, entropy_scaled=True)
        return scores

    if not spec.top_k:
        return filter_distribution(scores, None), None
    cap = spec.top_k_cap if 0 < spec.top_k_cap < vocab_size else vocab_size
    top_values, candidates = tf.math.top_k(scores, cap)
    top_k = _knob(knobs, "top_k", tf.int32)
    kth = tf.gather(top_values, tf.clip_by_value(tf.maximum(top_k, keep), 1, cap)[:, None] - 1, batch_dims=1)
    scores = _drop(scores, (top_k[:, None] > 0) & (scores < kth))
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


def _check_user_processors(user_processors) -> tuple:
    user_processors = tuple(user_processors or ())
    for processor in user_processors:
        if isinstance(processor, type) or not callable(processor):
            raise TypeError(
                "logits_processor entries must be LogitsProcessor instances or callables "
                f"(input_ids, scores, cur_len) -> scores, got {processor!r}"
            )
    return user_processors


class SamplingCandidates(NamedTuple):
    """The tokens a draw from processed scores can pick, when top-k filtering narrows them down.

    ids: int32 [B, top_k_cap], per row the ids of its `top_k_cap` best scores, in ascending id order (so a
        cumulative sum over them runs in vocabulary order).
    complete: bool scalar, whether `ids` hold every finite score of every row (false when some row keeps more,
        e.g. no top-k for that row or ties at the cut). Only then may a sampler ignore the other columns.
    """

    ids: tf.Tensor
    complete: tf.Tensor


def apply_processors(
    spec: ProcessorSpec,
    scores: tf.Tensor,
    ctx: ProcessorContext,
    knobs,
    user_processors: Sequence[Callable] = (),
    *,
    return_candidates: bool = False,
):
    """Runs the pipeline `spec` describes on next-token `scores` float32 [B, V] (V static), in HF's order:
    built-in processors, then `user_processors` (called as `(ctx.sequences, scores, ctx.start + ctx.cur_len)`),
    then the warpers, then `renormalize_logits`. `knobs` maps knob names (see `processor_knobs_from_config`) to
    tensors or arrays; only the enabled processors' knobs are read. Returns float32 [B, V]; with
    `return_candidates`, `(scores, SamplingCandidates or None)` — None unless top-k ran over part of the
    vocabulary — so that sampling can draw from `top_k_cap` columns instead of all V."""
    user_processors = _check_user_processors(user_processors)
    scores = tf.convert_to_tensor(scores, tf.float32)
    vocab_size = scores.shape[-1]
    if vocab_size is None:
        raise ValueError("scores must have a static vocabulary dimension")
    cur_len = ctx.cur_len
    eos_mask = lambda: _id_mask(_knob(knobs, "eos_token_ids", tf.int32), vocab_size)[None, :]  # noqa: E731

    if spec.sequence_bias:
        biases = _knob(knobs, "sequence_bias", tf.float32)
        scores = scores + _sequence_bias(ctx, spec.sequence_bias, biases, vocab_size)
    if spec.repetition_penalty:
        penalty = _per_row(knobs, "repetition_penalty")
        seen = _token_counts(ctx.sequences, tf.broadcast_to(_visible(ctx), tf.shape(ctx.sequences)), vocab_size) > 0
        scores = tf.where(seen, tf.where(scores < 0, scores * penalty, scores / penalty), scores)
    if spec.no_repeat_ngram_size:
        scores = _drop(scores, _repeated_ngram_bans(ctx, spec.no_repeat_ngram_size, vocab_size))
    if spec.bad_words_ids:
        always_banned = tf.fill([tf.shape(scores)[0], len(spec.bad_words_ids)], _NEG_INF)
        scores = scores + _sequence_bias(ctx, spec.bad_words_ids, always_banned, vocab_size)
    if spec.min_length:
        scores = _drop(scores, (cur_len < _per_row(knobs, "min_length", tf.int32)) & eos_mask())
    if spec.min_new_tokens:
        scores = _drop(scores, (cur_len - ctx.prompt_len < _per_row(knobs, "min_new_tokens", tf.int32)) & eos_mask())
    if spec.forced_bos_token_id:
        bos = tf.range(vocab_size) == _knob(knobs, "forced_bos_token_id", tf.int32)
        scores = tf.where(tf.equal(cur_len, 1), _only(bos)[None, :], scores)
    if spec.forced_eos_token_id:
        last_step = tf.reshape(ctx.max_length, [-1, 1]) - 1 == cur_len
        forced = _id_mask(_knob(knobs, "forced_eos_token_ids", tf.int32), vocab_size)
        scores = tf.where(last_step, _only(forced)[None, :], scores)
    if spec.remove_invalid_values:
        finfo = np.finfo(np.float32)
        scores = tf.where(tf.math.is_nan(scores), 0.0, scores)
        scores = tf.clip_by_value(scores, finfo.min, finfo.max)
    if spec.exponential_decay_length_penalty:
        factor = _per_row(knobs, "exponential_decay_factor")
        steps_past = cur_len - ctx.prompt_len - _per_row(knobs, "exponential_decay_start", tf.int32)
        boost = tf.abs(scores) * (tf.pow(factor, tf.cast(steps_past, tf.float32)) - 1.0)
        # factor == 1 rows stay untouched (HF would turn an eos score of -inf into nan via inf * 0).
        scores = tf.where((steps_past > 0) & (factor != 1.0) & eos_mask(), scores + boost, scores)
    if spec.suppress_tokens:
        scores = _drop(scores, _knob(knobs, "suppress_tokens", tf.bool)[None, :])
    if spec.begin_suppress_tokens:
        begin_index = ctx.prompt_len
        if spec.forced_bos_token_id:  # HF: the forced BOS token comes first when the prompt is a lone start token
            begin_index += tf.cast(ctx.prompt_len <= 1, tf.int32)
        suppressed = _knob(knobs, "begin_suppress_tokens", tf.bool)[None, :]
        scores = _drop(scores, tf.equal(cur_len, begin_index) & suppressed)

    for processor in user_processors:
        scores = tf.convert_to_tensor(processor(ctx.sequences, scores, ctx.start + cur_len), tf.float32)

    scores, candidates = _apply_warpers(spec, scores, knobs)
    if spec.renormalize_logits:
        scores = tf.nn.log_softmax(scores)
    if not return_candidates:
        return scores
    if candidates is None:
        return scores, None
    # Every finite score ranks among the top `cap` exactly when a row has at most `cap` of them.
    finite_counts = tf.reduce_sum(tf.cast(scores > _NEG_INF, tf.int32), axis=-1)
    complete = tf.reduce_all(finite_counts <= candidates.shape[-1])
    return scores, SamplingCandidates(tf.sort(candidates, axis=-1), complete)
