"""The encoder side of an encoder-decoder generate() as HF's: `encoder_outputs=` (HF's `BaseModelOutput`, a tuple or
the array) replaces running the encoder and gives HF's tokens, with or without `input_ids`; `output_hidden_states`
returns HF's `encoder_hidden_states` (the encoder run once, before the program); bad `encoder_outputs` are refused
before anything compiles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
import torch
from t5_checkpoints import build_branching_model
from transformers.modeling_outputs import BaseModelOutput

from tfgen.generation.programs import program_cache

NEW_TOKENS = 8
# Right-padded encoder rows of different lengths (T5's pad id is 0).
IDS = np.array([[13, 7, 42, 9, 55, 21, 1], [88, 14, 61, 1, 0, 0, 0]], np.int32)
MASK = (IDS != 0).astype(np.int32)


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return build_branching_model("t5", tmp_path_factory.mktemp("t5_encoder_outputs"))


def hf_encoder_outputs(hf_model, ids=IDS, mask=MASK) -> BaseModelOutput:
    with torch.no_grad():
        return hf_model.get_encoder()(input_ids=torch.tensor(ids, dtype=torch.long),
                                      attention_mask=torch.tensor(mask, dtype=torch.long), output_hidden_states=True)


def hf_tokens(hf_model, **inputs) -> np.ndarray:
    """HF's sequences padded with T5's pad id 0 to tfgen's width (HF stops once every row finished)."""
    with torch.no_grad():
        sequences = hf_model.generate(max_new_tokens=NEW_TOKENS, **inputs).numpy()
    return np.pad(sequences, [(0, 0), (0, 1 + NEW_TOKENS - sequences.shape[1])])


@pytest.mark.parametrize("options", [{}, dict(num_beams=3, num_return_sequences=2)], ids=["greedy", "beams"])
def test_encoder_outputs_give_hfs_tokens_without_running_the_encoder(t5, options):
    hf_model, model = t5
    # HF's generate expands the encoder_outputs it is given in place (for beams), so each call gets its own.
    expected = hf_tokens(hf_model, encoder_outputs=hf_encoder_outputs(hf_model), attention_mask=torch.tensor(MASK),
                         **options)
    encoder_outputs = hf_encoder_outputs(hf_model)
    # The same tokens as encoding in the program, so the states given are really the ones decoded from.
    np.testing.assert_array_equal(
        model.generate(IDS, attention_mask=MASK, max_new_tokens=NEW_TOKENS, **options), expected)
    ours = model.generate(encoder_outputs=encoder_outputs, attention_mask=MASK, max_new_tokens=NEW_TOKENS, **options)
    np.testing.assert_array_equal(ours, expected)
    # With the input ids beside them, and as a bare array or HF's tuple form, the result is the same.
    last = encoder_outputs.last_hidden_state
    for given in (last.numpy(), (last,), {"last_hidden_state": tf.constant(last.numpy())}):
        np.testing.assert_array_equal(
            model.generate(IDS, attention_mask=MASK, encoder_outputs=given, max_new_tokens=NEW_TOKENS, **options),
            expected)


def test_encoder_outputs_are_all_attended_without_a_mask_as_in_hf(t5):
    """HF infers no encoder mask beside encoder_outputs: the padded row then attends its padding too."""
    hf_model, model = t5
    encoder_outputs = hf_encoder_outputs(hf_model)
    expected = hf_tokens(hf_model, encoder_outputs=hf_encoder_outputs(hf_model))
    ours = model.generate(encoder_outputs=encoder_outputs, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(ours, expected)
    assert not np.array_equal(ours[1], model.generate(IDS, attention_mask=MASK, max_new_tokens=NEW_TOKENS)[1])


def test_encoder_outputs_read_by_encoder_processors_with_their_ids(t5):
    hf_model, model = t5
    encoder_outputs = hf_encoder_outputs(hf_model)
    options = dict(encoder_repetition_penalty=3.0, encoder_no_repeat_ngram_size=2)
    expected = hf_tokens(hf_model, input_ids=torch.tensor(IDS, dtype=torch.long),
                         encoder_outputs=hf_encoder_outputs(hf_model),
                         attention_mask=torch.tensor(MASK), **options)
    ours = model.generate(IDS, attention_mask=MASK, encoder_outputs=encoder_outputs, max_new_tokens=NEW_TOKENS,
                          **options)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("options", [
    {},
    dict(num_beams=3, num_return_sequences=2),
    dict(do_sample=True, num_return_sequences=2, seed=[3, 4]),
], ids=["greedy", "beams", "sampling"])
def test_output_hidden_states_return_hfs_encoder_hidden_states(t5, options):
    hf_model, model = t5
    seed = options.pop("seed", None)
    plain = model.generate(IDS, attention_mask=MASK, max_new_tokens=NEW_TOKENS, seed=seed, **options)
    with pytest.warns(UserWarning, match="not the decoder's"):
        out = model.generate(IDS, attention_mask=MASK, max_new_tokens=NEW_TOKENS, seed=seed, output_hidden_states=True,
                             return_dict_in_generate=True, **options)
    np.testing.assert_array_equal(out.sequences, plain)
    expected = hf_encoder_outputs(hf_model).hidden_states
    # One row per prompt, the caller's columns (HF's layout: embeddings, each block's input, the final output).
    assert len(out.encoder_hidden_states) == len(expected) == model.config.num_layers + 1
    for ours, theirs in zip(out.encoder_hidden_states, expected):
        assert ours.shape == theirs.shape == (2, IDS.shape[1], model.config.d_model)
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-4)
    assert "decoder_hidden_states" not in out.keys()
    # The encoder ran ahead of the program, which then took its output rather than encoding again.
    assert any(key[0] == "encode" for key in program_cache(model).functions)


