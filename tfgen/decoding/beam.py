"""Beam search and beam sampling (HF transformers 4.55.4's vectorised `_beam_search`), plus what every beam
strategy shares (`tfgen.decoding.group_beam` builds group beam search on it).

All beams of all prompts decode together as `B * num_beams` rows grouped by prompt; the cache keeps that row count
and is reordered with one `tf.gather` per step (leading axis = batch, see `tfgen.decoding.model_protocol`), so nothing
is re-padded or re-shaped. Finished hypotheses live in static `[B, num_beams, ...]` buffers with their scores.

A few static sizes differ from HF's while giving its results: HF keeps `max(2, 1 + n_eos) * num_beams`
candidates per step, where `n_eos` is only known at run time here (eos ids are a padded tensor), so the loop
takes as many candidates as the eos vector has slots and rules the extra ranks out.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS, repeat_per_row
from tfgen.decoding.loop import DecodingLoop
from tfgen.decoding.random import uniform_per_element
from tfgen.decoding.state import (
    DecodeInputs,
    DecodeState,
    forward_last_tokens,
    gather_rows,
    is_eos,
    prefill,
    processor_context,
    record_step,
    reorder_cache,
    score_buffer,
    size_of,
    write_at,
)
from tfgen.logits import grammar
from tfgen.logits.pipeline import apply_processors
from tfgen.stopping.criteria import stopped_rows

# HF's offset for "this candidate may not be chosen" (added, so ruled-out candidates keep their order).
IMPOSSIBLE = -1.0e9

# `early_stopping` as a knob (so its three modes share one program): HF's False, True and "never".
_HEURISTIC, _WHEN_FULL, _NEVER = 0, 1, 2


# ----------------------------------------------------------------------------------------------------------
# Options and run-time knobs (see `Strategy` in tfgen.decoding.strategies)


def beam_options(config) -> dict:
    """Static options of beam search / beam sampling."""
    return {
        "num_beams": int(config.num_beams),
        "num_return_sequences": int(config.num_return_sequences or 1),
        "do_sample": bool(config.do_sample),
    }


def beam_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """`length_penalty` and `early_stopping` (0 = False, 1 = True, 2 = "never"), `[batch_size]` each."""
    value = config.early_stopping
    if not (isinstance(value, bool) or value == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {value!r}")
    code = _NEVER if value == "never" else _WHEN_FULL if value else _HEURISTIC
    return {
        "length_penalty": KNOBS["length_penalty"].fill(batch_size, float(config.length_penalty)),
        "early_stopping": KNOBS["early_stopping"].fill(batch_size, code),
    }


def repeat_knobs(knobs: dict, copies: int) -> dict:
    """The knobs for `copies` consecutive rows per prompt (per-row knobs repeated, shared ones as they are)."""
    return repeat_per_row(knobs, copies, lambda value, n: tf.repeat(value, n, axis=0))


# Beam scores are float32 sums of log-probabilities divided by `length ** length_penalty`: past e**80 the divisor
# (or its inverse, times the summed log-probabilities) leaves float32 (max e**88.7), every hypothesis scores 0 or
# -inf and the ranking is arbitrary. So |length_penalty| * ln(longest generated length) must stay within this.
LENGTH_PENALTY_EXPONENT_LIMIT = 80.0


def length_penalty_fits(length_penalty, max_new_tokens) -> tf.Tensor:
    """Element-wise bool: whether `length ** length_penalty` stays within float32 for every generated length up
    to `max_new_tokens` (float64 / int arrays or tensors of one shape; see `LENGTH_PENALTY_EXPONENT_LIMIT`)."""
    longest = tf.maximum(tf.cast(tf.convert_to_tensor(max_new_tokens), tf.float64), 1.0)
    length_penalty = tf.cast(tf.convert_to_tensor(length_penalty, dtype_hint=tf.float64), tf.float64)
    return tf.abs(length_penalty) * tf.math.log(longest) <= LENGTH_PENALTY_EXPONENT_LIMIT


def length_divisor(length: tf.Tensor, length_penalty: tf.Tensor) -> tf.Tensor:
    """float32 `length ** length_penalty`, computed in double precision like HF's Python `int ** float`."""
    return tf.cast(tf.pow(tf.cast(length, tf.float64), length_penalty), tf.float32)


