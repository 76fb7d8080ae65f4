"""Stopping an encoder-decoder generate() (T5): stop strings token for token with HF PyTorch 4.55.4 on a
SentencePiece-style tokenizer (T5's kind), a user criterion traced into the loop (greedy and beams; HF's torch criterion
is the reference), `max_time`, and an export whose greedy signature stops on the strings fixed at export. The criteria
see the decoder's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from t5_checkpoints import build_branching_model, unigram_t5_tokenizers
from test_t5_generate import encoder_batch

import tfgen

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return build_branching_model("t5", tmp_path_factory.mktemp("t5_stopping"))


@pytest.fixture(scope="module")
def tokenizers():
    """(tfgen tokenizer, HF fast tokenizer) over the same vocabulary."""
    return unigram_t5_tokenizers()


def hf_tokens(hf_model, ids, mask, **options) -> np.ndarray:
    """HF's sequences padded with T5's pad id 0 to tfgen's width (HF stops once every row finished). HF's beam search
    fills a hypothesis after its end with `pad_token_id or eos_token_id` (T5's eos id, its pad id being 0); tfgen
    fills with the pad id (see tests/test_t5_generate.py), so beam outputs are compared with HF's fill as pad."""
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.tensor(ids, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long), max_new_tokens=NEW_TOKENS,
                                return_dict_in_generate=True, **options)
    sequences = out.sequences.numpy()
    if getattr(out, "beam_indices", None) is not None:
        lengths = 1 + (out.beam_indices.numpy() >= 0).sum(axis=1)
        sequences = np.where(np.arange(sequences.shape[1])[None, :] < lengths[:, None], sequences, 0)
    return np.pad(sequences, [(0, 0), (0, 1 + NEW_TOKENS - sequences.shape[1])])


def stop_token(free: np.ndarray) -> int:
    """A word (not a special token nor the bare "▁") that the free run of row 0 emits mid-way, so stopping on it ends
    rows at different steps."""
    for token in free[0, 3:NEW_TOKENS - 2]:
        if token > 3:
            return int(token)
    pytest.fail("row 0 of the random checkpoint emits no word mid-way; change its seed")


def stop_text(tokenizer, token: int) -> str:
    """The text of `token`'s piece without its word-start marker ("▁ba" -> "ba")."""
    return tokenizer.backend_tokenizer.id_to_token(token).replace("▁", "")


def stopped_early(sequences: np.ndarray) -> bool:
    """Whether some row ended (pad id 0 after its start token) before the budget."""
    return bool((sequences[:, 1:] == 0).any())


@pytest.mark.parametrize("options", [{}, dict(num_beams=3, num_return_sequences=2)], ids=["greedy", "beams"])
def test_stop_strings_match_hf(t5, tokenizers, options):
    hf_model, model = t5
    ours_tokenizer, hf_tokenizer = tokenizers
    ids, mask = encoder_batch()
    free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
    stop = stop_text(tokenizers[0], stop_token(free))
    expected = hf_tokens(hf_model, ids, mask, stop_strings=[stop], tokenizer=hf_tokenizer, **options)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stop_strings=[stop],
                          tokenizer=ours_tokenizer, **options).numpy()
    np.testing.assert_array_equal(ours, expected)
    unstopped = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options).numpy()
    assert not np.array_equal(ours, unstopped), "the stop string changed nothing: the test would prove nothing"


@pytest.mark.parametrize("options", [{}, dict(num_beams=3)], ids=["greedy", "beams"])
def test_a_user_criterion_sees_the_decoders_tokens_like_hfs(t5, options):
    hf_model, model = t5
    ids, mask = encoder_batch()
    free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
    token = stop_token(free)

    class HFLastTokenIs(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == token

    class LastTokenIs(tfgen.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == token

    expected = hf_tokens(hf_model, ids, mask, stopping_criteria=transformers.StoppingCriteriaList([HFLastTokenIs()]),
                         **options)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stopping_criteria=[LastTokenIs()],
                          **options).numpy()
    np.testing.assert_array_equal(ours, expected)
    unstopped = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options).numpy()
    assert not np.array_equal(ours, unstopped), "the criterion changed nothing: the test would prove nothing"


def test_max_time_cuts_an_encoder_decoder_run(t5):
    _, model = t5
    ids, mask = encoder_batch()
    budget = 4 * NEW_TOKENS
    full = model.generate(ids, attention_mask=mask, max_new_tokens=budget, eos_token_id=None).numpy()
    cut = model.generate(ids, attention_mask=mask, max_new_tokens=budget, eos_token_id=None, max_time=1e-6).numpy()
    # Out of time after the first (compiling) chunk: each row gets one more step, and its tokens are the run's start.
    generated = (cut[:, 1:] != 0).sum(axis=1)
    assert generated.max() < budget
    kept = 1 + int(generated.min())
    np.testing.assert_array_equal(cut[:, :kept], full[:, :kept])


def test_an_export_stops_on_the_strings_fixed_at_export(t5, tokenizers, tmp_path):
    _, model = t5
    tokenizer = tokenizers[0]
    ids, mask = encoder_batch()
    free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
    stop = stop_text(tokenizers[0], stop_token(free))
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stop_strings=[stop],
                              tokenizer=tokenizer, jit_compile=False).numpy()
    assert stopped_early(expected)
    directory = tfgen.export_saved_model(model, tmp_path / "t5_stop", max_new_tokens=NEW_TOKENS, signatures=["greedy"],
                                         jit_compile=False, tokenizer=tokenizer, stop_strings=[stop])
    out = tf.saved_model.load(directory).signatures["greedy"](
        input_ids=tf.constant(ids), attention_mask=tf.constant(mask), max_new_tokens=tf.fill([len(ids)], NEW_TOKENS))
    np.testing.assert_array_equal(out["sequences"].numpy(), expected)
