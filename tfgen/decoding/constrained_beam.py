"""Constrained beam search (`force_words_ids` / `constraints`): HF transformers 4.55.4's `_constrained_beam_search`
with its `ConstrainedBeamSearchScorer`, inside one compiled loop.

Each step, as HF: the `max(2, 1 + n_eos) * num_beams` best (beam, token) candidates are ranked; an eos among the
first `num_beams` ends a hypothesis only when its beam has fulfilled every constraint; the first `num_beams`
others are joined by each beam's "advance" candidates (the tokens that move its constraints on, deduplicated by
sequence), and the next beams are chosen round-robin over HF's banks (constraint progress) — the best of each bank,
then the second best of each, ... in the order of `bank * 100 + score`. At the budget, the running beams that
fulfil every constraint become hypotheses (all of them when fewer than `num_return_sequences` do). A prompt whose
search is done keeps running as copies of row 0 with pad tokens, as in HF (its scores show it).

Every beam carries its constraint progress (`tfgen.decoding.constraint_states`), reordered with the beams.
Finished hypotheses live in static `[B, num_beams, ...]` buffers; their scores are float64, as HF's Python floats.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgen.decoding.beam import (
    IMPOSSIBLE,
    BeamLoopBase,
    BeamState,
    candidates_kept,
    repeat_knobs,
    static_candidates,
)
from tfgen.decoding.beam_hypotheses import HypothesisList
from tfgen.decoding.constraint_states import ConstraintGraph, Progress, gather_progress, select_progress
from tfgen.decoding.constraints import constraint_tables
from tfgen.decoding.state import DecodeInputs, DecodeState, is_eos, processor_context, size_of, write_at
from tfgen.logits.pipeline import apply_processors


class ConstrainedSearch(NamedTuple):
    running_scores: tf.Tensor  # float32 [B, K] summed log-probs of the running beams
    running_indices: tf.Tensor  # int32 [B * K, N] HF beam_indices of the running beams (-1 = no token yet)
    progress: Progress  # [B * K, C] each running beam's constraint state
    finished_sequences: tf.Tensor  # int32 [B, K, L] in HF's list order (`HypothesisList`)
    finished_scores: tf.Tensor  # float64 [B, K] length-penalised scores
    finished_indices: tf.Tensor  # int32 [B, K, N]
    finished_count: tf.Tensor  # int32 [B]: hypotheses in the list
    done: tf.Tensor  # bool [B]: the prompt's search is over (HF's `_done`, or finalized at the budget)


class ConstrainedBeamSearchLoop(BeamLoopBase):
    """Constrained beam search over `num_beams` beams per prompt (static option `constraints`: the
    `tfgen.decoding.constraints.ConstraintTables`). `result` as `BeamSearchLoop`'s; `scores` are HF's: the processed
    log-probabilities plus each beam's running score."""

    def __init__(self, model, spec):
        super().__init__(model, spec)
        # `tfgen.request.prepare.decode_spec` (the one maker of a `DecodeSpec`) has checked the tables' token ids
        # against the vocabulary and refused stopping criteria.
        self.graph_tables = spec.option("constraints")

    def _initial_search(self, inputs: DecodeInputs, decode: DecodeState) -> ConstrainedSearch:
        beams, batch_size = self.beams, size_of(inputs.input_ids, 0)
        graph = ConstraintGraph(self.graph_tables)
        # HF's states start from the whole prompt as the caller gave it (its padding included).
        progress = graph.walk(graph.initial(batch_size * beams), decode.sequences, inputs.start,
                              size_of(inputs.input_ids, 1))
        first_beam = tf.range(beams) == 0
        no_indices = tf.fill(tf.stack([batch_size, beams, self.spec.buffer_new_tokens]), -1)
        return ConstrainedSearch(
            running_scores=tf.tile(tf.where(first_beam, 0.0, IMPOSSIBLE)[None], tf.stack([batch_size, 1])),
            running_indices=tf.reshape(no_indices, [-1, self.spec.buffer_new_tokens]),
            progress=progress,
            finished_sequences=tf.reshape(decode.sequences, tf.stack([batch_size, beams, -1])),
            finished_scores=tf.zeros(tf.stack([batch_size, beams]), tf.float64),
            finished_indices=no_indices,
            finished_count=tf.zeros(tf.stack([batch_size]), tf.int32),
            done=inputs.max_new_tokens <= 0,
        )

    def _choose(self, inputs: DecodeInputs, state: BeamState) -> BeamState:
        spec, beams, decode, search = self.spec, self.beams, state.decode, state.search
        graph = ConstraintGraph(self.graph_tables)
        step = decode.step
        batch_size, prompt_width, vocab_size, total, prompt_rows, rules = self._sizes(inputs, decode)
        candidates = static_candidates(inputs, beams)
        ranks = tf.range(candidates)

        context = processor_context(inputs, decode.sequences, step, beams)
        processed = apply_processors(
            spec.processor_spec, tf.nn.log_softmax(decode.logits), context, repeat_knobs(inputs.knobs, beams),
            spec.user_processors,
        )
        # HF's `scores_for_all_vocab` (and its `scores` output): processed log-probs plus the beam's score.
        totals = processed + tf.reshape(search.running_scores, [-1])[:, None]
        candidate_scores, order = tf.math.top_k(tf.reshape(totals, [batch_size, beams * vocab_size]), candidates)
        candidate_scores = tf.where(ranks < candidates_kept(inputs.eos_token_ids, beams), candidate_scores,
                                    float("-inf"))
        sources = prompt_rows * beams + order // vocab_size  # [B, M] global beam rows
        tokens = order % vocab_size
        eos = is_eos(tokens, inputs.eos_token_ids)
        # `length ** length_penalty` once per length, so that equal scores stay equal (HF's `>=` tests meet ties).
        divisor = tf.pow(tf.cast(step + 1, tf.float64), rules.length_penalty)[:, None]
        attainable = rules.attainable_length(inputs, step)
        best_divisor = tf.where(attainable[:, None] == step + 1, divisor,
                                tf.pow(tf.cast(attainable, tf.float64), rules.length_penalty)[:, None])

        def penalised(scores, by=divisor):
            return tf.cast(scores, tf.float64) / by

        # 1. An eos among the first `beams` candidates ends its beam's hypothesis if every constraint is met; HF
        # writes the first eos id after it. Hypotheses come from a pool: the kept ones, these, the finalized ones.
        first_eos = tf.concat([inputs.eos_token_ids, [-1]], axis=0)[0]
        column = prompt_width + step
        ending = sources[:, :beams]
        ended = eos[:, :beams] & tf.gather(graph.completed(search.progress), ending) & ~search.done[:, None]
        finished = HypothesisList.from_pool(search.finished_scores, search.finished_count)
        finished = finished.add_all(ended, penalised(candidate_scores[:, :beams]), beams)
        pool_sequences = [search.finished_sequences,
                          write_at(tf.gather(decode.sequences, ending), tf.fill(tf.shape(ending), first_eos), column)]
        pool_indices = [search.finished_indices, write_at(tf.gather(search.running_indices, ending), ending, step)]

        # 2. The first `beams` other candidates, then HF's `step_sentence_constraint`.
        others = ~eos & (tf.cumsum(tf.cast(~eos, tf.int32), axis=1) <= beams)
        picked = tf.math.top_k(tf.cast(tf.where(others, -ranks, -2 * candidates - ranks), tf.float32), beams).indices
        next_scores, next_tokens, next_sources, next_progress = self._rebalance(
            graph, decode, search, totals,
            tf.gather(candidate_scores, picked, batch_dims=1), tf.gather(tokens, picked, batch_dims=1),
            tf.gather(sources, picked, batch_dims=1),
        )
        # A prompt already done runs on as copies of row 0 with pad tokens and zero scores, as in HF.
        done_rows = tf.repeat(search.done, beams)
        next_sources = tf.where(search.done[:, None], 0, next_sources)
        next_tokens = tf.where(search.done[:, None], inputs.pad_token_id, next_tokens)
        next_scores = tf.where(search.done[:, None], 0.0, next_scores)
        rows, flat_tokens = tf.reshape(next_sources, [-1]), tf.reshape(next_tokens, [-1])
        padded = graph.add(gather_progress(search.progress, tf.zeros_like(rows)), flat_tokens)
        next_progress = select_progress(done_rows, padded, next_progress)

        # 3. HF's `is_done`, on the hypotheses so far and the best candidate's score.
        best_possible = penalised(candidate_scores[:, :1], best_divisor)[:, 0]
        done = search.done | ((finished.count >= beams) & (rules.stops_when_full | (finished.worst() >= best_possible)))

        # 4. At the budget, HF's `finalize`: the running beams that meet every constraint become hypotheses (in
        # beam order), then, when fewer than `num_return_sequences` do, the others.
        running_sequences = write_at(tf.gather(decode.sequences, rows), flat_tokens, column)
        running_indices = write_at(tf.gather(search.running_indices, rows), rows, step)
        finalizing = ~done & (step + 1 >= inputs.max_new_tokens)
        meets = tf.reshape(graph.completed(next_progress), [batch_size, beams])
        too_few = tf.reduce_sum(tf.cast(meets, tf.int32), axis=1, keepdims=True) < self.num_return_sequences
        beam_order = tf.range(beams)
        final = tf.math.top_k(tf.cast(tf.where(meets, 2 * beams - beam_order, beams - beam_order), tf.float32),
                              beams).indices  # [B, K] meeting beams first, each group in beam order
        finished = finished.add_all(tf.gather(finalizing[:, None] & (meets | too_few), final, batch_dims=1),
                                    tf.gather(penalised(next_scores), final, batch_dims=1), 2 * beams)
        pool_sequences.append(tf.gather(tf.reshape(running_sequences, [batch_size, beams, total]), final, batch_dims=1))
        pool_indices.append(tf.gather(tf.reshape(running_indices, [batch_size, beams, -1]), final, batch_dims=1))
        done |= finalizing

        search = ConstrainedSearch(
            running_scores=next_scores,
            running_indices=running_indices,
            progress=next_progress,
            finished_sequences=tf.gather(tf.concat(pool_sequences, axis=1), finished.ids, batch_dims=1),
            finished_scores=finished.scores,
            finished_indices=tf.gather(tf.concat(pool_indices, axis=1), finished.ids, batch_dims=1),
            finished_count=finished.count,
            done=done,
        )
        return self._commit(inputs, state._replace(search=search), rows, flat_tokens, totals, done)

    def _rebalance(self, graph: ConstraintGraph, decode: DecodeState, search: ConstrainedSearch, totals,
                   top_scores, top_tokens, top_sources):
        """HF's `step_sentence_constraint` for every prompt: the `K` chosen candidates `[B, K]` (scores, tokens,
        global source rows) plus each beam's advance candidates, ranked by bank round-robin. Returns the next
        beams' scores, tokens, source rows `[B, K]` and progress `[B * K, C]`."""
        beams = self.beams
        batch_size = size_of(top_scores, 0)
        slots = self.graph_tables.advance_slots
        top_progress = graph.add(gather_progress(search.progress, tf.reshape(top_sources, [-1])),
                                 tf.reshape(top_tokens, [-1]))
        advance = graph.advance_candidates(search.progress)
        vocab_size = totals.shape[-1]
        advance_scores = tf.gather(totals, tf.clip_by_value(advance.tokens, 0, vocab_size - 1), batch_dims=1)

        # Advance sequences already among the candidates (HF compares whole sequences) are dropped.
        beam_rows = tf.reshape(decode.sequences, [batch_size, beams, -1])
        same_beam = tf.reduce_all(beam_rows[:, :, None] == beam_rows[:, None], axis=-1)  # [B, K, K]
        owner = tf.repeat(tf.range(beams), slots)  # [K * A] beam of each advance slot
        flat_tokens = tf.reshape(advance.tokens, [batch_size, beams * slots])
        flat_valid = tf.reshape(advance.valid, [batch_size, beams * slots])
        same_as_top = tf.gather(tf.gather(same_beam, owner, axis=1), top_sources % beams, axis=2, batch_dims=1)
        same_as_top &= flat_tokens[:, :, None] == top_tokens[:, None, :]
        same_as_earlier = tf.gather(tf.gather(same_beam, owner, axis=1), owner, axis=2)
        same_as_earlier &= (flat_tokens[:, :, None] == flat_tokens[:, None, :]) & flat_valid[:, None, :]
        earlier = tf.range(beams * slots)[None, :] < tf.range(beams * slots)[:, None]
        keep = flat_valid & ~tf.reduce_any(same_as_top, axis=2) & ~tf.reduce_any(same_as_earlier & earlier, axis=2)

        # Every candidate: the K chosen, then the advance ones.
        valid = tf.concat([tf.ones_like(top_tokens, tf.bool), keep], axis=1)
        banks = tf.concat([tf.reshape(graph.bank(top_progress), [batch_size, beams]),
                           tf.reshape(advance.banks, [batch_size, beams * slots])], axis=1)
        scores = tf.concat([top_scores, tf.reshape(advance_scores, [batch_size, beams * slots])], axis=1)
        rows = tf.concat([top_sources, tf.tile(tf.range(beams * slots)[None] // slots, [batch_size, 1])
                          + tf.range(batch_size)[:, None] * beams], axis=1)
        tokens = tf.concat([top_tokens, flat_tokens], axis=1)
        progress = Progress(*(
            tf.concat([tf.reshape(top, [batch_size, beams, -1]), tf.reshape(adv, [batch_size, beams * slots, -1])],
                      axis=1)
            for top, adv in zip(top_progress, advance.progress)
        ))
        # HF ranks only when some advance candidate is new; otherwise the K chosen stay as they are.
        chosen = tf.where(tf.reduce_any(keep, axis=1, keepdims=True), _round_robin(banks, scores, valid, beams),
                          tf.range(beams)[None])
        return (tf.gather(scores, chosen, batch_dims=1), tf.gather(tokens, chosen, batch_dims=1),
                tf.gather(rows, chosen, batch_dims=1),
                Progress(*(tf.reshape(tf.gather(part, chosen, batch_dims=1), [batch_size * beams, -1])
                           for part in progress)))

    def result(self, inputs: DecodeInputs, state: BeamState) -> dict:
        search, total = state.search, size_of(state.decode.sequences, 1)
        finished = HypothesisList.from_pool(search.finished_scores, search.finished_count)
        returned = finished.best_first()[:, : self.num_return_sequences]

        def pick(part):
            return tf.gather(part, returned, batch_dims=1)

        return self._beam_result(
            state.decode,
            tf.reshape(pick(search.finished_sequences), [-1, total]),
            tf.cast(tf.reshape(pick(search.finished_scores), [-1]), tf.float32),
            tf.reshape(pick(search.finished_indices), [-1, self.spec.buffer_new_tokens]),
        )


def _sort_positions(valid, keys, order):
    """int32 `[B, P]`: each item's position when sorted by (valid first, `keys` descending, `order` ascending)."""
    valid_q, valid_p = valid[:, None, :], valid[:, :, None]
    keys_q, keys_p = keys[:, None, :], keys[:, :, None]
    order = tf.broadcast_to(order, tf.shape(keys))
    ahead = (valid_q & ~valid_p) | ((valid_q == valid_p) & (
        (keys_q > keys_p) | ((keys_q == keys_p) & (order[:, None, :] < order[:, :, None]))))
    return tf.reduce_sum(tf.cast(ahead, tf.int32), axis=2)


def _first(positions, count: int):
    """int32 `[B, count]`: the items at sorted positions 0, 1, ... (`positions` a permutation per row)."""
    return tf.math.top_k(-tf.cast(positions, tf.float32), count).indices


def _round_robin(banks, scores, valid, beams: int):
    """int32 `[B, K]`: HF's choice among candidates `[B, P]`: sorted by `bank * 100 + score` (float32, descending),
    then the first of each run of equal banks, the second of each, ... (invalid candidates last)."""
    zipped = tf.cast(banks * 100, tf.float32) + scores
    count = scores.shape[1]
    by_score = _first(_sort_positions(valid, zipped, tf.range(count)), count)  # [B, P] candidate at each position
    sorted_banks = tf.gather(banks, by_score, batch_dims=1)
    sorted_valid = tf.gather(valid, by_score, batch_dims=1)
    position = tf.range(count)
    run_starts = tf.concat([tf.ones_like(sorted_banks[:, :1], tf.bool),
                            sorted_banks[:, 1:] != sorted_banks[:, :-1]], axis=1)
    started = tf.where(run_starts, position, 0)[:, None, :]
    run_start = tf.reduce_max(tf.where(position[None, :] <= position[:, None], started, 0), axis=2)
    increment = tf.where(sorted_valid, position - run_start, count)
    rearranged = _first(increment * count + position, beams)
    return tf.gather(by_score, rearranged, batch_dims=1)


def constrained_options(config) -> dict:
    """Static options of constrained beam search, its constraints as tables; the errors HF raises for options
    that do not go with it (before anything compiles)."""
    if config.num_beams <= 1:
        raise ValueError(f"num_beams: `constraints` / `force_words_ids` select constrained beam search, which needs "
                         f"num_beams > 1, got {config.num_beams}.")
    for flag, value, neutral in (("do_sample", config.do_sample, False),
                                 ("num_beam_groups", config.num_beam_groups, 1)):
        if value != neutral:
            raise ValueError(f"one of `constraints`, `force_words_ids` is not `None`, triggering constrained beam "
                             f"search. However, `{flag}` is set to `{value}`, which is incompatible with this "
                             f"generation mode.")
    return {
        "num_beams": int(config.num_beams),
        "num_return_sequences": int(config.num_return_sequences or 1),
        "constraints": constraint_tables(config.constraints, config.force_words_ids),
    }
