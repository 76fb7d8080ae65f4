"""Encoder-decoder generate() on T5 is token for token HF transformers' PyTorch generate on the same random weights:
greedy (encoder inputs padded to different lengths), beam search, group beam search, contrastive search and the
encoder-side processors; sampling is seeded and row-independent; scores within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from t5_checkpoints import build_branching_model, word_level_t5_tokenizer

import tfgen

NEW_TOKENS = 10
# Encoder inputs of different lengths, right padded with T5's pad id 0 (what its tokenizer does).
SOURCES = [[13, 7, 42, 9, 55, 21, 3, 1], [88, 14, 61, 1], [5, 29, 33, 47, 70, 1]]


def encoder_batch(rows=SOURCES):
    width = max(len(row) for row in rows)
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return ids, mask


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("t5")


@pytest.fixture(scope="module")
def t5(t5_dir):
    return build_branching_model("t5", t5_dir)


@pytest.fixture(scope="module")
def flan(tmp_path_factory):
    return build_branching_model("flan", tmp_path_factory.mktemp("flan_t5"))


def hf_generate(hf_model, ids, mask, **options):
    """HF's generate output and its sequences (numpy; HF stops once every row finished)."""
    options.setdefault("max_new_tokens", NEW_TOKENS)
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.tensor(ids, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long), **options)
    return out, (out.sequences if hasattr(out, "sequences") else out).numpy()


def _same_tokens(ours, hf_sequences):
    """tfgen's sequences (always prompt + max_new_tokens wide) equal HF's (cut after the longest row) padded with
    T5's pad id 0."""
    ours = np.asarray(ours)
    assert hf_sequences.shape[1] <= ours.shape[1]
    padding = [(0, 0), (0, ours.shape[1] - hf_sequences.shape[1])]
    np.testing.assert_array_equal(ours, np.pad(hf_sequences, padding))


def mid_way_eos(hf_model, ids, mask, **options):
    """A token the free-running search emits at different steps in at least two rows (an eos with teeth)."""
    _, free = hf_generate(hf_model, ids, mask, eos_token_id=None, **options)
    free = free[:, 1:]
    for candidate in np.unique(free):
        steps = [np.flatnonzero(row == candidate)[0] for row in free if candidate in row]
        if len(steps) >= 2 and len(set(steps)) == len(steps) and 1 <= min(steps) and max(steps) < NEW_TOKENS - 1:
            return int(candidate)
    pytest.fail("the random checkpoint has no token usable as a mid-way eos; change its seed")


@pytest.mark.parametrize("variant", ["t5", "flan"])
def test_greedy_with_padded_encoder_inputs_matches_hf(variant, request):
    hf_model, model = request.getfixturevalue(variant)
    ids, mask = encoder_batch()
    eos = mid_way_eos(hf_model, ids, mask)
    out, expected = hf_generate(hf_model, ids, mask, eos_token_id=eos, output_scores=True, output_logits=True,
                                return_dict_in_generate=True)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                          output_scores=True, output_logits=True, return_dict_in_generate=True)
    assert isinstance(ours, tfgen.GenerateEncoderDecoderOutput)
    _same_tokens(ours.sequences, expected)
    assert (expected[:, 1:] == eos).any(axis=1).sum() >= 2  # rows really finished early
    assert len(ours.scores) == len(out.scores)
    for name in ("scores", "logits"):
        for step, (mine, theirs) in enumerate(zip(getattr(ours, name), getattr(out, name))):
            finite = np.isfinite(theirs.numpy())
            np.testing.assert_array_equal(np.isfinite(mine.numpy()), finite, err_msg=f"{name}[{step}]")
            np.testing.assert_allclose(mine.numpy()[finite], theirs.numpy()[finite], atol=1e-4, err_msg=name)


