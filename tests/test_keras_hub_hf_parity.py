"""A keras-hub Llama through `tfgen.from_keras_hub` against HF PyTorch on the same weights (converted to HF's layout
here): greedy search over a left-padded batch with eos mid-way, and beam search with length penalties and early
stopping, token for token with their scores."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import left_padded_batch  # noqa: E402
from keras_hub_models import randomize  # noqa: E402
from test_beam_search import BEAM, assert_beams_match, assert_steps_match  # noqa: E402
from test_beam_search import hf_generate as hf_beam_generate  # noqa: E402
from test_generate_parity import NEW_TOKENS, hf_generate  # noqa: E402
from test_llama_parity import OUTPUTS, PROMPTS, beam_eos, mid_way_eos  # noqa: E402

import tfgen  # noqa: E402


def _hf_llama(causal_lm):
    """HF `LlamaForCausalLM` with the keras-hub Llama's weights (kernels `[in, heads, head_dim]` → `[out, in]`)."""
    backbone = causal_lm.backbone
    hidden, heads = backbone.hidden_dim, backbone.num_query_heads
    config = transformers.LlamaConfig(
        vocab_size=backbone.vocabulary_size, hidden_size=hidden, intermediate_size=backbone.intermediate_dim,
        num_hidden_layers=backbone.num_layers, num_attention_heads=heads,
        num_key_value_heads=backbone.num_key_value_heads, rms_norm_eps=backbone.layer_norm_epsilon,
        rope_theta=backbone.rope_max_wavelength, tie_word_embeddings=backbone.tie_word_embeddings,
        max_position_embeddings=128, pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )

    def value(variable):
        return np.asarray(variable.numpy(), np.float32)

    def projection(layer):  # EinsumDense "bqm,muh->bquh": [D, heads, head_dim] -> [heads * head_dim, D]
        kernel = value(layer.kernel)
        return kernel.reshape(kernel.shape[0], -1).T

    embedding = backbone.token_embedding
    state = {"model.embed_tokens.weight": value(embedding.embeddings),
             "model.norm.weight": value(backbone.layer_norm.weights[0]),
             # Untied, keras-hub keeps the head as `reverse_embeddings` `[D, vocab]`.
             "lm_head.weight": value(embedding.embeddings) if backbone.tie_word_embeddings
             else value(embedding.reverse_embeddings).T}
    for index, decoder in enumerate(backbone.transformer_layers):
        attention, prefix = decoder._self_attention_layer, f"model.layers.{index}."
        output_kernel = value(attention._output_dense.kernel)  # [heads, head_dim, D]
        state.update({
            prefix + "input_layernorm.weight": value(decoder._self_attention_layernorm.weights[0]),
            prefix + "post_attention_layernorm.weight": value(decoder._feedforward_layernorm.weights[0]),
            prefix + "self_attn.q_proj.weight": projection(attention._query_dense),
            prefix + "self_attn.k_proj.weight": projection(attention._key_dense),
            prefix + "self_attn.v_proj.weight": projection(attention._value_dense),
            prefix + "self_attn.o_proj.weight": output_kernel.reshape(-1, hidden).T,
            prefix + "mlp.gate_proj.weight": value(decoder._feedforward_gate_dense.kernel).T,
            prefix + "mlp.up_proj.weight": value(decoder._feedforward_intermediate_dense.kernel).T,
            prefix + "mlp.down_proj.weight": value(decoder._feedforward_output_dense.kernel).T,
        })
    hf_model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = hf_model.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} and (not missing or backbone.tie_word_embeddings)
    return hf_model


@pytest.fixture(scope="module")
def models():
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=96, num_layers=2, num_query_heads=4,
                                              num_key_value_heads=2, hidden_dim=32, intermediate_dim=48)
    causal_lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    randomize(causal_lm, 7)
    causal_lm.compile(sampler="greedy")
    return _hf_llama(causal_lm), tfgen.from_keras_hub(causal_lm), causal_lm


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


def test_converted_weights_give_keras_hubs_logits(models):
    hf_model, _, causal_lm = models
    ids = np.array([PROMPTS[0]], np.int32)
    theirs = np.asarray(causal_lm({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}))
    with torch.no_grad():
        hf_logits = hf_model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(hf_logits, theirs, atol=1e-4)


def test_greedy_with_left_padding_and_eos_mid_way_matches_hf(models, batch):
    hf_model, ours, _ = models
    ids, mask = batch
    eos = mid_way_eos(hf_model, ids, mask, do_sample=False)
    for eos_token_id in (None, eos):
        expected, hf_out = hf_generate(hf_model, ids, mask, do_sample=False, eos_token_id=eos_token_id, **OUTPUTS)
        ours_out = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos_token_id,
                                 pad_token_id=0, **OUTPUTS)
        np.testing.assert_array_equal(ours_out.sequences.numpy(), expected)
        assert_steps_match(ours_out, hf_out)


def test_beam_search_with_length_penalty_and_early_stopping_matches_hf(models, batch):
    hf_model, ours, _ = models
    ids, mask = batch
    eos = beam_eos(hf_model, ids, mask)
    for early_stopping, length_penalty in [(True, 0.7), (False, 1.5), ("never", -0.5)]:
        options = dict(eos_token_id=eos, early_stopping=early_stopping, length_penalty=length_penalty, **BEAM)
        hf_out = hf_beam_generate(hf_model, ids, mask, **options)
        ours_out = ours.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0, **options)
        assert_beams_match(ours_out, hf_out, ids.shape[1])
