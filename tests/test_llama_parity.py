"""generate() on Llama-family models (llama, mistral, qwen2, qwen3) against HF transformers' PyTorch generate on the
same random weights: greedy (left padding, eos mid-way, scores and logits), beam search, group beam search and
contrastive search token for token; seeded sampling with tfgen's own RNG; and an exported SavedModel.

One model per family, one program per (family, strategy): output flags are the same across the runs of a strategy
so that eos ids, length penalties and early stopping (run-time knobs) share it. Greedy runs on every family; each other
strategy on one family by default and on the others under the `slow` mark (each pair is an XLA compilation).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import left_padded_batch
from llama_checkpoints import FAMILIES, build_checkpoints, first_eos_candidate
from test_beam_search import BEAM, GROUP, as_hf_writes_it, assert_beams_match, assert_steps_match, right_padded
from test_beam_search import hf_generate as hf_beam_generate
from test_generate_parity import NEW_TOKENS, hf_generate

from tfgen.export import export_saved_model

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]
OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
SAMPLE = dict(max_new_tokens=10, do_sample=True, eos_token_id=None, top_k=0)


def families(default: str) -> list:
    """Every family as a parameter, all but `default` marked slow."""
    return [family if family == default else pytest.param(family, marks=pytest.mark.slow) for family in FAMILIES]


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (HF torch model, our model loaded from its checkpoint)."""
    return {family: built[1:] for family, built in build_checkpoints(tmp_path_factory).items()}


def mid_way_eos(hf_model, ids, mask, **options) -> int:
    free_run = hf_generate(hf_model, ids, mask, eos_token_id=None, **options)
    free_run = (free_run[0] if isinstance(free_run, tuple) else free_run)[:, ids.shape[1]:]
    eos = first_eos_candidate(free_run)
    if eos is None:
        pytest.fail("the random checkpoint produced no token usable as a mid-way eos; change its seed")
    return eos


def assert_matches_hf(ours, expected, hf_out):
    np.testing.assert_array_equal(ours.sequences.numpy(), expected)
    assert_steps_match(ours, hf_out)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_left_padding_eos_mid_way_and_scores_matches_hf(family, models, batch):
    hf_model, ours = models[family]
    ids, mask = batch
    eos = mid_way_eos(hf_model, ids, mask, do_sample=False)
    for eos_token_id in (None, eos):
        expected, hf_out = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=eos_token_id, **OUTPUTS)
        ours_out = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos_token_id,
                                 **OUTPUTS)
        assert_matches_hf(ours_out, expected, hf_out)
    # The eos case has teeth: rows stopped at different steps and were padded afterwards.
    generated = expected[:, ids.shape[1]:]
    assert len({int(np.flatnonzero(row == eos)[0]) for row in generated if eos in row}) >= 2


@pytest.mark.parametrize("family", families("mistral"))
def test_seeded_sampling_is_deterministic_and_batch_invariant(family, models, batch):
    _, ours = models[family]
    ids, mask = batch
    seeds = np.array([[11, 1], [22, 2], [33, 3]], np.int32)
    together = ours.generate(ids, attention_mask=mask, seed=seeds, **SAMPLE).numpy()
    np.testing.assert_array_equal(ours.generate(ids, attention_mask=mask, seed=seeds, **SAMPLE).numpy(), together)
    other = ours.generate(ids, attention_mask=mask, seed=seeds + 100, **SAMPLE).numpy()
    assert (other != together).any()
    for row in range(len(PROMPTS)):
        # Alone and unpadded: the row's tokens depend on its prompt and seed only.
        alone = ours.generate([PROMPTS[row]], seed=seeds[row:row + 1], **SAMPLE).numpy()[0]
        np.testing.assert_array_equal(alone[len(PROMPTS[row]):], together[row, ids.shape[1]:])


