"""Beam search, beam sampling and diverse beam search against HF transformers' PyTorch generate (same weights).

Programs are shared through identical static signatures: every beam-search parity case runs one compiled
program (`early_stopping` and `length_penalty` are run-time knobs), group beam search another.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import left_padded_batch

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
NEW_TOKENS = 12
OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
BEAM = dict(num_beams=3, num_return_sequences=3, **OUTPUTS)
GROUP = dict(num_beams=4, num_beam_groups=2, num_return_sequences=4, repetition_penalty=1.3, **OUTPUTS)


def hf_generate(hf_model, ids, mask, **options):
    with torch.no_grad():
        return hf_model.generate(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            **options,
        )


def hf_sequences(out, prompt_width):
    """HF's hypotheses padded with pad id 0 after their end (HF fills with its own value), to our fixed width."""
    lengths = (out.beam_indices.numpy() >= 0).sum(axis=1)
    full = np.zeros((out.sequences.shape[0], prompt_width + NEW_TOKENS), np.int64)
    for row, length in enumerate(lengths):
        full[row, : prompt_width + length] = out.sequences[row, : prompt_width + length].numpy()
    return full


def right_padded(sequences, prompt_width):
    """HF's group-beam output (already pad-filled after each hypothesis) widened with pad id 0 to our width."""
    full = np.zeros((sequences.shape[0], prompt_width + NEW_TOKENS), np.int64)
    full[:, : sequences.shape[1]] = sequences.numpy()
    return full


def assert_steps_match(ours, hf_out):
    """Per-step processed scores and raw logits of every beam, as HF reports them."""
    assert len(ours.scores) == len(hf_out.scores) and len(ours.logits) == len(hf_out.logits)
    for step, (our_scores, hf_scores) in enumerate(zip(ours.scores, hf_out.scores)):
        np.testing.assert_allclose(our_scores.numpy(), hf_scores.numpy(), atol=1e-4, err_msg=f"scores, step {step}")
    for step, (our_logits, hf_logits) in enumerate(zip(ours.logits, hf_out.logits)):
        np.testing.assert_allclose(our_logits.numpy(), hf_logits.numpy(), atol=1e-4, err_msg=f"logits, step {step}")


def assert_beams_match(ours, hf_out, prompt_width):
    """Hypotheses, their scores, every step's scores and logits, and the beam indices, as HF's."""
    np.testing.assert_array_equal(ours.sequences.numpy(), hf_sequences(hf_out, prompt_width))
    np.testing.assert_allclose(ours.sequences_scores.numpy(), hf_out.sequences_scores.numpy(), atol=1e-4)
    assert_steps_match(ours, hf_out)
    hf_indices = np.full(ours.beam_indices.shape, -1)
    hf_indices[:, : hf_out.beam_indices.shape[1]] = hf_out.beam_indices.numpy()
    np.testing.assert_array_equal(ours.beam_indices.numpy(), hf_indices)


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def beam_eos(hf_model, batch):
    """Two eos ids with which HF's beam search (early_stopping=True) finishes hypotheses at several different
    steps and stops before the budget; found among the tokens the beams produce without eos."""
    ids, mask = batch
    free_run = hf_generate(hf_model, ids, mask, eos_token_id=None, **BEAM).sequences.numpy()[:, ids.shape[1] :]
    tokens, counts = np.unique(free_run, return_counts=True)
    for eos in itertools.combinations(tokens[np.argsort(-counts, kind="stable")][:6].tolist(), 2):
        out = hf_generate(hf_model, ids, mask, eos_token_id=list(eos), early_stopping=True, length_penalty=0.0, **BEAM)
        lengths = set((out.beam_indices.numpy() >= 0).sum(axis=1).tolist())
        if len(out.scores) < NEW_TOKENS and len(lengths - {NEW_TOKENS}) >= 2:
            return list(eos)
    pytest.fail("the random checkpoint gave no eos ids that stop beam search early; change its seed")


BEAM_CASES = [(False, 1.0), (False, 2.0), (False, -1.0), (True, 0.0), ("never", 0.5), ("never", -0.5)]


@pytest.fixture(scope="module")
def hf_beam_outputs(hf_model, batch, beam_eos):
    """HF's beam search for every (early_stopping, length_penalty) case, computed once."""
    ids, mask = batch
    return {
        case: hf_generate(
            hf_model, ids, mask, eos_token_id=beam_eos, early_stopping=case[0], length_penalty=case[1], **BEAM
        )
        for case in BEAM_CASES
    }


