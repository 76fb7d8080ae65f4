"""The checks of a generate call's inputs (prompt, attention mask, lengths, seed), each raising a ValueError or
TypeError that names the argument before anything compiles. Used by `tfgen.request.prepare`."""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig
from tfgen.decoding.random import derive_seeds, random_seeds


def pop_input_ids(inputs, options: dict):
    """The prompt, given as `inputs` or as the `input_ids` option (popped), not both."""
    keyword_ids = options.pop("input_ids", None)
    if inputs is not None and keyword_ids is not None:
        raise ValueError("input_ids: pass the prompt either as `inputs` or as `input_ids=`, not both.")
    return keyword_ids if keyword_ids is not None else inputs


def check_prompt(input_ids, attention_mask, config: GenerationConfig, vocab_size: int, pad_token_id: int, eos_ids,
                 *, stacklevel: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """int32 ids and mask `[batch, prompt_len]` from any array-likes (the mask inferred when None). An empty prompt
    (`[batch, 0]`, with no mask or its `[batch, 0]` mask: a tokenizer's encoding of "") starts from the bos token."""
    ids = check_input_ids(input_ids, vocab_size)
    if ids.shape[1]:
        return ids, check_attention_mask(attention_mask, ids, pad_token_id, eos_ids, stacklevel=stacklevel + 1)
    if attention_mask is not None and np.shape(attention_mask) != ids.shape:
        raise ValueError(f"attention_mask has shape {np.shape(attention_mask)}, but input_ids has shape {ids.shape}.")
    if config.bos_token_id is None:
        raise ValueError("input_ids: the prompt is empty and the model has no bos_token_id to start from.")
    ids = check_input_ids(np.full([ids.shape[0], 1], config.bos_token_id), vocab_size)
    return ids, np.ones_like(ids)


def check_input_ids(input_ids, vocab_size: int) -> np.ndarray:
    """int32 `[batch, prompt_len]` ids from any array-like (None: one empty row), each in `[0, vocab_size)`."""
    if input_ids is None:
        input_ids = np.zeros([1, 0], np.int32)
    if _holds_text(input_ids):
        # generate() is HF's: ids in, ids out (keras-hub's takes text). Text goes through a tokenizer or the pipeline.
        raise TypeError("input_ids holds text (str); tokenize it first (tokenizer(...)) or use "
                        "tfgen.pipeline('text-generation', ...)")
    if isinstance(input_ids, (tf.Tensor, tf.Variable)):
        input_ids = input_ids.numpy()
    try:
        array = np.asarray(input_ids)
    except ValueError as error:  # ragged nested lists
        raise ValueError(f"input_ids: rows must all have the same length (left-pad them): {error}") from None
    if array.dtype == object:
        raise ValueError("input_ids: rows must all have the same length (left-pad them).")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {array.dtype}.")
    if array.ndim != 2:
        raise ValueError(f"input_ids must be 2-D [batch, prompt_len], got shape {array.shape}.")
    if array.shape[0] == 0:
        raise ValueError("input_ids: the batch is empty.")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = array[(array < 0) | (array >= vocab_size)][0]
        raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size}).")
    return array.astype(np.int32)


