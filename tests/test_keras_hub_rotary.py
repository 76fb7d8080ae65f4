"""keras-hub's rotary decoders (Llama, Llama 3, Mistral, Qwen, Qwen 3, Phi-3) through `tfgen.from_keras_hub`: the same
greedy tokens as keras-hub's own `generate()`, left padding that changes nothing, batch-invariant seeded sampling,
beam search token-exact with HF PyTorch on the same weights, int8 and bfloat16 models, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from conftest import left_padded_batch  # noqa: E402
from keras_hub_models import keras_hub_greedy, randomize  # noqa: E402

import tfgen  # noqa: E402

SMALL = dict(vocabulary_size=96, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
             intermediate_dim=48)
# A window of 4 slots, so that it matters within the prompts below.
FAMILIES = {
    "llama": (lambda: keras_hub.models.LlamaBackbone(**SMALL), keras_hub.models.LlamaCausalLM),
    "llama3": (lambda: keras_hub.models.Llama3Backbone(**SMALL, tie_word_embeddings=True),
               keras_hub.models.Llama3CausalLM),
    "mistral": (lambda: keras_hub.models.MistralBackbone(**SMALL, sliding_window=4), keras_hub.models.MistralCausalLM),
    "qwen": (lambda: keras_hub.models.QwenBackbone(**SMALL, use_sliding_window_attention=True, sliding_window_size=4),
             keras_hub.models.QwenCausalLM),
    "qwen3": (lambda: keras_hub.models.Qwen3Backbone(**SMALL, head_dim=8, sliding_window_size=4),
              keras_hub.models.Qwen3CausalLM),
    "phi3": (lambda: keras_hub.models.Phi3Backbone(**SMALL), keras_hub.models.Phi3CausalLM),
}
# keras-hub 0.32's own cached generate() fails to trace for Qwen with a sliding window (`if cache_update_index:` on a
# tensor in QwenAttention); its uncached forward runs.
KERAS_HUB_GENERATE_FAILS = {"qwen"}
PROMPT = [5, 9, 11, 3, 7, 40, 2, 17]
OTHER = [1, 2, 3]
NEW_TOKENS = 10


def build(family: str, seed: int = 0, **backbone_overrides):
    make_backbone, causal_lm_class = FAMILIES[family]
    causal_lm = causal_lm_class(backbone=make_backbone(), preprocessor=None)
    randomize(causal_lm, seed)
    causal_lm.compile(sampler="greedy")  # the wrapper's defaults follow the sampler (keras-hub's default: top-k)
    return causal_lm


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request):
    return _build_wrapped(request.param)


# Left padding and batching are the adapter's, not a family's: two families (one windowed) by default, all in `slow`.
@pytest.fixture(scope="module", params=[family if family in ("llama", "mistral")
                                        else pytest.param(family, marks=pytest.mark.slow)
                                        for family in sorted(FAMILIES)])
def padded_family_model(request):
    return _build_wrapped(request.param)


_WRAPPED: dict = {}


def _build_wrapped(family):
    if family not in _WRAPPED:  # one model (and its compiled programs) per family for both fixtures
        causal_lm = build(family)
        _WRAPPED[family] = family, causal_lm, tfgen.from_keras_hub(causal_lm)
    return _WRAPPED[family]


def test_greedy_matches_keras_hubs_own_generate(family_model):
    family, causal_lm, model = family_model
    prompt = np.array([PROMPT], np.int32)
    ours = np.asarray(model.generate(prompt, attention_mask=np.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                     pad_token_id=0))
    # Not a degenerate model: the continuation is not one token repeated.
    assert len(set(ours[0, len(PROMPT):].tolist())) > 2
    # Every greedy token is the argmax of keras-hub's own (uncached) forward over the sequence so far.
    logits = np.asarray(causal_lm({"token_ids": ours, "padding_mask": np.ones_like(ours, bool)}))
    np.testing.assert_array_equal(np.argmax(logits[0, len(PROMPT) - 1:-1], -1), ours[0, len(PROMPT):])
    if family in KERAS_HUB_GENERATE_FAILS:
        return
    np.testing.assert_array_equal(ours, keras_hub_greedy(causal_lm, prompt, NEW_TOKENS))


def test_left_padding_and_batching_change_no_row(padded_family_model):
    """The same rows in another order, behind other amounts of padding (widths 20 and 24: the same compiled programs,
    other buffer slots and batch positions), give each row the same tokens, greedy and with per-row seeds; and the
    greedy row equals the unpadded prompt alone (the program of `test_greedy_matches_keras_hubs_own_generate`)."""
    _, _, model = padded_family_model
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0)
    runs = []
    for rows, seeds, width in (([PROMPT, OTHER], [[1, 2], [3, 4]], 20), ([OTHER, PROMPT], [[3, 4], [1, 2]], 24)):
        ids, mask = left_padded_batch(rows)
        ids, mask = (np.pad(a, [(0, 0), (width - a.shape[1], 0)]) for a in (ids, mask))
        greedy = np.asarray(model.generate(ids, attention_mask=mask, **options))[:, -NEW_TOKENS:]
        sampled = np.asarray(model.generate(ids, attention_mask=mask, do_sample=True, seed=np.array(seeds, np.int32),
                                            **options))[:, -NEW_TOKENS:]
        runs.append((greedy, sampled))
    (greedy, sampled), (greedy_swapped, sampled_swapped) = runs
    np.testing.assert_array_equal(greedy, greedy_swapped[::-1])
    np.testing.assert_array_equal(sampled, sampled_swapped[::-1])
    alone = np.array([PROMPT], np.int32)
    np.testing.assert_array_equal(
        greedy[0], np.asarray(model.generate(alone, attention_mask=np.ones_like(alone), **options))[0, -NEW_TOKENS:])
    assert not np.array_equal(greedy[0], greedy[1])
    assert not np.array_equal(greedy, sampled)


def test_speculative_decoding_keeps_greedy_tokens(padded_family_model):
    """Prompt lookup and early-exit drafting through the adapter (each row at its own cache slots in keras-hub's
    layers, a sliding window for Mistral) give plain greedy's tokens, in the programs' width of the test above."""
    _, _, model = padded_family_model
    ids, mask = left_padded_batch([PROMPT + PROMPT[:5], OTHER])
    ids, mask = (np.pad(a, [(0, 0), (20 - a.shape[1], 0)]) for a in (ids, mask))
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0)
    plain = np.asarray(model.generate(ids, attention_mask=mask, **options))
    for drafter in (dict(prompt_lookup_num_tokens=3), dict(assistant_early_exit=1, num_assistant_tokens=2)):
        np.testing.assert_array_equal(np.asarray(model.generate(ids, attention_mask=mask, **drafter, **options)), plain)
