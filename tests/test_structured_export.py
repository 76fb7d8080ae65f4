"""Structured output in an export (`tfgen.export.structured_inputs`): a JSON schema baked into the signatures of the
shipped model (greedy, sample, beam_search give in-process generate()'s tokens under the same constraint, and valid
JSON), the signatures that cannot carry it left out (so `tfgen serve` runs whole calls), and the `structured`
signature whose requests carry the automaton's tables: two regexes of one size bucket, one program.

One export, built once for the module and loaded the way `tfgen serve` loads it: its warm-up requests compile every
signature for one row of 8 columns, and every call here has that shape, so nothing compiles twice. References run
generate() eagerly (`jit_compile=False`), which gives the compiled program's tokens (test_structured_output.py).
"""

from __future__ import annotations

import json
import re
import warnings

import jsonschema
import numpy as np
import pytest

from tfgen.export.structured_inputs import STRUCTURED_SIGNATURE, constrain_export, structured_tables

MAX_NEW_TOKENS = 48  # the schema's longest text fits, however a row spells it
WIDTH = 8  # the warm-up prompt's width: calls of this shape reuse the programs the warm-up compiled
PROMPTS = ["def add(a, b):", "import"]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "role": {"enum": ["admin", "user"]}},
    "required": ["ok", "role"],
}
ID_REGEX = r"(0|[1-9][0-9]{0,3})-[a-z]{2,5}"
CODE_REGEX = r"[A-Z]{3}-[0-9]{2}"
BUCKET = (16, 16)  # both regexes' automata fit (12 x 13 and 8 x 7 states x classes)
BEAMS = 2
SAMPLE_ROW = {"seed": [7, 11], "temperature": 0.75, "top_k": 0, "top_p": 0.875}  # exact in float32


@pytest.fixture(scope="module")
def shipped():
    import tfgen
    from tfgen.hub.default_model import default_model_path

    path = default_model_path()
    return tfgen.AutoModelForCausalLM.from_pretrained(path), tfgen.Tokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def export(shipped, tmp_path_factory):
    """(version folder, the export loaded for serving with continuous batching asked for)."""
    from tfgen.export import export_saved_model
    from tfgen.serving.served_model import load_export

    model, tokenizer = shipped
    root = tmp_path_factory.mktemp("structured_export")
    version_dir = export_saved_model(
        model, root, max_new_tokens=MAX_NEW_TOKENS, signatures=["greedy", "sample", "beam_search"],
        tokenizer=tokenizer, json_schema=SCHEMA, num_beams=BEAMS, structured_inputs=BUCKET,
    )
    served = load_export(root, warmup=True, batching={"steps_per_call": 8})
    yield version_dir, served
    served.close()


@pytest.fixture(scope="module")
def schema_pattern():
    from tfgen.structured.json_schema import schema_regex

    return schema_regex(SCHEMA)


def _prompt(tokenizer, text: str):
    """ids and mask `[1, WIDTH]`, left padded."""
    ids = tokenizer.encode(text)
    assert len(ids) <= WIDTH
    padded = np.zeros([1, WIDTH], np.int32)
    padded[0, WIDTH - len(ids):] = ids
    mask = np.zeros([1, WIDTH], np.int32)
    mask[0, WIDTH - len(ids):] = 1
    return padded, mask