def test_each_row_decodes_as_it_would_alone(t5):
    """Padding (the caller's and the bucket's) changes nothing: a row in a batch equals the row alone."""
    _, model = t5
    ids, mask = encoder_batch()
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
    for index, row in enumerate(SOURCES):
        alone = model.generate(np.array([row]), max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
        np.testing.assert_array_equal(alone[0], batch[index])


def test_decoder_input_ids_continue_a_prefix_like_hf(t5):
    hf_model, model = t5
    ids, mask = encoder_batch()
    prefix = np.array([[0, 17, 4], [0, 23, 23], [0, 5, 60]])
    _, expected = hf_generate(hf_model, ids, mask, eos_token_id=None, decoder_input_ids=torch.tensor(prefix))
    ours = model.generate(ids, attention_mask=mask, decoder_input_ids=prefix, max_new_tokens=NEW_TOKENS,
                          eos_token_id=None)
    _same_tokens(ours, expected)
    # Without the start token HF prepends it; so does tfgen.
    no_start = model.generate(ids, attention_mask=mask, decoder_input_ids=prefix[:, 1:], max_new_tokens=NEW_TOKENS,
                              eos_token_id=None)
    np.testing.assert_array_equal(no_start.numpy(), ours.numpy())


_BEAM_CASES = {
    "beam": dict(num_beams=3),
    "beam_return_two_early_stop": dict(num_beams=3, num_return_sequences=2, length_penalty=0.5, early_stopping=True),
    "beam_never": dict(num_beams=4, num_return_sequences=3, length_penalty=1.5, early_stopping="never"),
    "group_beam": dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5, num_return_sequences=2),
}


# Group beam search on one variant: the search does not depend on the feed-forward.
@pytest.mark.parametrize("variant, case", [(variant, case) for variant in ("t5", "flan") for case in _BEAM_CASES
                                           if variant == "t5" or case != "group_beam"])
def test_beam_search_matches_hf(variant, case, request):
    hf_model, model = request.getfixturevalue(variant)
    options = _BEAM_CASES[case]
    ids, mask = encoder_batch()
    eos = mid_way_eos(hf_model, ids, mask)
    out, expected = hf_generate(hf_model, ids, mask, eos_token_id=eos, return_dict_in_generate=True,
                                output_scores=True, **options)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                          return_dict_in_generate=True, output_scores=True, **options)
    assert isinstance(ours, tfgen.GenerateBeamEncoderDecoderOutput)
    # HF's beam search fills a hypothesis after its end with `pad_token_id or eos_token_id` (the eos id, T5's pad id
    # being 0); tfgen fills with the pad id, as in tests/test_beam_search.py.
    lengths = 1 + (out.beam_indices.numpy() >= 0).sum(axis=1)
    expected = np.where(np.arange(expected.shape[1])[None, :] < lengths[:, None], expected, 0)
    _same_tokens(ours.sequences, expected)
    np.testing.assert_allclose(ours.sequences_scores.numpy(), out.sequences_scores.numpy(), atol=1e-4)


def test_contrastive_search_matches_hf(t5):
    hf_model, model = t5
    ids, mask = encoder_batch()
    options = dict(penalty_alpha=0.6, top_k=4)
    _, expected = hf_generate(hf_model, ids, mask, eos_token_id=None, **options)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None, **options)
    _same_tokens(ours, expected)


@pytest.mark.parametrize(
    "options",
    [
        dict(encoder_no_repeat_ngram_size=2),
        dict(encoder_no_repeat_ngram_size=2, num_beams=3, num_return_sequences=2),
        dict(encoder_repetition_penalty=4.0),
        dict(encoder_repetition_penalty=0.3, repetition_penalty=1.4, no_repeat_ngram_size=2),
    ],
    ids=["ngram_greedy", "ngram_beams", "encoder_penalty", "encoder_penalty_with_others"],
)
def test_encoder_processors_match_hf(t5, options):
    hf_model, model = t5
    # Sources that repeat the decoder's favourite tokens, so the encoder-side processors have something to act on.
    _, free = hf_generate(hf_model, *encoder_batch(), eos_token_id=None)
    sources = [list(free[row, 1:7]) + SOURCES[row] for row in range(len(SOURCES))]
    ids, mask = encoder_batch(sources)
    _, expected = hf_generate(hf_model, ids, mask, eos_token_id=None, **options)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None, **options)
    _same_tokens(ours, expected)
    plain = {name: value for name, value in options.items() if not name.startswith("encoder_")}
    _, unprocessed = hf_generate(hf_model, ids, mask, eos_token_id=None, **plain)
    assert (unprocessed[: expected.shape[0]] != expected).any()  # the processor changed tokens: the match has teeth