def static_candidates(inputs: DecodeInputs, beams: int) -> int:
    """Candidates a step ranks for `beams` beams: enough for any number of eos ids the eos vector can hold
    (`candidates_kept` rules out the ranks HF would not keep)."""
    return (1 + max(1, inputs.eos_token_ids.shape[0])) * beams


def candidates_kept(eos_token_ids: tf.Tensor, beams: int) -> tf.Tensor:
    """HF's number of candidates per step: `max(2, 1 + n_eos) * beams` (int32 scalar)."""
    n_eos = tf.reduce_sum(tf.cast(eos_token_ids >= 0, tf.int32))
    return tf.maximum(2, 1 + n_eos) * beams


class StoppingRules(NamedTuple):
    """The per-prompt knobs of HF's finishing rules."""

    length_penalty: tf.Tensor  # float64 [B]
    stops_when_full: tf.Tensor  # bool [B]: early_stopping=True
    bounds_by_budget: tf.Tensor  # bool [B]: the best attainable length is the budget ("never", positive penalty)

    @classmethod
    def from_knobs(cls, inputs: DecodeInputs) -> StoppingRules:
        length_penalty = tf.convert_to_tensor(inputs.knobs["length_penalty"], tf.float64)
        early_stopping = tf.convert_to_tensor(inputs.knobs["early_stopping"], tf.int32)
        return cls(length_penalty, early_stopping == _WHEN_FULL, (early_stopping == _NEVER) & (length_penalty > 0.0))

    def attainable_length(self, inputs: DecodeInputs, step) -> tf.Tensor:
        """int32 [B]: the generated length HF's early-stop checks divide the best running score by."""
        return tf.where(self.bounds_by_budget, inputs.max_new_tokens, step + 1)


# ----------------------------------------------------------------------------------------------------------
# The part of the loop every beam strategy shares


class BeamState(NamedTuple):
    """decode: the `DecodeState` of the `B * K` running beams, grouped by prompt; its `cache` rows are in the
    order of the previous step and `cache_rows` int32 `[B * K]` says which cache row each beam continues.
    `finished` marks the beams of prompts whose search is done. search: the strategy's own state."""

    decode: DecodeState
    cache_rows: tf.Tensor
    search: Any


class _StepSizes(NamedTuple):
    batch_size: Any  # B prompts
    prompt_width: Any  # T
    vocab_size: int  # V
    total: Any  # T + N buffer columns
    prompt_rows: tf.Tensor  # int32 [B, 1]: each prompt's index
    rules: StoppingRules


