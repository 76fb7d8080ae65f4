"""Errors a person understands, each before anything slow (issue 31, item 6): a model path that does not exist, a
registry-name near-miss, a prompt longer than the context, a bad `--regex` / `--json-schema`, `-q` after the
subcommand, and `--seed` with other than two integers. Each CLI case checks the words, the status, one line on
stderr, and that no model was loaded (the loader is replaced by one that fails the test)."""

from __future__ import annotations

import json
import subprocess
import sys

import huggingface_hub
import numpy as np
import pytest

import tfgen.auto.models
from tfgen import AutoModelForCausalLM, AutoTokenizer
from tfgen.cli import build_parser, main
from tfgen.hub.registry import MODELS
from tfgen.structured.pattern_check import check_pattern

NAME = "smollm2-135m-instruct"
assert NAME in MODELS


@pytest.fixture
def nothing_slow(monkeypatch):
    """Fails the test if a model loads or the Hugging Face Hub is asked for a snapshot."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"nothing slow should run: called with {args} {kwargs}")

    monkeypatch.setattr(tfgen.auto.models, "load_generation_model", refuse)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error: ") and "Traceback" not in err, err
    return err


def test_flag_mistakes_come_before_tensorflow_is_imported():
    """A missing path, a near-miss name, a bad regex and a bad seed are answered before the seconds of importing
    TensorFlow (and of loading a model)."""
    script = """
import sys
from tfgen.cli import main
for argv in (["generate", "--model", "./no-such-dir", "hi"], ["generate", "--model", "smollm2", "hi"],
             ["generate", "--regex", "(", "hi"], ["batch", "--input", "x", "--output", "y", "--seed", "1", "hi"]):
    assert main(argv) == 2, argv
assert "tensorflow" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 4 and all(line.startswith("tfgen: error: ") for line in lines), lines
    assert "no such file or directory" in lines[0] and "did you mean" in lines[1] and "--regex" in lines[2]


# A path that does not exist -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["./no-such-dir", "../no/such/model", "/no/such/tfgen-model", "~/no-such-tfgen-model",
                                   "missing-model.gguf", "models/sub/missing"])
def test_a_missing_model_path_says_so_before_the_hub(nothing_slow, capsys, value):
    assert main(["generate", "--model", value, "hi"]) == 2
    err = one_error_line(capsys)
    assert f"--model: no such file or directory: {value!r}" in err
    assert "alphanumeric" not in err and "Hub" not in err


@pytest.mark.parametrize("load", [AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained],
                         ids=["model", "tokenizer"])
def test_from_pretrained_names_a_missing_path(monkeypatch, load):
    asked = []

    def snapshot_download(repo_id, **options):
        asked.append(repo_id)
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(FileNotFoundError, match=r"^no such file or directory: '\./no-such-dir'$"):
        load("./no-such-dir")
    assert asked == []
    with pytest.raises(OSError, match="cannot load .*'someone/some-model'"):
        load("someone/some-model")  # a Hub id still goes to the Hub
    assert asked == ["someone/some-model"]


# A registry-name near-miss --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["smollm2", "smollm2-135m", "SmolLM2-135M-Instruct", "smollm2-135-instruct"])
def test_a_near_miss_of_a_registered_name_suggests_it(nothing_slow, capsys, value):
    assert main(["generate", "--model", value, "hi"]) == 2
    err = one_error_line(capsys)
    assert f"--model: {value!r} is not a registered model name (did you mean {NAME}?)" in err
    assert f"registered names: {NAME}" in err and "internet" not in err


@pytest.mark.parametrize("load", [AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained],
                         ids=["model", "tokenizer"])
def test_from_pretrained_suggests_the_registered_name(nothing_slow, load):
    with pytest.raises(OSError, match=f"'smollm2' is not a registered model name \\(did you mean {NAME}\\?\\)"):
        load("smollm2")


def test_a_bare_word_far_from_every_name_still_goes_to_the_hub():
    from tfgen.hub.pull import check_model_argument

    # Legacy Hub ids without an owner (gpt2, t5-small) stay Hub ids; only a near-miss of a registered name is refused.
    assert check_model_argument("gpt2") is None and check_model_argument("llama-9000") is None
    with pytest.raises(ValueError, match=f"did you mean {NAME}"):
        check_model_argument("smollm2")


def test_pull_suggests_the_name_too(capsys):
    assert main(["pull", "smollm2"]) == 2
    assert f"unknown model name 'smollm2' (did you mean {NAME}?); known names: {NAME}" in one_error_line(capsys)


# A prompt longer than the context --------------------------------------------------------------------------------


def test_a_prompt_over_the_context_is_refused_before_the_model_loads(model_dir, nothing_slow, capsys):
    prompt = " ".join(["w5"] * 70)  # the tiny model has 64 positions
    assert main(["generate", "--model", model_dir, prompt]) == 2
    err = one_error_line(capsys)
    assert "the prompt has 70 tokens and the model's context is 64 tokens" in err
    assert "use a shorter prompt" in err and "max_new_tokens" not in err and "max_length" not in err


@pytest.mark.parametrize("options", [{}, {"max_new_tokens": 4}], ids=["default_length", "max_new_tokens"])
def test_generate_names_both_numbers_and_truncation(tiny_model, options):
    prompt = np.full([1, 64], 5, np.int32)
    with pytest.raises(ValueError, match=r"input_ids: the prompt has 64 tokens and the model's context is 64 tokens "
                       r".*truncation=True, max_length=N\) with N below 64"):
        tiny_model.generate(prompt, jit_compile=False, **options)


