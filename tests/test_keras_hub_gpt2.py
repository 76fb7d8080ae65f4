"""keras-hub's GPT-2 through `tfgen.from_keras_hub`: the same greedy tokens as keras-hub's own `generate()`, left
padding and batching that change no row (greedy and seeded sampling), greedy and beam search token-exact with HF
PyTorch's `GPT2LMHeadModel` on the same (converted) weights, text in and out through the GPT-2 preprocessor, and the
decoder options the style refuses.

One tiny random backbone for the whole file; every generate() call below reuses one of a few compiled programs
(one left-padded batch shape, one unpadded prompt shape)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import left_padded_batch  # noqa: E402
from keras_hub_models import keras_hub_greedy, randomize  # noqa: E402
from test_beam_search import BEAM, NEW_TOKENS, assert_beams_match  # noqa: E402
from test_beam_search import hf_generate as hf_beam_generate  # noqa: E402
from test_generate_parity import hf_generate  # noqa: E402

import tfgen  # noqa: E402
from tfgen.decoding.random import derive_seeds  # noqa: E402

SMALL = dict(vocabulary_size=96, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64,
             max_sequence_length=64)
PROMPT = [5, 9, 11, 3, 7, 40, 2, 17]
OTHER = [44, 3, 90]
assert NEW_TOKENS == 12  # test_beam_search's helpers pad HF's output to this many new tokens


def build_causal_lm(seed: int = 0, preprocessor=None):
    causal_lm = keras_hub.models.GPT2CausalLM(backbone=keras_hub.models.GPT2Backbone(**SMALL),
                                              preprocessor=preprocessor)
    randomize(causal_lm, seed)
    return causal_lm


@pytest.fixture(scope="module")
def causal_lm():
    return build_causal_lm()


@pytest.fixture(scope="module")
def model(causal_lm):
    # keras-hub's CausalLM samples top-k until compiled otherwise; the wrapper takes that choice as its default.
    causal_lm.compile(sampler="greedy")
    wrapped = tfgen.from_keras_hub(causal_lm)
    assert not wrapped.generation_config.do_sample
    return wrapped


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch([PROMPT, OTHER])


# ------------------------------------------------------------------------------------------------ HF PyTorch GPT-2


def hf_state_dict(backbone) -> dict:
    """keras-hub GPT-2 weights under HF `GPT2LMHeadModel` names (HF's Conv1D weights are `[in, out]`)."""
    D = backbone.hidden_dim

    def array(variable):
        return np.asarray(variable.numpy(), np.float32)

    def norm(prefix, layer):
        return {f"{prefix}.weight": array(layer.gamma), f"{prefix}.bias": array(layer.beta)}

    tensors = {
        "transformer.wte.weight": array(backbone.token_embedding.embeddings),
        "transformer.wpe.weight": array(backbone.position_embedding.position_embeddings),
        **norm("transformer.ln_f", backbone.layer_norm),
    }
    for index, decoder in enumerate(backbone.transformer_layers):
        prefix, attention = f"transformer.h.{index}", decoder._self_attention_layer
        projections = [attention._query_dense, attention._key_dense, attention._value_dense]  # kernels [D, H, Dh]
        tensors.update({
            f"{prefix}.attn.c_attn.weight": np.concatenate([array(p.kernel).reshape(D, D) for p in projections], 1),
            f"{prefix}.attn.c_attn.bias": np.concatenate([array(p.bias).reshape(D) for p in projections]),
            f"{prefix}.attn.c_proj.weight": array(attention._output_dense.kernel).reshape(D, D),  # [H, Dh, D]
            f"{prefix}.attn.c_proj.bias": array(attention._output_dense.bias),
            f"{prefix}.mlp.c_fc.weight": array(decoder._feedforward_intermediate_dense.kernel),
            f"{prefix}.mlp.c_fc.bias": array(decoder._feedforward_intermediate_dense.bias),
            f"{prefix}.mlp.c_proj.weight": array(decoder._feedforward_output_dense.kernel),
            f"{prefix}.mlp.c_proj.bias": array(decoder._feedforward_output_dense.bias),
            **norm(f"{prefix}.ln_1", decoder._self_attention_layer_norm),
            **norm(f"{prefix}.ln_2", decoder._feedforward_layer_norm),
        })
    return {name: torch.from_numpy(value) for name, value in tensors.items()}


@pytest.fixture(scope="module")
def hf_model(causal_lm):
    backbone = causal_lm.backbone
    config = transformers.GPT2Config(
        vocab_size=backbone.vocabulary_size, n_positions=backbone.max_sequence_length, n_embd=backbone.hidden_dim,
        n_layer=backbone.num_layers, n_head=backbone.num_heads, n_inner=backbone.intermediate_dim,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, attn_implementation="eager",
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(backbone), strict=False)
    # lm_head is tied to wte; attn.bias / masked_bias are buffers some releases keep.
    assert [name for name in missing if not name.endswith(("attn.bias", "attn.masked_bias"))] == ["lm_head.weight"]
    assert not unexpected
    return hf


def test_converted_weights_give_keras_hubs_logits_in_hf(causal_lm, hf_model):
    prompt = np.array([PROMPT], np.int32)
    theirs = np.asarray(causal_lm({"token_ids": prompt, "padding_mask": np.ones_like(prompt)}))
    with torch.no_grad():
        hf_logits = hf_model(torch.tensor(prompt, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, hf_logits, atol=1e-4)


# ------------------------------------------------------------------------------------------------------ the tests


def test_greedy_matches_keras_hubs_own_generate(causal_lm, model):
    prompt = np.array([PROMPT], np.int32)
    ours = model.generate(prompt, attention_mask=np.ones_like(prompt), max_new_tokens=NEW_TOKENS, pad_token_id=0)
    theirs = keras_hub_greedy(causal_lm, prompt, NEW_TOKENS)
    np.testing.assert_array_equal(np.asarray(ours), theirs)
    # Not a degenerate model: the continuation is not one token repeated.
    assert len(set(theirs[0, len(PROMPT):].tolist())) > 2


def test_left_padding_and_batching_change_no_row(model, batch):
    ids, mask = batch
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0)
    row_seeds = np.array([[1, 2], [3, 4]], np.int32)
    greedy = np.asarray(model.generate(ids, attention_mask=mask, **options))
    sampled = np.asarray(model.generate(ids, attention_mask=mask, do_sample=True, seed=row_seeds, **options))
    # One seed `[2]` for the whole batch: row i samples with the key derived from it and i, whatever its neighbours.
    shared = np.asarray(model.generate(ids, attention_mask=mask, do_sample=True, seed=[1, 2], **options))
    for index, row in enumerate([PROMPT, OTHER]):
        alone = np.array([row], np.int32)
        alone_mask = np.ones_like(alone)
        alone_greedy = np.asarray(model.generate(alone, attention_mask=alone_mask, **options))
        np.testing.assert_array_equal(greedy[index, -NEW_TOKENS:], alone_greedy[0, -NEW_TOKENS:])
        alone_sampled = np.asarray(model.generate(alone, attention_mask=alone_mask, do_sample=True,
                                                  seed=row_seeds[index:index + 1], **options))
        np.testing.assert_array_equal(sampled[index, -NEW_TOKENS:], alone_sampled[0, -NEW_TOKENS:])
        row_key = derive_seeds(np.array([[1, 2]]), [index]).numpy()
        alone_shared = np.asarray(model.generate(alone, attention_mask=alone_mask, do_sample=True, seed=row_key,
                                                 **options))
        np.testing.assert_array_equal(shared[index, -NEW_TOKENS:], alone_shared[0, -NEW_TOKENS:])
    assert not np.array_equal(greedy[0, -NEW_TOKENS:], greedy[1, -NEW_TOKENS:])
    assert not np.array_equal(greedy[:, -NEW_TOKENS:], sampled[:, -NEW_TOKENS:])


def test_greedy_on_a_left_padded_batch_matches_hf(model, hf_model, batch):
    ids, mask = batch
    expected = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=None)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    np.testing.assert_array_equal(np.asarray(ours), expected)


