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
from tfgen.input_checks import check_input_ids

#: generate() keywords of encoder-decoder models (besides `input_ids` / `attention_mask`).
ENCODER_DECODER_KWARGS = ("decoder_input_ids", "decoder_attention_mask")


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


def refuse_decoder_inputs(options: dict) -> None:
    """Pops the encoder-decoder keywords from `options`: ValueError when a decoder-only model's call sets one."""
    for name in ENCODER_DECODER_KWARGS:
        if options.pop(name, None) is not None:
            raise ValueError(f"{name}: the model is decoder-only; pass its prompt as input_ids.")


def encoder_decoder_prompt(input_ids, attention_mask, options: dict, config: GenerationConfig, vocab_size: int,
                           pad_token_id: int, eos_ids) -> EncoderDecoderPrompt:
    """Checks the encoder input and resolves the decoder prompt (popping `decoder_input_ids` /
    `decoder_attention_mask` from `options`).

    The encoder mask is inferred from pad ids by HF's rule when absent. The decoder starts from
    `config.decoder_start_token_id` (else `bos_token_id`; a list gives one per row); `decoder_input_ids` that do not
    start with it in any row get it prepended, as HF does. A decoder mask is all ones unless given (HF never infers
    it: T5's start token is its pad token)."""
    decoder_input_ids = options.pop("decoder_input_ids", None)
    decoder_attention_mask = options.pop("decoder_attention_mask", None)
    ids = check_input_ids(input_ids, vocab_size)
    if not ids.shape[1]:
        raise ValueError("input_ids: an encoder-decoder model needs a non-empty encoder input.")
    mask = _encoder_mask(attention_mask, ids, pad_token_id, eos_ids)
    batch_size = ids.shape[0]
    start = _decoder_start(config, batch_size, vocab_size)
    if decoder_input_ids is None:
        if decoder_attention_mask is not None:
            raise ValueError("decoder_attention_mask: given without decoder_input_ids.")
        return EncoderDecoderPrompt(ids, mask, start, np.ones_like(start))
    decoder_ids = check_input_ids(decoder_input_ids, vocab_size)
    if decoder_ids.shape[0] != batch_size or not decoder_ids.shape[1]:
        raise ValueError(f"decoder_input_ids must have shape [{batch_size}, length >= 1] like input_ids' batch, got "
                         f"{decoder_ids.shape}.")
    decoder_mask = np.ones_like(decoder_ids) if decoder_attention_mask is None else _decoder_mask(
        decoder_attention_mask, decoder_ids)
    if (decoder_ids[:, 0] != start[:, 0]).all():
        decoder_ids = np.concatenate([start, decoder_ids], axis=1)
        decoder_mask = np.concatenate([np.ones_like(start), decoder_mask], axis=1)
    return EncoderDecoderPrompt(ids, mask, decoder_ids, decoder_mask)


def _encoder_mask(attention_mask, ids: np.ndarray, pad_token_id: int, eos_ids) -> np.ndarray:
    if attention_mask is None:
        # HF's rule: infer the mask from pad ids only when pad ids occur and pad is not also eos.
        if pad_token_id in ids and pad_token_id not in eos_ids:
            return (ids != pad_token_id).astype(np.int32)
        return np.ones_like(ids)
    mask = _mask_array(attention_mask, ids, "attention_mask")
    if (mask.sum(axis=1) == 0).any():
        raise ValueError(f"attention_mask: row {int(np.argmin(mask.sum(axis=1)))} of the encoder input has no tokens.")
    return mask


def _decoder_mask(decoder_attention_mask, decoder_ids: np.ndarray) -> np.ndarray:
    mask = _mask_array(decoder_attention_mask, decoder_ids, "decoder_attention_mask")
    if (mask[:, -1] == 0).any():
        raise ValueError("decoder_attention_mask: the decoder continues from the last column, so its rows must be "
                         "left padded (their last column a real token).")
    return mask


def _mask_array(mask, ids: np.ndarray, name: str) -> np.ndarray:
    """int32 0/1 mask of `ids`' shape; ValueError / TypeError naming `name` otherwise."""
    if isinstance(mask, (tf.Tensor, tf.Variable)):
        mask = mask.numpy()
    array = np.asarray(mask)
    if array.shape != ids.shape:
        raise ValueError(f"{name} has shape {array.shape}, but its ids have shape {ids.shape}.")
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == bool):
        raise TypeError(f"{name} must hold integers 0/1, got dtype {array.dtype}.")
    if not np.isin(array, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1.")
    return array.astype(np.int32)


def _decoder_start(config: GenerationConfig, batch_size: int, vocab_size: int) -> np.ndarray:
    """int32 `[batch_size, 1]`: each row's decoder start token."""
    start = config.decoder_start_token_id
    if start is None:
        start = config.bos_token_id
    if start is None:
        raise ValueError("decoder_start_token_id: the encoder-decoder model's generation config has neither a "
                         "decoder_start_token_id nor a bos_token_id to start the decoder from.")
    column = np.asarray(start).reshape(-1, 1)
    if column.shape[0] not in (1, batch_size):
        raise ValueError(f"decoder_start_token_id: a list must hold one id per row ({batch_size}), got {start!r}.")
    if column.min() < 0 or column.max() >= vocab_size:
        raise ValueError(f"decoder_start_token_id: {start!r} is outside the vocabulary [0, {vocab_size}).")
    return np.broadcast_to(column, [batch_size, 1]).astype(np.int32)


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
