"""`compute_transition_scores`: HF's function on HF's outputs, and sequence scores rebuilt from our beam outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import torch
from conftest import left_padded_batch

from tfgen.decoding.transition_scores import compute_transition_scores

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
NEW_TOKENS = 12
OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
# The static signatures of tests/test_beam_search.py's BEAM and GROUP (two eos ids), so the programs are shared.
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


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def eos_pair(hf_model, batch):
    """The two tokens HF's beams produce most often without eos: as eos ids they end hypotheses early."""
    ids, mask = batch
    free_run = hf_generate(hf_model, ids, mask, eos_token_id=None, **BEAM).sequences.numpy()[:, ids.shape[1] :]
    tokens, counts = np.unique(free_run, return_counts=True)
    return tokens[np.argsort(-counts, kind="stable")][:2].tolist()


@pytest.fixture(scope="module")
def hf_beam(hf_model, batch, eos_pair):
    ids, mask = batch
    return hf_generate(hf_model, ids, mask, eos_token_id=eos_pair, length_penalty=1.5, **BEAM)


def test_beam_transition_scores_equal_hf(hf_model, hf_beam):
    expected = hf_model.compute_transition_scores(hf_beam.sequences, hf_beam.scores, hf_beam.beam_indices)
    ours = compute_transition_scores(
        hf_beam.sequences.numpy(), [step.numpy() for step in hf_beam.scores], hf_beam.beam_indices.numpy()
    )
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), atol=1e-6)
    assert (ours.numpy() == 0).any()  # some hypotheses ended before others: the -1 masking is exercised


@pytest.mark.parametrize("normalize_logits", [False, True])
def test_greedy_transition_scores_equal_hf(hf_model, batch, normalize_logits):
    ids, mask = batch
    out = hf_generate(hf_model, ids, mask, do_sample=False, repetition_penalty=1.3, **OUTPUTS)
    expected = hf_model.compute_transition_scores(out.sequences, out.logits, normalize_logits=normalize_logits)
    ours = compute_transition_scores(
        out.sequences.numpy(), [step.numpy() for step in out.logits], normalize_logits=normalize_logits
    )
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("length_penalty", [1.0, 0.5, 2.0])
def test_transition_scores_rebuild_beam_sequence_scores(tiny_model, batch, eos_pair, length_penalty):
    ids, mask = batch
    out = tiny_model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos_pair, length_penalty=length_penalty,
        **BEAM,
    )
    transition = compute_transition_scores(out.sequences, out.scores, out.beam_indices, input_length=ids.shape[1])
    lengths = (out.beam_indices.numpy() >= 0).sum(axis=1)
    assert len(set(lengths.tolist())) >= 2
    rebuilt = transition.numpy().sum(axis=1) / lengths.astype(np.float64) ** length_penalty
    np.testing.assert_allclose(rebuilt, out.sequences_scores.numpy(), rtol=1e-5, atol=1e-5)


def test_transition_scores_rebuild_group_beam_sequence_scores(tiny_model, batch, eos_pair):
    """Our group beam search reports global beam indices, so its scores (diversity penalty included) add up."""
    ids, mask = batch
    out = tiny_model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos_pair, diversity_penalty=1.5, **GROUP
    )
    transition = compute_transition_scores(out.sequences, out.scores, out.beam_indices, input_length=ids.shape[1])
    lengths = (out.beam_indices.numpy() >= 0).sum(axis=1)
    np.testing.assert_allclose(transition.numpy().sum(axis=1) / lengths, out.sequences_scores.numpy(), rtol=1e-5)


def test_bad_arguments_are_rejected():
    sequences = np.zeros([2, 5], np.int32)
    scores = [np.zeros([2, 7], np.float32)] * 3
    with pytest.raises(ValueError, match="scores"):
        compute_transition_scores(sequences, [])
    with pytest.raises(ValueError, match="beam_indices"):
        compute_transition_scores(sequences, scores, np.zeros([3, 3], np.int32))
    with pytest.raises(ValueError, match="input_length"):
        compute_transition_scores(sequences, scores, input_length=4)


def test_the_seeds_example_through_the_model_method(tiny_model, batch):
    """HF's documented recipe, verbatim but for tfgen's model: no eos, so the beams use the whole budget and
    HF's default (generated tokens are the last columns) holds for tfgen's fixed-width output."""
    ids, mask = batch
    outputs = tiny_model.generate(
        ids, attention_mask=mask, max_new_tokens=5, num_beams=4, num_return_sequences=4,
        return_dict_in_generate=True, output_scores=True, eos_token_id=None,
    )
    transition_scores = tiny_model.compute_transition_scores(
        outputs.sequences, outputs.scores, outputs.beam_indices, normalize_logits=False
    )
    output_length = np.sum(transition_scores.numpy() < 0, axis=1)
    length_penalty = tiny_model.generation_config.length_penalty
    reconstructed_scores = transition_scores.numpy().sum(axis=1) / (output_length**length_penalty)
    assert np.allclose(outputs.sequences_scores, reconstructed_scores)
    # Greedy, normalised: each step's log-probability of the chosen token, also the model method's job.
    greedy = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None,
                                 return_dict_in_generate=True, output_scores=True)
    log_probs = tiny_model.compute_transition_scores(greedy.sequences, greedy.scores, normalize_logits=True).numpy()
    chosen = greedy.sequences.numpy()[:, -5:]
    expected = np.stack([tf.nn.log_softmax(step).numpy()[np.arange(len(chosen)), chosen[:, i]]
                         for i, step in enumerate(greedy.scores)], axis=1)
    np.testing.assert_allclose(log_probs, expected, atol=1e-6)
