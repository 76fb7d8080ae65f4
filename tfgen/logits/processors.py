"""HF's logits processors as XLA-safe TF ops, numerically matching HF transformers 4.55.4's PyTorch ones, each declared
once (`tfgen.logits.spec.Processor`): the option it reads and when HF builds it, its run-time knobs and its function.

`PROCESSORS` is their order (HF's `GenerationMixin._get_logits_processor`), ahead of the caller's own
`logits_processor`s; the structured-output mask (`tfgen.logits.grammar`), the sampling warpers (`tfgen.logits.warpers`)
and `RENORMALIZE` come after those (`tfgen.logits.pipeline` runs them all).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS, padded_token_ids
from tfgen.logits.context import (
    NEG_INF,
    ProcessorContext,
    buffer_columns,
    current_length,
    drop_tokens,
    eos_mask,
    id_mask,
    only,
    per_row_knob,
    read_knob,
    token_counts,
    visible_columns,
)
from tfgen.logits.spec import (
    BuildEnv,
    Processor,
    finite_number,
    float_option,
    int_option,
    option,
    per_row,
    token_ids,
    token_ids_option,
    token_sequences,
    true_option,
    vocabulary_mask,
)
from tfgen.value_types import is_integer, is_real


def _bans(tokens: Callable) -> Callable:
    """An `apply` that drops the tokens `tokens(static, ctx, knobs, vocab_size)` (bool, broadcasting to [B, V])."""
    return lambda static, scores, ctx, knobs: drop_tokens(scores, tokens(static, ctx, knobs, scores.shape[-1]))


# ----------------------------------------------------------------------------------------------------------
# In-graph pieces


def _sequence_bias(ctx, sequences: tuple[tuple[int, ...], ...], biases: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """HF's SequenceBiasLogitsProcessor bias, float32 [B, V]: sequence s adds `biases[:, s]` to its last token in
    the rows whose visible tail equals its other tokens (length-1 sequences always; sequences longer than
    cur_len never)."""
    prefix_width = max(len(sequence) for sequence in sequences) - 1
    # Prefixes right-aligned in a [S, prefix_width] pattern; -1 marks "no token here, anything matches".
    pattern = np.full([len(sequences), prefix_width], -1, np.int32)
    for index, sequence in enumerate(sequences):
        pattern[index, prefix_width - len(sequence) + 1 :] = sequence[:-1]
    cur_len = current_length(ctx)
    end = ctx.start + cur_len
    tail = buffer_columns(ctx, end - prefix_width + tf.range(prefix_width))  # [B, prefix_width]
    matches = tf.reduce_all((tail[:, None, :] == pattern[None]) | (pattern < 0)[None], axis=-1)
    fits = tf.constant([[len(sequence) for sequence in sequences]], tf.int32) <= cur_len
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
    end = ctx.start + current_length(ctx)
    inside = (window_starts >= ctx.start) & (window_starts + ngram_size <= end)  # [W] or [B, W]
    last_tokens = buffer_columns(ctx, end - (ngram_size - 1) + tf.range(ngram_size - 1))  # [B, n-1]
    repeats = tf.reduce_all(windows[:, :, :-1] == last_tokens[:, None, :], axis=-1) & inside
    return token_counts(windows[:, :, -1], repeats, vocab_size) > 0


def _encoder_ngram_bans(ctx: ProcessorContext, ngram_size: int, vocab_size: int) -> tf.Tensor:
    """bool [B, V]: HF's EncoderNoRepeatNGram bans — the last token of every n-gram of the row's encoder input whose
    first n-1 tokens equal the last n-1 visible decoder tokens (none while fewer than n-1 are visible)."""
    encoder_ids = ctx.encoder_ids
    window_starts = tf.range(tf.maximum(tf.shape(encoder_ids)[1] - ngram_size + 1, 0))
    windows = tf.gather(encoder_ids, window_starts[:, None] + tf.range(ngram_size)[None, :], axis=1)  # [B, W, n]
    cur_len = current_length(ctx)
    end = ctx.start + cur_len
    last_tokens = buffer_columns(ctx, end - (ngram_size - 1) + tf.range(ngram_size - 1))  # [B, n-1]
    # Bucket columns hold -1, so a window reaching into them never matches decoder tokens.
    repeats = tf.reduce_all(windows[:, :, :-1] == last_tokens[:, None, :], axis=-1) & (cur_len >= ngram_size - 1)
    return token_counts(windows[:, :, -1], repeats & (windows[:, :, -1] >= 0), vocab_size) > 0


# ----------------------------------------------------------------------------------------------------------
# The processors, one declaration each


def _read_sequence_bias(config, env: BuildEnv):
    """HF's two `sequence_bias` forms ({(ids...): bias} or [[ids, bias], ...]) as {ids: bias}; later wins."""
    value = option(config, "sequence_bias")
    if value is None:
        return None
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
        bias = finite_number(bias, f"sequence_bias: the bias of {tuple(sequence)}")
        items[token_ids(list(sequence), "sequence_bias", env.vocab_size)] = bias
    return items


