"""Greedy generate() is token-for-token HF transformers' PyTorch generate on the same random GPT-2 weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import left_padded_batch

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
NEW_TOKENS = 12


def hf_generate(hf_model, ids, mask, **options):
    """HF PyTorch generate, padded on the right with pad id 0 to prompt + NEW_TOKENS (HF stops early)."""
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            **options,
        )
    sequences = out.sequences if hasattr(out, "sequences") else out
    full = np.zeros((ids.shape[0], ids.shape[1] + NEW_TOKENS), np.int64)
    full[:, : sequences.shape[1]] = sequences.numpy()
    return (full, out) if hasattr(out, "sequences") else full


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def mid_way_eos(hf_model, batch):
    """An eos id that the greedy continuations hit at different steps (and not in the first new token)."""
    ids, mask = batch
    free_run = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=None)[:, ids.shape[1] :]
    for candidate in np.unique(free_run):
        first_hits = [np.flatnonzero(row == candidate) for row in free_run]
        steps = [hits[0] for hits in first_hits if hits.size]
        if len(steps) >= 2 and len(set(steps)) == len(steps) and min(steps) >= 1 and max(steps) < NEW_TOKENS - 1:
            return int(candidate)
    pytest.fail("the random checkpoint produced no token usable as a mid-way eos; change its seed")


def test_greedy_left_padding_matches_hf(tiny_model, hf_model, batch):
    ids, mask = batch
    expected = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=None)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    np.testing.assert_array_equal(ours.numpy(), expected)


def test_greedy_rows_finishing_on_eos_at_different_steps(tiny_model, hf_model, batch, mid_way_eos):
    ids, mask = batch
    expected = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=mid_way_eos)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=mid_way_eos)
    np.testing.assert_array_equal(ours.numpy(), expected)
    # The check has teeth: rows really stopped early, at different steps, and were padded afterwards.
    finish_steps = {int(np.flatnonzero(row[ids.shape[1] :] == mid_way_eos)[0])
                    for row in expected if mid_way_eos in row}
    assert len(finish_steps) >= 2


@pytest.mark.parametrize(
    "options",
    [
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 2},
        {"repetition_penalty": 0.7, "no_repeat_ngram_size": 3},
        {"min_new_tokens": 5, "bad_words_ids": [[11], [40, 41]], "suppress_tokens": [9, 10]},
        # A decoder-only model's "encoder input" is its prompt, left padding included (HF's rule).
        {"encoder_repetition_penalty": 3.0},
        {"encoder_repetition_penalty": 0.2, "repetition_penalty": 0.8},
    ],
    ids=["repetition_penalty", "no_repeat_ngram", "penalty_and_ngram", "min_new_bad_words_suppress",
         "encoder_repetition_penalty", "encoder_and_plain_penalty"],
)
def test_greedy_with_processors_matches_hf(tiny_model, hf_model, batch, mid_way_eos, options):
    ids, mask = batch
    expected = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=mid_way_eos, **options)
    ours = tiny_model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=mid_way_eos, **options
    )
    np.testing.assert_array_equal(ours.numpy(), expected)
    if "encoder_repetition_penalty" in options:  # the penalty changed the tokens, so the match has teeth
        others = {name: value for name, value in options.items() if name != "encoder_repetition_penalty"}
        assert (hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=mid_way_eos, **others) != expected).any()


def test_several_eos_ids_match_hf(tiny_model, hf_model, batch, mid_way_eos):
    ids, mask = batch
    eos_ids = [mid_way_eos, 96, 2]
    expected = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=eos_ids)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos_ids)
    np.testing.assert_array_equal(ours.numpy(), expected)


def test_greedy_scores_and_logits_match_hf(tiny_model, hf_model, batch, mid_way_eos):
    ids, mask = batch
    options = dict(do_sample=False, eos_token_id=mid_way_eos, repetition_penalty=1.3, no_repeat_ngram_size=2)
    expected, hf_out = hf_generate(
        hf_model, ids, mask, output_scores=True, output_logits=True, return_dict_in_generate=True, **options
    )
    ours = tiny_model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **options,
    )
    np.testing.assert_array_equal(ours.sequences.numpy(), expected)
    assert len(ours.scores) == len(hf_out.scores) and len(ours.logits) == len(hf_out.logits)
    for step, (our_scores, hf_scores) in enumerate(zip(ours.scores, hf_out.scores)):
        np.testing.assert_allclose(our_scores.numpy(), hf_scores.numpy(), atol=1e-4, err_msg=f"scores, step {step}")
    for step, (our_logits, hf_logits) in enumerate(zip(ours.logits, hf_out.logits)):
        np.testing.assert_allclose(our_logits.numpy(), hf_logits.numpy(), atol=1e-4, err_msg=f"logits, step {step}")


def test_eager_loop_equals_compiled(tiny_model, batch, mid_way_eos):
    ids, mask = batch
    options = dict(max_new_tokens=NEW_TOKENS, eos_token_id=mid_way_eos, repetition_penalty=1.5)
    compiled = tiny_model.generate(ids, attention_mask=mask, **options)
    eager = tiny_model.generate(ids, attention_mask=mask, jit_compile=False, **options)
    np.testing.assert_array_equal(compiled.numpy(), eager.numpy())
