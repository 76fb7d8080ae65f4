"""Seeded multinomial sampling: determinism, per-row keys, equivalences, and no recompilation for new knobs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import left_padded_batch

from tfgen.decoding.state import sample_from_scores

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
SAMPLE = dict(max_new_tokens=10, do_sample=True, eos_token_id=None, top_k=0)


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


def test_same_seed_same_tokens_other_seed_other_tokens(tiny_model, batch):
    ids, mask = batch
    first = tiny_model.generate(ids, attention_mask=mask, seed=[1, 2], **SAMPLE).numpy()
    again = tiny_model.generate(ids, attention_mask=mask, seed=[1, 2], **SAMPLE).numpy()
    other = tiny_model.generate(ids, attention_mask=mask, seed=[3, 4], **SAMPLE).numpy()
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()
    # Rows given one batch seed still get different keys: identical prompts must not sample identically.
    twins = tiny_model.generate(np.array([PROMPTS[0]] * 2), seed=[1, 2], **SAMPLE).numpy()
    assert (twins[0] != twins[1]).any()


def test_top_k_one_equals_greedy(tiny_model, batch):
    ids, mask = batch
    greedy = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=None)
    sampled = tiny_model.generate(
        ids, attention_mask=mask, seed=[9, 9], **{**SAMPLE, "top_k": 1, "temperature": 1.7}
    )
    np.testing.assert_array_equal(sampled.numpy(), greedy.numpy())


def test_per_row_seeds_are_batch_invariant(tiny_model, batch):
    ids, mask = batch
    seeds = np.array([[11, 1], [22, 2], [33, 3]], np.int32)
    together = tiny_model.generate(ids, attention_mask=mask, seed=seeds, **SAMPLE).numpy()
    for row in range(len(PROMPTS)):
        alone = tiny_model.generate(
            ids[row : row + 1], attention_mask=mask[row : row + 1], seed=seeds[row : row + 1], **SAMPLE
        ).numpy()
        np.testing.assert_array_equal(alone[0], together[row])
    # Reordering the batch moves each row's tokens with its seed.
    order = [2, 0, 1]
    shuffled = tiny_model.generate(ids[order], attention_mask=mask[order], seed=seeds[order], **SAMPLE).numpy()
    np.testing.assert_array_equal(shuffled, together[order])


def test_eager_sampling_equals_compiled(tiny_model, batch):
    ids, mask = batch
    options = dict(SAMPLE, top_k=20, top_p=0.9, temperature=0.8)
    compiled = tiny_model.generate(ids, attention_mask=mask, seed=[5, 6], **options)
    eager = tiny_model.generate(ids, attention_mask=mask, seed=[5, 6], jit_compile=False, **options)
    np.testing.assert_array_equal(compiled.numpy(), eager.numpy())


def test_new_knob_values_and_prompts_do_not_recompile(tiny_model, batch):
    ids, mask = batch
    options = dict(max_new_tokens=10, do_sample=True, eos_token_id=None)
    tiny_model.generate(ids, attention_mask=mask, seed=[1, 1], temperature=0.7, top_k=20, top_p=0.9, **options)
    traces = tiny_model.generate_trace_count
    runs = [
        dict(seed=[2, 2], temperature=1.3, top_k=5, top_p=0.5),
        dict(seed=[[1, 1], [2, 2], [3, 3]], temperature=0.2, top_k=40, top_p=0.99, repetition_penalty=None),
        dict(seed=[7, 7], temperature=0.9, top_k=33, top_p=0.7, max_new_tokens=7),
    ]
    for run in runs:
        run = {**options, **{k: v for k, v in run.items() if v is not None}}
        tiny_model.generate(ids, attention_mask=mask, **run)
    other_ids, other_mask = left_padded_batch([[9, 8, 7, 6], [1, 5], [60, 61, 62, 63, 64, 65, 66]])
    tiny_model.generate(other_ids, attention_mask=other_mask, seed=[3, 3], temperature=1.1, top_k=3, top_p=0.8,
                        **options)
    assert tiny_model.generate_trace_count == traces
    # A different static choice (an n-gram size no other test uses) is a new program: the counter sees it.
    tiny_model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=None, no_repeat_ngram_size=5)
    assert tiny_model.generate_trace_count == traces + 1


def test_switching_sampling_knobs_on_and_off_does_not_recompile(tiny_model, batch):
    """A server passes each request's knobs: turning temperature, top-k, top-p, min-p, typical-p or the
    repetition penalty on or off between sampling calls reuses one program, and the neutral values change
    nothing (the same tokens as a call that never mentions them)."""
    ids, mask = batch
    options = dict(max_new_tokens=10, do_sample=True, eos_token_id=None, seed=[4, 2])
    plain = tiny_model.generate(ids, attention_mask=mask, top_k=0, **options).numpy()
    traces = tiny_model.generate_trace_count
    toggles = [
        dict(temperature=0.6), dict(top_k=12), dict(top_p=0.8), dict(min_p=0.05), dict(typical_p=0.9),
        dict(repetition_penalty=1.2), dict(temperature=1.4, top_k=30, top_p=0.9, min_p=0.1, typical_p=0.95,
                                           repetition_penalty=0.8),
        dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repetition_penalty=1.0, temperature=1.0),
    ]
    outputs = [tiny_model.generate(ids, attention_mask=mask, **{"top_k": 0, **options, **toggle}).numpy()
               for toggle in toggles]
    assert tiny_model.generate_trace_count == traces
    np.testing.assert_array_equal(outputs[-1], plain)
    assert all((output != plain).any() for output in outputs[:-2])
    # Greedy search carries the repetition penalty too.
    greedy = dict(max_new_tokens=10, eos_token_id=None)
    tiny_model.generate(ids, attention_mask=mask, **greedy)
    traces = tiny_model.generate_trace_count
    tiny_model.generate(ids, attention_mask=mask, repetition_penalty=1.3, **greedy)
    assert tiny_model.generate_trace_count == traces


def test_sampling_follows_the_distribution():
    """Inverse-CDF draws over many row keys reproduce softmax(scores), including -inf (filtered) entries."""
    probs = np.array([0.5, 0.0, 0.3, 0.15, 0.05], np.float32)
    scores = np.log(np.where(probs > 0, probs, 1e-30)).astype(np.float32)
    scores[1] = -np.inf
    rows = 20000
    seeds = np.stack([np.arange(rows), np.full(rows, 7)], axis=1).astype(np.int32)
    tokens = sample_from_scores(tf.constant(np.tile(scores, [rows, 1])), tf.constant(seeds), tf.constant(3)).numpy()
    frequencies = np.bincount(tokens, minlength=5) / rows
    assert frequencies[1] == 0
    np.testing.assert_allclose(frequencies, probs, atol=0.015)


def test_num_return_sequences_gives_distinct_samples(tiny_model):
    out = tiny_model.generate(np.array([PROMPTS[0]]), seed=[4, 4], num_return_sequences=3, **SAMPLE).numpy()
    assert out.shape == (3, len(PROMPTS[0]) + 10)
    assert len({tuple(row) for row in out}) == 3
    np.testing.assert_array_equal(out[:, : len(PROMPTS[0])], np.array([PROMPTS[0]] * 3))
