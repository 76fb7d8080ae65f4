"""Speculative decoding inside the compiled loop: a drafter proposes k tokens per row, the model scores them all in
one call over k + 1 positions, and each row keeps the drafts the model agrees with plus one token of the model's
own — so every row advances by its own count (its cache slot, positions and mask move per row).

Exactness:
- greedy: a draft is kept when it is the model's argmax at its position; the tokens equal plain greedy search's.
- sampling with a deterministic drafter (prompt lookup; the one-hot-draft form of the rule): at each position the
  model's token is drawn exactly as plain sampling draws it (same processed scores, same per-row key and token
  index) and the draft is kept when it equals that draw; so the tokens equal plain sampling's with the same seed.
- sampling with a model drafter (assistant, early exit): the speculative sampling rule (Leviathan et al. 2023,
  Chen et al. 2023): draft x ~ q is kept with probability min(1, p(x) / q(x)); at the first rejection the token is
  drawn from normalize(max(p - q, 0)); when all k are kept a bonus token is drawn from p. Each token is distributed
  exactly as the model's p. Every draw is keyed by the row's seed and the index of the token it decides, so rows
  are batch-invariant and a seed gives the same tokens every time.
Logits processors and warpers run on every verified position with that position's context, as in plain decoding;
eos, budgets, stop strings and stopping criteria are applied token by token to what a row keeps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfgen.config.knobs import repeat_per_row
from tfgen.decoding.drafters import (
    AssistantDrafter,
    EarlyExitDrafter,
    PromptLookupDrafter,
    block_mask,
    draft_context,
    write_row_columns,
)
from tfgen.decoding.loop import DecodingLoop
from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.random import uniform_per_row
from tfgen.decoding.rows import RowTokens, commit_per_row
from tfgen.decoding.state import (
    DecodeInputs,
    DecodeState,
    commit_tokens,
    decoding_model,
    prefill,
    processor_context,
    sample_from_scores,
    size_of,
    softmax_limit,
)
from tfgen.logits.pipeline import apply_processors

#: Philox stream of the acceptance test of the speculative sampling rule (0: token draws, 1: drafter draws).
ACCEPT_STREAM = 2


class SpeculativeState(NamedTuple):
    """decode: the `DecodeState` over a buffer of `T + N + k` columns (k: draft tokens, room for a last round's
    drafts); its `step` counts the columns final in every row (what streaming may hand out), `generated` each
    row's own count. drafter: the drafter's state (the assistant's cache, or `()`). accepted: int32 `[B]`, drafts
    each row kept; rounds: int32 `[B]`, verification calls each row took part in while running."""

    decode: DecodeState
    drafter: Any
    accepted: tf.Tensor
    rounds: tf.Tensor


def ready_columns(decode: DecodeState) -> tf.Tensor:
    """int32 scalar: new-token columns final in every row (a finished row's columns all are)."""
    most = tf.reduce_max(decode.generated)
    return tf.reduce_min(tf.where(decode.finished, most, decode.generated))


def record_rows(buffer: tf.Tensor, values: tf.Tensor, steps: tf.Tensor, active: tf.Tensor, collecting: bool):
    """`buffer` `[S, B, V]` with `values` `[B, V]` stored at each active row's own step (`steps` `[B]`)."""
    if not collecting:
        return buffer
    rows = tf.range(tf.shape(values)[0])
    indices = tf.stack([tf.minimum(steps, tf.shape(buffer)[0] - 1), rows], axis=1)
    kept = tf.where(active[:, tf.newaxis], values, tf.gather_nd(buffer, indices))
    return tf.tensor_scatter_nd_update(buffer, indices, kept)


def commit_row_tokens(decode: DecodeState, inputs: DecodeInputs, tokens, active, processed, raw_logits, spec):
    """Appends `tokens` int32 `[B]` to the `active` rows (bool `[B]`), each at its own next column; marks rows
    finished that hit eos, spent their budget or meet a stop string or stopping criterion; records scores."""
    rows = commit_per_row(
        RowTokens(decode.sequences, decode.buffer_mask, decode.finished, decode.generated), tokens,
        size_of(inputs.input_ids, 1) + decode.generated, active, processed, eos_token_ids=inputs.eos_token_ids,
        budget=inputs.max_new_tokens, stop_strings=spec.stop_strings, stopping_criteria=spec.stopping_criteria,
        start=inputs.start, pad_token_id=inputs.pad_token_id,
    )
    return decode._replace(
        sequences=rows.sequences,
        buffer_mask=rows.mask,
        finished=rows.finished,
        generated=rows.generated,
        scores=record_rows(decode.scores, processed, decode.generated, active, spec.output_scores),
        raw_logits=record_rows(decode.raw_logits, raw_logits, decode.generated, active, spec.output_logits),
    )


def leading_true(matches: tf.Tensor) -> tf.Tensor:
    """int32 `[B]`: how many entries of bool `[B, k]` are true before the first false."""
    return tf.reduce_sum(tf.math.cumprod(tf.cast(matches, tf.int32), axis=1), axis=1)


class SpeculativeLoop(DecodingLoop):
    """Assisted generation (HF's name): greedy search or sampling, k drafted tokens verified per model call.

    Static options: `do_sample`, `drafter` ("prompt_lookup", "early_exit" or "assistant"), `draft_tokens` (k),
    `max_ngram` (prompt lookup), `exit_layers` (early exit); the assistant model is `spec.assistant`.
    """

    def __init__(self, model, spec):
        super().__init__(model, spec)
        self.k = int(spec.option("draft_tokens"))
        self.sampling = bool(spec.option("do_sample"))
        self.rows_per_prompt = self.k + 1
        self.drafter = self._drafter(model, spec.assistant)

    def _drafter(self, model, assistant_view):
        kind, spec = self.spec.option("drafter"), self.spec
        if kind == "prompt_lookup":
            return PromptLookupDrafter(self.k, int(spec.option("max_ngram")))
        if kind == "early_exit":
            return EarlyExitDrafter(model, int(spec.option("exit_layers")), self.k, spec, self.sampling)
        return AssistantDrafter(spec.assistant, assistant_view, self.k, spec, self.sampling)

    def with_decoding_view(self, batch_rows):
        loop = super().with_decoding_view(batch_rows)
        assistant = self.spec.assistant
        loop.drafter = loop._drafter(loop.step_model, assistant and decoding_model(assistant, batch_rows))
        return loop

    def start(self, inputs: DecodeInputs) -> SpeculativeState:
        """Prefills the prompt into a buffer with room for the last round's drafts and chooses the first token."""
        spec = self.spec
        state = prefill(self.model, inputs, spec.buffer_new_tokens + self.k, output_scores=spec.output_scores,
                        output_logits=spec.output_logits).state
        scores = apply_processors(spec.processor_spec, state.logits, processor_context(inputs, state.sequences, 0),
                                  inputs.knobs)
        if self.sampling:
            tokens = sample_from_scores(scores, inputs.row_seeds, state.step)
        else:
            tokens = tf.argmax(scores, axis=-1, output_type=tf.int32)
        decode = commit_tokens(state, inputs, tokens, scores, spec)
        decode = decode._replace(step=ready_columns(decode))
        zeros = tf.zeros_like(decode.generated)
        return SpeculativeState(decode, self.drafter.start(inputs, decode), zeros, zeros)

    def decode_state(self, state: SpeculativeState) -> DecodeState:
        return state.decode

    def step(self, inputs: DecodeInputs, state: SpeculativeState) -> SpeculativeState:
        """One round: draft k tokens per row, verify them with the pending token in one call, keep per row."""
        k, spec = self.k, self.spec
        decode = state.decode
        decode = decode._replace(finished=decode.finished | (decode.generated >= inputs.max_new_tokens))
        running = ~decode.finished
        # The pending token (chosen, not yet run through the model) sits at each row's last written column.
        slots = tf.maximum(size_of(inputs.input_ids, 1) + decode.generated - 1, 0)
        draft = self.drafter.draft(inputs, decode, state.drafter, slots)
        pending = tf.gather(decode.sequences, slots[:, tf.newaxis], axis=1, batch_dims=1)
        out = self.step_model.call_with_cache(
            tf.concat([pending, draft.tokens], axis=1), draft.cache, slots,
            block_mask(decode.buffer_mask, slots, k + 1),
            decode.next_position[:, tf.newaxis] + tf.range(k + 1)[tf.newaxis],
        )
        logits = tf.cast(out.logits, tf.float32)  # [B, k + 1, V]
        scores = self._scores(inputs, logits, write_row_columns(decode.sequences, draft.tokens, slots + 1),
                              decode.generated)
        tokens, accepted = self._accept(inputs, scores, draft, decode.generated)
        before = decode.generated
        decode = decode._replace(cache=out.cache)
        for index in range(k + 1):
            active = (index <= accepted) & ~decode.finished
            decode = commit_row_tokens(decode, inputs, tokens[:, index], active, scores[:, index], logits[:, index],
                                       spec)
        decode = decode._replace(next_position=decode.next_position + decode.generated - before)
        decode = decode._replace(step=ready_columns(decode))
        return SpeculativeState(
            decode, draft.state, state.accepted + tf.where(running, accepted, 0),
            state.rounds + tf.cast(running, tf.int32),
        )

    def _scores(self, inputs: DecodeInputs, logits, drafted_sequences, generated) -> tf.Tensor:
        """The processed scores float32 `[B, k + 1, V]` of every verified position, each with its own context."""
        copies, vocab = self.k + 1, logits.shape[-1]
        offsets = tf.range(copies)[tf.newaxis]
        context = draft_context(inputs, tf.repeat(drafted_sequences, copies, axis=0),
                                tf.reshape(generated[:, tf.newaxis] + offsets, [-1]), 0)
        context = context._replace(max_length=tf.repeat(context.max_length, copies),
                                   encoder_ids=tf.repeat(context.encoder_ids, copies, axis=0))
        knobs = repeat_per_row(inputs.knobs, copies, lambda value, n: tf.repeat(value, n, axis=0))
        scores = apply_processors(self.spec.processor_spec, tf.reshape(logits, [-1, vocab]), context, knobs)
        return tf.reshape(scores, [-1, copies, vocab])

    def _draws(self, inputs: DecodeInputs, scores, generated, stream: int = 0) -> tf.Tensor:
        """int32 `[B, n]`: a token drawn from each position of `scores` `[B, n, V]`, keyed by the row's seed and
        the index of the token it decides (`generated` `[B]` + position)."""
        positions, vocab = scores.shape[1], scores.shape[-1]
        steps = tf.reshape(generated[:, tf.newaxis] + tf.range(positions)[tf.newaxis], [-1])
        seeds = tf.repeat(inputs.row_seeds, positions, axis=0)
        draws = sample_from_scores(tf.reshape(scores, [-1, vocab]), seeds, steps, stream)
        return tf.reshape(draws, [-1, positions])

    def _accept(self, inputs: DecodeInputs, scores, draft, generated):
        """(tokens int32 `[B, k + 1]`, accepted int32 `[B]`): each row keeps `tokens[:, :accepted + 1]`."""
        k = self.k
        if not self.sampling:
            chosen = tf.argmax(scores, axis=-1, output_type=tf.int32)
            return chosen, leading_true(chosen[:, :k] == draft.tokens)
        if draft.probs is None:  # a deterministic draft: the one-hot form of the rule
            chosen = self._draws(inputs, scores, generated)
            return chosen, leading_true(chosen[:, :k] == draft.tokens)
        probs = tf.nn.softmax(softmax_limit(scores), axis=-1)  # [B, k + 1, V]
        target, proposal = probs[:, :k], draft.probs
        picked = draft.tokens[..., tf.newaxis]
        target_picked = tf.gather(target, picked, axis=2, batch_dims=2)[..., 0]
        proposal_picked = tf.gather(proposal, picked, axis=2, batch_dims=2)[..., 0]
        steps = tf.reshape(generated[:, tf.newaxis] + tf.range(k)[tf.newaxis], [-1])
        uniforms = tf.reshape(uniform_per_row(tf.repeat(inputs.row_seeds, k, axis=0), steps, ACCEPT_STREAM), [-1, k])
        accepted = leading_true(uniforms * proposal_picked < target_picked)
        residual = tf.maximum(target - proposal, 0.0)
        # p == q leaves no residual mass, but then every draft is kept; p keeps the draw defined anyway.
        residual = tf.where(tf.reduce_sum(residual, axis=-1, keepdims=True) > 0, residual, target)
        corrections = tf.concat([self._draws(inputs, tf.math.log(residual), generated),
                                 self._draws(inputs, scores[:, k:], generated + k)], axis=1)
        drafts = tf.concat([draft.tokens, corrections[:, k:]], axis=1)
        chosen = tf.where(tf.range(k + 1)[tf.newaxis] < accepted[:, tf.newaxis], drafts, corrections)
        return chosen, accepted

    def result(self, inputs: DecodeInputs, state: SpeculativeState) -> dict:
        """`DecodingLoop.result`'s outputs over the caller's `T + N` columns, plus `draft_accepted` and
        `draft_rounds` int32 `[B]` (drafts each row kept, verification rounds it ran)."""
        decode, new_tokens = state.decode, self.spec.buffer_new_tokens
        width = size_of(inputs.input_ids, 1) + new_tokens
        decode = decode._replace(
            sequences=decode.sequences[:, :width],
            step=tf.reduce_max(decode.generated),
            scores=decode.scores[:new_tokens] if self.spec.output_scores else decode.scores,
            raw_logits=decode.raw_logits[:new_tokens] if self.spec.output_logits else decode.raw_logits,
        )
        return self.token_result(decode, draft_accepted=state.accepted, draft_rounds=state.rounds)


def assisted_options(config) -> dict:
    """The static options of assisted generation: greedy or sampling, the drafter and its sizes (HF's defaults:
    `max_matching_ngram_size` 2; a model drafter drafts `num_assistant_tokens`)."""
    if config.prompt_lookup_num_tokens is not None and config.assistant_early_exit is not None:
        raise ValueError("prompt_lookup_num_tokens / assistant_early_exit: choose one drafter, not both.")
    options = {"do_sample": bool(config.do_sample), "max_ngram": 0, "exit_layers": 0}
    if config.prompt_lookup_num_tokens is not None:
        return {**options, "drafter": "prompt_lookup", "draft_tokens": int(config.prompt_lookup_num_tokens),
                "max_ngram": int(config.max_matching_ngram_size or 2)}
    draft_tokens = int(config.num_assistant_tokens)
    if config.assistant_early_exit is not None:
        return {**options, "drafter": "early_exit", "draft_tokens": draft_tokens,
                "exit_layers": int(config.assistant_early_exit)}
    return {**options, "drafter": "assistant", "draft_tokens": draft_tokens}


def check_assisted(model, assistant_model, config, user_processors) -> None:
    """Refuses, before anything compiles, an assisted-generation request tfgen cannot run exactly: a model (or
    assistant) whose `call_with_cache` does not take a per-row `cache_index`, two drafters,
    an assistant that does not follow the model protocol or has another vocabulary, an early exit at or past the
    model's last layer (or on a model without early exit), and user logits processors (they take one `cur_len`
    for the whole batch, and speculative rows stand at different lengths)."""
    if assistant_model is not None and not all(
            callable(getattr(assistant_model, name, None)) for name in ("init_cache", "call_with_cache")):
        raise TypeError("assistant_model must be a tfgen causal LM (init_cache / call_with_cache), got "
                        f"{type(assistant_model).__name__}")
    for name, net in (("model", model), ("assistant_model", assistant_model)):
        if net is not None and not capabilities(net).row_cache_index:
            raise ValueError(f"{name}: {type(net).__name__} does not declare `row_cache_index = True` (a "
                             "call_with_cache taking one cache slot per row, `tfgen.decoding.model_protocol`), which "
                             "assisted generation needs.")
    if assistant_model is not None:
        chosen = [name for name in ("prompt_lookup_num_tokens", "assistant_early_exit")
                  if getattr(config, name) is not None]
        if chosen:
            raise ValueError(f"assistant_model: choose one drafter; {chosen[0]} is set too.")
        ours, theirs = int(model.config.vocab_size), int(assistant_model.config.vocab_size)
        if ours != theirs:
            raise ValueError(f"assistant_model: its vocabulary has {theirs} tokens, the model's {ours}; the assistant "
                             "must share the model's tokenizer.")
    if config.assistant_early_exit is not None:
        if not capabilities(model).early_exit_layers:
            raise ValueError(f"assistant_early_exit: {type(model).__name__} cannot run part of its layers.")
        layers = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
        if layers is not None and config.assistant_early_exit >= layers:
            raise ValueError(f"assistant_early_exit: {config.assistant_early_exit} must be below the model's "
                             f"{layers} layers.")
    if user_processors:
        raise ValueError("logits_processor: assisted generation checks each row at its own length, and a user "
                         "processor takes one cur_len for the whole batch; use the built-in processors, or plain "
                         "greedy search / sampling.")