def _sequence_bias_knobs(value, batch_size: int, env: BuildEnv) -> dict:
    # One bias per biased sequence, in the static tuple's order (none when off: shape [B, 0]).
    biases = np.array(list((value or {}).values()), np.float32).reshape(1, -1)
    return {"sequence_bias": np.tile(biases, [batch_size, 1])}


def _apply_sequence_bias(static, scores, ctx, knobs):
    return scores + _sequence_bias(ctx, static, read_knob(knobs, "sequence_bias", tf.float32), scores.shape[-1])


def _apply_encoder_repetition_penalty(static, scores, ctx, knobs):
    # HF divides by the inverse penalty: a token of the encoder input becomes more likely (penalty > 1).
    inverse = tf.cast(1.0 / per_row_knob(knobs, "encoder_repetition_penalty", tf.float64), tf.float32)
    present = token_counts(ctx.encoder_ids, ctx.encoder_ids >= 0, scores.shape[-1]) > 0
    return tf.where(present, tf.where(scores < 0, scores * inverse, scores / inverse), scores)


def _apply_repetition_penalty(static, scores, ctx, knobs):
    penalty = per_row_knob(knobs, "repetition_penalty")

    def penalised(scores):
        visible = tf.broadcast_to(visible_columns(ctx), tf.shape(ctx.sequences))
        seen = token_counts(ctx.sequences, visible, scores.shape[-1])
        return tf.where(seen > 0, tf.where(scores < 0, scores * penalty, scores / penalty), scores)

    # In every program (a server switches it per request): skip the [B, V] count when no row asks for it.
    return tf.cond(tf.reduce_any(penalty != 1.0), lambda: penalised(scores), lambda: scores)


def _read_bad_words(config, env: BuildEnv):
    value = option(config, "bad_words_ids")
    if value is None:
        return None
    # HF drops bans of a lone eos token (they would keep a row from ever finishing).
    eos_alone = {(token,) for token in env.eos_ids}
    bad_words = tuple(s for s in token_sequences(value, "bad_words_ids", env.vocab_size) if s not in eos_alone)
    if not bad_words:
        raise ValueError("bad_words_ids only bans eos tokens, which are never banned: nothing is left")
    return bad_words


def _apply_bad_words(static, scores, ctx, knobs):
    always_banned = tf.fill([tf.shape(scores)[0], len(static)], NEG_INF)
    return scores + _sequence_bias(ctx, static, always_banned, scores.shape[-1])


def _apply_forced_bos(static, scores, ctx, knobs):
    bos = tf.range(scores.shape[-1]) == read_knob(knobs, "forced_bos_token_id", tf.int32)
    return tf.where(tf.equal(current_length(ctx), 1), only(bos)[None, :], scores)


def _apply_forced_eos(static, scores, ctx, knobs):
    last_step = tf.reshape(ctx.max_length, [-1, 1]) - 1 == current_length(ctx)
    forced = id_mask(read_knob(knobs, "forced_eos_token_ids", tf.int32), scores.shape[-1])
    return tf.where(last_step, only(forced)[None, :], scores)


def _apply_remove_invalid_values(static, scores, ctx, knobs):
    finfo = np.finfo(np.float32)
    scores = tf.where(tf.math.is_nan(scores), 0.0, scores)
    return tf.clip_by_value(scores, finfo.min, finfo.max)


def _read_decay(config, env: BuildEnv):
    decay = option(config, "exponential_decay_length_penalty")
    if decay is None:
        return None
    if not isinstance(decay, (list, tuple)) or len(decay) != 2:
        raise ValueError(f"exponential_decay_length_penalty must be (start_index, decay_factor), got {decay!r}")
    if not env.eos_ids:
        raise ValueError("exponential_decay_length_penalty needs an eos_token_id")
    start, factor = decay
    if not is_integer(start) or not 0 <= start < 2**31:
        raise ValueError(f"exponential_decay_length_penalty: start_index must be an integer in [0, 2**31), "
                         f"got {start!r}")
    if not is_real(factor) or not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"exponential_decay_length_penalty: decay_factor must be a finite number > 0, "
                         f"got {factor!r}")
    return int(start), float(factor)


def _decay_knobs(value, batch_size: int, env: BuildEnv) -> dict:
    start, factor = value or (0, 1.0)
    return {"exponential_decay_start": KNOBS["exponential_decay_start"].fill(batch_size, start),
            "exponential_decay_factor": KNOBS["exponential_decay_factor"].fill(batch_size, factor)}


