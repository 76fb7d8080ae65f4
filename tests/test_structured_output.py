"""Structured output: `regex=` / `json_schema=` constrain generate() inside the compiled loop, on real tokenizers
(the shipped model's byte-level BPE, 4096 ids, and SmolLM2's, 49152 ids), for greedy search, seeded sampling, beam
search and contrastive search; the constraint's tables are program inputs (no new program for a new prompt or a
pattern of the same size); what cannot be honoured is refused before compiling."""

from __future__ import annotations

import json
import os
import re
import warnings

import jsonschema
import numpy as np
import pytest
from llama_checkpoints import build_hf_model

PROMPTS = ["def add(a, b):", "import"]
ID_REGEX = r"(0|[1-9][0-9]{0,3})-[a-z]{2,5}"
# Strings, integers, enums, arrays and a nested object; strings and arrays bounded so that a random model can finish.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "address": {
            "type": "object",
            # A random model tends to repeat digits: one integer field keeps the answers short enough.
            "properties": {"city": {"type": "string", "maxLength": 5}, "zip": {"enum": [1000, 2000]}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
# A random model writes digits forever under beam search (a digit outscores the comma after it), so beams over
# SmolLM2's vocabulary get a schema whose numbers are enums; the shipped model closes its integers by itself.
BOUNDED_NUMBERS_SCHEMA = json.loads(json.dumps(PERSON_SCHEMA).replace('{"type": "integer"}', '{"enum": [7, 42]}'))
# The shipped model's generation config samples: greedy search is asked for explicitly.
STRATEGIES = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "seed": [3, 4], "top_k": 0},
    "beam": {"num_beams": 3, "num_return_sequences": 2, "do_sample": False},
    "contrastive": {"penalty_alpha": 0.6, "top_k": 4, "do_sample": False},
}


@pytest.fixture(scope="module")
def shipped():
    """(model, tokenizer) of the shipped 2.6M model."""
    import tfgen
    from tfgen.hub.default_model import default_model_path

    path = default_model_path()
    return tfgen.AutoModelForCausalLM.from_pretrained(path), tfgen.Tokenizer.from_pretrained(path)


def _prompts(tokenizer, texts=PROMPTS):
    encoded = tokenizer(texts, return_tensors="np")
    return encoded["input_ids"], encoded["attention_mask"]


def _new_texts(tokenizer, out, prompt_width: int) -> list[str]:
    sequences = out.sequences if hasattr(out, "sequences") else out
    return tokenizer.batch_decode(np.asarray(sequences)[:, prompt_width:], skip_special_tokens=True)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_output_matches_the_regex(shipped, strategy):
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    out = model.generate(ids, attention_mask=mask, regex=ID_REGEX, tokenizer=tokenizer, max_new_tokens=12,
                         return_dict_in_generate=True, **STRATEGIES[strategy])
    texts = _new_texts(tokenizer, out, ids.shape[1])
    assert len(texts) == (4 if strategy == "beam" else 2)
    assert all(re.fullmatch(ID_REGEX, text) for text in texts), texts
    assert out.structured_complete.numpy().all()


def test_without_the_regex_the_same_prompts_do_not_match(shipped):
    """The constraint is what makes the outputs match (the model alone writes code)."""
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    texts = _new_texts(tokenizer, model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False),
                       ids.shape[1])
    assert not any(re.fullmatch(ID_REGEX, text) for text in texts), texts


def test_seeded_sampling_repeats_and_rows_keep_their_tokens(shipped):
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    options = dict(regex=ID_REGEX, tokenizer=tokenizer, max_new_tokens=12, **STRATEGIES["sample"])
    first = model.generate(ids, attention_mask=mask, **options).numpy()
    again = model.generate(ids, attention_mask=mask, **options).numpy()
    np.testing.assert_array_equal(first, again)
    seeds = np.array([[3, 4], [5, 6]])
    both = model.generate(ids, attention_mask=mask, **{**options, "seed": seeds}).numpy()
    alone = model.generate(ids[1:], attention_mask=mask[1:], **{**options, "seed": seeds[1:]}).numpy()
    np.testing.assert_array_equal(both[1:], alone)


def test_new_prompts_and_patterns_of_the_same_size_reuse_the_program(shipped):
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    options = dict(tokenizer=tokenizer, max_new_tokens=12, do_sample=False)
    model.generate(ids, attention_mask=mask, regex=ID_REGEX, **options)
    traces = model.generate_trace_count
    other_ids, other_mask = _prompts(tokenizer, ["class Foo:", "x = 1"])
    out = model.generate(other_ids, attention_mask=other_mask, regex=ID_REGEX, **options)
    other_regex = r"[A-Z]{3}-[0-9]{2}"
    again = model.generate(ids, attention_mask=mask, regex=other_regex, **options)
    assert model.generate_trace_count == traces
    assert all(re.fullmatch(ID_REGEX, text) for text in _new_texts(tokenizer, out, other_ids.shape[1]))
    assert all(re.fullmatch(other_regex, text) for text in _new_texts(tokenizer, again, ids.shape[1]))


