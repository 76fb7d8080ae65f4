"""Pieces every decoding loop shares: the loop inputs, the prefill, token selection and buffer writes."""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfgen.random import uniform_per_row


class DecodeInputs(NamedTuple):
    """The run-time tensors of one compiled generate call (all have a static shape inside the program).

    input_ids, attention_mask: int32 `[B, T]`, left padded (the columns before `start` are bucket padding).
    start: int32 scalar, buffer index where the caller's prompt begins.
    prompt_len: int32 scalar, the caller's padded prompt length (HF's `input_ids.shape[-1]`).
    max_new_tokens: int32 `[B]`, each row's budget of new tokens (0 for bucket-padding rows).
    row_seeds: int32 `[B, 2]`, each row's sampling key.
    pad_token_id: int32 scalar. eos_token_ids: int32 `[E]` (-1 entries never match).
    knobs: dict of processor values (see `tfgen.processors`), per row where numeric.
    """

    input_ids: tf.Tensor
    attention_mask: tf.Tensor
    start: tf.Tensor
    prompt_len: tf.Tensor
    max_new_tokens: tf.Tensor
    row_seeds: tf.Tensor
    pad_token_id: tf.Tensor
    eos_token_ids: tf.Tensor
    knobs: dict


class Prefill(NamedTuple):
    """State after the prompt went through the model.

    sequences: int32 `[B, L]` token buffer (prompt, then pad in the slots still to generate).
    buffer_mask: int32 `[B, L]` attention mask over the buffer.
    cache: the model's cache nest, holding the prompt.
    logits: float32 `[B, V]` next-token logits after the prompt.
    hidden: float `[B, T, D]` last hidden states of the prompt (contrastive search compares against them).
    next_position: int32 `[B]` position id of the next token (real tokens so far).
    """

    sequences: tf.Tensor
    buffer_mask: tf.Tensor
    cache: Any
    logits: tf.Tensor
    hidden: tf.Tensor
    next_position: tf.Tensor


def decoding_model(model, rows):
    """`model.decoding_view(rows)` when the model offers one (see `tfgen.models.protocol`), else the model.
    Called in the program before a loop, so what the view prepares is computed once per run, not per step."""
    view = getattr(model, "decoding_view", None)
    return model if view is None else view(rows)


def prefill(model, inputs: DecodeInputs, buffer_new_tokens: int) -> Prefill:
    """Allocates the static buffers (`L = T + buffer_new_tokens` slots) and runs the whole prompt at once."""
    # Dynamic sizes (constants under a fixed-shape trace), so an exported signature can leave batch and
    # prompt length as None.
    batch_size, prompt_width = tf.unstack(tf.shape(inputs.input_ids))
    total = prompt_width + buffer_new_tokens
    sequences = tf.concat(
        [inputs.input_ids, tf.fill([batch_size, buffer_new_tokens], inputs.pad_token_id)], axis=1
    )
    buffer_mask = tf.concat(
        [inputs.attention_mask, tf.zeros([batch_size, buffer_new_tokens], tf.int32)], axis=1
    )
    # Positions count real tokens only, so left padding (the caller's and the bucket's) is exact.
    position_ids = tf.maximum(tf.cumsum(inputs.attention_mask, axis=1) - 1, 0)
    cache = model.init_cache(batch_size, total)
    out = model.call_with_cache(
        inputs.input_ids, cache, tf.constant(0, tf.int32), buffer_mask, position_ids, last_logits_only=True
    )
    return Prefill(
        sequences=sequences,
        buffer_mask=buffer_mask,
        cache=out.cache,
        logits=tf.cast(out.logits[:, -1, :], tf.float32),
        hidden=out.hidden_states,
        next_position=tf.reduce_sum(inputs.attention_mask, axis=1),
    )


def write_column(buffer: tf.Tensor, column: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """Returns `buffer` `[B, L]` with `column` `[B]` written at column `index` (a scalar tensor).

    A masked select rather than a dynamic slice: token and mask buffers are tiny, and this form is the
    same op eagerly, in a graph and under XLA.
    """
    at_index = tf.range(tf.shape(buffer)[1]) == tf.cast(index, tf.int32)
    return tf.where(at_index[None, :], tf.cast(column, buffer.dtype)[:, None], buffer)


def is_eos(tokens: tf.Tensor, eos_token_ids: tf.Tensor) -> tf.Tensor:
    """bool `[B]`: whether each token is one of the eos ids (`[E]`, -1 padding never matches)."""
    return tf.reduce_any(tokens[:, None] == eos_token_ids[None, :], axis=1)


def sample_from_scores(scores: tf.Tensor, row_seeds: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """Draws one token per row from `softmax(scores)` by inverse CDF: int32 `[B]`.

    scores: float32 `[B, V]` (filtered entries are -inf). One uniform per row, keyed by the row's seed and the
    step, so a row's draw does not depend on its neighbours. A zero-probability token is never returned:
    the first index whose cumulative mass exceeds the target has positive mass by construction.
    """
    probs = tf.nn.softmax(scores, axis=-1)
    cdf = tf.cumsum(probs, axis=-1)
    target = uniform_per_row(row_seeds, step) * cdf[:, -1]
    index = tf.reduce_sum(tf.cast(cdf <= target[:, None], tf.int32), axis=-1)
    vocab = tf.shape(scores)[-1]
    # Rounding can leave the target at the very top of the CDF; fall back to the most likely token then.
    return tf.where(index < vocab, index, tf.argmax(scores, axis=-1, output_type=tf.int32))
