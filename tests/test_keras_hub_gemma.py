"""keras-hub's Gemma backbones (`GemmaBackbone`: Gemma 1 and Gemma 2; `Gemma3Backbone`, text only) through
`tfgen.from_keras_hub`: the same greedy tokens as keras-hub's own `generate()`, left padding and batching that change
no row, batch-invariant seeded sampling, greedy and beam search token-exact with HF PyTorch on the same weights, and
the refusals."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from keras_hub_models import keras_hub_greedy, randomize  # noqa: E402

import tfgen  # noqa: E402

SMALL = dict(vocabulary_size=96, num_query_heads=4, hidden_dim=32, intermediate_dim=64)
WINDOW = 4  # slots, so that the window matters within the prompts below
VARIANTS = {
    # Gemma 1: multi-query attention, no window, no caps.
    "gemma": (lambda: keras_hub.models.GemmaBackbone(**SMALL, num_layers=2, num_key_value_heads=1, head_dim=8),
              keras_hub.models.GemmaCausalLM),
    # Gemma 2: post norms, both soft caps, a window on even layers. head_dim 16 != hidden / heads 8, so the query
    # scale tells which one is used; keras-hub's decoder blocks build their attention with
    # query_head_dim_normalize=True whatever the backbone's flag says, so 1/sqrt(16).
    "gemma2": (lambda: keras_hub.models.GemmaBackbone(
        **SMALL, num_layers=2, num_key_value_heads=2, head_dim=16, query_head_dim_normalize=False,
        use_post_ffw_norm=True, use_post_attention_norm=True, attention_logit_soft_cap=20.0,
        final_logit_soft_cap=10.0, use_sliding_window_attention=True, sliding_window_size=WINDOW),
        keras_hub.models.GemmaCausalLM),
    # Gemma 3: q/k norms; keras-hub makes five local layers in six (10k RoPE wavelength, local scaling) and the
    # sixth global (1M, global scaling), so six layers to have both.
    "gemma3": (lambda: keras_hub.models.Gemma3Backbone(
        **SMALL, image_size=None, num_layers=6, num_key_value_heads=2, head_dim=8, use_post_ffw_norm=True,
        use_post_attention_norm=True, use_sliding_window_attention=True, sliding_window_size=WINDOW,
        global_rope_scaling_factor=2.0), keras_hub.models.Gemma3CausalLM),
}
EXPECTED_WINDOWS = {"gemma": [None, None], "gemma2": [WINDOW, None], "gemma3": [WINDOW] * 5 + [None]}
PROMPT = [5, 9, 11, 3, 7, 40, 2, 17, 33, 60]
OTHER = [1, 2, 3]
NEW_TOKENS = 10
# Sampling and beam search add a compiled program each; they run on the variant with every attention option
# (window, soft caps), the others check greedy decoding only, which is what depends on the decoder style.
SAMPLING_AND_BEAM = "gemma2"


def left_padded(rows, width):
    """Left-padded int32 ids and mask `[len(rows), width]` (pad id 0)."""
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        ids[index, width - len(row):], mask[index, width - len(row):] = row, 1
    return ids, mask


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request):
    make_backbone, causal_lm_class = VARIANTS[request.param]
    causal_lm = causal_lm_class(backbone=make_backbone(), preprocessor=None)
    randomize(causal_lm, 0)
    # The fourth item keeps results that later tests of the same variant reuse (each new program compiles).
    return request.param, causal_lm, tfgen.from_keras_hub(causal_lm), {}


def greedy_alone(variant, row):
    _, _, model, results = variant
    if tuple(row) not in results:
        prompt = np.array([row], np.int32)
        results[tuple(row)] = np.asarray(model.generate(prompt, attention_mask=np.ones_like(prompt),
                                                        do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0))
    return results[tuple(row)]


def keras_hub_own_greedy(name, causal_lm, prompt):
    if name != "gemma3":
        return keras_hub_greedy(causal_lm, prompt, NEW_TOKENS)
    # keras-hub 0.32's Gemma3CausalLM.generate() without a preprocessor fails turning its output's `images: None`
    # into numpy; the compiled generate function it calls is run directly instead.
    causal_lm.compile(sampler=keras_hub.samplers.GreedySampler())
    length = prompt.shape[1] + NEW_TOKENS
    token_ids = np.zeros((1, length), np.int32)
    token_ids[:, : prompt.shape[1]] = prompt
    padding_mask = np.arange(length)[np.newaxis] < prompt.shape[1]
    out = causal_lm.make_generate_function()({"token_ids": token_ids, "padding_mask": padding_mask},
                                             stop_token_ids=None)
    return np.asarray(out["token_ids"])


def test_greedy_matches_keras_hubs_own_generate(variant):
    name, causal_lm, model, _ = variant
    assert [model.style.layer_window(index) for index in range(model.style.num_layers())] == EXPECTED_WINDOWS[name]
    ours = greedy_alone(variant, PROMPT)
    theirs = keras_hub_own_greedy(name, causal_lm, np.array([PROMPT], np.int32))
    np.testing.assert_array_equal(ours, theirs)
    # Not a degenerate model: the continuation is not one token repeated.
    assert len(set(theirs[0, len(PROMPT):].tolist())) > 2


def test_prompt_logits_match_keras_hubs_forward_pass(variant):
    # Greedy tokens cannot see a monotonic change of the logits (the final soft cap) nor a small one (gelu's tanh
    # approximation); the logits can. Eager, no program to compile: a left-padded batch through tfgen's cached
    # forward against each row alone through keras-hub's own forward pass.
    _, causal_lm, model, _ = variant
    rows = [PROMPT, OTHER]
    ids, mask = left_padded(rows, width=len(PROMPT) + 2)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ours = model.call_with_cache(ids, model.init_cache(len(rows), ids.shape[1]), 0, mask, positions).logits
    for index, row in enumerate(rows):
        alone = np.array([row], np.int32)
        theirs = np.asarray(causal_lm({"token_ids": alone, "padding_mask": np.ones_like(alone)}))
        np.testing.assert_allclose(np.asarray(ours)[index, -len(row):], theirs[0], rtol=1e-5, atol=1e-4)


def test_left_padding_and_batching_change_no_row(variant):
    name, _, model, _ = variant
    # Wider than the prompts need, so that the rows sit at other buffer slots (and in another length bucket) than
    # alone: the windows count slots, the positions must not.
    ids, mask = left_padded([PROMPT, OTHER], width=20)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0)
    greedy = np.asarray(model.generate(ids, attention_mask=mask, do_sample=False, **options))
    for index, row in enumerate([PROMPT, OTHER]):
        np.testing.assert_array_equal(greedy[index, -NEW_TOKENS:], greedy_alone(variant, row)[0, -NEW_TOKENS:])
    assert not np.array_equal(greedy[0, -NEW_TOKENS:], greedy[1, -NEW_TOKENS:])
    if name != SAMPLING_AND_BEAM:
        return
    row_seeds = np.array([[1, 2], [3, 4]], np.int32)
    sampled = np.asarray(model.generate(ids, attention_mask=mask, do_sample=True, seed=row_seeds, **options))
    for index, row in enumerate([PROMPT, OTHER]):
        alone = np.array([row], np.int32)
        alone_sampled = np.asarray(model.generate(alone, attention_mask=np.ones_like(alone), do_sample=True,
                                                  seed=row_seeds[index:index + 1], **options))
        np.testing.assert_array_equal(sampled[index, -NEW_TOKENS:], alone_sampled[0, -NEW_TOKENS:])
    assert not np.array_equal(greedy[:, -NEW_TOKENS:], sampled[:, -NEW_TOKENS:])


def hf_twin(name, causal_lm):
    """The HF PyTorch model (eager attention, float32) computing what keras-hub's backbone computes, with its
    weights copied. The query scale keras-hub uses is 1/sqrt(head_dim) (see VARIANTS), HF's query_pre_attn_scalar."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    backbone = causal_lm.backbone
    config = dict(
        vocab_size=backbone.vocabulary_size, hidden_size=backbone.hidden_dim,
        intermediate_size=backbone.intermediate_dim // (2 if name != "gemma3" else 1),
        num_hidden_layers=backbone.num_layers, num_attention_heads=backbone.num_query_heads,
        num_key_value_heads=backbone.num_key_value_heads, head_dim=backbone.head_dim,
        rms_norm_eps=backbone.layer_norm_epsilon, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, attn_implementation="eager",
    )
    if name == "gemma":
        hf = transformers.GemmaForCausalLM(transformers.GemmaConfig(**config, rope_theta=10_000.0))
    elif name == "gemma2":
        hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            **config, rope_theta=10_000.0, query_pre_attn_scalar=backbone.head_dim,
            attn_logit_softcapping=backbone.attention_logit_soft_cap,
            final_logit_softcapping=backbone.final_logit_soft_cap, sliding_window=backbone.sliding_window_size))
    else:
        hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            **config, query_pre_attn_scalar=backbone.head_dim, sliding_window=backbone.sliding_window_size,
            sliding_window_pattern=6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": backbone.global_rope_scaling_factor},
            attn_logit_softcapping=None, final_logit_softcapping=None))

    def value(variable):
        return np.asarray(variable.numpy(), np.float32)

    def heads_kernel(variable):  # keras [heads, D, head_dim] -> torch [heads * head_dim, D]
        kernel = value(variable)
        return kernel.transpose(0, 2, 1).reshape(-1, kernel.shape[1])

    weights = {"model.embed_tokens.weight": value(backbone.token_embedding.embeddings),
               "model.norm.weight": value(backbone.layer_norm.scale)}
    for index, decoder in enumerate(backbone.transformer_layers):
        prefix, attention = f"model.layers.{index}.", decoder.attention
        output = value(attention.output_dense.kernel)  # [heads, head_dim, D]
        weights.update({
            prefix + "input_layernorm.weight": value(decoder.pre_attention_norm.scale),
            prefix + "self_attn.q_proj.weight": heads_kernel(attention.query_dense.kernel),
            prefix + "self_attn.k_proj.weight": heads_kernel(attention.key_dense.kernel),
            prefix + "self_attn.v_proj.weight": heads_kernel(attention.value_dense.kernel),
            prefix + "self_attn.o_proj.weight": output.reshape(-1, output.shape[-1]).T,
            prefix + "mlp.gate_proj.weight": value(decoder.gating_ffw.kernel).T,
            prefix + "mlp.up_proj.weight": value(decoder.gating_ffw_2.kernel).T,
            prefix + "mlp.down_proj.weight": value(decoder.ffw_linear.kernel).T,
        })
        if name == "gemma":
            weights[prefix + "post_attention_layernorm.weight"] = value(decoder.pre_ffw_norm.scale)
        else:
            weights.update({
                prefix + "post_attention_layernorm.weight": value(decoder.post_attention_norm.scale),
                prefix + "pre_feedforward_layernorm.weight": value(decoder.pre_ffw_norm.scale),
                prefix + "post_feedforward_layernorm.weight": value(decoder.post_ffw_norm.scale),
            })
        if name == "gemma3":
            weights[prefix + "self_attn.q_norm.weight"] = value(attention.query_norm.scale)
            weights[prefix + "self_attn.k_norm.weight"] = value(attention.key_norm.scale)
    state = {key: torch.from_numpy(np.ascontiguousarray(array)) for key, array in weights.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def test_greedy_and_beam_match_hf_pytorch(variant):
    torch = pytest.importorskip("torch")
    name, causal_lm, model, _ = variant
    hf = hf_twin(name, causal_lm)
    prompt = np.array([PROMPT], np.int32)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0)
    with torch.no_grad():
        hf_greedy = hf.generate(torch.tensor(prompt, dtype=torch.long), do_sample=False, **options).numpy()
    np.testing.assert_array_equal(greedy_alone(variant, PROMPT), hf_greedy)
    if name != SAMPLING_AND_BEAM:
        return
    with torch.no_grad():
        hf_beam = hf.generate(torch.tensor(prompt, dtype=torch.long), do_sample=False, num_beams=3,
                              **options).numpy()
    ours_beam = np.asarray(model.generate(prompt, attention_mask=np.ones_like(prompt), num_beams=3, **options))
    np.testing.assert_array_equal(ours_beam, hf_beam)
    assert not np.array_equal(hf_beam, hf_greedy)