def _reference(model, tokenizer, ids, mask, **options) -> np.ndarray:
    """The new tokens of eager generate() (through the row's eos; pads after it dropped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sampling options of the shipped config under greedy search
        out = model.generate(ids, attention_mask=mask, tokenizer=tokenizer, max_new_tokens=MAX_NEW_TOKENS,
                             jit_compile=False, **options)
    return _new_tokens(np.asarray(out)[0, WIDTH:], tokenizer.eos_token_id)


def _new_tokens(row, eos_token_id: int) -> np.ndarray:
    row = list(row)
    return np.array(row[: row.index(eos_token_id) + 1] if eos_token_id in row else row, np.int32)


def _signature_tokens(outputs) -> np.ndarray:
    return np.asarray(outputs["sequences"])[0, WIDTH: int(outputs["sequence_lengths"][0])]


def _text(tokenizer, tokens) -> str:
    return tokenizer.decode(tokens.tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("signature", ["greedy", "sample", "beam_search"])
def test_baked_signatures_give_generates_tokens_and_valid_json(shipped, export, schema_pattern, signature, prompt):
    model, tokenizer = shipped
    _, served = export
    ids, mask = _prompt(tokenizer, prompt)
    rows = {"max_new_tokens": np.array([MAX_NEW_TOKENS], np.int32)}
    options = {"regex": schema_pattern}
    if signature == "greedy":
        options.update(do_sample=False)
    elif signature == "sample":
        rows.update({name: np.array([value], np.int32 if name in ("seed", "top_k") else np.float32)
                     for name, value in SAMPLE_ROW.items()})
        options.update(do_sample=True, seed=[SAMPLE_ROW["seed"]],
                       **{name: SAMPLE_ROW[name] for name in ("temperature", "top_k", "top_p")})
    else:
        rows["length_penalty"] = np.array([1.0], np.float32)
        options.update(do_sample=False, num_beams=BEAMS, length_penalty=1.0)
    got = _signature_tokens(served.predict(signature, {"input_ids": ids, "attention_mask": mask, **rows}))
    np.testing.assert_array_equal(got, _reference(model, tokenizer, ids, mask, **options))
    assert got[-1] == tokenizer.eos_token_id, "the row should finish its JSON within the budget"
    text = _text(tokenizer, got)
    assert re.fullmatch(schema_pattern, text), text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_the_export_records_the_constraint_and_leaves_out_what_cannot_carry_it(export, schema_pattern):
    version_dir, served = export
    with open(f"{version_dir}/assets.extra/tfgen_export.json", encoding="utf-8") as file:
        info = json.load(file)
    constraint = info["constraint"]
    assert constraint["option"] == "json_schema" and constraint["json_schema"] == SCHEMA
    assert constraint["pattern"] == schema_pattern
    assert constraint["states"] <= constraint["padded_states"] and constraint["classes"] <= constraint["padded_classes"]
    assert constraint["table_bytes"] > 0
    assert constraint["left_out"] == ["slot_init", "slot_insert", "slot_steps*"]
    assert info["structured_inputs"] == {"states": BUCKET[0], "classes": BUCKET[1], "vocab_size": 4096}
    assert sorted(served.signatures) == ["beam_search", "greedy", "sample", STRUCTURED_SIGNATURE]
    assert "slots" not in info
    assert served.engine is None  # tfgen serve runs whole calls
    with open(f"{version_dir}/assets.extra/generation_config.json", encoding="utf-8") as file:
        assert json.load(file)["json_schema"] == SCHEMA


def test_structured_signature_takes_two_regexes_of_one_bucket_in_one_program(shipped, export):
    from tfgen.serving.requests import check_arrays
    from tfgen.structured.automaton import build_automaton

    model, tokenizer = shipped
    _, served = export
    ids, mask = _prompt(tokenizer, PROMPTS[0])
    # top_k 1 is greedy search; the second row samples.
    for regex in (ID_REGEX, CODE_REGEX):
        tables = structured_tables(build_automaton(tokenizer, 4096, regex), *BUCKET, vocab_size=4096)
        for top_k, seed in ((1, [0, 0]), (0, [5, 6])):
            rows = {"seed": np.array([seed], np.int32), "temperature": np.array([1.0], np.float32),
                    "top_k": np.array([top_k], np.int32), "top_p": np.array([1.0], np.float32),
                    "max_new_tokens": np.array([MAX_NEW_TOKENS], np.int32)}
            inputs = {"input_ids": ids, "attention_mask": mask, **rows, **tables}
            # tfgen serve's request checks take tables without a batch axis beside the rows.
            check_arrays(STRUCTURED_SIGNATURE, inputs, served.input_specs[STRUCTURED_SIGNATURE])
            # The tables' input shapes are fixed (the bucket), so every pattern of the bucket runs the one program.
            specs = served.input_specs[STRUCTURED_SIGNATURE]
            assert tuple(specs["grammar_next"].shape) == tuple(BUCKET)
            outputs = served.predict(STRUCTURED_SIGNATURE, inputs)
            got = _signature_tokens(outputs)
            expected = _reference(model, tokenizer, ids, mask, regex=regex, do_sample=True, seed=[seed], top_k=top_k,
                                  temperature=1.0, top_p=1.0)
            np.testing.assert_array_equal(got, expected)
            assert re.fullmatch(regex, _text(tokenizer, got))


def test_structured_signature_refuses_tables_indexing_outside_themselves(shipped, export):
    from tfgen.serving.errors import RequestError
    from tfgen.structured.automaton import build_automaton

    model, tokenizer = shipped
    _, served = export
    ids, mask = _prompt(tokenizer, PROMPTS[1])
    tables = structured_tables(build_automaton(tokenizer, 4096, ID_REGEX), *BUCKET)
    tables["grammar_next"][1, 1] = BUCKET[0]
    rows = {"seed": np.zeros([1, 2], np.int32), "temperature": np.ones([1], np.float32),
            "top_k": np.ones([1], np.int32), "top_p": np.ones([1], np.float32),
            "max_new_tokens": np.ones([1], np.int32)}
    with pytest.raises(RequestError, match=r"grammar_next: states must be in \[0, 16\)"):
        served.predict(STRUCTURED_SIGNATURE, {"input_ids": ids, "attention_mask": mask, **rows, **tables})


def test_an_automaton_too_big_for_the_bucket_is_a_clear_error(shipped, schema_pattern):
    from tfgen.structured.automaton import build_automaton

    _, tokenizer = shipped
    automaton = build_automaton(tokenizer, 4096, schema_pattern)
    with pytest.raises(ValueError, match=r"states and \d+ token classes; the export's structured signature takes at "
                                         r"most 16 and 16"):
        structured_tables(automaton, *BUCKET)
    with pytest.raises(ValueError, match="built for 4096 token ids, the export's model has 50257"):
        structured_tables(build_automaton(tokenizer, 4096, ID_REGEX), *BUCKET, vocab_size=50257)


@pytest.mark.parametrize("change, match", [
    ({"signatures": ["greedy", "prompt_lookup"]}, "prompt_lookup .assisted generation. cannot carry a regex"),
    ({"slots": 4}, "slots: the continuous-batching signatures cannot carry a regex"),
    ({"tokenizer": None}, "regex: constraining the output needs the model's tokenizer"),
    ({"structured_inputs": (16,)}, r"structured_inputs must be \(STATES, CLASSES\)"),
])
def test_what_a_constrained_export_cannot_do_is_refused_before_tracing(shipped, tmp_path, change, match):
    from tfgen.export import export_saved_model

    model, tokenizer = shipped
    options = {"signatures": ["greedy"], "tokenizer": tokenizer, "regex": ID_REGEX, **change}
    with pytest.raises(ValueError, match=match):
        export_saved_model(model, tmp_path, max_new_tokens=4, **options)
    assert not any(tmp_path.iterdir())


def test_default_signatures_of_a_constrained_export_drop_prompt_lookup_and_slots():
    from tfgen.config.generation_config import GenerationConfig

    names = ["serving_default", "greedy", "prompt_lookup"]
    assert constrain_export(GenerationConfig(), names, False, None, True) == (names, None, [])
    kept, slots, left_out = constrain_export(GenerationConfig(regex="a+"), names, False, None, True)
    assert (kept, slots) == (["serving_default", "greedy"], 0)
    assert left_out == ["prompt_lookup", "slot_init", "slot_insert", "slot_steps*"]
