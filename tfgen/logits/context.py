"""What every in-graph logits processor reads: where HF's `input_ids` sits in the loop's token buffer
(`ProcessorContext`), the run-time knobs, and the few tensor helpers the processors, warpers and the grammar mask
share. Inside the graph there are no slices of run-time length, no Python branches on tensor values and no host round
trips: the token buffer is read through masks over its full width."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

NEG_INF = float("-inf")


class ProcessorContext(NamedTuple):
    """Where HF's `input_ids` lives in the decode loop's token buffer at the current step.

    sequences: int32 [B, L]. HF's `input_ids` == `sequences[:, start:start + cur_len]`; columns before `start`
        are extra left padding HF never sees, columns from `start + cur_len` on are unwritten (arbitrary ids).
    start: int32 scalar.
    cur_len: int32 scalar, HF's `input_ids.shape[-1]` (the padded prompt plus the tokens generated so far); or
        int32 [B], one per row, where rows stand at different lengths (speculative decoding verifies several
        positions of each row at once). User processors take a scalar only.
    prompt_len: int32 scalar, HF's `input_ids_seq_length` (the caller's padded prompt length).
    max_length: int32 [B], per-row HF `max_length` (prompt_len + that row's max_new_tokens).
    encoder_ids: int32 [B, S], HF's `encoder_input_ids`: an encoder-decoder model's encoder input, a decoder-only
        model's prompt (the caller's columns, their padding included; bucket columns hold -1, which matches no token).
    grammar_state: int32 [B], each row's structured-output automaton state, or `()` (no automaton).
    """

    sequences: tf.Tensor
    start: tf.Tensor
    cur_len: tf.Tensor
    prompt_len: tf.Tensor
    max_length: tf.Tensor
    encoder_ids: tf.Tensor
    grammar_state: object = ()


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


def eos_mask(knobs, vocab_size: int) -> tf.Tensor:
    """bool [1, V]: the eos ids of the `eos_token_ids` knob."""
    return id_mask(read_knob(knobs, "eos_token_ids", tf.int32), vocab_size)[None, :]


def drop_tokens(scores: tf.Tensor, removed: tf.Tensor) -> tf.Tensor:
    """`scores` float32 [B, V] with -inf where `removed` (bool, broadcasting to [B, V]) is true."""
    return tf.where(removed, NEG_INF, scores)


def only(mask: tf.Tensor) -> tf.Tensor:
    """Scores forcing the tokens of `mask`: 0 there, -inf elsewhere."""
    return tf.where(mask, 0.0, NEG_INF)


def token_counts(token_ids: tf.Tensor, counted: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """int32 [B, V]: per row, how many of `token_ids` int32 [B, N] with `counted` bool [B, N] hold each id."""
    batch_size, width = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], [batch_size, width])
    # Uncounted entries (unwritten buffer columns may hold anything) are redirected to id 0 with weight 0.
    columns = tf.where(counted, token_ids, 0)
    return tf.scatter_nd(tf.stack([rows, columns], axis=-1), tf.cast(counted, tf.int32), [batch_size, vocab_size])


def current_length(ctx: ProcessorContext) -> tf.Tensor:
    """`ctx.cur_len` as a scalar, or as a column [B, 1] when it is per row: either broadcasts against [B, V]."""
    cur_len = tf.convert_to_tensor(ctx.cur_len)
    return tf.reshape(cur_len, [-1, 1]) if cur_len.shape.rank == 1 else cur_len


def visible_columns(ctx: ProcessorContext) -> tf.Tensor:
    """bool [L] (or [B, L] with a per-row `cur_len`): the buffer columns HF's `input_ids` holds."""
    positions = tf.range(tf.shape(ctx.sequences)[1])
    return (positions >= ctx.start) & (positions < ctx.start + current_length(ctx))


def buffer_columns(ctx: ProcessorContext, positions: tf.Tensor) -> tf.Tensor:
    """sequences[:, positions] (positions [N], or [B, N] per row), with positions before the buffer clamped to column
    0 (callers mask those)."""
    return tf.gather(ctx.sequences, tf.maximum(positions, 0), axis=1, batch_dims=positions.shape.rank - 1)
