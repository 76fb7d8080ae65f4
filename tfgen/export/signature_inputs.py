"""What an exported signature's request becomes: the decode loop's `DecodeInputs` (per-row budgets clipped to the
export's buffer, knob values from the request or the export's config, sampling keys from `seed` or a hash of the
prompt), with an encoder-decoder model's encoder input; and `default_row_seeds`, the keys of requests without a
seed. Used by `tfgen.export.saved_model`."""

from __future__ import annotations

import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.decoding.random import derive_seeds, philox4x32
from tfgen.decoding.state import DecodeInputs, EncoderInputs

# Fixed Philox key of `default_row_seeds`: the same prompt samples the same tokens in every export.
_PROMPT_HASH_KEY = (0x2545F491, 0x6A09E667)
_MASK32 = 0xFFFFFFFF


def default_row_seeds(input_ids, attention_mask) -> tf.Tensor:
    """The sampling keys of signatures without a `seed` input: int32 `[B, 2]` from `[B, T]` ids and mask.

    Each key is derived from a 32-bit hash of the row's real tokens (mask 1) and their distance from the end of
    the row. So a row's samples depend on its prompt only — not on its neighbours, its place in the batch or
    extra left padding — which keeps TF Serving's request batching deterministic, and `serving_default` samples
    what `model.generate(..., do_sample=True, seed=default_row_seeds(ids, mask))` samples.
    """
    ids = tf.cast(input_ids, tf.int64)
    width = tf.shape(ids, out_type=tf.int64)[1]
    from_end = width - 1 - tf.range(width)
    zeros = tf.zeros_like(from_end)
    # One pseudo-random 32-bit weight per distance from the end (counter word 1 = 1 keeps clear of the words
    # the decode loop and `derive_seeds` use).
    counters = tf.stack([from_end, tf.ones_like(from_end), zeros, zeros], axis=-1)
    weights = tf.cast(philox4x32(counters, tf.constant(_PROMPT_HASH_KEY, tf.int64))[:, 0], tf.uint64)
    products = tf.cast(ids + 1, tf.uint64) * weights[None, :]
    terms = tf.cast(tf.bitwise.bitwise_and(products, tf.constant(_MASK32, tf.uint64)), tf.int64)
    terms = tf.where(tf.cast(attention_mask, tf.bool), terms, tf.zeros_like(terms))
    digest = tf.bitwise.bitwise_and(tf.reduce_sum(terms, axis=1), tf.constant(_MASK32, tf.int64))
    keys = tf.tile(tf.constant([_PROMPT_HASH_KEY], tf.int64), [tf.shape(ids)[0], 1])
    return derive_seeds(keys, digest)


def signature_run(exporter, decode, knobs: dict):
    """`(input_ids, attention_mask, row_inputs) -> outputs` of a signature: `decode` (its traced loop) on the request's
    `DecodeInputs`. `exporter` is the `tfgen.export.saved_model._Exporter` (its buffer, positions, pad id and, for an
    encoder-decoder model, decoder start token); `knobs` the signature's values for one row (per-row ones repeated to
    the request's batch unless `row_inputs` carries them). An encoder-decoder's `input_ids` / `attention_mask` are the
    encoder's, and every row's decoder starts from one token; `sequence_lengths` count the prompt (or start token)."""

    def run(input_ids, attention_mask, row_inputs: dict) -> dict:
        batch_size = tf.shape(input_ids)[0]
        if exporter.encoder_decoder:  # the inputs are the encoder's; every row's decoder starts from one token
            prompt = tf.fill([batch_size, 1], tf.constant(exporter.decoder_start_token_id, tf.int32))
            prompt_mask, encoder = tf.ones_like(prompt), EncoderInputs(input_ids, attention_mask,
                                                                       tf.constant(0, tf.int32))
        else:
            prompt, prompt_mask, encoder = input_ids, attention_mask, ()
        width = tf.shape(prompt)[1]
        requested = row_inputs.get("max_new_tokens", tf.fill([batch_size], exporter.buffer_new_tokens))
        budgets = tf.clip_by_value(requested, 0, exporter.buffer_new_tokens)
        if exporter.max_positions is not None:
            budgets = tf.minimum(budgets, exporter.max_positions - tf.reduce_sum(prompt_mask, axis=1))
        run_knobs = {
            name: tf.cast(row_inputs[name], value.dtype) if name in row_inputs
            else tf.repeat(tf.constant(value), batch_size, axis=0) if KNOBS[name].per_row
            else tf.constant(value)
            for name, value in knobs.items()
        }
        seeds = row_inputs["seed"] if "seed" in row_inputs else default_row_seeds(input_ids, attention_mask)
        result = decode(DecodeInputs(
            input_ids=prompt,
            attention_mask=prompt_mask,
            start=tf.constant(0, tf.int32),
            prompt_len=width,
            max_new_tokens=budgets,
            row_seeds=seeds,
            pad_token_id=tf.constant(exporter.pad_token_id, tf.int32),
            knobs=run_knobs,
            encoder=encoder,
        ))
        return {**result, "sequence_lengths": width + result["generated_lengths"]}

    return run
