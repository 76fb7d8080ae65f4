"""Pieces every decoding loop shares: the loop inputs and token state, the prefill, and the one way each of
these is done — writing a column, the eos test, score buffers, processor context, sampling a token."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.random import uniform_per_row
from tfgen.logits import grammar
from tfgen.logits.context import ProcessorContext
from tfgen.stopping.criteria import stopped_rows


class EncoderInputs(NamedTuple):
    """The encoder side of an encoder-decoder request (`DecodeInputs.encoder`).

    input_ids, attention_mask: int32 `[B, S]`; the columns before `start` are bucket padding (masked), the caller's
        own padding (left or right) is masked by the caller's mask.
    start: int32 scalar, the column where the caller's encoder input begins.
    hidden_states: float32 `[B, S, D]`, the encoder's output when it was computed before the program (the caller's
        `encoder_outputs`, or tfgen's own run that returns every layer's states), else `()`: the program encodes.
    """

    input_ids: tf.Tensor
    attention_mask: tf.Tensor
    start: tf.Tensor
    hidden_states: Any = ()


class DecodeInputs(NamedTuple):
    """The run-time tensors of one compiled generate call (all have a static shape inside the program).

    input_ids, attention_mask: int32 `[B, T]`, left padded (the columns before `start` are bucket padding).
    start: int32 scalar, buffer index where the caller's prompt begins.
    prompt_len: int32 scalar, the caller's padded prompt length (HF's `input_ids.shape[-1]`).
    max_new_tokens: int32 `[B]`, each row's budget of new tokens (0 for bucket-padding rows).
    row_seeds: int32 `[B, 2]`, each row's sampling key.
    pad_token_id: int32 scalar.
    knobs: dict of run-time knob tensors (see `tfgen.config.knobs`), per row where the schema says so; among them the
    eos ids (`eos_token_ids`, the one copy of them).
    encoder: the `EncoderInputs` of an encoder-decoder model (`input_ids` above is then the decoder prompt), or `()`.
    """

    input_ids: tf.Tensor
    attention_mask: tf.Tensor
    start: tf.Tensor
    prompt_len: tf.Tensor
    max_new_tokens: tf.Tensor
    row_seeds: tf.Tensor
    pad_token_id: tf.Tensor
    knobs: dict
    encoder: Any = ()

    @property
    def eos_token_ids(self) -> tf.Tensor:
        """int32 `[E]`: the eos ids (-1 entries never match), the `eos_token_ids` knob."""
        return self.knobs["eos_token_ids"]


class DecodeState(NamedTuple):
    """The token-level state every loop carries (R rows: prompts, or prompts x beams / candidates).

    step: int32 scalar, tokens chosen so far (the next one is written at buffer column `T + step`).
    sequences: int32 `[R, T + N]` token buffer (prompt, chosen tokens, then pad).
    buffer_mask: int32 `[R, T + N]` attention mask over the buffer.
    cache: the model's cache nest (leading axis R, or a multiple of it).
    logits: float32 `[R, V]` raw logits for the token at `step`.
    next_position: int32 `[R]` position id of the next token (real tokens so far).
    finished: bool `[R]`, rows that will not change any more (eos, budget spent, or their search is done).
    generated: int32 `[R]`, tokens each row chose before it finished (the finishing token included); kept by
        the one-token-per-row loops (beam strategies count their hypotheses' tokens from `beam_indices`).
    scores / raw_logits: float32 `[N, R, V]` processed scores / raw logits per step, or `[0]` when not collected.
    grammar_state: int32 `[R]`, each row's state in the structured-output automaton (`tfgen.structured`), or `()`
        when the output is not constrained.
    """

    step: tf.Tensor
    sequences: tf.Tensor
    buffer_mask: tf.Tensor
    cache: Any
    logits: tf.Tensor
    next_position: tf.Tensor
    finished: tf.Tensor
    generated: tf.Tensor
    scores: tf.Tensor
    raw_logits: tf.Tensor
    grammar_state: Any = ()


class Prefill(NamedTuple):
    """The prompt after one pass through the model: the first `DecodeState` (step 0, nothing chosen) and the
    prompt's last hidden states float `[B, T, D]` (contrastive search compares against them)."""

    state: DecodeState
    hidden: tf.Tensor


def decoding_model(model, rows):
    """`model.decoding_view(rows)` when the model offers one (see `tfgen.decoding.model_protocol`), else the model.
    Called in the program before a loop, so what the view prepares is computed once per run, not per step."""
    return model.decoding_view(rows) if capabilities(model).decoding_view else model


def size_of(tensor: tf.Tensor, axis: int):
    """`tensor.shape[axis]` when the trace knows it (so loop-carried shapes stay static), else its run-time size
    (an exported signature may leave batch and prompt length as None)."""
    size = tensor.shape[axis]
    return tf.shape(tensor)[axis] if size is None else size


def score_buffer(collecting: bool, steps: int, rows, vocab_size: int) -> tf.Tensor:
    """Zeros float32 `[steps, rows, vocab_size]` for per-step scores, or a `[0]` placeholder when not collected."""
    return tf.zeros(tf.stack([steps, rows, vocab_size]) if collecting else [0], tf.float32)


def record_step(buffer: tf.Tensor, values: tf.Tensor, step: tf.Tensor, collecting: bool) -> tf.Tensor:
    """`buffer` with `values` `[rows, V]` stored at `step` (unchanged when not collecting)."""
    if not collecting:
        return buffer
    return tf.tensor_scatter_nd_update(buffer, step[None, None], values[None])


class PromptBuffers(NamedTuple):
    """Prompts laid into fresh static buffers (B rows, T prompt columns, N new columns), the prefill's inputs.

    sequences: int32 `[B, T + N]`, the prompts then pad. buffer_mask: int32 `[B, T + N]`, their masks then 0.
    position_ids: int32 `[B, T]`, each prompt column's position (`prompt_positions`).
    """

    sequences: tf.Tensor
    buffer_mask: tf.Tensor
    position_ids: tf.Tensor


def prompt_positions(attention_mask: tf.Tensor) -> tf.Tensor:
    """int32 `[B, T]`: the position id of each column of prompts under `attention_mask` int32 `[B, T]` — real tokens
    counted from 0, padding columns at the position of the real token before them (0 before the first)."""
    # Positions count real tokens only, so padding (the caller's, the bucket's, a slot row's right padding) is exact.
    return tf.maximum(tf.cumsum(attention_mask, axis=1) - 1, 0)


def prompt_buffers(input_ids: tf.Tensor, attention_mask: tf.Tensor, new_columns, pad_token_id) -> PromptBuffers:
    """The buffers of prompts `input_ids` / `attention_mask` int32 `[B, T]` with room for `new_columns` (an int or an
    int32 scalar) new tokens after them, and their positions (see `PromptBuffers`)."""
    batch_size = tf.shape(input_ids)[0]
    return PromptBuffers(
        sequences=tf.concat([input_ids, tf.fill([batch_size, new_columns], pad_token_id)], axis=1),
        buffer_mask=tf.concat([attention_mask, tf.zeros([batch_size, new_columns], tf.int32)], axis=1),
        position_ids=prompt_positions(attention_mask),
    )


def prefill(model, inputs: DecodeInputs, buffer_new_tokens: int, *, output_scores=False,
            output_logits=False) -> Prefill:
    """Allocates the static buffers (`T + buffer_new_tokens` slots) and runs the whole prompt at once."""
    # Dynamic sizes (constants under a fixed-shape trace), so an exported signature can leave batch and
    # prompt length as None.
    batch_size, prompt_width = tf.unstack(tf.shape(inputs.input_ids))
    buffers = prompt_buffers(inputs.input_ids, inputs.attention_mask, buffer_new_tokens, inputs.pad_token_id)
    cache = start_cache(model, inputs, batch_size, prompt_width + buffer_new_tokens)
    out = model.call_with_cache(
        inputs.input_ids, cache, tf.constant(0, tf.int32), buffers.buffer_mask, buffers.position_ids,
        last_logits_only=True,
    )
    logits = tf.cast(out.logits[:, -1, :], tf.float32)
    vocab_size = logits.shape[-1]
    state = DecodeState(
        step=tf.constant(0, tf.int32),
        sequences=buffers.sequences,
        buffer_mask=buffers.buffer_mask,
        cache=out.cache,
        logits=logits,
        next_position=tf.reduce_sum(inputs.attention_mask, axis=1),
        finished=inputs.max_new_tokens <= 0,
        generated=tf.zeros_like(inputs.max_new_tokens),
        scores=score_buffer(output_scores, buffer_new_tokens, batch_size, vocab_size),
        raw_logits=score_buffer(output_logits, buffer_new_tokens, batch_size, vocab_size),
        grammar_state=grammar.start_states(inputs.knobs, batch_size),
    )
    return Prefill(state, out.hidden_states)


def start_cache(model, inputs: DecodeInputs, batch_size, total):
    """The model's empty cache of `total` slots for `batch_size` rows; for an encoder-decoder model the encoder runs
    here, once (unless its output came with the inputs), and its cross-attention keys and values are projected into
    the cache (`init_cache`'s keywords)."""
    if not inputs.encoder:
        return model.init_cache(batch_size, total)
    encoder = inputs.encoder
    hidden = encoder.hidden_states
    if isinstance(hidden, tuple):
        hidden = model.encode(encoder.input_ids, encoder.attention_mask)
    return model.init_cache(batch_size, total, encoder_hidden_states=hidden,
                            encoder_attention_mask=encoder.attention_mask)


def gather_rows(nest, rows: tf.Tensor):
    """Every tensor of `nest` (leading axis = rows) gathered at `rows` int32 `[R]`."""
    return tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows), nest)


