"""Group (diverse) beam search: HF transformers 4.55.4's `_group_beam_search` with `BeamSearchScorer`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.decoding.beam import (
    IMPOSSIBLE,
    BeamLoopBase,
    BeamState,
    beam_knobs,
    repeat_knobs,
    static_candidates,
)
from tfgen.decoding.state import DecodeInputs, DecodeState, is_eos, processor_context, size_of, write_at
from tfgen.logits.pipeline import apply_processors


def group_beam_options(config) -> dict:
    """Static options of group (diverse) beam search."""
    return {
        "num_beams": int(config.num_beams),
        "num_beam_groups": int(config.num_beam_groups),
        "num_return_sequences": int(config.num_return_sequences or 1),
    }


def group_beam_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """Beam search's knobs plus `diversity_penalty` `[batch_size]`."""
    return {
        **beam_knobs(config, batch_size),
        "diversity_penalty": KNOBS["diversity_penalty"].fill(batch_size, float(config.diversity_penalty or 0.0)),
    }


class GroupSearch(NamedTuple):
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


class GroupBeamSearchLoop(BeamLoopBase):
    """Diverse beam search: `num_beam_groups` groups of `num_beams // num_beam_groups` beams per prompt; within a
    step, group `g` pays `diversity_penalty` (a per-prompt knob) per earlier group's beam that chose the same token.

    `result` is beam search's (`tfgen.decoding.beam.BeamSearchLoop`). `beam_indices` are global
    (`prompt * num_beams + beam`), as in beam search, so `compute_transition_scores` works (HF 4.55 fills them with
    indices local to a group). Where HF differs from its own beam search, this follows HF: hypotheses are ranked in
    double precision, a finished prompt's beams continue as copies of the first prompt's (their scores after that
    are what HF reports), and the diversity penalty comes before the other processors (HF runs it right after
    `sequence_bias`, which only adds).
    """

    def __init__(self, model, spec):
        super().__init__(model, spec)
        self.groups = int(spec.option("num_beam_groups"))
        if self.beams < 2 or self.groups < 2 or self.beams % self.groups:
            raise ValueError(
                f"num_beam_groups ({self.groups}) must be at least 2 and divide num_beams ({self.beams})"
            )
        self.group_size = self.beams // self.groups

    def _initial_search(self, inputs: DecodeInputs, decode: DecodeState) -> GroupSearch:
        beams, groups, group_size = self.beams, self.groups, self.group_size
        batch_size, total = size_of(inputs.input_ids, 0), size_of(decode.sequences, 1)
        buffer_new_tokens = self.spec.buffer_new_tokens
        leads_group = tf.range(beams) % group_size == 0
        has_budget = inputs.max_new_tokens > 0
        shape = tf.stack([batch_size, groups, group_size])
        return GroupSearch(
            beam_scores=tf.tile(tf.where(leads_group, 0.0, IMPOSSIBLE)[None], tf.stack([batch_size, 1])),
            running_indices=tf.fill(tf.stack([batch_size, beams, buffer_new_tokens]), -1),
            hypothesis_scores=tf.fill(shape, tf.constant(float("-inf"), tf.float64)),
            hypothesis_sequences=tf.fill(tf.concat([shape, [total]], 0), inputs.pad_token_id),
            hypothesis_indices=tf.fill(tf.concat([shape, [buffer_new_tokens]], 0), -1),
            done=tf.tile(~has_budget[:, None], [1, groups]),
        )

    def _choose(self, inputs: DecodeInputs, state: BeamState) -> BeamState:
        spec, decode, search = self.spec, state.decode, state.search
        beams, groups, group_size = self.beams, self.groups, self.group_size
        step = decode.step
        batch_size, prompt_width, vocab_size, total, prompt_rows, rules = self._sizes(inputs, decode)
        candidates = static_candidates(inputs, group_size)
        ranks = tf.range(candidates)
        group_knobs = repeat_knobs(inputs.knobs, group_size)
        diversity_penalty = tf.convert_to_tensor(inputs.knobs["diversity_penalty"], tf.float32)

        def hypothesis_score(summed_scores, length):
            """HF's `sum_logprobs / generated_len ** length_penalty`, in double precision: float64 `[B, C]`."""
            divisor = tf.pow(tf.cast(length, tf.float64), rules.length_penalty)
            return tf.cast(summed_scores, tf.float64) / divisor[:, None]

        log_probs = tf.reshape(tf.nn.log_softmax(decode.logits), [batch_size, beams, vocab_size])
        sequences = tf.reshape(decode.sequences, [batch_size, beams, total])
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
            context = processor_context(inputs, tf.reshape(group_sequences, [-1, total]), step, group_size)
            processed = apply_processors(
                spec.processor_spec, tf.reshape(scores, [-1, vocab_size]), context, group_knobs, spec.user_processors
            )
            processed_groups.append(tf.reshape(processed, [batch_size, group_size, vocab_size]))
            totals = processed_groups[-1] + search.beam_scores[:, members, None]
            candidate_scores, order = tf.math.top_k(tf.reshape(totals, [batch_size, -1]), candidates)
            source = order // vocab_size
            tokens = order % vocab_size
            eos = is_eos(tokens, inputs.eos_token_ids)

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

        # HF's finalize, per prompt at its last step: the running beams of unfinished groups become hypotheses.
        last_step = step + 1 >= inputs.max_new_tokens
        closing = [last_step & ~group_done for group_done in done]
        done = tf.stack([group_done | last_step for group_done in done], axis=1)
        flat_rows = tf.reshape(tf.concat(rows, axis=1), [-1])
        state = self._commit(
            inputs,
            state,
            flat_rows,
            tf.reshape(tf.concat(chosen_tokens, axis=1), [-1]),
            tf.reshape(tf.concat(processed_groups, axis=1), [-1, vocab_size]),
            tf.reduce_all(done, axis=1),
        )
        running_indices = write_at(
            tf.gather(tf.reshape(search.running_indices, [-1, spec.buffer_new_tokens]), flat_rows), flat_rows, step
        )
        running_indices = tf.reshape(running_indices, [batch_size, beams, spec.buffer_new_tokens])
        beam_scores = tf.concat(beam_scores, axis=1)
        running_sequences = tf.reshape(state.decode.sequences, [batch_size, beams, total])
        for group in range(groups):
            members = slice(group * group_size, (group + 1) * group_size)
            hypotheses[group] = _keep_best(
                *hypotheses[group],
                tf.where(closing[group][:, None], hypothesis_score(beam_scores[:, members], step + 1), float("-inf")),
                running_sequences[:, members],
                running_indices[:, members],
            )
        search = GroupSearch(
            beam_scores=beam_scores,
            running_indices=running_indices,
            hypothesis_scores=tf.stack([kept[0] for kept in hypotheses], axis=1),
            hypothesis_sequences=tf.stack([kept[1] for kept in hypotheses], axis=1),
            hypothesis_indices=tf.stack([kept[2] for kept in hypotheses], axis=1),
            done=done,
        )
        return state._replace(search=search)

    def result(self, inputs: DecodeInputs, state: BeamState) -> dict:
        search, beams = state.search, self.beams
        batch_size, total = size_of(inputs.input_ids, 0), size_of(state.decode.sequences, 1)
        best_scores, best = tf.math.top_k(
            tf.reshape(search.hypothesis_scores, [batch_size, -1]), self.num_return_sequences
        )

        def best_rows(per_group, width):
            """`[B, G, S, width]` -> the best hypotheses' rows `[B * R, width]`, best first."""
            per_prompt = tf.reshape(per_group, [batch_size, beams, width])
            return tf.reshape(tf.gather(per_prompt, best, batch_dims=1), [-1, width])

        return self._beam_result(
            state.decode,
            best_rows(search.hypothesis_sequences, total),
            tf.reshape(tf.cast(best_scores, tf.float32), [-1]),
            best_rows(search.hypothesis_indices, self.spec.buffer_new_tokens),
        )