class BeamLoopBase(DecodingLoop):
    """What beam search, beam sampling and group beam search share: `K = num_beams` rows per prompt, the cache
    reordered at the start of each step, and a strategy-specific `_choose(inputs, state)`."""

    def __init__(self, model, spec):
        super().__init__(model, spec)
        self.beams = int(spec.option("num_beams"))
        self.num_return_sequences = int(spec.option("num_return_sequences", 1))
        if not 1 <= self.num_return_sequences <= self.beams:
            raise ValueError(
                f"num_return_sequences must be in [1, num_beams={self.beams}], got {self.num_return_sequences}"
            )
        self.rows_per_prompt = self.beams

    def decode_state(self, state: BeamState) -> DecodeState:
        return state.decode

    def start(self, inputs: DecodeInputs) -> BeamState:
        """Runs each prompt once, copies the result to its `K` rows and chooses the first tokens."""
        spec = self.spec
        prefilled = prefill(self.model, inputs, spec.buffer_new_tokens).state
        batch_size = size_of(inputs.input_ids, 0)
        rows = tf.repeat(tf.range(batch_size), self.beams)
        vocab_size = prefilled.logits.shape[-1]
        decode = DecodeState(
            step=prefilled.step,
            sequences=tf.gather(prefilled.sequences, rows),
            buffer_mask=tf.gather(prefilled.buffer_mask, rows),
            cache=gather_rows(prefilled.cache, rows),
            logits=tf.gather(prefilled.logits, rows),
            next_position=tf.gather(prefilled.next_position, rows),
            finished=tf.gather(prefilled.finished, rows),
            generated=tf.gather(prefilled.generated, rows),
            scores=score_buffer(spec.output_scores, spec.buffer_new_tokens, batch_size * self.beams, vocab_size),
            raw_logits=score_buffer(spec.output_logits, spec.buffer_new_tokens, batch_size * self.beams, vocab_size),
            grammar_state=gather_rows(prefilled.grammar_state, rows),
        )
        state = BeamState(decode, tf.range(batch_size * self.beams), self._initial_search(inputs, decode))
        return self._choose(inputs, state)

    def step(self, inputs: DecodeInputs, state: BeamState) -> BeamState:
        """Reorders the cache to the running beams, runs their last tokens through the model, chooses."""
        decode = state.decode._replace(cache=reorder_cache(state.decode.cache, state.cache_rows))
        decode = forward_last_tokens(self.step_model, decode, tf.shape(inputs.input_ids)[1])
        return self._choose(inputs, BeamState(decode, tf.range(size_of(state.cache_rows, 0)), state.search))

    def _commit(self, inputs, state: BeamState, rows, tokens, processed, search_done) -> BeamState:
        """Makes running beam `i` a copy of beam `rows[i]` extended with `tokens[i]` (both `[B*K]`); the beams of
        prompts whose search is done (`search_done` bool `[B]`) are marked finished."""
        decode, spec = state.decode, self.spec
        index = tf.shape(inputs.input_ids)[1] + decode.step
        decode = decode._replace(
            step=decode.step + 1,
            sequences=write_at(tf.gather(decode.sequences, rows), tokens, index),
            buffer_mask=write_at(decode.buffer_mask, tf.ones_like(tokens), index),
            finished=tf.repeat(search_done, self.beams),
            scores=record_step(decode.scores, processed, decode.step, spec.output_scores),
            raw_logits=record_step(decode.raw_logits, decode.logits, decode.step, spec.output_logits),
            # A beam's automaton state follows it: its source beam's state, advanced by its new token.
            grammar_state=grammar.advance(inputs.knobs, gather_rows(decode.grammar_state, rows), tokens,
                                          is_eos(tokens, inputs.eos_token_ids)),
        )
        return state._replace(decode=decode, cache_rows=tf.gather(state.cache_rows, rows))

    def _initial_search(self, inputs: DecodeInputs, decode: DecodeState):
        raise NotImplementedError

    @staticmethod
    def _sizes(inputs: DecodeInputs, decode: DecodeState) -> _StepSizes:
        """What every beam step derives from its inputs and state (static where the trace knows them)."""
        batch_size = size_of(inputs.input_ids, 0)
        return _StepSizes(
            batch_size=batch_size,
            prompt_width=size_of(inputs.input_ids, 1),
            vocab_size=decode.logits.shape[-1],
            total=size_of(decode.sequences, 1),
            prompt_rows=tf.range(batch_size)[:, None],
            rules=StoppingRules.from_knobs(inputs),
        )

    def _choose(self, inputs: DecodeInputs, state: BeamState) -> BeamState:
        raise NotImplementedError

    def _beam_result(self, decode: DecodeState, sequences, sequences_scores, beam_indices) -> dict:
        """`result`'s dict for the returned hypotheses (`beam_indices` hold -1 after a hypothesis's end)."""
        return self.token_result(
            decode, sequences=sequences, sequences_scores=sequences_scores, beam_indices=beam_indices,
            generated_lengths=tf.reduce_sum(tf.cast(beam_indices >= 0, tf.int32), axis=-1),
        )


# ----------------------------------------------------------------------------------------------------------
# Beam search and beam sampling (HF `_beam_search`)