def test_eos_comes_only_once_the_text_is_a_whole_match(shipped):
    """`[a-z]{3}` allows eos after exactly three letters, and nothing but eos then."""
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    out = model.generate(ids, attention_mask=mask, regex="[a-z]{3}", tokenizer=tokenizer, max_new_tokens=12,
                         do_sample=False, return_dict_in_generate=True)
    for row in out.sequences.numpy()[:, ids.shape[1]:]:
        text_ids = list(row[: list(row).index(tokenizer.eos_token_id)])
        assert re.fullmatch("[a-z]{3}", tokenizer.decode(text_ids))


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_json_answers_parse_and_validate_on_the_shipped_tokenizer(shipped, strategy):
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    out = model.generate(ids, attention_mask=mask, json_schema=PERSON_SCHEMA, tokenizer=tokenizer,
                         max_new_tokens=128, return_dict_in_generate=True, **STRATEGIES[strategy])
    assert out.structured_complete.numpy().all()
    for text in _new_texts(tokenizer, out, ids.shape[1]):
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_a_budget_too_short_truncates_warns_and_flags_the_rows(shipped):
    from tfgen.structured.automaton import DEAD_STATE, build_automaton
    from tfgen.structured.json_schema import schema_regex

    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    with pytest.warns(UserWarning, match=r"row\(s\) \[0, 1\] ended before their text was a whole match"):
        out = model.generate(ids, attention_mask=mask, json_schema=PERSON_SCHEMA, tokenizer=tokenizer,
                             max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert not out.structured_complete.numpy().any()
    automaton = build_automaton(tokenizer, model.config.vocab_size, schema_regex(PERSON_SCHEMA))
    for row in out.sequences.numpy()[:, ids.shape[1]:]:
        assert len(row) == 4 and automaton.walk(row) != DEAD_STATE  # the start of a match


@pytest.mark.parametrize("options, error, message", [
    (dict(regex=ID_REGEX, tokenizer=None), ValueError, "regex: constraining the output needs the model's tokenizer"),
    (dict(regex="(unclosed"), ValueError,
     "regex: '\\(unclosed' is not a regular expression outlines-core can compile: missing \\)"),
    (dict(regex="", ), TypeError, "`regex` must be a non-empty string"),
    (dict(json_schema={"type": "teapot"}), ValueError, "json_schema: unsupported or invalid schema: Unsupported type"),
    (dict(json_schema="{not json"), ValueError, "json_schema: not valid JSON"),
    (dict(json_schema=3), TypeError, "`json_schema` must be a JSON schema"),
    (dict(regex="a", json_schema={"type": "integer"}), ValueError, "set one of them"),
    (dict(regex="a", num_beams=2, num_beam_groups=2, diversity_penalty=0.5, do_sample=False), ValueError,
     "regex: structured output works with .* not with group beam search"),
    (dict(regex="a", prompt_lookup_num_tokens=3, do_sample=False), ValueError, "not with assisted generation"),
])
def test_what_cannot_be_honoured_is_refused_before_compiling(shipped, options, error, message):
    model, tokenizer = shipped
    ids, mask = _prompts(tokenizer)
    traces = model.generate_trace_count
    with pytest.raises(error, match=message):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, **{"tokenizer": tokenizer, **options})
    assert model.generate_trace_count == traces


def test_a_pattern_the_vocabulary_cannot_spell_is_refused(shipped):
    """The shipped tokenizer's 4096 ids spell every byte, so a word-level vocabulary stands in for one that
    cannot: its tokens are "w3" ... "w96"."""
    from conftest import word_level_tokenizer

    from tfgen.structured.automaton import build_automaton

    with pytest.raises(ValueError, match="regex: 'x' cannot constrain this model's output: .*incompatible"):
        build_automaton(word_level_tokenizer(), 97, "x")


def test_schema_keywords_the_regex_cannot_enforce_are_warned_about(shipped):
    from tfgen.structured.json_schema import schema_regex

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"],
              "additionalProperties": False}
    with pytest.warns(UserWarning, match=r"not enforced on the output .*: /properties/n/minimum$"):
        schema_regex(schema)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema_regex(PERSON_SCHEMA)


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2's tokenizer (49152 ids): a tiny random Llama with that vocabulary decodes over the real automaton.


@pytest.fixture(scope="module")
def smollm2_vocabulary_model(tmp_path_factory):
    """(tiny random Llama with SmolLM2's 49152-id vocabulary, SmolLM2's tokenizer from its GGUF)."""
    import tfgen
    from tfgen.hub.pull import pull

    tokenizer = tfgen.AutoTokenizer.from_pretrained(os.fspath(pull("smollm2-135m-instruct", progress=False)))
    directory = tmp_path_factory.mktemp("llama-49k")
    build_hf_model("llama", directory, vocab_size=tokenizer.vocab_size, hidden_size=24, intermediate_size=32,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                   eos_token_id=tokenizer.eos_token_id, bos_token_id=1, pad_token_id=tokenizer.eos_token_id)
    return tfgen.AutoModelForCausalLM.from_pretrained(directory), tokenizer


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_json_answers_parse_and_validate_on_smollm2s_tokenizer(smollm2_vocabulary_model, strategy):
    model, tokenizer = smollm2_vocabulary_model
    ids, mask = _prompts(tokenizer, ["Give me a person as JSON:", "JSON:"])
    schema = BOUNDED_NUMBERS_SCHEMA if strategy == "beam" else PERSON_SCHEMA
    out = model.generate(ids, attention_mask=mask, json_schema=schema, tokenizer=tokenizer,
                         max_new_tokens=128, return_dict_in_generate=True, **STRATEGIES[strategy])
    assert out.structured_complete.numpy().all()
    for text in _new_texts(tokenizer, out, ids.shape[1]):
        jsonschema.validate(json.loads(text), schema)