def test_seeded_sampling_is_reproducible_and_row_independent(t5):
    _, model = t5
    ids, mask = encoder_batch()
    options = dict(do_sample=True, top_k=20, temperature=1.3, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    seeds = np.array([[1, 2], [3, 4], [5, 6]])
    first = model.generate(ids, attention_mask=mask, seed=seeds, **options).numpy()
    again = model.generate(ids, attention_mask=mask, seed=seeds, **options).numpy()
    np.testing.assert_array_equal(first, again)
    other = model.generate(ids, attention_mask=mask, seed=seeds + 10, **options).numpy()
    assert (first != other).any()
    alone = model.generate(ids[1:2, :4], attention_mask=mask[1:2, :4], seed=seeds[1:2], **options).numpy()
    np.testing.assert_array_equal(alone[0], first[1])


def test_streaming_hands_out_the_tokens_of_the_whole_call(t5):
    _, model = t5
    ids, mask = encoder_batch()
    chunks = []
    streamed = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                              streamer=lambda tokens: chunks.append(np.asarray(tokens).reshape(len(ids), -1)))
    whole = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    np.testing.assert_array_equal(streamed.numpy(), whole.numpy())
    np.testing.assert_array_equal(np.concatenate(chunks, axis=1), whole.numpy()[:, 1:])  # the new tokens


def test_encoder_inputs_of_one_bucket_share_a_program(t5):
    _, model = t5
    model.generate(np.array([[4, 5, 6, 1]]), max_new_tokens=4)
    traces = model.generate_trace_count
    model.generate(np.array([[4, 5, 6, 7, 8, 9, 1]]), max_new_tokens=4)
    assert model.generate_trace_count == traces


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(decoder_attention_mask=[[1]]), "decoder_attention_mask"),
        (dict(decoder_input_ids=[[0, 1], [0, 1]]), "decoder_input_ids"),
        (dict(decoder_start_token_id=500), "decoder_start_token_id"),
        (dict(prompt_lookup_num_tokens=3), "assisted"),
        (dict(num_beams=2, force_words_ids=[[5]]), "constrained_beam_search"),
        (dict(attention_mask=[[0, 0, 0]]), "attention_mask"),
    ],
)
def test_bad_encoder_decoder_requests_are_refused_before_compiling(t5, options, message):
    _, model = t5
    traces = model.generate_trace_count
    with pytest.raises(ValueError, match=message):
        model.generate(np.array([[4, 5, 1]]), max_new_tokens=3, **options)
    assert model.generate_trace_count == traces


def test_decoder_only_models_refuse_decoder_inputs(tiny_model):
    with pytest.raises(ValueError, match="decoder_input_ids"):
        tiny_model.generate(np.array([[4, 5]]), decoder_input_ids=np.array([[0]]), max_new_tokens=2)


def test_cli_generate_runs_a_t5_directory_like_a_causal_one(t5, t5_dir, capsys):
    """`tfgen generate --model DIR "text"`: the text is the encoder input, the printed answer the decoder's text."""
    from tfgen.cli import main

    _, model = t5
    tokenizer = word_level_t5_tokenizer()
    tokenizer.save_pretrained(t5_dir)
    assert main(["generate", "--model", str(t5_dir), "w13 w7 w42 w9", "--max-new-tokens", "6", "--greedy"]) == 0
    expected = model.generate(np.array([[13, 7, 42, 9]]), max_new_tokens=6, do_sample=False)
    assert capsys.readouterr().out.strip() == tokenizer.decode(expected[0].numpy(), skip_special_tokens=True)


def test_batch_job_generates_what_generate_does(t5, tmp_path):
    """`tfgen.batch` (the engine of `tfgen batch`) sends each row's ids to the encoder and writes the decoder's new
    tokens: the same as `generate` row by row."""
    import json

    from tfgen.batch import run_batch_job

    _, model = t5
    source, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"id": index, "input_ids": row}) + "\n" for index, row in enumerate(SOURCES)))
    run_batch_job(model, str(source), str(output), max_new_tokens=6, eos_token_id=None, progress=False, batch_size=2)
    written = [json.loads(line)["token_ids"] for line in output.read_text().splitlines()]
    expected = [model.generate(np.array([row]), max_new_tokens=6, eos_token_id=None).numpy()[0, 1:].tolist()
                for row in SOURCES]
    assert written == expected