def test_beam_search_matches_hf(model, hf_model, batch):
    ids, mask = batch
    # An eos that the free-running beams produce, so that it ends hypotheses (early_stopping then has a say).
    free_run = hf_beam_generate(hf_model, ids, mask, eos_token_id=None, **BEAM).sequences.numpy()[:, ids.shape[1]:]
    tokens, counts = np.unique(free_run[:, 1:], return_counts=True)
    eos = int(tokens[np.argmax(counts)])
    for length_penalty in (0.7, 1.5):
        options = dict(eos_token_id=eos, early_stopping=True, length_penalty=length_penalty, **BEAM)
        hf_out = hf_beam_generate(hf_model, ids, mask, **options)
        ended = (hf_out.beam_indices.numpy() >= 0).sum(axis=1)
        assert (ended < NEW_TOKENS).any(), "no hypothesis ended at the eos; pick another"
        ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0, **options)
        assert_beams_match(ours, hf_out, ids.shape[1])


@pytest.mark.parametrize("kind", ["int8", "bfloat16"])
def test_int8_and_bfloat16_models_match_keras_hubs_own_generate(causal_lm, kind):
    if kind == "int8":
        variant = build_causal_lm()
        with warnings.catch_warnings():  # "Layer LayerNormalization does not have a `quantize` method", ...
            warnings.simplefilter("ignore", UserWarning)
            variant.quantize("int8")
    else:
        variant = keras_hub.models.GPT2CausalLM(
            backbone=keras_hub.models.GPT2Backbone(**SMALL, dtype="bfloat16"), preprocessor=None
        )
        for target, source in zip(variant.weights, causal_lm.weights):
            target.assign(np.asarray(source.numpy(), np.float32).astype(target.dtype))
    variant.compile(sampler="greedy")
    prompt = np.array([PROMPT], np.int32)
    ours = np.asarray(tfgen.from_keras_hub(variant).generate(prompt, attention_mask=np.ones_like(prompt),
                                                             max_new_tokens=NEW_TOKENS, pad_token_id=0))
    if kind == "int8":
        np.testing.assert_array_equal(ours, keras_hub_greedy(variant, prompt, NEW_TOKENS))
        return
    # bfloat16 rounds differently along keras-hub's attention (all slots at once) and ours (earlier slots, then the
    # new ones), so a near-tie may go either way: each token must be keras-hub's choice up to bfloat16 rounding.
    logits = np.asarray(variant({"token_ids": ours, "padding_mask": np.ones_like(ours, bool)}), np.float32)
    steps = logits[0, len(PROMPT) - 1:-1]
    chosen = steps[np.arange(NEW_TOKENS), ours[0, len(PROMPT):]]
    best = steps.max(axis=-1)
    assert np.all(best - chosen <= 0.02 * np.maximum(np.abs(best), 1.0)), (best, chosen)
    assert np.mean(chosen == best) >= 0.75