@pytest.mark.parametrize("early_stopping, length_penalty", BEAM_CASES)
def test_beam_search_matches_hf(tiny_model, batch, beam_eos, hf_beam_outputs, early_stopping, length_penalty):
    ids, mask = batch
    hf_out = hf_beam_outputs[early_stopping, length_penalty]
    ours = tiny_model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        eos_token_id=beam_eos,
        early_stopping=early_stopping,
        length_penalty=length_penalty,
        **BEAM,
    )
    assert_beams_match(ours, hf_out, ids.shape[1])


def test_beam_cases_exercise_early_stop_and_fill_in(batch, beam_eos, hf_beam_outputs):
    """The parity cases have teeth: some stop before the budget, and in some the running beams fill in for
    hypotheses that never reached eos."""
    width = batch[0].shape[1]
    assert any(len(out.scores) < NEW_TOKENS for out in hf_beam_outputs.values())
    last_tokens = np.concatenate([hf_sequences(out, width)[:, -1] for out in hf_beam_outputs.values()])
    assert ((last_tokens != 0) & ~np.isin(last_tokens, beam_eos)).any()


def test_processors_inside_beam_search_match_hf(tiny_model, hf_model, batch, beam_eos):
    ids, mask = batch
    options = dict(
        BEAM,
        num_return_sequences=2,
        eos_token_id=beam_eos,
        repetition_penalty=1.4,
        no_repeat_ngram_size=2,
        min_new_tokens=3,
        bad_words_ids=[[4], [17, 22]],
    )
    hf_out = hf_generate(hf_model, ids, mask, **options)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
    np.testing.assert_array_equal(ours.sequences.numpy(), hf_sequences(hf_out, ids.shape[1]))
    np.testing.assert_allclose(ours.sequences_scores.numpy(), hf_out.sequences_scores.numpy(), atol=1e-4)
    assert_steps_match(ours, hf_out)


def test_beam_knobs_do_not_recompile(tiny_model, batch, beam_eos):
    ids, mask = batch
    options = dict(eos_token_id=beam_eos, max_new_tokens=NEW_TOKENS, **BEAM)
    first = tiny_model.generate(ids, attention_mask=mask, length_penalty=1.0, **options)
    traces = tiny_model.generate_trace_count
    other = tiny_model.generate(ids, attention_mask=mask, length_penalty=-2.0, early_stopping="never", **options)
    tiny_model.generate(ids, attention_mask=mask, length_penalty=3.0, early_stopping=True, **options)
    assert tiny_model.generate_trace_count == traces
    assert not np.array_equal(first.sequences_scores.numpy(), other.sequences_scores.numpy())


# ----------------------------------------------------------------------------------------------------------
# Diverse (group) beam search


def as_hf_writes_it(sequences, eos):
    """HF 4.55's group-beam scorer ends every finished hypothesis with the first eos id, whichever eos id ended
    it; we keep the real one. This maps ours to HF's spelling."""
    return np.where(np.isin(sequences, eos[1:]), eos[0], sequences)


GROUP_CASES = [(1.0, False, 1.0), (2.5, True, 1.0), (0.5, "never", 1.5)]


@pytest.mark.parametrize("diversity_penalty, early_stopping, length_penalty", GROUP_CASES)
def test_group_beam_search_matches_hf(
    tiny_model, hf_model, batch, beam_eos, diversity_penalty, early_stopping, length_penalty
):
    ids, mask = batch
    options = dict(
        eos_token_id=beam_eos,
        diversity_penalty=diversity_penalty,
        early_stopping=early_stopping,
        length_penalty=length_penalty,
        **GROUP,
    )
    hf_out = hf_generate(hf_model, ids, mask, **options)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
    np.testing.assert_array_equal(
        as_hf_writes_it(ours.sequences.numpy(), beam_eos), right_padded(hf_out.sequences, ids.shape[1])
    )
    np.testing.assert_allclose(ours.sequences_scores.numpy(), hf_out.sequences_scores.numpy(), atol=1e-4)
    assert_steps_match(ours, hf_out)


