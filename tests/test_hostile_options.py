"""Options with bounded cost (issue 30, item 4): stop strings whose tables and matcher grow linearly, never with the
square of a string's length or with the vocabulary times the count, and a cap beyond which they are refused before
anything is built; structured-output automata bounded in states with a clear refusal; JSON-schema errors that say
what is wrong (nesting depth, unsupported keyword) instead of outlines-core's generic words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import tfgen
from tfgen.cli import main
from tfgen.hub import default_model as defaults
from tfgen.stopping import stop_tables
from tfgen.stopping.stop_strings import stop_string_tables
from tfgen.structured import automaton

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 5000 distinct 5-character strings (the issue's count case).
_MANY_SHORT = [f"{index:04d}q" for index in range(4999)] + ["xxxxx"]

# Builds the tables of argv[1] (JSON stop strings) and runs the compiled matcher once on a tail of "x" tokens, after
# XLA's own start-up; prints the peak RSS growth in MB and whether the tail hit.
_STOP_STRING_PROBE = """
import json, resource, sys
import numpy as np
import tensorflow as tf
from tfgen.hub import default_model as defaults
from tfgen.stopping.stop_strings import stop_string_hits, stop_string_tables
from tfgen.text.tokenizer import Tokenizer

tokenizer = Tokenizer.from_pretrained(defaults.DEFAULT_MODEL)
(x_id,) = tokenizer.encode("x", add_special_tokens=False)
tf.function(lambda value: value + 1, jit_compile=True)(tf.constant([1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tables = stop_string_tables(tokenizer, json.loads(sys.argv[1]))
tail = np.full([2, tables.max_token_len], x_id, np.int32)
tail[1, 0] = tokenizer.encode(" def", add_special_tokens=False)[0]
hits = tf.function(lambda ids: stop_string_hits(tables, ids), jit_compile=True)(tf.constant(tail)).numpy()
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"grown_mb": grown, "hits": hits.tolist()}))
"""


def _probe_stop_strings(stop_strings) -> dict:
    environment = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL="2")
    finished = subprocess.run([sys.executable, "-c", _STOP_STRING_PROBE, json.dumps(stop_strings)], env=environment,
                              capture_output=True, text=True, timeout=240)
    assert finished.returncode == 0, finished.stderr[-2000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer():
    return tfgen.Tokenizer.from_pretrained(defaults.DEFAULT_MODEL)


def test_a_10k_character_stop_string_costs_megabytes_not_gigabytes():
    # Before: a 164 MB table and 3.4 GB more RSS once the matcher compiled (its comparison was length squared).
    probe = _probe_stop_strings(["x" * 10_000])
    assert probe["grown_mb"] < 300, probe
    # A tail of 10k "x" tokens ends with the string; one other token at its oldest end breaks it.
    assert probe["hits"] == [True, False]


def test_5000_short_stop_strings_cost_megabytes_not_gigabytes():
    # Before: a 492 MB table (vocab x 30,001 int32 columns), then over 5 GB while the matcher compiled.
    probe = _probe_stop_strings(_MANY_SHORT)
    assert probe["grown_mb"] < 300, probe
    assert probe["hits"] == [True, False]


def test_table_bytes_grow_with_what_the_vocabulary_matches(tokenizer):
    long_string = stop_string_tables(tokenizer, ["x" * 10_000])
    many = stop_string_tables(tokenizer, _MANY_SHORT)
    assert long_string.nbytes < 1_000_000
    assert many.nbytes < 16_000_000
    # Doubling the long string's length at most doubles its tables (no square term).
    assert stop_string_tables(tokenizer, ["x" * 20_000]).nbytes < 2.2 * long_string.nbytes


def test_stop_strings_over_the_cap_are_refused_before_the_tokenizer_is_read():
    limit = stop_tables.MAX_STOP_STRING_CHARACTERS
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"stop_strings: .* over the limit of {limit} characters"):
        stop_string_tables(object(), ["ab"] * (limit // 2) + ["c"])
    assert time.perf_counter() - started < 1
    with pytest.raises(ValueError, match="stop_strings"):
        stop_string_tables(object(), ["x" * (limit + 1)])


def test_generate_refuses_stop_strings_over_the_cap_before_compiling(tokenizer, monkeypatch):
    monkeypatch.setattr(stop_tables, "MAX_STOP_STRING_CHARACTERS", 8)
    model = tfgen.AutoModelForCausalLM.from_pretrained(defaults.DEFAULT_MODEL)
    traces = model.generate_trace_count
    with pytest.raises(ValueError, match="stop_strings: 2 strings of 10 characters in all, over the limit of 8"):
        model.generate(tokenizer(["def f():"], return_tensors="tf")["input_ids"], max_new_tokens=2,
                       stop_strings=["stop!", "again"], tokenizer=tokenizer)
    assert model.generate_trace_count == traces


def test_cli_refuses_stop_strings_over_the_cap_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(stop_tables, "MAX_STOP_STRING_CHARACTERS", 8)
    assert main(["generate", "--model", defaults.DEFAULT_MODEL, "w5", "--max-new-tokens", "2",
                 "--stop-string", "stop, now"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "stop_strings" in error and "limit of 8" in error


def _deep_arrays(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_long_max_length_is_refused_at_once_naming_the_option(tokenizer):
    # Before: over 90 s and 2.3 GB building the automaton.
    model = tfgen.AutoModelForCausalLM.from_pretrained(defaults.DEFAULT_MODEL)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"json_schema: its regex unrolls to 300002 positions .* over the limit of "
                                         rf"{automaton.MAX_AUTOMATON_STATES} automaton states"):
        model.generate(tokenizer(["{"], return_tensors="tf")["input_ids"], max_new_tokens=2, tokenizer=tokenizer,
                       json_schema={"type": "string", "maxLength": 100_000})
    with pytest.raises(ValueError, match=r"regex: its regex unrolls to 70000 positions"):
        model.generate(tokenizer(["{"], return_tensors="tf")["input_ids"], max_new_tokens=2, tokenizer=tokenizer,
                       regex="[a-z]{70000}")
    assert time.perf_counter() - started < 2


def test_a_slow_automaton_build_is_stopped_at_the_deadline(tokenizer, monkeypatch):
    # outlines-core's build time doubles with each character of maxLength here (20: minutes).
    monkeypatch.setattr(automaton, "MAX_BUILD_SECONDS", 1.5)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"json_schema: building its automaton took over 1.5 s, the limit"):
        automaton.constraint_automaton(tfgen.GenerationConfig(json_schema={"type": "string", "maxLength": 40}),
                                       tokenizer, tokenizer.vocab_size)
    assert time.perf_counter() - started < 5


def test_automaton_states_over_the_limit_are_refused(tokenizer, monkeypatch):
    monkeypatch.setattr(automaton, "MAX_AUTOMATON_STATES", 50)
    with pytest.raises(ValueError, match=r"regex: its regex unrolls to 60 positions"):
        automaton.build_automaton(tokenizer, tokenizer.vocab_size, "[a-z]{60}")
    # 7 positions, but its automaton remembers the last 6 characters: 2 ** 6 states and more.
    with pytest.raises(ValueError, match=r"regex: its automaton has \d+ states, over the limit of 50"):
        automaton.build_automaton(tokenizer, tokenizer.vocab_size, "[ab]*a[ab]{5}")


@pytest.mark.parametrize("schema, message", [
    (_deep_arrays(200), r"schemas nested 11 levels deep at /items/items.*over the limit of 10 "
                        r"\(tfgen.structured.json_schema.MAX_SCHEMA_DEPTH\)"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"not": {"type": "string"}}}}}},
     r"unsupported keyword 'not' at /properties/a/properties/b"),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, r"unsupported keyword 'if' at /"),
    ({"enum": [json.loads("[" * 50 + "]" * 50)]}, r"nested more than 40 levels deep at /enum/0"),
    ("[" * 100_000 + "]" * 100_000, r"nested deeper than 40 levels"),
])
def test_schema_errors_say_what_is_wrong(tokenizer, schema, message):
    # Before: "Expected a valid JSON string" (200 deep) or "Unsupported JSON Schema structure" from outlines-core.
    with pytest.raises(ValueError, match="json_schema: " + message):
        automaton.constraint_automaton(tfgen.GenerationConfig(json_schema=schema), tokenizer, tokenizer.vocab_size)


def test_schemas_within_the_limits_still_build(tokenizer):
    nine_deep = automaton.constraint_automaton(tfgen.GenerationConfig(json_schema=_deep_arrays(9)), tokenizer,
                                               tokenizer.vocab_size)
    assert nine_deep.matches(tokenizer.encode("[[[[[[[[[1]]]]]]]]]", add_special_tokens=False))
    named_not = {"type": "object", "properties": {"not": {"type": "string", "maxLength": 5}}, "required": ["not"]}
    built = automaton.constraint_automaton(tfgen.GenerationConfig(json_schema=named_not), tokenizer,
                                           tokenizer.vocab_size)
    assert built.matches(tokenizer.encode('{"not": "ok"}', add_special_tokens=False))