def small_causal_lm(backbone_class=None, causal_lm_class=None, **overrides):
    backbone = (backbone_class or keras_hub.models.GemmaBackbone)(
        **{**SMALL, "num_layers": 1, "num_key_value_heads": 1, "head_dim": 8, **overrides})
    return (causal_lm_class or keras_hub.models.GemmaCausalLM)(backbone=backbone, preprocessor=None)


def test_vision_gemma3_is_refused():
    encoder = keras_hub.models.Gemma3VisionEncoder(image_size=16, patch_size=8, num_heads=2, hidden_dim=8,
                                                   num_layers=1, intermediate_dim=16, output_dim=32, pool_size=2)
    causal_lm = small_causal_lm(keras_hub.models.Gemma3Backbone, keras_hub.models.Gemma3CausalLM, image_size=16,
                                vision_encoder=encoder)
    with pytest.raises(ValueError, match="vision encoder.*text-only"):
        tfgen.from_keras_hub(causal_lm)


def test_bidirectional_gemma3_is_refused():
    causal_lm = small_causal_lm(keras_hub.models.Gemma3Backbone, keras_hub.models.Gemma3CausalLM, image_size=None,
                                use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        tfgen.from_keras_hub(causal_lm)


@pytest.mark.parametrize("owner, name", [("decoder", "gating_ffw_2"), ("decoder", "post_ffw_norm"),
                                         ("attention", "rope_layer"), ("attention", "query_head_dim_normalize")])
def test_a_renamed_sublayer_or_option_fails_at_from_keras_hub(owner, name):
    causal_lm = small_causal_lm(use_post_ffw_norm=True)
    decoder = causal_lm.backbone.transformer_layers[0]
    target = decoder if owner == "decoder" else decoder.attention
    # Keras tracks layer attributes; a plain object attribute is dropped the same way.
    object.__delattr__(target, name)
    with pytest.raises(ValueError, match=name):
        tfgen.from_keras_hub(causal_lm)