# --------------------------------------------------------------------------------------------------- text in/out


def tiny_gpt2_tokenizer():
    """A byte-level BPE tokenizer over 96 ids (the backbone's vocabulary): "!" is id 0 (GPT-2's pad), printable
    ASCII and "Ġ" (a space), the merges that spell "a quick fox", and "<|endoftext|>" last, as in GPT-2."""
    merges = ["Ġ q", "u i", "c k", "ui ck", "Ġq uick", "Ġ f", "o x", "Ġf ox"]
    tokens = ["!", "Ġ"] + [merge.replace(" ", "") for merge in merges]
    tokens += [chr(code) for code in range(ord("a"), ord("z") + 1)]
    tokens += [chr(code) for code in range(34, 127) if chr(code) not in tokens][:95 - len(tokens)]
    vocabulary = {token: index for index, token in enumerate(tokens + ["<|endoftext|>"])}
    assert len(vocabulary) == SMALL["vocabulary_size"]
    return keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)


def test_text_in_and_out_through_the_gpt2_preprocessor(causal_lm):
    tokenizer = tiny_gpt2_tokenizer()
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=16)
    text_lm = keras_hub.models.GPT2CausalLM(backbone=causal_lm.backbone, preprocessor=preprocessor)
    text_lm.compile(sampler="greedy")
    model = tfgen.from_keras_hub(text_lm)
    end = tokenizer.token_to_id("<|endoftext|>")
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (end, [end], 0)
    encoded = model.tokenizer(["a quick fox"])
    packed = preprocessor.generate_preprocess(["a quick fox"])
    theirs = np.asarray(packed["token_ids"])[0][np.asarray(packed["padding_mask"])[0].astype(bool)]
    assert encoded["input_ids"].tolist() == [theirs.tolist()]
    assert theirs.tolist() == [end] + [tokenizer.token_to_id(t) for t in ("a", "Ġquick", "Ġfox")]
    np.testing.assert_array_equal(encoded["attention_mask"], np.ones((1, 4)))
    assert model.tokenizer.batch_decode(encoded["input_ids"], skip_special_tokens=True) == ["a quick fox"]
    assert model.tokenizer.batch_decode(encoded["input_ids"]) == ["<|endoftext|>a quick fox"]
    # Any id the backbone can generate decodes (the vocabulary covers all 96); only the end token is special.
    (everything,) = model.tokenizer.batch_decode([list(range(SMALL["vocabulary_size"]))], skip_special_tokens=True)
    assert everything == "".join(tokenizer.id_to_token(i).replace("Ġ", " ") for i in range(end))


# ------------------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("option, value, named", [
    ("normalize_first", False, "normalize_first=False"),
    ("_cross_attention_layer", "cross", "cross-attention"),
])
def test_decoder_options_tfgen_cannot_run_are_refused(option, value, named):
    causal_lm = build_causal_lm()
    decoder = causal_lm.backbone.transformer_layers[1]
    setattr(decoder, option, decoder._self_attention_layer if value == "cross" else value)
    with pytest.raises(ValueError, match=f"transformer layer 1.*{named}"):
        tfgen.from_keras_hub(causal_lm)


@pytest.mark.parametrize("option, value, named", [
    ("_value_dim", 8, "value_dim=8"),
    ("_use_gate", True, "use_gate=True"),
    ("_sliding_window", 4, "sliding_window=4"),
])
def test_attention_options_tfgen_cannot_run_are_refused(causal_lm, option, value, named):
    attention = causal_lm.backbone.transformer_layers[0]._self_attention_layer
    before = getattr(attention, option)
    setattr(attention, option, value)
    try:
        with pytest.raises(ValueError, match=f"transformer layer 0's self-attention has {named}"):
            tfgen.from_keras_hub(causal_lm)
    finally:
        setattr(attention, option, before)


def test_a_renamed_sublayer_fails_with_its_name():
    causal_lm = build_causal_lm()
    del causal_lm.backbone.transformer_layers[0]._feedforward_layer_norm
    with pytest.raises(ValueError, match="feedforward norm.*_feedforward_layer_norm"):
        tfgen.from_keras_hub(causal_lm)