def reorder_cache(cache, rows: tf.Tensor):
    """`cache` with its rows taken from `rows` int32 `[R]`, each from a row of the same prompt (beams, candidates).
    An encoder-decoder cache's `"encoder"` entry (cross-attention keys and values) is the same in every row of a
    prompt, so it is left as it is: a step's reorder never copies anything that grows with the encoder input."""
    if isinstance(cache, dict) and "encoder" in cache:
        return {**gather_rows({k: v for k, v in cache.items() if k != "encoder"}, rows), "encoder": cache["encoder"]}
    return gather_rows(cache, rows)


def write_at(buffer: tf.Tensor, values: tf.Tensor, index, axis: int = -1) -> tf.Tensor:
    """`buffer` with `values` (`buffer`'s shape without `axis`) written at position `index` (a scalar tensor)
    of `axis`. A masked select rather than a dynamic slice: the buffers are small, and this form is the same
    op eagerly, in a graph and under XLA."""
    rank = buffer.shape.rank
    axis %= rank
    at_index = tf.range(tf.shape(buffer)[axis]) == tf.cast(index, tf.int32)
    at_index = tf.reshape(at_index, [-1 if dim == axis else 1 for dim in range(rank)])
    return tf.where(at_index, tf.expand_dims(tf.cast(values, buffer.dtype), axis), buffer)