def _holds_text(value) -> bool:
    """Whether a prompt is text: a string, a string tensor or array, or (nested) lists holding a string first."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value.dtype == tf.string
    return isinstance(value, (str, bytes)) or (isinstance(value, np.ndarray) and value.dtype.kind in "USO"
                                                and value.size > 0 and isinstance(value.flat[0], (str, bytes)))


def check_attention_mask(attention_mask, input_ids: np.ndarray, pad_token_id: int, eos_ids, *, stacklevel: int = 4,
                         left_padded: bool = True):
    """int32 mask of `input_ids`' shape: checked, or inferred from pad ids by HF's rule when None. `left_padded`: warn
    about right-padded rows (a decoder continues from the last column; an encoder input may be padded either side)."""
    if attention_mask is None:
        # HF's rule: infer the mask from pad ids only when pad ids occur and pad is not also eos.
        if pad_token_id in input_ids and pad_token_id not in eos_ids:
            return (input_ids != pad_token_id).astype(np.int32)
        return np.ones_like(input_ids, np.int32)
    mask = mask_array(attention_mask, input_ids, "attention_mask", "input_ids")
    if (mask.sum(axis=1) == 0).any():
        raise ValueError(f"attention_mask: row {int(np.argmin(mask.sum(axis=1)))} has no tokens.")
    if left_padded and (mask[:, -1] == 0).any():
        warnings.warn(
            "attention_mask: some rows are right-padded; decoder-only generation continues from the last column, "
            "so pad on the left.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return mask.astype(np.int32)


def mask_array(mask, ids: np.ndarray, name: str, ids_name: str) -> np.ndarray:
    """`mask` (any array-like) as int32 0/1 of `ids`' shape; ValueError / TypeError naming `name` otherwise."""
    if isinstance(mask, (tf.Tensor, tf.Variable)):
        mask = mask.numpy()
    array = np.asarray(mask)
    if array.shape != ids.shape:
        raise ValueError(f"{name} has shape {array.shape}, but {ids_name} has shape {ids.shape}.")
    if not (np.issubdtype(array.dtype, np.integer) or array.dtype == bool):
        raise TypeError(f"{name} must hold integers 0/1, got dtype {array.dtype}.")
    if not np.isin(array, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1.")
    return array.astype(np.int32)


def check_prompt_fits(prompt_tokens: int, max_positions: int | None, *, name: str | None = "input_ids",
                      remedy: str | None = None) -> None:
    """ValueError when a prompt of `prompt_tokens` tokens leaves no position for an answer in a model of
    `max_positions` positions (None: no limit), naming both numbers and what helps: a shorter prompt, or truncation
    as it is encoded (`remedy` replaces that advice; `name`, the argument the message begins with, None: none). No
    length option can help there, so the message names none."""
    if max_positions is None or prompt_tokens < max_positions:
        return
    if remedy is None:
        remedy = (f"use a shorter prompt, or truncate it as you encode it: tokenizer(text, truncation=True, "
                  f"max_length=N) with N below {max_positions}, leaving room for the answer")
    raise ValueError(f"{'' if name is None else name + ': '}the prompt has {prompt_tokens} tokens and the model's "
                     f"context is {max_positions} tokens (prompt and answer together), so no token is left for the "
                     f"answer; {remedy}.")


def resolve_lengths(config: GenerationConfig, prompt_len: int, model_config, explicit_max_length: bool) -> int:
    """HF's length rules: returns max_new_tokens and sets `config.max_length`/`min_length` to totals (a prompt that
    fills the model's positions is refused before, by `check_prompt_fits`: no length option can make room there)."""
    max_positions = getattr(model_config, "max_position_embeddings", None)
    if config.max_new_tokens is not None:
        config.max_length = prompt_len + config.max_new_tokens
    elif not explicit_max_length and config.max_length == GenerationConfig().max_length:
        # HF's default: 20 new tokens, capped by the model's positions.
        config.max_length = config.max_length + prompt_len
        if max_positions is not None:
            config.max_length = min(config.max_length, max_positions)
    if config.max_length <= prompt_len:
        raise ValueError(
            f"max_length ({config.max_length}) must exceed the prompt length ({prompt_len}); "
            "set max_new_tokens instead."
        )
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_len
    return config.max_length - prompt_len


def check_seed(seed, batch_size: int, do_sample: bool, *, stacklevel: int = 4) -> np.ndarray:
    """Returns int32 row keys `[batch_size, 2]` from `seed` (`None`, `[2]` or `[batch_size, 2]`)."""
    if seed is None:
        return random_seeds(batch_size)
    if not do_sample:
        warnings.warn("seed has no effect: do_sample is False (greedy search).", UserWarning, stacklevel=stacklevel)
    if isinstance(seed, (tf.Tensor, tf.Variable)):
        seed = seed.numpy()
    array = np.asarray(seed)
    if array.dtype == object or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"seed must hold integers, got {seed!r}.")
    if array.shape not in ((2,), (batch_size, 2)):
        raise ValueError(f"seed must have shape [2] or [batch_size, 2] = [{batch_size}, 2], got {array.shape}.")
    if array.min() < -(2**31) or array.max() >= 2**32:
        raise ValueError("seed values must fit in 32 bits.")
    keys = (array.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    if keys.ndim == 1:
        keys = derive_seeds(np.tile(keys[None], [batch_size, 1]), np.arange(batch_size)).numpy()
    return keys.astype(np.int32)
