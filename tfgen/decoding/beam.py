"""Beam search, beam sampling and diverse (group) beam search, each in one `tf.while_loop` over static buffers.

Semantics are HF transformers 4.55.4's: `_beam_search` (vectorised: top-k continuations, running beams, finished
beams and the early-stop heuristic) for beam search and beam sampling, and `_group_beam_search` with
`BeamSearchScorer` / `BeamHypotheses` for group beam search. All beams of all prompts decode together as
`B * num_beams` rows grouped by prompt; the cache keeps that row count and is reordered with one `tf.gather`
per step (leading axis = batch, see `tfgen.models.protocol`), so nothing is re-padded or re-shaped.

A few static sizes differ from HF's while giving its results: HF keeps `max(2, 1 + n_eos) * num_beams`
candidates per step, where `n_eos` is only known at run time here (eos ids are a padded tensor), so the loop
takes as many candidates as the eos vector has slots and rules the extra ranks out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.decoding.common import DecodeInputs, decoding_model, prefill
from tfgen.processors import ProcessorContext, apply_processors
from tfgen.random import uniform_per_element

# HF's offset for "this candidate may not be chosen" (added, so ruled-out candidates keep their order).
IMPOSSIBLE = -1.0e9

# Knobs that hold token ids or vocabulary masks shared by all rows; every other knob has one entry per prompt.
_SHARED_KNOBS = frozenset(
    {"eos_token_ids", "forced_eos_token_ids", "forced_bos_token_id", "suppress_tokens", "begin_suppress_tokens"}
)


# ----------------------------------------------------------------------------------------------------------
# Options and run-time knobs (see `Strategy` in tfgen.decoding.strategies)


# `early_stopping` as a knob (so its three modes share one program): HF's False, True and "never".
_HEURISTIC, _WHEN_FULL, _NEVER = 0, 1, 2


def beam_options(config) -> dict:
    """Static options of beam search / beam sampling."""
    return {
        "num_beams": int(config.num_beams),
        "num_return_sequences": int(config.num_return_sequences or 1),
        "do_sample": bool(config.do_sample),
    }


def group_beam_options(config) -> dict:
    """Static options of group (diverse) beam search."""
    return {
        "num_beams": int(config.num_beams),
        "num_beam_groups": int(config.num_beam_groups),
        "num_return_sequences": int(config.num_return_sequences or 1),
    }


def beam_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """`length_penalty` float64 `[batch_size]` (float64 because HF raises lengths to it in double precision) and
    `early_stopping` int32 `[batch_size]` (0 = False, 1 = True, 2 = "never")."""
    value = config.early_stopping
    if not (isinstance(value, bool) or value == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {value!r}")
    code = _NEVER if value == "never" else _WHEN_FULL if value else _HEURISTIC
    return {
        "length_penalty": np.full([batch_size], float(config.length_penalty), np.float64),
        "early_stopping": np.full([batch_size], code, np.int32),
    }


def group_beam_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """`length_penalty` float64 and `diversity_penalty` float32, both `[batch_size]`."""
    return {
        **beam_knobs(config, batch_size),
        "diversity_penalty": np.full([batch_size], float(config.diversity_penalty or 0.0), np.float32),
    }


# ----------------------------------------------------------------------------------------------------------
# Helpers shared with contrastive search


def repeat_knobs(knobs: dict, copies: int) -> dict:
    """The knobs for `copies` consecutive rows per prompt: per-prompt knobs repeated, shared ones unchanged."""
    repeated = {}
    for name, value in knobs.items():
        value = tf.convert_to_tensor(value)
        if name not in _SHARED_KNOBS and value.shape.rank == 0:
            raise ValueError(f"knob {name!r} is a scalar, but it is not one of the shared knobs")
        repeated[name] = value if name in _SHARED_KNOBS else tf.repeat(value, copies, axis=0)
    return repeated


def size_of(tensor: tf.Tensor, axis: int):
    """`tensor.shape[axis]` when the trace knows it (so loop-carried shapes stay static), else its run-time size
    (an exported signature may leave batch and prompt length as None)."""
    size = tensor.shape[axis]
    return tf.shape(tensor)[axis] if size is None else size


def gather_rows(nest, rows: tf.Tensor):
    """Every tensor of `nest` (leading axis = rows) gathered at `rows` int32 `[R]`."""
    return tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows), nest)


def step_buffer(collecting: bool, steps: int, rows: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """Zeros float32 `[steps, rows, vocab_size]` for per-step scores, or a `[0]` placeholder when not collected."""
    return tf.zeros(tf.stack([steps, rows, vocab_size]) if collecting else [0], tf.float32)


def record_step(buffer: tf.Tensor, values: tf.Tensor, step: tf.Tensor, collecting: bool) -> tf.Tensor:
    """`buffer` with `values` `[rows, V]` stored at `step` (unchanged when not collecting)."""
    if not collecting:
        return buffer
    return tf.tensor_scatter_nd_update(buffer, step[None, None], values[None])


def is_eos_any(tokens: tf.Tensor, eos_token_ids: tf.Tensor) -> tf.Tensor:
    """bool, shape of `tokens`: whether each token is one of the eos ids (`[E]`, -1 padding never matches)."""
    return tf.reduce_any(tokens[..., None] == eos_token_ids, axis=-1)


def write_at(buffer: tf.Tensor, values: tf.Tensor, index) -> tf.Tensor:
    """`buffer` `[..., W]` with `values` (`buffer`'s shape without the last axis) written at last-axis `index`."""
    at_index = tf.range(tf.shape(buffer)[-1]) == tf.cast(index, tf.int32)
    return tf.where(at_index, tf.cast(values, buffer.dtype)[..., None], buffer)


def length_divisor(length: tf.Tensor, length_penalty: tf.Tensor) -> tf.Tensor:
    """float32 `length ** length_penalty`, computed in double precision like HF's Python `int ** float`."""
    return tf.cast(tf.pow(tf.cast(length, tf.float64), length_penalty), tf.float32)


def candidates_kept(eos_token_ids: tf.Tensor, beams: int) -> tf.Tensor:
    """HF's number of candidates per step: `max(2, 1 + n_eos) * beams` (int32 scalar)."""
    n_eos = tf.reduce_sum(tf.cast(eos_token_ids >= 0, tf.int32))
    return tf.maximum(2, 1 + n_eos) * beams


class _StoppingRules(NamedTuple):
    """The per-prompt knobs of HF's finishing rules."""

    length_penalty: tf.Tensor  # float64 [B]
    stops_when_full: tf.Tensor  # bool [B]: early_stopping=True
    bounds_by_budget: tf.Tensor  # bool [B]: the best attainable length is the budget ("never", positive penalty)

    @classmethod
    def from_knobs(cls, inputs: DecodeInputs) -> "_StoppingRules":
        length_penalty = tf.convert_to_tensor(inputs.knobs["length_penalty"], tf.float64)
        early_stopping = tf.convert_to_tensor(inputs.knobs["early_stopping"], tf.int32)
        return cls(length_penalty, early_stopping == _WHEN_FULL, (early_stopping == _NEVER) & (length_penalty > 0.0))

    def attainable_length(self, inputs: DecodeInputs, step) -> tf.Tensor:
        """int32 [B]: the generated length HF's early-stop checks divide the best running score by."""
        return tf.where(self.bounds_by_budget, inputs.max_new_tokens, step + 1)


# ----------------------------------------------------------------------------------------------------------
# The part of the loop state every beam strategy shares


class _Decoder(NamedTuple):
    step: tf.Tensor  # int32 scalar: tokens chosen so far
    sequences: tf.Tensor  # int32 [B*K, L] running beams, grouped by prompt
    buffer_mask: tf.Tensor  # int32 [B*K, L]
    cache: object  # rows in the order of the previous step; `cache_rows` reorders them
    cache_rows: tf.Tensor  # int32 [B*K]: the cache row each running beam continues
    logits: tf.Tensor  # float32 [B*K, V] raw logits for the token at `step`
    next_position: tf.Tensor  # int32 [B*K]
    scores: tf.Tensor  # float32 [N, B*K, V] processed scores, or a [0] placeholder
    raw_logits: tf.Tensor  # float32 [N, B*K, V], or a [0] placeholder


def _start(model, inputs: DecodeInputs, buffer_new_tokens: int, num_beams: int, output_scores, output_logits):
    """Runs each prompt once and copies the result to its `num_beams` rows."""
    state0 = prefill(model, inputs, buffer_new_tokens)
    batch_size = size_of(inputs.input_ids, 0)
    rows = tf.repeat(tf.range(batch_size), num_beams)
    vocab_size = state0.logits.shape[-1]
    return _Decoder(
        step=tf.constant(0, tf.int32),
        sequences=tf.gather(state0.sequences, rows),
        buffer_mask=tf.gather(state0.buffer_mask, rows),
        cache=gather_rows(state0.cache, rows),
        cache_rows=tf.range(batch_size * num_beams),
        logits=tf.gather(state0.logits, rows),
        next_position=tf.gather(state0.next_position, rows),
        scores=step_buffer(output_scores, buffer_new_tokens, batch_size * num_beams, vocab_size),
        raw_logits=step_buffer(output_logits, buffer_new_tokens, batch_size * num_beams, vocab_size),
    )


def _advance(model, decoder: _Decoder, prompt_width) -> _Decoder:
    """Reorders the cache to the running beams and runs their last tokens through the model."""
    index = prompt_width + decoder.step - 1
    tokens = tf.gather(decoder.sequences, index[None], axis=1)
    cache = gather_rows(decoder.cache, decoder.cache_rows)
    out = model.call_with_cache(tokens, cache, index, decoder.buffer_mask, decoder.next_position[:, None])
    return decoder._replace(
        cache=out.cache,
        cache_rows=tf.range(size_of(decoder.cache_rows, 0)),
        logits=tf.cast(out.logits[:, -1, :], tf.float32),
        next_position=decoder.next_position + 1,
    )


def _commit(decoder: _Decoder, rows, tokens, processed, prompt_width, output_scores, output_logits) -> _Decoder:
    """Makes running beam `i` a copy of beam `rows[i]` extended with `tokens[i]` (both `[B*K]`)."""
    index = prompt_width + decoder.step
    return decoder._replace(
        step=decoder.step + 1,
        sequences=write_at(tf.gather(decoder.sequences, rows), tokens, index),
        buffer_mask=write_at(decoder.buffer_mask, tf.ones_like(tokens), index),
        cache_rows=tf.gather(decoder.cache_rows, rows),
        scores=record_step(decoder.scores, processed, decoder.step, output_scores),
        raw_logits=record_step(decoder.raw_logits, decoder.logits, decoder.step, output_logits),
    )


def _run(model, inputs, buffer_new_tokens, start: _Decoder, search, choose):
    """Chooses the first token from the prefill's logits, then loops (forward, choose) until every prompt's
    search is done (`search.done` all True) or the longest budget is spent."""
    model = decoding_model(model, start.buffer_mask.shape[0])  # rows: prompts x beams
    prompt_width = tf.shape(inputs.input_ids)[1]
    budget = tf.reduce_max(inputs.max_new_tokens)
    decoder, search = choose(start, search)
    return tf.while_loop(
        lambda decoder, search: (decoder.step < budget) & ~tf.reduce_all(search.done),
        lambda decoder, search: choose(_advance(model, decoder, prompt_width), search),
        (decoder, search),
        maximum_iterations=buffer_new_tokens,
    )


def _result(decoder: _Decoder, sequences, sequences_scores, beam_indices, output_scores, output_logits) -> dict:
    result = {
        "sequences": sequences,
        "sequences_scores": sequences_scores,
        "beam_indices": beam_indices,
        "steps": decoder.step,
    }
    if output_scores:
        result["scores"] = decoder.scores
    if output_logits:
        result["logits"] = decoder.raw_logits
    return result


def _context(inputs: DecodeInputs, sequences, step, copies: int) -> ProcessorContext:
    return ProcessorContext(
        sequences=sequences,
        start=inputs.start,
        cur_len=inputs.prompt_len + step,
        prompt_len=inputs.prompt_len,
        max_length=tf.repeat(inputs.prompt_len + inputs.max_new_tokens, copies),
    )


# ----------------------------------------------------------------------------------------------------------
# Beam search and beam sampling (HF `_beam_search`)


class _BeamSearch(NamedTuple):
    running_scores: tf.Tensor  # float32 [B, K] summed log-probs of the running beams, best first
    running_indices: tf.Tensor  # int32 [B, K, N] HF beam_indices of the running beams (-1 = no token yet)
    finished_sequences: tf.Tensor  # int32 [B, K, L]
    finished_scores: tf.Tensor  # float32 [B, K] length-penalised scores, best first
    finished_indices: tf.Tensor  # int32 [B, K, N]
    is_finished: tf.Tensor  # bool [B, K]: slot holds a finished hypothesis
    improvable: tf.Tensor  # bool [B]: HF's is_early_stop_heuristic_unsatisfied
    done: tf.Tensor  # bool [B]: this prompt no longer keeps the loop going


def decode_beam_search(
    model,
    inputs: DecodeInputs,
    *,
    buffer_new_tokens: int,
    processor_spec,
    user_processors=(),
    output_scores: bool = False,
    output_logits: bool = False,
    num_beams: int,
    num_return_sequences: int = 1,
    do_sample: bool = False,
) -> dict:
    """Beam search (or, with `do_sample`, beam sampling) over `num_beams` beams per prompt.

    Returns a dict: `sequences` int32 `[B * num_return_sequences, T + buffer_new_tokens]` (each prompt's best
    finished hypotheses, best first, padded after their end), `sequences_scores` float32 `[B * R]` (summed
    log-probabilities divided by `generated_length ** length_penalty`), `beam_indices` int32
    `[B * R, buffer_new_tokens]` (`prompt * num_beams + beam` each token came from, -1 after the end), `steps`
    int32, and when asked `scores` / `logits` float32 `[buffer_new_tokens, B * num_beams, V]` (the processed
    log-softmax scores / the raw logits of every running beam).

    Beam sampling draws HF's candidates without replacement from `softmax(beam scores + log-probs)` with the
    Gumbel-top-k trick, one uniform per (beam, token) keyed by the prompt's `row_seeds` and the step, so a prompt's
    result does not depend on the rest of the batch.
    """
    if num_beams < 2:
        raise ValueError(f"num_beams must be at least 2 for beam search, got {num_beams}")
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences must be in [1, num_beams={num_beams}], got {num_return_sequences}")
    beams = num_beams
    start = _start(model, inputs, buffer_new_tokens, beams, output_scores, output_logits)
    batch_size, prompt_width = size_of(inputs.input_ids, 0), size_of(inputs.input_ids, 1)
    vocab_size = start.logits.shape[-1]
    total = size_of(start.sequences, 1)
    # Enough static candidates for any number of eos ids the eos vector can hold; `keep` rules out the rest.
    candidates = (1 + max(1, inputs.eos_token_ids.shape[0])) * beams
    keep = candidates_kept(inputs.eos_token_ids, beams)
    ranks = tf.range(candidates)
    knobs = repeat_knobs(inputs.knobs, beams)
    rules = _StoppingRules.from_knobs(inputs)
    prompt_rows = tf.range(batch_size)[:, None]

    def choose(decoder: _Decoder, search: _BeamSearch):
        step = decoder.step
        context = _context(inputs, decoder.sequences, step, beams)
        processed = apply_processors(
            processor_spec, tf.nn.log_softmax(decoder.logits), context, knobs, user_processors
        )
        totals = tf.reshape(processed, [batch_size, beams, vocab_size]) + search.running_scores[:, :, None]
        totals = tf.reshape(totals, [batch_size, beams * vocab_size])
        if do_sample:
            uniforms = uniform_per_element(inputs.row_seeds, step, beams * vocab_size)
            order = tf.math.top_k(totals - tf.math.log(-tf.math.log(uniforms)), candidates).indices
            candidate_scores = tf.gather(totals, order, batch_dims=1)
        else:
            candidate_scores, order = tf.math.top_k(totals, candidates)
        available = ranks < keep
        candidate_scores = tf.where(available, candidate_scores, float("-inf"))
        source = order // vocab_size  # [B, M] beam within the prompt
        tokens = order % vocab_size
        candidate_sequences = tf.gather(
            tf.reshape(decoder.sequences, [batch_size, beams, total]), source, batch_dims=1
        )
        candidate_sequences = write_at(candidate_sequences, tokens, prompt_width + step)
        candidate_indices = write_at(
            tf.gather(search.running_indices, source, batch_dims=1), prompt_rows * beams + source, step
        )
        hits = is_eos_any(tokens, inputs.eos_token_ids) | (step + 1 >= inputs.max_new_tokens[:, None])

        # Running beams: the best candidates that did not stop.
        running_scores, picked = tf.math.top_k(candidate_scores + tf.cast(hits, tf.float32) * IMPOSSIBLE, beams)
        rows = tf.reshape(prompt_rows * beams + tf.gather(source, picked, batch_dims=1), [-1])
        decoder = _commit(
            decoder,
            rows,
            tf.reshape(tf.gather(tokens, picked, batch_dims=1), [-1]),
            processed,
            prompt_width,
            output_scores,
            output_logits,
        )

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
        search = _BeamSearch(
            running_scores=running_scores,
            running_indices=tf.gather(candidate_indices, picked, batch_dims=1),
            finished_sequences=merge(search.finished_sequences, candidate_sequences),
            finished_scores=finished_scores,
            finished_indices=merge(search.finished_indices, candidate_indices),
            is_finished=is_finished,
            improvable=improvable,
            done=done,
        )
        return decoder, search

    # Only the first beam of a prompt starts live, so the first step does not pick the same token K times.
    first_beam = tf.range(beams) == 0
    no_indices = tf.fill(tf.stack([batch_size, beams, buffer_new_tokens]), -1)
    has_budget = inputs.max_new_tokens > 0
    search = _BeamSearch(
        running_scores=tf.tile(tf.where(first_beam, 0.0, IMPOSSIBLE)[None], tf.stack([batch_size, 1])),
        running_indices=no_indices,
        finished_sequences=tf.reshape(start.sequences, [batch_size, beams, total]),
        finished_scores=tf.fill(tf.stack([batch_size, beams]), IMPOSSIBLE),
        finished_indices=no_indices,
        is_finished=tf.zeros(tf.stack([batch_size, beams]), tf.bool),
        improvable=has_budget,
        done=~has_budget,
    )
    decoder, search = _run(model, inputs, buffer_new_tokens, start, search, choose)
    returned = slice(0, num_return_sequences)
    return _result(
        decoder,
        tf.reshape(search.finished_sequences[:, returned], [-1, total]),
        tf.reshape(search.finished_scores[:, returned], [-1]),
        tf.reshape(search.finished_indices[:, returned], [-1, buffer_new_tokens]),
        output_scores,
        output_logits,
    )


# ----------------------------------------------------------------------------------------------------------
# Group (diverse) beam search (HF `_group_beam_search` with `BeamSearchScorer`)


class _GroupSearch(NamedTuple):
    beam_scores: tf.Tensor  # float32 [B, K] summed (diversity-penalised) scores of the running beams
    running_indices: tf.Tensor  # int32 [B, K, N]
    # Each (prompt, group) keeps its best `group_size` finished hypotheses (HF's BeamHypotheses); empty = -inf.
    hypothesis_scores: tf.Tensor  # float64 [B, G, S]: like HF, the length-penalised score in double precision
    hypothesis_sequences: tf.Tensor  # int32 [B, G, S, L]
    hypothesis_indices: tf.Tensor  # int32 [B, G, S, N]
    done: tf.Tensor  # bool [B, G]


def _keep_best(scores, sequences, indices, new_scores, new_sequences, new_indices):
    """HF's BeamHypotheses.add for a batch of candidates: the best `S` of the kept `[B, S]` and new `[B, C]`."""
    size = scores.shape[-1]
    scores, kept = tf.math.top_k(tf.concat([scores, new_scores], axis=1), size)
    sequences = tf.gather(tf.concat([sequences, new_sequences], axis=1), kept, batch_dims=1)
    indices = tf.gather(tf.concat([indices, new_indices], axis=1), kept, batch_dims=1)
    return scores, sequences, indices


def decode_group_beam_search(
    model,
    inputs: DecodeInputs,
    *,
    buffer_new_tokens: int,
    processor_spec,
    user_processors=(),
    output_scores: bool = False,
    output_logits: bool = False,
    num_beams: int,
    num_beam_groups: int,
    num_return_sequences: int = 1,
) -> dict:
    """Diverse beam search: `num_beam_groups` groups of `num_beams // num_beam_groups` beams per prompt; within a
    step, group `g` pays `diversity_penalty` (a per-prompt knob) per earlier group's beam that chose the same token.

    Returns the same dict as `decode_beam_search`. `beam_indices` are global (`prompt * num_beams + beam`), as
    in beam search, so `compute_transition_scores` works (HF 4.55 fills them with indices local to a group).
    Where HF differs from its own beam search, this follows HF: hypotheses are ranked in double precision, a
    finished prompt's beams continue as copies of the first prompt's (their scores after that are what HF
    reports), and the diversity penalty comes before the other processors (HF runs it right after
    `sequence_bias`, which only adds).
    """
    if num_beams < 2 or num_beam_groups < 2 or num_beams % num_beam_groups:
        raise ValueError(
            f"num_beam_groups ({num_beam_groups}) must be at least 2 and divide num_beams ({num_beams})"
        )
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences must be in [1, num_beams={num_beams}], got {num_return_sequences}")
    beams, groups = num_beams, num_beam_groups
    group_size = beams // groups
    start = _start(model, inputs, buffer_new_tokens, beams, output_scores, output_logits)
    batch_size, prompt_width = size_of(inputs.input_ids, 0), size_of(inputs.input_ids, 1)
    vocab_size = start.logits.shape[-1]
    total = size_of(start.sequences, 1)
    candidates = (1 + max(1, inputs.eos_token_ids.shape[0])) * group_size
    ranks = tf.range(candidates)
    group_knobs = repeat_knobs(inputs.knobs, group_size)
    rules = _StoppingRules.from_knobs(inputs)
    diversity_penalty = tf.convert_to_tensor(inputs.knobs["diversity_penalty"], tf.float32)
    prompt_rows = tf.range(batch_size)[:, None]

    def hypothesis_score(summed_scores, length):
        """HF's `sum_logprobs / generated_len ** length_penalty`, in double precision: float64 `[B, C]`."""
        divisor = tf.pow(tf.cast(length, tf.float64), rules.length_penalty)
        return tf.cast(summed_scores, tf.float64) / divisor[:, None]

    def choose(decoder: _Decoder, search: _GroupSearch):
        step = decoder.step
        log_probs = tf.reshape(tf.nn.log_softmax(decoder.logits), [batch_size, beams, vocab_size])
        sequences = tf.reshape(decoder.sequences, [batch_size, beams, total])
        chosen_tokens, rows, beam_scores, processed_groups, done = [], [], [], [], []
        hypotheses = []
        for group in range(groups):
            members = slice(group * group_size, (group + 1) * group_size)
            was_done = search.done[:, group]
            scores = log_probs[:, members]
            if group:
                earlier = tf.concat(chosen_tokens, axis=1)
                frequency = tf.reduce_sum(tf.one_hot(earlier, vocab_size), axis=1)
                scores -= (diversity_penalty[:, None] * frequency)[:, None, :]
            group_sequences = sequences[:, members]
            context = _context(inputs, tf.reshape(group_sequences, [-1, total]), step, group_size)
            processed = apply_processors(
                processor_spec, tf.reshape(scores, [-1, vocab_size]), context, group_knobs, user_processors
            )
            processed_groups.append(tf.reshape(processed, [batch_size, group_size, vocab_size]))
            totals = processed_groups[-1] + search.beam_scores[:, members, None]
            candidate_scores, order = tf.math.top_k(tf.reshape(totals, [batch_size, -1]), candidates)
            source = order // vocab_size
            tokens = order % vocab_size
            eos = is_eos_any(tokens, inputs.eos_token_ids)

            # The running beams continue with the best non-eos candidates, in rank order.
            picked = tf.math.top_k(-(ranks + tf.cast(eos, tf.int32) * candidates), group_size).indices
            next_tokens = tf.gather(tokens, picked, batch_dims=1)
            next_beams = group * group_size + tf.gather(source, picked, batch_dims=1)
            # A finished prompt's group continues with pad tokens from the first prompt's first beam of the group,
            # as HF's scorer pads it (index 0).
            chosen_tokens.append(tf.where(was_done[:, None], inputs.pad_token_id, next_tokens))
            rows.append(tf.where(was_done[:, None], group * group_size, prompt_rows * beams + next_beams))
            beam_scores.append(tf.where(was_done[:, None], 0.0, tf.gather(candidate_scores, picked, batch_dims=1)))

            # eos candidates among the first `group_size` ranks become hypotheses (HF skips worse-ranked ones).
            first = slice(0, group_size)
            adding = eos[:, first] & ~was_done[:, None]
            finished_sequences = write_at(
                tf.gather(group_sequences, source[:, first], batch_dims=1), tokens[:, first], prompt_width + step
            )
            finished_indices = write_at(
                tf.gather(search.running_indices[:, members], source[:, first], batch_dims=1),
                prompt_rows * beams + group * group_size + source[:, first],
                step,
            )
            kept = _keep_best(
                search.hypothesis_scores[:, group],
                search.hypothesis_sequences[:, group],
                search.hypothesis_indices[:, group],
                tf.where(adding, hypothesis_score(candidate_scores[:, first], step + 1), float("-inf")),
                finished_sequences,
                finished_indices,
            )
            hypotheses.append(kept)

            # HF's BeamHypotheses.is_done, with the best candidate score of this step.
            full = tf.reduce_all(kept[0] > float("-inf"), axis=1)
            best_attainable = hypothesis_score(candidate_scores[:, :1], rules.attainable_length(inputs, step))[:, 0]
            satisfied = full & (rules.stops_when_full | (tf.reduce_min(kept[0], axis=1) >= best_attainable))
            done.append(was_done | satisfied)

        flat_rows = tf.reshape(tf.concat(rows, axis=1), [-1])
        decoder = _commit(
            decoder,
            flat_rows,
            tf.reshape(tf.concat(chosen_tokens, axis=1), [-1]),
            tf.reshape(tf.concat(processed_groups, axis=1), [-1, vocab_size]),
            prompt_width,
            output_scores,
            output_logits,
        )
        running_indices = write_at(
            tf.gather(tf.reshape(search.running_indices, [-1, buffer_new_tokens]), flat_rows), flat_rows, step
        )
        running_indices = tf.reshape(running_indices, [batch_size, beams, buffer_new_tokens])
        beam_scores = tf.concat(beam_scores, axis=1)

        # HF's finalize, per prompt at its last step: the running beams of unfinished groups become hypotheses.
        last_step = step + 1 >= inputs.max_new_tokens
        running_sequences = tf.reshape(decoder.sequences, [batch_size, beams, total])
        for group in range(groups):
            members = slice(group * group_size, (group + 1) * group_size)
            closing = last_step & ~done[group]
            hypotheses[group] = _keep_best(
                *hypotheses[group],
                tf.where(closing[:, None], hypothesis_score(beam_scores[:, members], step + 1), float("-inf")),
                running_sequences[:, members],
                running_indices[:, members],
            )
            done[group] |= last_step
        search = _GroupSearch(
            beam_scores=beam_scores,
            running_indices=running_indices,
            hypothesis_scores=tf.stack([kept[0] for kept in hypotheses], axis=1),
            hypothesis_sequences=tf.stack([kept[1] for kept in hypotheses], axis=1),
            hypothesis_indices=tf.stack([kept[2] for kept in hypotheses], axis=1),
            done=tf.stack(done, axis=1),
        )
        return decoder, search

    leads_group = tf.range(beams) % group_size == 0
    has_budget = inputs.max_new_tokens > 0
    shape = tf.stack([batch_size, groups, group_size])
    search = _GroupSearch(
        beam_scores=tf.tile(tf.where(leads_group, 0.0, IMPOSSIBLE)[None], tf.stack([batch_size, 1])),
        running_indices=tf.fill(tf.stack([batch_size, beams, buffer_new_tokens]), -1),
        hypothesis_scores=tf.fill(shape, tf.constant(float("-inf"), tf.float64)),
        hypothesis_sequences=tf.fill(tf.concat([shape, [total]], 0), inputs.pad_token_id),
        hypothesis_indices=tf.fill(tf.concat([shape, [buffer_new_tokens]], 0), -1),
        done=tf.tile(~has_budget[:, None], [1, groups]),
    )
    decoder, search = _run(model, inputs, buffer_new_tokens, start, search, choose)
    best_scores, best = tf.math.top_k(tf.reshape(search.hypothesis_scores, [batch_size, -1]), num_return_sequences)

    def best_rows(per_group, width):
        """`[B, G, S, width]` -> the best hypotheses' rows `[B * R, width]`, best first."""
        per_prompt = tf.reshape(per_group, [batch_size, beams, width])
        return tf.reshape(tf.gather(per_prompt, best, batch_dims=1), [-1, width])

    return _result(
        decoder,
        best_rows(search.hypothesis_sequences, total),
        tf.reshape(tf.cast(best_scores, tf.float32), [-1]),
        best_rows(search.hypothesis_indices, buffer_new_tokens),
        output_scores,
        output_logits,
    )