class BeamSearch(NamedTuple):
    running_scores: tf.Tensor  # float32 [B, K] summed log-probs of the running beams, best first
    running_indices: tf.Tensor  # int32 [B, K, N] HF beam_indices of the running beams (-1 = no token yet)
    finished_sequences: tf.Tensor  # int32 [B, K, L]
    finished_scores: tf.Tensor  # float32 [B, K] length-penalised scores, best first
    finished_indices: tf.Tensor  # int32 [B, K, N]
    is_finished: tf.Tensor  # bool [B, K]: slot holds a finished hypothesis
    improvable: tf.Tensor  # bool [B]: HF's is_early_stop_heuristic_unsatisfied
    done: tf.Tensor  # bool [B]: this prompt no longer keeps the loop going


class BeamSearchLoop(BeamLoopBase):
    """Beam search (or, with the static option `do_sample`, beam sampling) over `num_beams` beams per prompt.

    `result` gives `sequences` int32 `[B * R, T + N]` (each prompt's best `R = num_return_sequences` finished
    hypotheses, best first, padded after their end), `sequences_scores` float32 `[B * R]` (summed
    log-probabilities divided by `generated_length ** length_penalty`), `beam_indices` int32 `[B * R, N]`
    (`prompt * num_beams + beam` each token came from, -1 after the end), `steps`, and when asked `scores` /
    `logits` float32 `[N, B * num_beams, V]` (the processed log-softmax scores / raw logits of every running beam).

    Beam sampling draws HF's candidates without replacement from `softmax(beam scores + log-probs)` with the
    Gumbel-top-k trick, one uniform per (beam, token) keyed by the prompt's `row_seeds` and the step, so a prompt's
    result does not depend on the rest of the batch.
    """

    def __init__(self, model, spec):
        super().__init__(model, spec)
        if self.beams < 2:
            raise ValueError(f"num_beams must be at least 2 for beam search, got {self.beams}")

    def _initial_search(self, inputs: DecodeInputs, decode: DecodeState) -> BeamSearch:
        beams, batch_size = self.beams, size_of(inputs.input_ids, 0)
        # Only the first beam of a prompt starts live, so the first step does not pick the same token K times.
        first_beam = tf.range(beams) == 0
        no_indices = tf.fill(tf.stack([batch_size, beams, self.spec.buffer_new_tokens]), -1)
        has_budget = inputs.max_new_tokens > 0
        return BeamSearch(
            running_scores=tf.tile(tf.where(first_beam, 0.0, IMPOSSIBLE)[None], tf.stack([batch_size, 1])),
            running_indices=no_indices,
            finished_sequences=tf.reshape(decode.sequences, [batch_size, beams, -1]),
            finished_scores=tf.fill(tf.stack([batch_size, beams]), IMPOSSIBLE),
            finished_indices=no_indices,
            is_finished=tf.zeros(tf.stack([batch_size, beams]), tf.bool),
            improvable=has_budget,
            done=~has_budget,
        )

    def _choose(self, inputs: DecodeInputs, state: BeamState) -> BeamState:
        spec, beams, decode, search = self.spec, self.beams, state.decode, state.search
        step = decode.step
        batch_size, prompt_width, vocab_size, total, prompt_rows, rules = self._sizes(inputs, decode)
        candidates = static_candidates(inputs, beams)
        ranks = tf.range(candidates)

        context = processor_context(inputs, decode.sequences, step, beams, decode.grammar_state)
        processed = apply_processors(
            spec.processor_spec, tf.nn.log_softmax(decode.logits), context, repeat_knobs(inputs.knobs, beams),
            spec.user_processors,
        )
        totals = tf.reshape(processed, [batch_size, beams, vocab_size]) + search.running_scores[:, :, None]
        totals = tf.reshape(totals, [batch_size, beams * vocab_size])
        if spec.option("do_sample"):
            uniforms = uniform_per_element(inputs.row_seeds, step, beams * vocab_size)
            order = tf.math.top_k(totals - tf.math.log(-tf.math.log(uniforms)), candidates).indices
            candidate_scores = tf.gather(totals, order, batch_dims=1)
        else:
            candidate_scores, order = tf.math.top_k(totals, candidates)
        available = ranks < candidates_kept(inputs.eos_token_ids, beams)
        candidate_scores = tf.where(available, candidate_scores, float("-inf"))
        source = order // vocab_size  # [B, M] beam within the prompt
        tokens = order % vocab_size
        candidate_sequences = tf.gather(tf.reshape(decode.sequences, [batch_size, beams, total]), source, batch_dims=1)
        candidate_sequences = write_at(candidate_sequences, tokens, prompt_width + step)
        candidate_indices = write_at(
            tf.gather(search.running_indices, source, batch_dims=1), prompt_rows * beams + source, step
        )
        hits = is_eos(tokens, inputs.eos_token_ids) | (step + 1 >= inputs.max_new_tokens[:, None])
        # HF tests its stopping criteria on every candidate (a stop string ends that hypothesis).
        stopped = stopped_rows(spec.stop_strings, spec.stopping_criteria, tf.reshape(candidate_sequences, [-1, total]),
                               prompt_width + step, inputs.start, inputs.pad_token_id, None)
        if stopped is not None:
            hits |= tf.reshape(stopped, [batch_size, candidates])

        # Running beams: the best candidates that did not stop.
        running_scores, picked = tf.math.top_k(candidate_scores + tf.cast(hits, tf.float32) * IMPOSSIBLE, beams)
        rows = tf.reshape(prompt_rows * beams + tf.gather(source, picked, batch_dims=1), [-1])
        picked_tokens = tf.reshape(tf.gather(tokens, picked, batch_dims=1), [-1])

        # Finished beams: stopped candidates among the first `beams` ranks compete with the kept hypotheses.
        just_finished = hits & (ranks < beams)
        finishing = candidate_scores / length_divisor(step + 1, rules.length_penalty)[:, None]
        full = tf.reduce_all(search.is_finished, axis=1) & rules.stops_when_full
        finishing += tf.cast(full[:, None], tf.float32) * IMPOSSIBLE
        finishing += tf.cast(~search.improvable[:, None], tf.float32) * IMPOSSIBLE
        finishing += tf.cast(~just_finished, tf.float32) * IMPOSSIBLE
        finished_scores, kept = tf.math.top_k(tf.concat([search.finished_scores, finishing], axis=1), beams)

        def merge(kept_so_far, new):
            return tf.gather(tf.concat([kept_so_far, new], axis=1), kept, batch_dims=1)

        is_finished = merge(search.is_finished, just_finished)

        # HF's early-stop heuristic, at the new length.
        attainable_length = rules.attainable_length(inputs, step)
        best_possible = running_scores[:, :1] / length_divisor(attainable_length, rules.length_penalty)[:, None]
        worst_finished = tf.where(is_finished, tf.reduce_min(finished_scores, axis=1, keepdims=True), IMPOSSIBLE)
        improvable = search.improvable & tf.reduce_any(best_possible > worst_finished, axis=1)
        done = (
            ~improvable
            | tf.reduce_all(hits | ~available, axis=1)
            | (tf.reduce_all(is_finished, axis=1) & rules.stops_when_full)
        )
        search = BeamSearch(
            running_scores=running_scores,
            running_indices=tf.gather(candidate_indices, picked, batch_dims=1),
            finished_sequences=merge(search.finished_sequences, candidate_sequences),
            finished_scores=finished_scores,
            finished_indices=merge(search.finished_indices, candidate_indices),
            is_finished=is_finished,
            improvable=improvable,
            done=done,
        )
        return self._commit(inputs, state._replace(search=search), rows, picked_tokens, processed, done)

    def result(self, inputs: DecodeInputs, state: BeamState) -> dict:
        search, total = state.search, size_of(state.decode.sequences, 1)
        returned = slice(0, self.num_return_sequences)
        return self._beam_result(
            state.decode,
            tf.reshape(search.finished_sequences[:, returned], [-1, total]),
            tf.reshape(search.finished_scores[:, returned], [-1]),
            tf.reshape(search.finished_indices[:, returned], [-1, self.spec.buffer_new_tokens]),
        )
