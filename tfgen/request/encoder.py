"""The inputs of an encoder-decoder generate call (T5): the encoder input and the decoder prompt, checked and
resolved by HF's rules before anything compiles. Used by `tfgen.request.prepare`.

`input_ids` / `attention_mask` go to the encoder (padded on either side: the encoder attends both ways); the decoder
starts from `decoder_input_ids`, by default one `decoder_start_token_id` per row, and the token buffer, the
processors and the outputs see the decoder's tokens only, as in HF.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig
from tfgen.decoding.state import EncoderInputs
from tfgen.request.input_checks import check_attention_mask, check_input_ids, mask_array

#: generate() keywords only encoder-decoder models take (besides `input_ids` / `attention_mask`).
ENCODER_DECODER_INPUTS = ("decoder_input_ids", "decoder_attention_mask", "encoder_outputs")


class EncoderStates(NamedTuple):
    """A caller's `encoder_outputs`: `last_hidden_state` float32 `[B, S, D]` and, when they carried it, the per-layer
    `hidden_states` as given (checked and returned as `encoder_hidden_states` only when asked), else None."""

    last_hidden_state: np.ndarray
    hidden_states: tuple | None = None


class EncoderDecoderPrompt(NamedTuple):
    """int32 arrays: the encoder's `input_ids` / `attention_mask` `[B, S]` and the decoder prompt
    `decoder_input_ids` / `decoder_attention_mask` `[B, W]` (left padded); `states`: the caller's `encoder_outputs`
    (`EncoderStates`), or None."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    decoder_input_ids: np.ndarray
    decoder_attention_mask: np.ndarray
    states: EncoderStates | None = None

    def repeated(self, copies: int) -> EncoderDecoderPrompt:
        """Each row repeated `copies` times in place (the host's rows for `num_return_sequences`)."""
        states = None if self.states is None else self.states._replace(
            last_hidden_state=np.repeat(self.states.last_hidden_state, copies, axis=0))
        return EncoderDecoderPrompt(*(np.repeat(array, copies, axis=0) for array in self[:4]), states)