def is_eos(tokens: tf.Tensor, eos_token_ids: tf.Tensor) -> tf.Tensor:
    """bool, shape of `tokens`: whether each token is one of the eos ids (`[E]`, -1 padding never matches)."""
    return tf.reduce_any(tokens[..., None] == eos_token_ids, axis=-1)


def processor_context(inputs: DecodeInputs, sequences: tf.Tensor, step, copies: int = 1,
                      grammar_state=()) -> ProcessorContext:
    """Where HF's `input_ids` sits in `sequences` (`copies` consecutive rows per prompt) at `step`, and the rows'
    automaton states (`DecodeState.grammar_state`)."""
    max_length = inputs.prompt_len + inputs.max_new_tokens
    # Only the encoder-side processors read it; a program without them drops these ops.
    encoder_ids = encoder_input_ids(inputs)
    encoder_ids = encoder_ids if copies == 1 else tf.repeat(encoder_ids, copies, axis=0)
    return ProcessorContext(
        sequences=sequences,
        start=inputs.start,
        cur_len=inputs.prompt_len + step,
        prompt_len=inputs.prompt_len,
        max_length=max_length if copies == 1 else tf.repeat(max_length, copies),
        grammar_state=grammar_state,
        encoder_ids=encoder_ids,
    )


def encoder_input_ids(inputs: DecodeInputs) -> tf.Tensor:
    """int32 `[B, S]`: HF's `encoder_input_ids` — the encoder input of an encoder-decoder model, else the prompt (HF
    applies `encoder_repetition_penalty` to a decoder-only model's prompt) — with -1 in the bucket columns."""
    source = inputs.encoder if inputs.encoder else inputs
    ids, start = source.input_ids, source.start
    return tf.where(tf.range(tf.shape(ids)[1])[None, :] >= start, ids, -1)


