"""`compute_transition_scores`: the score of each generated token, as HF transformers 4.55.4 computes it."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def compute_transition_scores(
    sequences,
    scores: Sequence,
    beam_indices=None,
    normalize_logits: bool = False,
    *,
    input_length: int | None = None,
) -> tf.Tensor:
    """The score each step gave to the token that was chosen: float32 `[rows, steps]`.

    sequences: int `[rows, prompt_len + ...]` from `generate`. scores: the per-step `[batch * k, V]` scores of a
    `return_dict_in_generate=True` output (processed scores, or raw logits). beam_indices: int `[rows, steps']`
    from beam search (the row of `scores` each token came from, -1 after the hypothesis ended); without it, row
    `i` of `sequences` reads row `i` of every step. normalize_logits: apply log-softmax over the vocabulary first.
    input_length: the column of `sequences` where generated tokens start. By default, HF's rule: the generated
    tokens are the last columns (HF crops its output to the longest hypothesis). tfgen's `generate` pads every
    row to `prompt_len + max_new_tokens`, so pass the prompt length unless generation used the whole budget.

    Steps after a beam hypothesis ended score 0, so for beam search
    `sum(transition_scores, 1) / generated_length ** length_penalty` gives back `sequences_scores`.
    """
    if not scores:
        raise ValueError("scores is empty: generate with return_dict_in_generate=True and output_scores=True")
    sequences = tf.convert_to_tensor(sequences)
    if sequences.shape.rank != 2:
        raise ValueError(f"sequences must be 2-D [rows, length], got shape {sequences.shape}")
    stacked = tf.stack([tf.convert_to_tensor(step, tf.float32) for step in scores])  # [S, rows, V]
    if normalize_logits:
        stacked = tf.nn.log_softmax(stacked, axis=-1)
    steps = stacked.shape[0]
    if beam_indices is None:
        beam_indices = tf.tile(tf.range(stacked.shape[1])[:, None], [1, steps])
    beam_indices = tf.cast(tf.convert_to_tensor(beam_indices), tf.int32)
    if beam_indices.shape.rank != 2 or beam_indices.shape[0] != sequences.shape[0]:
        raise ValueError(
            f"beam_indices must have shape [rows={sequences.shape[0]}, steps], got {beam_indices.shape}"
        )

    ended = beam_indices < 0
    length = int(tf.reduce_max(tf.reduce_sum(tf.cast(~ended, tf.int32), axis=1)))
    if length > steps:
        raise ValueError(f"beam_indices cover {length} steps but scores has only {steps}")
    start = sequences.shape[1] - length if input_length is None else int(input_length)
    if not 0 <= start <= sequences.shape[1] - length:
        raise ValueError(
            f"input_length: generated tokens start at column {start}, but sequences has {sequences.shape[1]} "
            f"columns for {length} generated steps"
        )
    ended = ended[:, :length]
    rows = tf.where(ended, 0, beam_indices[:, :length])
    tokens = tf.cast(sequences[:, start : start + length], tf.int32)
    step_index = tf.broadcast_to(tf.range(length)[None, :], tf.shape(tokens))
    chosen = tf.gather_nd(stacked, tf.stack([step_index, rows, tokens], axis=-1))
    return tf.where(ended, 0.0, chosen)
