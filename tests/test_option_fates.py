"""Every `GenerationConfig` attribute has exactly one fate: honoured, refused with a ValueError naming it, or —
only where HF also warns — warned about as having no effect in the chosen mode. Never silently ignored."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import word_level_tokenizer

from tfgen import GenerationConfig, PhrasalConstraint

SAMPLE = dict(do_sample=True)
BEAMS = dict(num_beams=2)
AS_DICT = dict(return_dict_in_generate=True)

# attribute: (non-default value, options that give it a meaning)
HONOURED = {
    "max_length": (12, {"max_new_tokens": None}),
    "max_new_tokens": (3, {}),
    "min_length": (9, {}),
    "min_new_tokens": (2, {}),
    "early_stopping": (True, BEAMS),
    "max_time": (60.0, {}),
    "stop_strings": (["w5"], {}),
    "regex": ("w5|w6", {}),
    "do_sample": (True, {}),
    "num_beams": (2, {}),
    "num_beam_groups": (2, {"num_beams": 2, "diversity_penalty": 0.5}),
    "penalty_alpha": (0.5, {"top_k": 4}),
    "temperature": (0.7, SAMPLE),
    "top_k": (5, SAMPLE),
    "top_p": (0.9, SAMPLE),
    "min_p": (0.1, SAMPLE),
    "typical_p": (0.9, SAMPLE),
    "epsilon_cutoff": (0.01, SAMPLE),
    "eta_cutoff": (0.01, SAMPLE),
    "diversity_penalty": (0.7, {"num_beams": 2, "num_beam_groups": 2}),
    "repetition_penalty": (1.3, {}),
    # On a decoder-only model HF (and tfgen) applies it to the prompt's tokens; encoder-decoder: tests/test_t5_*.
    "encoder_repetition_penalty": (1.2, {}),
    "length_penalty": (0.5, BEAMS),
    "no_repeat_ngram_size": (2, {}),
    "bad_words_ids": ([[5]], {}),
    "force_words_ids": ([[5]], BEAMS),
    "constraints": ([PhrasalConstraint([5, 6])], BEAMS),
    "renormalize_logits": (True, {}),
    "forced_bos_token_id": (5, {}),
    "forced_eos_token_id": (5, {}),
    "remove_invalid_values": (True, {}),
    "exponential_decay_length_penalty": ((1, 1.1), {}),
    "suppress_tokens": ([5], {}),
    "begin_suppress_tokens": ([5], {}),
    "sequence_bias": ({(5,): 1.0}, {}),
    "num_return_sequences": (2, SAMPLE),
    "output_scores": (True, AS_DICT),
    "output_logits": (True, AS_DICT),
    "return_dict_in_generate": (True, {}),
    "pad_token_id": (3, {}),
    "bos_token_id": (1, {}),
    "eos_token_id": (5, {}),
    "cache_implementation": ("static", {}),
    "prompt_lookup_num_tokens": (3, {}),
    "max_matching_ngram_size": (1, {"prompt_lookup_num_tokens": 3}),
    "assistant_early_exit": (1, {}),
    "num_assistant_tokens": (3, {"assistant_early_exit": 1}),
}
REFUSED = {
    "dola_layers": ("low", {}),
    "use_cache": (False, {}),
    "cache_implementation": ("dynamic", {}),
    "cache_config": ({"max_batch_size": 2}, {}),
    "return_legacy_cache": (True, {}),
    "prefill_chunk_size": (16, {}),
    "token_healing": (True, {}),
    "guidance_scale": (1.5, {}),
    "low_memory": (True, {}),
    "watermarking_config": ({"bias": 2.0}, {}),
    "output_attentions": (True, AS_DICT),
    "output_hidden_states": (True, AS_DICT),
    # Decoder-only models have no encoder input nor decoder start (the table runs a decoder-only model).
    "encoder_no_repeat_ngram_size": (2, {}),
    "decoder_start_token_id": (1, {}),
    "is_assistant": (True, {}),
    "num_assistant_tokens_schedule": ("heuristic", {}),
    "assistant_confidence_threshold": (0.5, {}),
    "assistant_lookbehind": (5, {}),
    "target_lookbehind": (5, {}),
    "compile_config": ({"fullgraph": True}, {}),
    "disable_compile": (True, {}),
}
# As HF 4.55 warns: options of another mode than the one selected.
WARNED = {
    "temperature": (0.7, {}),
    "top_p": (0.9, {}),
    "typical_p": (0.9, {}),
    "min_p": (0.1, {}),
    "epsilon_cutoff": (0.01, {}),
    "eta_cutoff": (0.01, {}),
    "early_stopping": (True, {}),
    "length_penalty": (0.5, {}),
    "diversity_penalty": (0.5, BEAMS),
    "output_scores": (True, {}),
    "output_logits": (True, {}),
    "max_matching_ngram_size": (2, {}),
    "num_assistant_tokens": (5, {"prompt_lookup_num_tokens": 3}),
}
# Bookkeeping keys of generation_config.json, not options.
METADATA = {"_from_model_config", "transformers_version"}


# Honoured, checked with the shipped model's byte-level tokenizer (a JSON text needs quotes and digits, which the
# word-level test tokenizer cannot spell; its first 97 ids are single characters).
HONOURED_WITH_BYTES = {"json_schema": ({"enum": [1, 22]}, {})}


def test_the_table_covers_every_attribute():
    attributes = set(GenerationConfig.__annotations__) - METADATA
    assert set(HONOURED) | set(REFUSED) | set(HONOURED_WITH_BYTES) == attributes


@pytest.mark.parametrize("name", sorted(HONOURED_WITH_BYTES))
def test_honoured_options_of_byte_tokenizers_run_without_a_word(tiny_model, name):
    from tfgen import Tokenizer
    from tfgen.hub.default_model import default_model_path

    value, context = HONOURED_WITH_BYTES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        out = _generate(tiny_model, Tokenizer.from_pretrained(default_model_path()), name, value,
                        {**context, "eos_token_id": 0, "max_new_tokens": 3})
    assert {tuple(int(t) for t in row[3:] if t != 0) for row in out.numpy()} <= {(17,), (18, 18)}  # "1", "22"


@pytest.fixture(scope="module")
def tokenizer():
    return word_level_tokenizer()


def _generate(model, tokenizer, name, value, context):
    options = {"max_new_tokens": 2, **context, name: value}
    options = {key: option for key, option in options.items() if option is not None}
    return model.generate(np.array([[5, 6, 7], [8, 9, 10]]), jit_compile=False, tokenizer=tokenizer, **options)


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_honoured_options_run_without_a_word(tiny_model, tokenizer, name):
    value, context = HONOURED[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _generate(tiny_model, tokenizer, name, value, context)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_options_raise_a_value_error_naming_them(tiny_model, tokenizer, name):
    value, context = REFUSED[name]
    traces = tiny_model.generate_trace_count
    with pytest.raises(ValueError, match=name):
        _generate(tiny_model, tokenizer, name, value, context)
    assert tiny_model.generate_trace_count == traces


@pytest.mark.parametrize("name", sorted(WARNED))
def test_options_without_effect_warn_as_hf_does(tiny_model, tokenizer, name):
    value, context = WARNED[name]
    with pytest.warns(UserWarning, match=name):
        _generate(tiny_model, tokenizer, name, value, context)


def test_a_draft_length_without_a_drafter_warns(tiny_model, tokenizer):
    """`num_assistant_tokens` drafts for a model drafter; with none (no assistant_model, no assistant_early_exit) it
    has no effect, and says so once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _generate(tiny_model, tokenizer, "num_assistant_tokens", 3, {})
    assert [str(w.message).count("num_assistant_tokens") for w in caught if w.category is UserWarning] == [1]
    assert "no drafter" in str(caught[-1].message) and caught[-1].filename == __file__


def test_an_option_without_effect_warns_once(tiny_model, tokenizer):
    """The generation mode is worked out once per call, so its warning (an assisted-generation option in beam
    search, ignored there as in HF) comes once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _generate(tiny_model, tokenizer, "prompt_lookup_num_tokens", 3, BEAMS)
    assert [str(w.message).count("prompt_lookup_num_tokens") for w in caught if w.category is UserWarning] == [1]