def forward_last_tokens(model, state: DecodeState, prompt_width) -> DecodeState:
    """Runs each row's last chosen token (buffer column `prompt_width + step - 1`) through the model: the state
    with the updated cache, the logits for the token at `step` and the next positions."""
    index = prompt_width + state.step - 1
    tokens = tf.gather(state.sequences, index[None], axis=1)
    out = model.call_with_cache(tokens, state.cache, index, state.buffer_mask, state.next_position[:, None])
    return state._replace(
        cache=out.cache,
        logits=tf.cast(out.logits[:, -1, :], tf.float32),
        next_position=state.next_position + 1,
    )


def commit_tokens(state: DecodeState, inputs: DecodeInputs, tokens: tf.Tensor, processed: tf.Tensor,
                  spec) -> DecodeState:
    """Writes the chosen `tokens` int32 `[R]` at step `state.step` (pad in rows already finished), marks rows
    finished that hit eos, spent their budget or meet a stopping criterion of `spec` (a `DecodeSpec`), records
    the step's scores and advances `step`."""
    tokens = tf.where(state.finished, inputs.pad_token_id, tokens)
    index = tf.shape(inputs.input_ids)[1] + state.step
    sequences = write_at(state.sequences, tokens, index)
    eos = is_eos(tokens, inputs.eos_token_ids)
    finished = state.finished | eos | (state.step + 1 >= inputs.max_new_tokens)
    stopped = stopped_rows(spec.stop_strings, spec.stopping_criteria, sequences, index, inputs.start,
                           inputs.pad_token_id, processed)
    if stopped is not None:
        finished |= stopped
    return state._replace(
        step=state.step + 1,
        sequences=sequences,
        buffer_mask=write_at(state.buffer_mask, tf.ones_like(tokens), index),
        finished=finished,
        generated=state.generated + tf.cast(~state.finished, tf.int32),
        scores=record_step(state.scores, processed, state.step, spec.output_scores),
        raw_logits=record_step(state.raw_logits, state.logits, state.step, spec.output_logits),
        grammar_state=grammar.advance(inputs.knobs, state.grammar_state, tokens, state.finished | eos),
    )


def softmax_limit(scores: tf.Tensor) -> tf.Tensor:
    """`scores` float32 `[B, V]` with a defined softmax: NaN entries become -inf, and in a row holding +inf (a
    penalty or bias that overflowed float32) the +inf entries become 0 and the rest -inf — the limit the softmax
    tends to as those scores grow, where the plain softmax is NaN everywhere (HF's sampling raises on it)."""
    scores = tf.where(tf.math.is_nan(scores), -np.inf, scores)
    positive_inf = tf.equal(scores, np.inf)
    return tf.where(tf.reduce_any(positive_inf, axis=-1, keepdims=True),
                    tf.where(positive_inf, 0.0, -np.inf), scores)


def sample_from_scores(scores: tf.Tensor, row_seeds: tf.Tensor, step: tf.Tensor, stream: int = 0) -> tf.Tensor:
    """Draws one token per row from `softmax(scores)` by inverse CDF: int32 `[B]`.

    scores: float32 `[B, V]` (filtered entries are -inf). One uniform per row, keyed by the row's seed and the
    step (int32 scalar, or `[B]` where rows stand at different steps) and `stream` (see `uniform_per_row`), so a
    row's draw does not depend on its neighbours. A zero-probability token is never returned:
    the first index whose cumulative mass exceeds the target has positive mass by construction.
    """
    scores = softmax_limit(scores)
    probs = tf.nn.softmax(scores, axis=-1)
    cdf = tf.cumsum(probs, axis=-1)
    target = uniform_per_row(row_seeds, step, stream) * cdf[:, -1]
    index = tf.reduce_sum(tf.cast(cdf <= target[:, None], tf.int32), axis=-1)
    vocab = tf.shape(scores)[-1]
    # Rounding can leave the target at the very top of the CDF; fall back to the most likely token then.
    return tf.where(index < vocab, index, tf.argmax(scores, axis=-1, output_type=tf.int32))