def test_too_many_new_tokens_says_how_many_fit(tiny_model):
    with pytest.raises(ValueError, match=r"only 64 positions: at most 4 new tokens fit"):
        tiny_model.generate(np.full([1, 60], 5, np.int32), max_new_tokens=10, jit_compile=False)
    # A max_length below a prompt that fits keeps its advice: max_new_tokens can help there.
    with pytest.raises(ValueError, match=r"max_length \(5\) must exceed the prompt length \(10\); set max_new_tokens"):
        tiny_model.generate(np.full([1, 10], 5, np.int32), max_length=5, jit_compile=False)


# --regex / --json-schema before the model loads -------------------------------------------------------------------


@pytest.mark.parametrize("pattern, words", [
    ("(", "'(' is not a regular expression outlines-core can compile: missing ), unterminated subpattern"),
    ("(?=a)b", "look-around"),
    ("^[0-9]+", "starts with an anchor"),
], ids=["unclosed", "lookahead", "anchor"])
def test_a_bad_regex_fails_before_the_model_loads(model_dir, nothing_slow, capsys, pattern, words):
    assert main(["generate", "--model", model_dir, "--regex", pattern, "w5"]) == 2
    err = one_error_line(capsys)
    assert err.startswith("tfgen: error: --regex: ") and words in err


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "("}, "the schema's regex (see its `pattern` keywords) is not a regular expression"),
    ({"type": "object", "properties": {"a": {"not": {}}}}, "unsupported keyword 'not' at /properties/a"),
], ids=["bad_pattern", "untranslatable"])
def test_a_bad_json_schema_fails_before_the_model_loads(model_dir, nothing_slow, tmp_path, capsys, schema, words):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["generate", "--model", model_dir, "--json-schema", str(path), "w5"]) == 2
    err = one_error_line(capsys)
    assert err.startswith("tfgen: error: --json-schema: ") and words in err


def test_outlines_syntax_python_lacks_is_not_refused():
    check_pattern(r"\p{L}+ [[:digit:]]{2}", "--regex")  # Rust's regex syntax: outlines-core compiles it


def test_generate_words_a_bad_regex_too(tiny_model):
    from conftest import word_level_tokenizer

    with pytest.raises(ValueError, match=r"regex: '\(' is not a regular expression .*missing \)"):
        tiny_model.generate(np.array([[5, 6]]), regex="(", tokenizer=word_level_tokenizer(), jit_compile=False)


# -q after the subcommand ------------------------------------------------------------------------------------------


def test_quiet_is_taken_before_or_after_the_subcommand():
    cases = [
        (["generate", "hi"], False), (["-q", "generate", "hi"], True), (["generate", "hi", "-q"], True),
        (["generate", "--quiet", "hi"], True), (["batch", "--input", "in.jsonl", "--output", "out.jsonl", "-q"], True),
        (["export", "out", "--quiet"], True), (["bench", "-q"], False),  # bench hands "-q" to its harness
    ]
    for argv, quiet in cases:
        assert build_parser().parse_args(argv).quiet is quiet, argv


def test_quiet_after_the_subcommand_hides_the_compile_notice(model_dir, capsys):
    argv = ["generate", "--model", model_dir, "w5 w17", "--max-new-tokens", "3", "--greedy", "--no-stream", "-q"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "tfgen: compiling" not in captured.err and captured.out.startswith("w5 w17")


# --seed takes two integers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["generate", "--model", "never-read"], ["batch", "--input", "in.jsonl", "--output", "out.jsonl"],
], ids=["generate", "batch"])
@pytest.mark.parametrize("seed, words", [
    (["1", "hi"], "--seed takes two integers A B (got '1' 'hi')"),
    (["x", "2"], "--seed takes two integers A B (got 'x' '2')"),
    (["1", str(2**40)], f"--seed takes two integers A B that fit in 32 bits (got 1 {2**40})"),
])
def test_seed_takes_two_integers(nothing_slow, capsys, command, seed, words):
    assert main([*command, "--seed", *seed, "w5"]) == 2
    assert words in one_error_line(capsys)
    # Two integers, a negative one included, are still read before the prompt.
    prompt = ["w5"] if command[0] == "generate" else []
    assert build_parser().parse_args([*command, "--seed", "-1", "2", *prompt]).seed == [-1, 2]


def test_an_export_folder_as_model_points_to_serve(nothing_slow, capsys, tmp_path):
    """An export (a SavedModel, as `tfgen export` writes it) passed where a model goes is one line naming what
    `--model` takes and `tfgen serve`, before anything loads, in every command. (Beam's handler takes a tfgen
    export, and refuses a SavedModel without tfgen's description by naming the file it lacks.)"""
    from tfgen.beam import TFGenModelHandler

    base = tmp_path / "exported"
    (base / "1").mkdir(parents=True)
    (base / "1" / "saved_model.pb").write_bytes(b"")
    for folder in (base, base / "1"):
        for argv in (["generate", "hi", "--model", str(folder)],
                     ["batch", "--input", str(tmp_path / "in.jsonl"), "--output", "out.jsonl", "--model", str(folder)]):
            assert main(argv) == 2, argv
            error = one_error_line(capsys)
            assert "is an export" in error and f"tfgen serve {folder}" in error, error
        with pytest.raises(OSError, match="cannot read the export's description .*tfgen_export.json"):
            TFGenModelHandler(str(folder), max_new_tokens=4)
    (base / "1" / "saved_model.pb").unlink()
    assert main(["generate", "hi", "--model", str(base)]) != 0
    assert "is an export" not in capsys.readouterr().err
