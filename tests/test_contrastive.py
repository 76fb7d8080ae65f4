"""Contrastive search against HF transformers' PyTorch generate on the same random GPT-2 weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import left_padded_batch

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
NEW_TOKENS = 12
CONTRASTIVE = dict(top_k=4, return_dict_in_generate=True, output_scores=True, output_logits=True)


def hf_generate(hf_model, ids, mask, **options):
    """HF's output, widened with pad id 0 to prompt + NEW_TOKENS (HF stops when every row finished)."""
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            **options,
        )
    full = np.zeros((ids.shape[0], ids.shape[1] + NEW_TOKENS), np.int64)
    full[:, : out.sequences.shape[1]] = out.sequences.numpy()
    return full, out


def assert_matches_hf(ours, expected, hf_out):
    np.testing.assert_array_equal(ours.sequences.numpy(), expected)
    assert len(ours.scores) == len(hf_out.scores) and len(ours.logits) == len(hf_out.logits)
    for step, (our_scores, hf_scores) in enumerate(zip(ours.scores, hf_out.scores)):
        np.testing.assert_allclose(our_scores.numpy(), hf_scores.numpy(), atol=1e-4, err_msg=f"scores, step {step}")
    for step, (our_logits, hf_logits) in enumerate(zip(ours.logits, hf_out.logits)):
        np.testing.assert_allclose(our_logits.numpy(), hf_logits.numpy(), atol=1e-4, err_msg=f"logits, step {step}")


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def contrastive_eos(hf_model, batch):
    """An eos id that HF's contrastive search (alpha 0.6) hits at different steps in different rows, so those
    rows stop early and are padded (the parity cases have teeth)."""
    ids, mask = batch
    free_run, _ = hf_generate(hf_model, ids, mask, penalty_alpha=0.6, eos_token_id=None, **CONTRASTIVE)
    free_run = free_run[:, ids.shape[1] :]
    for candidate in np.unique(free_run):
        hits = [np.flatnonzero(row == candidate) for row in free_run]
        steps = [row_hits[0] for row_hits in hits if row_hits.size]
        if len(steps) >= 2 and len(set(steps)) == len(steps) and min(steps) >= 1 and max(steps) < NEW_TOKENS - 1:
            return int(candidate)
    pytest.fail("the random checkpoint produced no token usable as a mid-way eos; change its seed")


@pytest.mark.parametrize("penalty_alpha", [0.3, 0.6, 0.9])
def test_contrastive_search_matches_hf(tiny_model, hf_model, batch, contrastive_eos, penalty_alpha):
    ids, mask = batch
    options = dict(penalty_alpha=penalty_alpha, eos_token_id=contrastive_eos, **CONTRASTIVE)
    expected, hf_out = hf_generate(hf_model, ids, mask, **options)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
    assert_matches_hf(ours, expected, hf_out)


def test_processors_inside_contrastive_search_match_hf(tiny_model, hf_model, batch, contrastive_eos):
    ids, mask = batch
    options = dict(
        penalty_alpha=0.5, eos_token_id=contrastive_eos, repetition_penalty=1.3, no_repeat_ngram_size=2, **CONTRASTIVE
    )
    expected, hf_out = hf_generate(hf_model, ids, mask, **options)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
    assert_matches_hf(ours, expected, hf_out)


def test_penalty_alpha_does_not_recompile(tiny_model, batch, contrastive_eos):
    ids, mask = batch
    options = dict(eos_token_id=contrastive_eos, max_new_tokens=NEW_TOKENS, **CONTRASTIVE)
    low = tiny_model.generate(ids, attention_mask=mask, penalty_alpha=0.05, **options).sequences.numpy()
    traces = tiny_model.generate_trace_count
    high = tiny_model.generate(ids, attention_mask=mask, penalty_alpha=0.95, **options).sequences.numpy()
    assert tiny_model.generate_trace_count == traces
    assert (low != high).any()


def test_eager_contrastive_equals_compiled(tiny_model, batch, contrastive_eos):
    ids, mask = batch
    options = dict(penalty_alpha=0.6, eos_token_id=contrastive_eos, max_new_tokens=NEW_TOKENS, **CONTRASTIVE)
    compiled = tiny_model.generate(ids, attention_mask=mask, **options)
    eager = tiny_model.generate(ids, attention_mask=mask, jit_compile=False, **options)
    np.testing.assert_array_equal(eager.sequences.numpy(), compiled.sequences.numpy())
    for step, (eager_scores, compiled_scores) in enumerate(zip(eager.scores, compiled.scores)):
        np.testing.assert_allclose(eager_scores.numpy(), compiled_scores.numpy(), atol=1e-5, err_msg=f"step {step}")


def test_top_k_larger_than_the_vocabulary_is_rejected(tiny_model, batch):
    ids, mask = batch
    with pytest.raises(ValueError, match="top_k"):
        tiny_model.generate(ids, attention_mask=mask, max_new_tokens=2, penalty_alpha=0.6, top_k=500)