def refuse_encoder_decoder_inputs(given: dict) -> None:
    """ValueError naming the first of `given` (`ENCODER_DECODER_INPUTS` a call gave) that is set: a decoder-only model
    has no encoder, nor a decoder prompt apart from `input_ids`."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}: the model is decoder-only (it has no encoder); pass its prompt as input_ids.")


def encoder_decoder_prompt(input_ids, attention_mask, given: dict, config: GenerationConfig, model_config,
                           pad_token_id: int, eos_ids) -> EncoderDecoderPrompt:
    """Checks the encoder input and resolves the decoder prompt from `given` (`ENCODER_DECODER_INPUTS` a call
    gave) for a model of `model_config` (its `vocab_size`, `d_model`).

    The encoder mask is inferred from pad ids by HF's rule when absent, and may pad either side. Beside
    `encoder_outputs` (`encoder_states_of`) the encoder input is their shape: `input_ids` may be left out (then pad
    ids stand for it) and the mask is all ones unless given, as in HF. The decoder starts
    from `decoder_start_token_ids(config)` (one per row when a list); `decoder_input_ids` that do not start with it in
    any row get it prepended, as HF does. A decoder mask is all ones unless given (HF never infers it: T5's start
    token is its pad token) and must be left padded."""
    decoder_input_ids = given.get("decoder_input_ids")
    decoder_attention_mask = given.get("decoder_attention_mask")
    vocab_size, encoder_states = int(model_config.vocab_size), None
    if given.get("encoder_outputs") is not None:
        encoder_states = encoder_states_of(given["encoder_outputs"], int(model_config.d_model))
        refuse_encoder_processors_without_ids(config, input_ids)
    if encoder_states is None:
        ids = check_input_ids(input_ids, vocab_size)
        if not ids.shape[1]:
            raise ValueError("input_ids: an encoder-decoder model needs a non-empty encoder input.")
        mask = check_attention_mask(attention_mask, ids, pad_token_id, eos_ids, left_padded=False)
    else:
        ids, mask = _inputs_beside_states(input_ids, attention_mask, encoder_states, vocab_size, pad_token_id)
    batch_size = ids.shape[0]
    start = decoder_start_token_ids(config, vocab_size).reshape(-1, 1)
    if start.shape[0] not in (1, batch_size):
        raise ValueError(f"decoder_start_token_id: a list must hold one id per row ({batch_size}), got "
                         f"{config.decoder_start_token_id!r}.")
    start = np.broadcast_to(start, [batch_size, 1])
    if decoder_input_ids is None:
        if decoder_attention_mask is not None:
            raise ValueError("decoder_attention_mask: given without decoder_input_ids.")
        return EncoderDecoderPrompt(ids, mask, start, np.ones_like(start), encoder_states)
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
    return EncoderDecoderPrompt(ids, mask, decoder_ids, decoder_mask, encoder_states)


def _inputs_beside_states(input_ids, attention_mask, encoder_states: EncoderStates, vocab_size: int,
                          pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """int32 encoder ids and mask `[B, S]` beside the caller's encoder states `[B, S, D]`: `input_ids` when given
    (only the encoder-side processors read them then), else pad ids; the mask as given, else all ones (HF infers none
    beside `encoder_outputs`)."""
    shape = encoder_states.last_hidden_state.shape[:2]
    if input_ids is None:
        ids = np.full(shape, pad_token_id, np.int32)
    else:
        ids = check_input_ids(input_ids, vocab_size)
        if ids.shape != shape:
            raise ValueError(f"input_ids has shape {ids.shape}, but encoder_outputs' last_hidden_state is "
                             f"{encoder_states.last_hidden_state.shape}: they must be the same encoder input.")
    if attention_mask is None:
        return ids, np.ones(shape, np.int32)
    mask = mask_array(attention_mask, ids, "attention_mask", "encoder_outputs' last_hidden_state [B, S]")
    if (mask.sum(axis=1) == 0).any():
        raise ValueError(f"attention_mask: row {int(np.argmin(mask.sum(axis=1)))} has no tokens.")
    return ids, mask


def encoder_states_of(encoder_outputs, hidden_size: int) -> EncoderStates:
    """The caller's `encoder_outputs` as HF's generate takes them — an object or mapping with `last_hidden_state`
    (HF's `BaseModelOutput`; its `hidden_states` are kept), a tuple whose first entry is that array, or the array itself
    `[B, S, hidden_size]` (numpy, TF or CPU torch) — as float32 `EncoderStates`; ValueError / TypeError naming
    `encoder_outputs` when they cannot be the model's encoder output."""
    hidden_states = None
    if isinstance(encoder_outputs, Mapping):
        last, hidden_states = encoder_outputs.get("last_hidden_state"), encoder_outputs.get("hidden_states")
    elif hasattr(encoder_outputs, "last_hidden_state"):
        last, hidden_states = encoder_outputs.last_hidden_state, getattr(encoder_outputs, "hidden_states", None)
    elif isinstance(encoder_outputs, tuple) and encoder_outputs and hasattr(encoder_outputs[0], "shape"):
        last = encoder_outputs[0]
    else:
        last = encoder_outputs
    if last is None:
        raise ValueError("encoder_outputs: no last_hidden_state in them (HF's BaseModelOutput field).")
    last = _float_array(last, "encoder_outputs")
    if last.ndim != 3 or not last.shape[0] or not last.shape[1] or last.shape[2] != hidden_size:
        raise ValueError(f"encoder_outputs: the last hidden state must be [batch, encoder_length, {hidden_size}] "
                         f"(the model's hidden size), got {last.shape}.")
    return EncoderStates(last, hidden_states)


def refuse_encoder_processors_without_ids(config: GenerationConfig, input_ids) -> None:
    """ValueError naming the encoder-side processor `config` turns on when a call gave `encoder_outputs` without the
    `input_ids` they encode: those processors read the encoder's ids."""
    for name, is_on in (("encoder_repetition_penalty", config.encoder_repetition_penalty not in (None, 1.0)),
                        ("encoder_no_repeat_ngram_size", bool(config.encoder_no_repeat_ngram_size))):
        if is_on and input_ids is None:
            raise ValueError(f"{name}: it reads the encoder's input ids; with encoder_outputs pass the input_ids they "
                             "encode too.")


def returned_encoder_states(prompt: EncoderDecoderPrompt | None, config: GenerationConfig, *,
                            stacklevel: int) -> tuple[tuple | None, bool]:
    """`(encoder_hidden_states, encode_ahead)` of a call with `prompt` (None: decoder-only) under `config`: `(None,
    False)` unless it asks for `output_hidden_states` in a `return_dict_in_generate`; then the per-layer states the
    caller's `encoder_outputs` carried (as tensors; None, warned, when they carried none, as HF returns then), or
    `(None, True)`: tfgen runs the encoder ahead of the program to get them. Warns that the decoder's hidden states
    are not returned."""
    if prompt is None or config.output_hidden_states is not True or not config.return_dict_in_generate:
        return None, False
    encoder_states = prompt.states
    warnings.warn("output_hidden_states: tfgen returns the encoder's hidden states (encoder_hidden_states) but not the "
                  "decoder's: the compiled loop keeps no per-step hidden states.", UserWarning, stacklevel=stacklevel)
    if encoder_states is None:
        return None, True
    if encoder_states.hidden_states is None:
        warnings.warn("output_hidden_states: the encoder_outputs given carry no hidden_states, so "
                      "encoder_hidden_states is None (as in HF).", UserWarning, stacklevel=stacklevel)
        return None, False
    shape = encoder_states.last_hidden_state.shape
    layers = tuple(_float_array(layer, "encoder_outputs.hidden_states") for layer in encoder_states.hidden_states)
    if any(layer.shape != shape for layer in layers):
        raise ValueError(f"encoder_outputs.hidden_states: every layer must be {shape} like the last hidden state, got "
                         f"{[layer.shape for layer in layers]}.")
    return tuple(tf.constant(layer) for layer in layers), False


def _float_array(value, name: str) -> np.ndarray:
    """float32 numpy array of a numpy / TF / torch (CPU) array; TypeError naming `name` when it holds no floats."""
    if hasattr(value, "detach"):  # a torch tensor: numpy() refuses tensors that track gradients
        value = value.detach().float().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        array = array.astype(np.float32)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"{name} must hold floats (the encoder's hidden states), got dtype {array.dtype}.")
    array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: the hidden states hold NaN or infinite values.")
    return array


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