def _apply_decay(static, scores, ctx, knobs):
    factor = per_row_knob(knobs, "exponential_decay_factor")
    steps_past = current_length(ctx) - ctx.prompt_len - per_row_knob(knobs, "exponential_decay_start", tf.int32)
    boost = tf.abs(scores) * (tf.pow(factor, tf.cast(steps_past, tf.float32)) - 1.0)
    # factor == 1 rows stay untouched (HF would turn an eos score of -inf into nan via inf * 0).
    return tf.where((steps_past > 0) & (factor != 1.0) & eos_mask(knobs, scores.shape[-1]), scores + boost, scores)


def _begin_suppressed(static, ctx, knobs, vocab_size):
    # HF: a forced BOS token (its knob >= 0) comes first when the prompt is a lone start token.
    forced_bos = read_knob(knobs, "forced_bos_token_id", tf.int32) >= 0
    begin_index = ctx.prompt_len + tf.cast((ctx.prompt_len <= 1) & forced_bos, tf.int32)
    suppressed = read_knob(knobs, "begin_suppress_tokens", tf.bool)[None, :]
    return tf.equal(current_length(ctx), begin_index) & suppressed


def _at_least(knob: str, since_prompt: bool) -> Callable:
    """Bans of eos while a row is shorter than the knob `knob` (counted from the prompt's end when `since_prompt`)."""

    def banned(static, ctx, knobs, vocab_size):
        length = current_length(ctx) - (ctx.prompt_len if since_prompt else 0)
        return (length < per_row_knob(knobs, knob, tf.int32)) & eos_mask(knobs, vocab_size)

    return banned


def _needs_eos(value, env: BuildEnv) -> bool:
    return value > 0 and bool(env.eos_ids)


#: HF's logits processors, in HF's order (before the caller's processors, the grammar mask and the warpers).
PROCESSORS: tuple[Processor, ...] = (
    Processor("sequence_bias", _read_sequence_bias, _apply_sequence_bias, static=lambda value, env: tuple(value),
              knobs=_sequence_bias_knobs),
    Processor("encoder_repetition_penalty", float_option("encoder_repetition_penalty", lambda v: v != 1.0),
              _apply_encoder_repetition_penalty,
              knobs=lambda value, batch, env: {} if value is None else per_row("encoder_repetition_penalty")(
                  value, batch, env)),
    Processor("repetition_penalty", float_option("repetition_penalty", lambda v: v != 1.0), _apply_repetition_penalty,
              knobs=per_row("repetition_penalty"), presence="always"),
    Processor("no_repeat_ngram_size", int_option("no_repeat_ngram_size", lambda v, env: v > 0),
              _bans(lambda static, ctx, knobs, vocab: _repeated_ngram_bans(ctx, static, vocab)),
              static=lambda value, env: value),
    Processor("encoder_no_repeat_ngram_size", int_option("encoder_no_repeat_ngram_size", lambda v, env: v > 0),
              _bans(lambda static, ctx, knobs, vocab: _encoder_ngram_bans(ctx, static, vocab)),
              static=lambda value, env: value),
    Processor("bad_words_ids", _read_bad_words, _apply_bad_words, static=lambda value, env: value),
    Processor("min_length", int_option("min_length", _needs_eos), _bans(_at_least("min_length", False)),
              knobs=per_row("min_length")),
    Processor("min_new_tokens", int_option("min_new_tokens", _needs_eos), _bans(_at_least("min_new_tokens", True)),
              knobs=per_row("min_new_tokens")),
    Processor("forced_bos_token_id",
              lambda config, env: None if option(config, "forced_bos_token_id") is None else token_ids(
                  [option(config, "forced_bos_token_id")], "forced_bos_token_id", env.vocab_size)[0],
              _apply_forced_bos,
              knobs=lambda value, batch, env: {"forced_bos_token_id": np.array(-1 if value is None else value,
                                                                               np.int32)}),
    Processor("forced_eos_token_id", token_ids_option("forced_eos_token_id"), _apply_forced_eos,
              knobs=lambda value, batch, env: {"forced_eos_token_ids": padded_token_ids(value)}),
    Processor("remove_invalid_values", true_option("remove_invalid_values"), _apply_remove_invalid_values),
    Processor("exponential_decay_length_penalty", _read_decay, _apply_decay, knobs=_decay_knobs),
    Processor("suppress_tokens", token_ids_option("suppress_tokens"),
              _bans(lambda static, ctx, knobs, vocab: read_knob(knobs, "suppress_tokens", tf.bool)[None, :]),
              knobs=vocabulary_mask("suppress_tokens")),
    Processor("begin_suppress_tokens", token_ids_option("begin_suppress_tokens"), _bans(_begin_suppressed),
              knobs=vocabulary_mask("begin_suppress_tokens")),
)

#: HF's `renormalize_logits`: a log-softmax after everything else.
RENORMALIZE = Processor("renormalize_logits", true_option("renormalize_logits"),
                        lambda static, scores, ctx, knobs: tf.nn.log_softmax(scores), stage="final")
