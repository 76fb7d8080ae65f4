"""`tfgen.from_keras_hub` on quantized and bfloat16 keras-hub models, the generation defaults it reads from the
model's sampler, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from keras_hub_models import randomize  # noqa: E402

import tfgen  # noqa: E402

SMALL = dict(vocabulary_size=96, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
             intermediate_dim=48)
PROMPT = np.array([[5, 9, 11, 3, 7, 40, 2, 17]], np.int32)


def llama(dtype=None, seed=0):
    causal_lm = keras_hub.models.LlamaCausalLM(
        backbone=keras_hub.models.LlamaBackbone(**SMALL, dtype=dtype), preprocessor=None)
    randomize(causal_lm, seed)
    causal_lm.compile(sampler="greedy")
    return causal_lm


def keras_hub_argmaxes(causal_lm, sequence, prompt_width):
    """keras-hub's greedy choice after each prefix of `sequence` `[1, L]` (its own uncached forward)."""
    logits = np.asarray(causal_lm({"token_ids": sequence, "padding_mask": np.ones_like(sequence, bool)}),
                        np.float32)
    return np.argmax(logits[0, prompt_width - 1:-1], -1)


def test_an_int8_quantized_model_generates_keras_hubs_tokens():
    causal_lm = llama()
    causal_lm.quantize("int8")
    assert "int8" in {str(v.dtype) for v in causal_lm.weights}
    model = tfgen.from_keras_hub(causal_lm)
    ours = np.asarray(model.generate(PROMPT, attention_mask=np.ones_like(PROMPT), max_new_tokens=8, pad_token_id=0))
    np.testing.assert_array_equal(ours[0, PROMPT.shape[1]:], keras_hub_argmaxes(causal_lm, ours, PROMPT.shape[1]))
    # The wrapper reads the quantized weights themselves: no float copy is made.
    assert {id(v) for v in model.variables} == {id(v) for v in causal_lm.variables}


def test_a_bfloat16_model_runs_in_bfloat16_with_keras_hubs_logits():
    causal_lm = llama("bfloat16")
    model = tfgen.from_keras_hub(causal_lm)
    cache = model.init_cache(1, 16)
    assert str(cache[0][0].dtype.name) == "bfloat16"
    ours = np.asarray(model.generate(PROMPT, attention_mask=np.ones_like(PROMPT), max_new_tokens=6, pad_token_id=0,
                                     output_logits=True, return_dict_in_generate=True).logits[0])
    sequence = np.asarray(model.generate(PROMPT, attention_mask=np.ones_like(PROMPT), max_new_tokens=6,
                                         pad_token_id=0))
    theirs = np.asarray(causal_lm({"token_ids": sequence, "padding_mask": np.ones_like(sequence, bool)}), np.float32)
    # bfloat16 keeps 8 bits of mantissa: the logits agree to its rounding, not bit for bit.
    np.testing.assert_allclose(ours[0], theirs[0, PROMPT.shape[1] - 1], atol=0.1, rtol=0.02)


@pytest.mark.parametrize("sampler, expected", [
    ("greedy", dict(do_sample=False)),
    (lambda: keras_hub.samplers.TopPSampler(p=0.8, k=10, temperature=0.7),
     dict(do_sample=True, top_p=0.8, top_k=10, temperature=0.7)),
    (lambda: keras_hub.samplers.TopKSampler(k=7), dict(do_sample=True, top_k=7)),
    (lambda: keras_hub.samplers.RandomSampler(), dict(do_sample=True, top_k=0)),
    (lambda: keras_hub.samplers.BeamSampler(num_beams=3), dict(do_sample=False, num_beams=3, length_penalty=0.0)),
    (lambda: keras_hub.samplers.ContrastiveSampler(k=4, alpha=0.5), dict(top_k=4, penalty_alpha=0.5)),
])
def test_defaults_follow_the_compiled_sampler(sampler, expected):
    causal_lm = llama()
    causal_lm.compile(sampler=sampler if isinstance(sampler, str) else sampler())
    config = tfgen.from_keras_hub(causal_lm).generation_config
    for name, value in expected.items():
        assert getattr(config, name) == pytest.approx(value), name


def test_a_sampler_tfgen_cannot_express_is_warned_about_and_replaced_by_greedy():
    class Forbidding(keras_hub.samplers.GreedySampler):
        def get_next_token(self, probabilities):
            return super().get_next_token(probabilities)

    causal_lm = llama()
    causal_lm.compile(sampler=Forbidding())
    with pytest.warns(UserWarning, match="Forbidding has no tfgen equivalent"):
        config = tfgen.from_keras_hub(causal_lm).generation_config
    assert config.do_sample is False


@pytest.mark.parametrize("sampler, message", [
    (lambda: keras_hub.samplers.TopKSampler(k=3, seed=42), "seed=42 is not carried over: pass seed= to generate"),
    (lambda: keras_hub.samplers.BeamSampler(num_beams=2, temperature=0.5), "temperature=0.5 is not carried over"),
])
def test_sampler_settings_tfgen_does_not_take_as_defaults_are_warned_about(sampler, message):
    causal_lm = llama()
    causal_lm.compile(sampler=sampler())
    with pytest.warns(UserWarning, match=message):
        tfgen.from_keras_hub(causal_lm)


def test_errors_name_what_is_wrong():
    with pytest.raises(TypeError, match="causal_lm must be a keras_hub.models.CausalLM, got LlamaBackbone"):
        tfgen.from_keras_hub(keras_hub.models.LlamaBackbone(**SMALL))
    with pytest.raises(TypeError, match="generation_config must be a tfgen.GenerationConfig"):
        tfgen.from_keras_hub(llama(), generation_config={"do_sample": False})
    backbone = keras_hub.models.BloomBackbone(vocabulary_size=96, num_layers=1, num_heads=2, hidden_dim=8,
                                              intermediate_dim=16)
    with pytest.raises(ValueError, match="BloomBackbone is not supported; supported backbones: .*LlamaBackbone"):
        tfgen.from_keras_hub(keras_hub.models.BloomCausalLM(backbone=backbone, preprocessor=None))


def test_a_sentencepiece_tokenizer_encodes_as_keras_hub_does_in_python_and_in_the_graph():
    import io

    import sentencepiece
    import tensorflow as tf

    texts = ["the quick brown fox", "jumps over the lazy dog", "the dog"]
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 20), model_writer=proto, vocab_size=12, model_type="WORD", pad_id=0,
        bos_id=1, eos_id=2, unk_id=3, pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>")
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(
        keras_hub.models.LlamaTokenizer(proto=proto.getvalue()), sequence_length=12)
    from tfgen.keras_hub import KerasHubTokenizer

    tokenizer = KerasHubTokenizer(preprocessor)
    batch = tokenizer(texts)
    packed = preprocessor.generate_preprocess(texts)
    for row in range(len(texts)):
        ours = batch["input_ids"][row][batch["attention_mask"][row] == 1]
        expected = np.asarray(packed["token_ids"])[row][np.asarray(packed["padding_mask"])[row]]
        np.testing.assert_array_equal(ours, expected)
    assert ours[0] == 1  # the start token <s>
    assert tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True) == texts
    # The exported generate_text signature's tokenizer gives the same left-padded ids.
    in_graph_ids, in_graph_mask = tf.function(tokenizer.in_graph(12).encode)(tf.constant(texts))
    np.testing.assert_array_equal(in_graph_ids.numpy(), batch["input_ids"])
    np.testing.assert_array_equal(in_graph_mask.numpy(), batch["attention_mask"])