def padded_encoder_inputs(prompt: EncoderDecoderPrompt, rows: int, width: int, pad_token_id: int) -> EncoderInputs:
    """The prompt's encoder input `[batch, S]` as `EncoderInputs` of `rows` x `width` (bucket rows and columns: pad ids
    under a zero mask, the columns on the left; bucket rows get one real column, so no row attends nothing), with the
    caller's encoder states float32 `[batch, S, D]` (zeros in bucket rows and columns) when given."""
    ids, mask = prompt.input_ids, prompt.attention_mask
    batch_size, length = ids.shape
    start = width - length
    padded_ids = np.full((rows, width), pad_token_id, np.int32)
    padded_ids[:batch_size, start:] = ids
    padded_mask = np.zeros((rows, width), np.int32)
    padded_mask[:batch_size, start:] = mask
    padded_mask[batch_size:, -1] = 1
    hidden_states = ()
    if prompt.states is not None:
        states = prompt.states.last_hidden_state
        padded_states = np.zeros((rows, width, states.shape[2]), np.float32)
        padded_states[:batch_size, start:] = states
        hidden_states = tf.constant(padded_states)
    return EncoderInputs(tf.constant(padded_ids), tf.constant(padded_mask), tf.constant(start, tf.int32),
                         hidden_states)