def beam_eos(hf_model, ids, mask) -> list:
    """Two eos ids with which HF's beam search finishes hypotheses at two or more different steps before the
    budget, found among the tokens the beams produce without eos."""
    import itertools

    free_run = hf_beam_generate(hf_model, ids, mask, eos_token_id=None, **BEAM).sequences.numpy()[:, ids.shape[1]:]
    tokens, counts = np.unique(free_run, return_counts=True)
    for eos in itertools.combinations(tokens[np.argsort(-counts, kind="stable")][:6].tolist(), 2):
        out = hf_beam_generate(hf_model, ids, mask, eos_token_id=list(eos), early_stopping=True, length_penalty=0.0,
                               **BEAM)
        if len(set((out.beam_indices.numpy() >= 0).sum(axis=1).tolist()) - {NEW_TOKENS}) >= 2:
            return list(eos)
    pytest.fail("the random checkpoint gave no eos ids that end beam hypotheses early; change its seed")


@pytest.mark.parametrize("family", families("llama"))
def test_beam_search_matches_hf(family, models, batch):
    hf_model, ours = models[family]
    ids, mask = batch
    eos = beam_eos(hf_model, ids, mask)
    for early_stopping, length_penalty in [(False, 1.0), (True, 0.0), ("never", -0.5), (False, 2.0)]:
        options = dict(eos_token_id=eos, early_stopping=early_stopping, length_penalty=length_penalty, **BEAM)
        hf_out = hf_beam_generate(hf_model, ids, mask, **options)
        ours_out = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
        assert_beams_match(ours_out, hf_out, ids.shape[1])


@pytest.mark.parametrize("family", families("qwen2"))
def test_group_beam_search_matches_hf(family, models, batch):
    hf_model, ours = models[family]
    ids, mask = batch
    eos = beam_eos(hf_model, ids, mask)
    for diversity_penalty, early_stopping, length_penalty in [(1.0, False, 1.0), (2.5, True, 1.0), (0.5, "never", 1.5)]:
        options = dict(eos_token_id=eos, diversity_penalty=diversity_penalty, early_stopping=early_stopping,
                       length_penalty=length_penalty, **GROUP)
        hf_out = hf_beam_generate(hf_model, ids, mask, **options)
        ours_out = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options)
        sequences = ours_out.sequences.numpy()
        # HF's spelling of finished hypotheses, in the generated columns only (the prompts may hold an eos id).
        sequences[:, ids.shape[1]:] = as_hf_writes_it(sequences[:, ids.shape[1]:], eos)
        np.testing.assert_array_equal(sequences, right_padded(hf_out.sequences, ids.shape[1]))
        np.testing.assert_allclose(ours_out.sequences_scores.numpy(), hf_out.sequences_scores.numpy(), atol=1e-4)
        assert_steps_match(ours_out, hf_out)


@pytest.mark.parametrize("family", families("qwen3"))
def test_contrastive_search_matches_hf(family, models, batch):
    hf_model, ours = models[family]
    ids, mask = batch
    contrastive = dict(top_k=4, **OUTPUTS)
    eos = mid_way_eos(hf_model, ids, mask, penalty_alpha=0.6, **contrastive)
    for penalty_alpha in (0.3, 0.6):
        options = dict(penalty_alpha=penalty_alpha, eos_token_id=eos, **contrastive)
        expected, hf_out = hf_generate(hf_model, ids, mask, **options)
        assert_matches_hf(ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options), expected,
                          hf_out)


def test_exported_saved_model_equals_generate(models, batch, tmp_path):
    """A portable (jit_compile=False) export of the sliding-window model, loaded back, answers as generate()."""
    _, ours = models["mistral"]
    ids, mask = batch
    config = ours.generation_config.copy()
    config.update(eos_token_id=None)
    directory = export_saved_model(ours, tmp_path / "export", config, max_new_tokens=8, jit_compile=False,
                                   signatures=["greedy"])
    loaded = tf.saved_model.load(str(directory))
    budgets = np.array([8, 5, 8], np.int32)
    result = loaded.signatures["greedy"](input_ids=tf.constant(ids), attention_mask=tf.constant(mask),
                                         max_new_tokens=tf.constant(budgets))
    expected = ours.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None, jit_compile=False).numpy()
    expected[1, ids.shape[1] + 5:] = 0  # row 1's budget of 5, then pad
    np.testing.assert_array_equal(result["sequences"].numpy(), expected)
    np.testing.assert_array_equal(result["sequence_lengths"].numpy(), ids.shape[1] + budgets)
