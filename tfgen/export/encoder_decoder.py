"""The export of an encoder-decoder model (T5), helpers of `tfgen.export.saved_model`.

Its table signatures take the ENCODER input as `input_ids` / `attention_mask` `[batch, encoder_len]` (padded on
either side: the encoder attends both ways); in the graph every row's decoder starts from one
`decoder_start_token_id`, and `sequences` are the decoder's tokens, start token first, `[batch, 1 + max_new_tokens]`.
What cannot run for such a model is left out of the defaults and refused when named (`NO_ENCODER_SIGNATURES`).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from tfgen.config import GenerationConfig
from tfgen.decoding.common import DecodeInputs, EncoderInputs
from tfgen.knobs import KNOBS
from tfgen.value_types import is_integer

logger = logging.getLogger(__name__)

#: Signatures an encoder-decoder export leaves out: drafting needs a decoder-only model, the in-graph tokenizer of
#: `generate_text` is byte-level BPE (T5's is SentencePiece).
NO_ENCODER_SIGNATURES = {
    "prompt_lookup": "assisted generation needs a decoder-only model",
    "generate_text": "the in-graph tokenizer is byte-level BPE only",
}
SLOTS_LEFT_OUT = ("slot signatures: continuous batching needs a decoder-only model with a per-row cache slot "
                  "(`tfgen serve` runs requests as whole calls)")


def encoder_decoder_names(names: list[str], explicit: bool, slots) -> tuple[list[str], list[str]]:
    """`(names, left_out)` of an encoder-decoder export from the signature `names` resolved as for any model
    (`explicit`: the caller named them): those without `NO_ENCODER_SIGNATURES`, and one line per signature (group)
    left out, which is logged and recorded in `tfgen_export.json`. ValueError when the caller named one of them or
    asked for slots."""
    if slots:
        raise ValueError(f"slots: {SLOTS_LEFT_OUT}; export an encoder-decoder model with slots=0 (or unset)")
    refused = [name for name in names if name in NO_ENCODER_SIGNATURES]
    if refused and explicit:
        raise ValueError(f"signatures: {', '.join(refused)} cannot be exported for an encoder-decoder model ("
                         + "; ".join(NO_ENCODER_SIGNATURES[name] for name in refused) + ")")
    names = [name for name in names if name not in NO_ENCODER_SIGNATURES]
    left_out = [f"{name}: {why}" for name, why in NO_ENCODER_SIGNATURES.items() if name not in names]
    left_out.append(SLOTS_LEFT_OUT)
    logger.info("encoder-decoder export: left out %s", "; ".join(left_out))
    return names, left_out


def decoder_start_token_id(config: GenerationConfig, vocab_size: int) -> int:
    """The decoder's start token of every row: the config's `decoder_start_token_id`, else its `bos_token_id` (HF's
    rule); ValueError unless that is one id in the vocabulary (a per-row list cannot fit a batch of any size)."""
    start = config.decoder_start_token_id
    if start is None:
        start = config.bos_token_id
    if isinstance(start, (list, tuple)) and len(start) == 1:
        start = start[0]
    if not is_integer(start) or not 0 <= start < vocab_size:
        raise ValueError(f"decoder_start_token_id: an encoder-decoder export starts every row from one token id in "
                         f"[0, {vocab_size}) (the config's decoder_start_token_id, else bos_token_id), got {start!r}")
    return int(start)


def encoder_decoder_run(exporter, decode, spec, knobs: dict, row_seeds):
    """`(input_ids, attention_mask, row_inputs) -> outputs` of an encoder-decoder signature (the `run` of
    `_Exporter._decoder`): `decode` is the signature's traced loop, `exporter` the `_Exporter`, `row_seeds(ids, mask)`
    the sampling keys of a request without `seed` (from the encoder input)."""
    start_token = exporter.decoder_start_token_id

    def run(input_ids, attention_mask, row_inputs: dict) -> dict:
        batch_size = tf.shape(input_ids)[0]
        requested = row_inputs.get("max_new_tokens", tf.fill([batch_size], exporter.buffer_new_tokens))
        budgets = tf.clip_by_value(requested, 0, exporter.buffer_new_tokens)
        if exporter.max_positions is not None:  # the decoder's positions: its prompt is the start token
            budgets = tf.minimum(budgets, exporter.max_positions - 1)
        run_knobs = {
            name: tf.cast(row_inputs[name], value.dtype) if name in row_inputs
            else tf.repeat(tf.constant(value), batch_size, axis=0) if KNOBS[name].per_row
            else tf.constant(value)
            for name, value in knobs.items()
        }
        seeds = row_inputs["seed"] if "seed" in row_inputs else row_seeds(input_ids, attention_mask)
        result = decode(DecodeInputs(
            input_ids=tf.fill([batch_size, 1], tf.constant(start_token, tf.int32)),
            attention_mask=tf.ones([batch_size, 1], tf.int32),
            start=tf.constant(0, tf.int32),
            prompt_len=tf.constant(1, tf.int32),
            max_new_tokens=budgets,
            row_seeds=seeds,
            pad_token_id=tf.constant(exporter.pad_token_id, tf.int32),
            knobs=run_knobs,
            encoder=EncoderInputs(input_ids, attention_mask, tf.constant(0, tf.int32)),
        ))
        return {**result, "sequence_lengths": 1 + result["generated_lengths"]}

    return run


__all__ = ["NO_ENCODER_SIGNATURES", "SLOTS_LEFT_OUT", "decoder_start_token_id", "encoder_decoder_names",
           "encoder_decoder_run"]
