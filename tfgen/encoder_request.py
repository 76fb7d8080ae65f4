"""The inputs of an encoder-decoder generate call (T5): the encoder input and the decoder prompt, checked and
resolved by HF's rules before anything compiles. Used by `tfgen.request`.

`input_ids` / `attention_mask` go to the encoder (padded on either side: the encoder attends both ways); the decoder
starts from `decoder_input_ids`, by default one `decoder_start_token_id` per row, and the token buffer, the
processors and the outputs see the decoder's tokens only, as in HF.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config import GenerationConfig
from tfgen.decoding.common import EncoderInputs
from tfgen.input_checks import check_attention_mask, check_input_ids, mask_array

#: generate() keywords of encoder-decoder models (besides `input_ids` / `attention_mask`).
DECODER_INPUTS = ("decoder_input_ids", "decoder_attention_mask")


class EncoderDecoderPrompt(NamedTuple):
    """int32 arrays: the encoder's `input_ids` / `attention_mask` `[B, S]` and the decoder prompt
    `decoder_input_ids` / `decoder_attention_mask` `[B, W]` (left padded)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    decoder_input_ids: np.ndarray
    decoder_attention_mask: np.ndarray


def is_encoder_decoder(model) -> bool:
    """Whether `model` follows the encoder-decoder protocol (`is_encoder_decoder = True` and an `encode` method)."""
    return getattr(model, "is_encoder_decoder", False) is True and callable(getattr(model, "encode", None))


def refuse_decoder_inputs(decoder_inputs: dict) -> None:
    """ValueError naming the first of `decoder_inputs` (`DECODER_INPUTS` a call gave) that is set: a decoder-only model
    has no decoder prompt apart from `input_ids`."""
    for name, value in decoder_inputs.items():
        if value is not None:
            raise ValueError(f"{name}: the model is decoder-only; pass its prompt as input_ids.")


def encoder_decoder_prompt(input_ids, attention_mask, decoder_inputs: dict, config: GenerationConfig, vocab_size: int,
                           pad_token_id: int, eos_ids) -> EncoderDecoderPrompt:
    """Checks the encoder input and resolves the decoder prompt from `decoder_inputs` (`DECODER_INPUTS` a call gave).

    The encoder mask is inferred from pad ids by HF's rule when absent, and may pad either side. The decoder starts
    from `decoder_start_token_ids(config)` (one per row when a list); `decoder_input_ids` that do not start with it in
    any row get it prepended, as HF does. A decoder mask is all ones unless given (HF never infers it: T5's start
    token is its pad token) and must be left padded."""
    decoder_input_ids = decoder_inputs.get("decoder_input_ids")
    decoder_attention_mask = decoder_inputs.get("decoder_attention_mask")
    ids = check_input_ids(input_ids, vocab_size)
    if not ids.shape[1]:
        raise ValueError("input_ids: an encoder-decoder model needs a non-empty encoder input.")
    mask = check_attention_mask(attention_mask, ids, pad_token_id, eos_ids, left_padded=False)
    batch_size = ids.shape[0]
    start = decoder_start_token_ids(config, vocab_size).reshape(-1, 1)
    if start.shape[0] not in (1, batch_size):
        raise ValueError(f"decoder_start_token_id: a list must hold one id per row ({batch_size}), got "
                         f"{config.decoder_start_token_id!r}.")
    start = np.broadcast_to(start, [batch_size, 1])
    if decoder_input_ids is None:
        if decoder_attention_mask is not None:
            raise ValueError("decoder_attention_mask: given without decoder_input_ids.")
        return EncoderDecoderPrompt(ids, mask, start, np.ones_like(start))
    decoder_ids = check_input_ids(decoder_input_ids, vocab_size)
    if decoder_ids.shape[0] != batch_size or not decoder_ids.shape[1]:
        raise ValueError(f"decoder_input_ids must have shape [{batch_size}, length >= 1] like input_ids' batch, got "
                         f"{decoder_ids.shape}.")
    decoder_mask = np.ones_like(decoder_ids)
    if decoder_attention_mask is not None:
        decoder_mask = mask_array(decoder_attention_mask, decoder_ids, "decoder_attention_mask", "decoder_input_ids")
        if (decoder_mask[:, -1] == 0).any():
            raise ValueError("decoder_attention_mask: the decoder continues from the last column, so its rows must be "
                             "left padded (their last column a real token).")
    if (decoder_ids[:, 0] != start[:, 0]).all():
        decoder_ids = np.concatenate([start, decoder_ids], axis=1)
        decoder_mask = np.concatenate([np.ones_like(start), decoder_mask], axis=1)
    return EncoderDecoderPrompt(ids, mask, decoder_ids, decoder_mask)


def decoder_start_token_ids(config: GenerationConfig, vocab_size: int) -> np.ndarray:
    """int32 `[N]`: the decoder's start token, `config.decoder_start_token_id` (an id, or a list of one per row), else
    its `bos_token_id` (HF's rule); ValueError naming `decoder_start_token_id` when there is none or one lies outside
    the vocabulary."""
    start = config.decoder_start_token_id
    if start is None:
        start = config.bos_token_id
    if start is None:
        raise ValueError("decoder_start_token_id: the encoder-decoder model's generation config has neither a "
                         "decoder_start_token_id nor a bos_token_id to start the decoder from.")
    ids = np.asarray(start).reshape(-1)
    if not ids.size or ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"decoder_start_token_id: {start!r} is outside the vocabulary [0, {vocab_size}).")
    return ids.astype(np.int32)


def padded_encoder_inputs(ids: np.ndarray, mask: np.ndarray, rows: int, width: int, pad_token_id: int) -> EncoderInputs:
    """The encoder input `[batch, S]` as `EncoderInputs` of `rows` x `width` (bucket rows and columns: pad ids under
    a zero mask, the columns on the left; bucket rows get one real column, so no row attends nothing)."""
    batch_size, length = ids.shape
    start = width - length
    padded_ids = np.full((rows, width), pad_token_id, np.int32)
    padded_ids[:batch_size, start:] = ids
    padded_mask = np.zeros((rows, width), np.int32)
    padded_mask[:batch_size, start:] = mask
    padded_mask[batch_size:, -1] = 1
    return EncoderInputs(tf.constant(padded_ids), tf.constant(padded_mask), tf.constant(start, tf.int32))
