"""The drafters of speculative decoding: what proposes the `k` tokens the model then verifies in one call.

Each drafter works over the loop's static buffers, inside the compiled program:
    start(inputs, prefilled) -> drafter state          once, after the model's prefill
    draft(inputs, decode, drafter_state, slots) -> Draft
where `decode` is the loop's `DecodeState` and `slots` int32 `[B]` each row's pending token's buffer slot (its last
chosen token, not yet run through the model). Drafts are proposals for the next `k` tokens of each row; whatever
they hold, the verification keeps the output exactly the model's (`tfgen.decoding.speculative`).

- `PromptLookupDrafter` (HF's `prompt_lookup_num_tokens`): matches each row's last n tokens (n from
  `max_matching_ngram_size` down to 1) against its earlier tokens and proposes what followed the latest match.
  Deterministic (no draft distribution).
- `EarlyExitDrafter` (HF's `assistant_early_exit`): the model's first N layers, its final norm and its LM head,
  one token at a time; it shares the model's cache (those layers' keys and values are the model's own, and the
  verification rewrites the drafted slots).
- `AssistantDrafter` (HF's `assistant_model`): a second model with the same vocabulary and its own cache over the
  same buffer slots.
The model drafters choose greedily, or sample from their processed distribution when the loop samples (their
`Draft.probs` then feeds the speculative sampling rule).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgen.decoding.state import (
    DecodeInputs,
    DecodeState,
    encoder_input_ids,
    prompt_positions,
    sample_from_scores,
    size_of,
    softmax_limit,
)
from tfgen.logits.context import ProcessorContext
from tfgen.logits.pipeline import apply_processors

#: Philox streams of the draws a sampling drafter makes (stream 0 is the model's own choice of a token).
DRAFT_STREAM = 1


class Draft(NamedTuple):
    """tokens: int32 `[B, k]`, the proposal for each row's next k tokens. probs: float32 `[B, k, V]`, the
    distribution each token was drawn from (None for deterministic drafters and greedy ones). cache: the model's
    cache after drafting (the early-exit drafter writes its layers' slots; the others return it unchanged).
    state: the drafter's state for the next round."""

    tokens: tf.Tensor
    probs: tf.Tensor | None
    cache: object
    state: object


def block_mask(buffer_mask: tf.Tensor, slots: tf.Tensor, length: int) -> tf.Tensor:
    """`buffer_mask` int32 `[B, L]` with the `length` slots from each row's `slots` `[B]` on (the call's tokens)."""
    columns = tf.range(tf.shape(buffer_mask)[1])[tf.newaxis]
    inside = (columns >= slots[:, tf.newaxis]) & (columns < slots[:, tf.newaxis] + length)
    return tf.where(inside, 1, buffer_mask)


def write_row_columns(buffer: tf.Tensor, values: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
    """`buffer` `[B, L]` with `values` `[B, n]` written at each row's columns `[first, first + n)` (`first` `[B]`)."""
    n = values.shape[1]
    columns = tf.range(tf.shape(buffer)[1])[tf.newaxis] - first[:, tf.newaxis]  # [B, L]
    inside = (columns >= 0) & (columns < n)
    gathered = tf.gather(values, tf.clip_by_value(columns, 0, n - 1), axis=1, batch_dims=1)
    return tf.where(inside, tf.cast(gathered, buffer.dtype), buffer)


def draft_context(inputs: DecodeInputs, sequences: tf.Tensor, generated: tf.Tensor, offset) -> ProcessorContext:
    """The processors' view of each row when choosing its token number `generated + offset` (`generated` `[B]`)."""
    return ProcessorContext(
        sequences=sequences, start=inputs.start, cur_len=inputs.prompt_len + generated + offset,
        prompt_len=inputs.prompt_len, max_length=inputs.prompt_len + inputs.max_new_tokens,
        encoder_ids=encoder_input_ids(inputs),
    )


class PromptLookupDrafter:
    """N-gram lookup over each row's own tokens (prompt and generated), on device."""

    def __init__(self, draft_tokens: int, max_ngram: int):
        self.k, self.max_ngram = draft_tokens, max_ngram

    def start(self, inputs: DecodeInputs, prefilled: DecodeState):
        return ()

    def draft(self, inputs: DecodeInputs, decode: DecodeState, state, slots: tf.Tensor) -> Draft:
        sequences, real = decode.sequences, decode.buffer_mask > 0
        width = size_of(sequences, 1)
        end = slots + 1  # each row's tokens so far end before this column
        continuation = tf.fill(tf.shape(slots), -1)
        for n in range(self.max_ngram, 0, -1):
            suffix_columns = end[:, tf.newaxis] - n + tf.range(n)[tf.newaxis]  # [B, n]
            suffix = tf.gather(sequences, tf.maximum(suffix_columns, 0), axis=1, batch_dims=1)
            suffix_real = tf.reduce_all(tf.gather(real, tf.maximum(suffix_columns, 0), axis=1, batch_dims=1)
                                        & (suffix_columns >= 0), axis=1)
            starts = width - n + 1
            same = tf.ones_like(real[:, :starts])
            for offset in range(n):
                window = sequences[:, offset:offset + starts]
                same &= (window == suffix[:, offset:offset + 1]) & real[:, offset:offset + starts]
            follows = tf.range(starts)[tf.newaxis] + n  # where each window's continuation begins
            # The latest earlier occurrence with at least one token after it (the suffix itself has none).
            found = same & (follows < end[:, tf.newaxis]) & suffix_real[:, tf.newaxis]
            latest = tf.reduce_max(tf.where(found, follows, -1), axis=1)
            continuation = tf.where(continuation < 0, latest, continuation)
        columns = continuation[:, tf.newaxis] + tf.range(self.k)[tf.newaxis]
        tokens = tf.gather(sequences, tf.clip_by_value(columns, 0, width - 1), axis=1, batch_dims=1)
        # Past the row's end (or with no match) any token will do: verification rejects what the model would not say.
        tokens = tf.where((continuation[:, tf.newaxis] >= 0) & (columns < end[:, tf.newaxis]), tokens,
                          inputs.pad_token_id)
        return Draft(tokens, None, decode.cache, state)


class _ModelDrafter:
    """Drafting one token at a time with a model call (`_call`), choosing greedily or by sampling."""

    def __init__(self, draft_tokens: int, spec, sampling: bool):
        self.k, self.spec, self.sampling = draft_tokens, spec, sampling

    def _call(self, tokens, cache, slots, mask, positions, state):
        """(logits float32 `[B, V]` of the last token, model cache, drafter state) after running `tokens`."""
        raise NotImplementedError

    def _first_tokens(self, decode: DecodeState, slots: tf.Tensor):
        """(tokens `[B, n]`, their first slot `[B]`, positions `[B, n]`) the first drafting call runs."""
        pending = tf.gather(decode.sequences, slots[:, tf.newaxis], axis=1, batch_dims=1)
        return pending, slots, decode.next_position[:, tf.newaxis]

    def draft(self, inputs: DecodeInputs, decode: DecodeState, state, slots: tf.Tensor) -> Draft:
        mask = block_mask(decode.buffer_mask, slots, self.k + 1)
        tokens, first_slots, positions = self._first_tokens(decode, slots)
        logits, cache, state = self._call(tokens, decode.cache, first_slots, mask, positions, state)
        sequences, drafted, probs = decode.sequences, [], []
        for index in range(self.k):
            if index:
                logits, cache, state = self._call(drafted[-1][:, tf.newaxis], cache, slots + index, mask,
                                                  decode.next_position[:, tf.newaxis] + index, state)
            context = draft_context(inputs, sequences, decode.generated, index)
            scores = apply_processors(self.spec.processor_spec, logits, context, inputs.knobs)
            if self.sampling:
                token = sample_from_scores(scores, inputs.row_seeds, decode.generated + index, stream=DRAFT_STREAM)
                probs.append(tf.nn.softmax(softmax_limit(scores), axis=-1))
            else:
                token = tf.argmax(scores, axis=-1, output_type=tf.int32)
            drafted.append(token)
            sequences = write_row_columns(sequences, token[:, tf.newaxis], slots + 1 + index)
        return Draft(tf.stack(drafted, axis=1), tf.stack(probs, axis=1) if probs else None, cache, state)


class EarlyExitDrafter(_ModelDrafter):
    """The model's first `layers` layers, final norm and LM head; they share the model's cache."""

    def __init__(self, model, layers: int, draft_tokens: int, spec, sampling: bool):
        super().__init__(draft_tokens, spec, sampling)
        self.model, self.layers = model, layers

    def start(self, inputs: DecodeInputs, prefilled: DecodeState):
        return ()

    def _call(self, tokens, cache, slots, mask, positions, state):
        out = self.model.call_with_cache(tokens, cache, slots, mask, positions, last_logits_only=True,
                                         layers=self.layers)
        return tf.cast(out.logits[:, -1], tf.float32), out.cache, state


class AssistantDrafter(_ModelDrafter):
    """A second model with its own cache over the same buffer slots (the state is that cache).

    Each round first re-runs the token before the pending one with it: when the model accepted every draft, the
    assistant never ran the last one, and re-running a token it did run rewrites the same keys and values."""

    def __init__(self, assistant, view, draft_tokens: int, spec, sampling: bool):
        """`view`: what the drafting calls run (the assistant, or its decoding view made once per run)."""
        super().__init__(draft_tokens, spec, sampling)
        self.assistant, self.view = assistant, view

    def start(self, inputs: DecodeInputs, prefilled: DecodeState):
        batch, width = size_of(inputs.input_ids, 0), size_of(prefilled.buffer_mask, 1)
        cache = self.assistant.init_cache(batch, width)
        return self.assistant.call_with_cache(inputs.input_ids, cache, tf.constant(0, tf.int32), prefilled.buffer_mask,
                                              prompt_positions(inputs.attention_mask), last_logits_only=True).cache

    def _first_tokens(self, decode: DecodeState, slots: tf.Tensor):
        first = tf.maximum(slots - 1, 0)
        tokens = tf.gather(decode.sequences, tf.stack([first, slots], axis=1), axis=1, batch_dims=1)
        positions = decode.next_position[:, tf.newaxis] + tf.constant([[-1, 0]])
        return tokens, first, tf.maximum(positions, 0)

    def _call(self, tokens, cache, slots, mask, positions, state):
        out = self.view.call_with_cache(tokens, state, slots, mask, positions, last_logits_only=True)
        return tf.cast(out.logits[:, -1], tf.float32), cache, out.cache