def test_group_beam_search_knobs_do_not_recompile(tiny_model, batch, beam_eos):
    ids, mask = batch
    options = dict(eos_token_id=beam_eos, max_new_tokens=NEW_TOKENS, **GROUP)
    mild = tiny_model.generate(ids, attention_mask=mask, diversity_penalty=0.01, **options)
    traces = tiny_model.generate_trace_count
    strong = tiny_model.generate(ids, attention_mask=mask, diversity_penalty=50.0, early_stopping=True, **options)
    assert tiny_model.generate_trace_count == traces
    # Hypotheses ending with the second eos id keep it (see `as_hf_writes_it`).
    assert np.isin(beam_eos[1], np.concatenate([mild.sequences.numpy(), strong.sequences.numpy()]))

    def first_tokens_per_group(out):
        """Per prompt, the non-eos first tokens of each group's hypotheses (a hypothesis stays in its group)."""
        beams, group_size = GROUP["num_beams"], GROUP["num_beams"] // GROUP["num_beam_groups"]
        groups = out.beam_indices.numpy()[:, 0] % beams // group_size
        first = out.sequences.numpy()[:, ids.shape[1]]
        prompt = np.repeat(np.arange(len(PROMPTS)), GROUP["num_return_sequences"])
        continued = ~np.isin(first, beam_eos)
        return [
            [set(first[(prompt == p) & (groups == g) & continued]) for g in range(2)] for p in range(len(PROMPTS))
        ]

    # A huge penalty forbids the second group the tokens the first group continued with (an eos ends a hypothesis
    # instead, so it is not counted); a negligible penalty lets them coincide.
    assert all(not first & second for first, second in first_tokens_per_group(strong))
    assert any(first & second for first, second in first_tokens_per_group(mild))


# ----------------------------------------------------------------------------------------------------------
# Beam sampling

SAMPLE = dict(num_beams=3, num_return_sequences=3, do_sample=True, top_k=0, max_new_tokens=NEW_TOKENS)


def test_beam_sampling_at_low_temperature_is_hf_beam_search(tiny_model, batch, beam_eos, hf_beam_outputs):
    """Temperature divides HF's log-softmax scores; near zero, sampling without replacement follows the ranking,
    so the whole sampling path must reproduce beam search."""
    ids, mask = batch
    hf_out = hf_beam_outputs[False, 1.0]
    ours = tiny_model.generate(
        ids, attention_mask=mask, eos_token_id=beam_eos, temperature=1e-4, seed=[5, 6], **SAMPLE
    )
    np.testing.assert_array_equal(ours.numpy(), hf_sequences(hf_out, ids.shape[1]))


def test_beam_sampling_is_seeded(tiny_model, batch, beam_eos):
    ids, mask = batch
    options = dict(eos_token_id=beam_eos, temperature=0.9, **SAMPLE)
    first = tiny_model.generate(ids, attention_mask=mask, seed=[1, 2], **options).numpy()
    again = tiny_model.generate(ids, attention_mask=mask, seed=[1, 2], **options).numpy()
    other = tiny_model.generate(ids, attention_mask=mask, seed=[3, 4], **options).numpy()
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()


def test_beam_sampling_eager_equals_compiled_and_rows_are_batch_invariant(tiny_model, batch, beam_eos):
    ids, mask = batch
    seeds = np.array([[11, 1], [22, 2], [33, 3]], np.int32)
    options = dict(eos_token_id=beam_eos, temperature=0.9, **SAMPLE)
    together = tiny_model.generate(ids, attention_mask=mask, seed=seeds, **options).numpy()
    eager = tiny_model.generate(ids, attention_mask=mask, seed=seeds, jit_compile=False, **options).numpy()
    np.testing.assert_array_equal(eager, together)
    # A prompt's beams depend on its own seed only, also in the batch-1 program (static shapes of one row).
    beams = SAMPLE["num_return_sequences"]
    alone = tiny_model.generate(ids[1:2], attention_mask=mask[1:2], seed=seeds[1:2], **options).numpy()
    np.testing.assert_array_equal(alone, together[beams : 2 * beams])
    order = [2, 0, 1]
    shuffled = tiny_model.generate(ids[order], attention_mask=mask[order], seed=seeds[order], **options).numpy()
    expected = np.concatenate([together[row * beams : (row + 1) * beams] for row in order])
    np.testing.assert_array_equal(shuffled, expected)