def test_hidden_states_of_given_encoder_outputs_are_passed_back(t5):
    hf_model, model = t5
    encoder_outputs = hf_encoder_outputs(hf_model)
    with pytest.warns(UserWarning, match="not the decoder's"):
        out = model.generate(encoder_outputs=encoder_outputs, attention_mask=MASK, max_new_tokens=NEW_TOKENS,
                             output_hidden_states=True, return_dict_in_generate=True)
    for ours, given in zip(out.encoder_hidden_states, encoder_outputs.hidden_states, strict=True):
        np.testing.assert_array_equal(ours.numpy(), given.numpy())
    with pytest.warns(UserWarning) as caught:
        out = model.generate(encoder_outputs=encoder_outputs.last_hidden_state, attention_mask=MASK,
                             max_new_tokens=NEW_TOKENS, output_hidden_states=True, return_dict_in_generate=True)
    assert out.encoder_hidden_states is None
    messages = [str(warning.message) for warning in caught]
    assert any("carry no hidden_states" in message for message in messages), messages
    assert {warning.filename for warning in caught} == {__file__}


def test_streaming_takes_encoder_outputs_and_returns_encoder_hidden_states(t5):
    hf_model, model = t5
    whole = model.generate(IDS, attention_mask=MASK, max_new_tokens=NEW_TOKENS, eos_token_id=None).numpy()
    for inputs in (dict(encoder_outputs=hf_encoder_outputs(hf_model)), dict(input_ids=IDS, output_hidden_states=True,
                                                                            return_dict_in_generate=True)):
        chunks = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "output_hidden_states", UserWarning)
            out = model.generate(attention_mask=MASK, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                 streamer=lambda tokens: chunks.append(np.asarray(tokens).reshape(len(IDS), -1)),
                                 **inputs)
        np.testing.assert_array_equal(np.concatenate(chunks, axis=1), whole[:, 1:])
        if "output_hidden_states" in inputs:
            np.testing.assert_array_equal(out.sequences, whole)
            np.testing.assert_allclose(out.encoder_hidden_states[-1].numpy(),
                                       hf_encoder_outputs(hf_model).last_hidden_state.numpy(), atol=1e-4)


@pytest.mark.parametrize("encoder_outputs, options, error, message", [
    (np.zeros((2, 7, 16), np.float32), {}, ValueError, r"encoder_outputs: the last hidden state must be \[batch, "
                                                      r"encoder_length, 32\]"),
    (np.zeros((2, 7), np.float32), {}, ValueError, "encoder_outputs: the last hidden state must be"),
    (np.zeros((2, 7, 32), np.int32), {}, TypeError, "encoder_outputs must hold floats"),
    (np.full((2, 7, 32), np.nan, np.float32), {}, ValueError, "encoder_outputs: the hidden states hold NaN"),
    ({"hidden_states": ()}, {}, ValueError, "encoder_outputs: no last_hidden_state"),
    (np.zeros((2, 5, 32), np.float32), dict(input_ids=IDS), ValueError, r"input_ids has shape \(2, 7\), but "
                                                                         "encoder_outputs"),
    (np.zeros((2, 7, 32), np.float32), dict(attention_mask=MASK[:, :5]), ValueError, "attention_mask has shape"),
    (BaseModelOutput(last_hidden_state=torch.zeros(2, 7, 32), hidden_states=(torch.zeros(2, 5, 32),)),
     dict(output_hidden_states=True, return_dict_in_generate=True), ValueError,
     r"encoder_outputs.hidden_states: every layer must be \(2, 7, 32\)"),
    (np.zeros((2, 7, 32), np.float32), dict(encoder_repetition_penalty=2.0), ValueError,
     "encoder_repetition_penalty: it reads the encoder's input ids"),
    (np.zeros((2, 7, 32), np.float32), dict(encoder_no_repeat_ngram_size=2), ValueError,
     "encoder_no_repeat_ngram_size: it reads the encoder's input ids"),
])
def test_bad_encoder_outputs_are_refused_before_compiling(t5, encoder_outputs, options, error, message):
    _, model = t5
    traces = model.generate_trace_count
    with pytest.raises(error, match=message), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "output_hidden_states", UserWarning)
        model.generate(encoder_outputs=encoder_outputs, max_new_tokens=NEW_TOKENS, **options)
    assert model.generate_trace_count == traces


def test_decoder_only_models_refuse_encoder_outputs_and_hidden_states(tiny_model):
    with pytest.raises(ValueError, match="encoder_outputs: the model is decoder-only"):
        tiny_model.generate([[5, 6]], encoder_outputs=np.zeros((1, 2, 8), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="output_hidden_states=True is not supported"):
            tiny_model.generate([[5, 6]], output_hidden_states=True, return_dict_in_generate=True)
