"""Text in Python: `tfgen.pipeline("text-generation", ...)` returns HF's shapes and the tokens of `generate()` (a
string, a batch of strings left-padded into one call, chat messages); `from_pretrained` takes registered names as the
command line does; `generate()` given text says what to do; `import tfgen` keeps TensorFlow's start-up lines quiet."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHAT_TEMPLATE

import tfgen
from tfgen.config.budget import config_sets_length
from tfgen.generation.mixin import TFGenerationMixin

NEW = 6
PROMPTS = ["w5 w17 w30 w41", "w8"]
MESSAGES = [{"role": "system", "content": "w20 w21"}, {"role": "user", "content": "w5 w17"}]


@pytest.fixture(scope="module")
def loaded(chat_model_dir):
    """(model, tokenizer, pipeline over them): one model, so the compiled programs are shared."""
    model = tfgen.AutoModelForCausalLM.from_pretrained(chat_model_dir)
    tokenizer = tfgen.AutoTokenizer.from_pretrained(chat_model_dir)
    return model, tokenizer, tfgen.pipeline("text-generation", model=model, tokenizer=tokenizer)


@pytest.fixture
def calls(monkeypatch):
    """The options of every generate() call, in order."""
    seen = []
    real_generate = TFGenerationMixin.generate

    def recording_generate(self, inputs=None, *args, **options):
        seen.append({"input_ids": np.asarray(inputs).tolist(), **options})
        return real_generate(self, inputs, *args, **options)

    monkeypatch.setattr(TFGenerationMixin, "generate", recording_generate)
    return seen


def generated_rows(model, ids, mask=None, **options):
    """generate()'s rows as lists: (prompt without padding, new tokens)."""
    ids = np.asarray(ids)
    mask = np.ones_like(ids) if mask is None else np.asarray(mask)
    sequences = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, **options).numpy()
    width = ids.shape[1]
    return [(row[:width][mask[index] == 1].tolist(), row[width:].tolist()) for index, row in enumerate(sequences)]


def hf_text(tokenizer, prompt, new):
    """HF's pipeline's new text: the whole sequence decoded less the decoded prompt's characters."""
    whole = tokenizer.decode(prompt + new, skip_special_tokens=True)
    return whole[len(tokenizer.decode(prompt, skip_special_tokens=True)):]


def test_a_string_gives_generates_tokens_and_hfs_record(loaded, calls):
    model, tokenizer, pipe = loaded
    (prompt, new), = generated_rows(model, [tokenizer.encode(PROMPTS[0])])
    assert 2 not in new  # the tiny model does not end these rows early: all NEW tokens compare
    assert pipe(PROMPTS[0], max_new_tokens=NEW, do_sample=False, return_tensors=True) == [
        {"generated_token_ids": prompt + new}]
    assert pipe(PROMPTS[0], max_new_tokens=NEW, do_sample=False) == [
        {"generated_text": PROMPTS[0] + hf_text(tokenizer, prompt, new)}]
    assert pipe(PROMPTS[0], max_new_tokens=NEW, do_sample=False, return_full_text=False) == [
        {"generated_text": hf_text(tokenizer, prompt, new)}]
    assert len(calls) == 4


def test_a_list_of_strings_runs_as_one_left_padded_batch(loaded, calls):
    model, tokenizer, pipe = loaded
    batch = tokenizer(PROMPTS)  # left-padded
    expected = generated_rows(model, batch["input_ids"], batch["attention_mask"])
    calls.clear()
    results = pipe(PROMPTS, max_new_tokens=NEW, do_sample=False, return_tensors=True)
    assert len(calls) == 1 and np.asarray(calls[0]["input_ids"]).shape == batch["input_ids"].shape
    assert results == [[{"generated_token_ids": prompt + new}] for prompt, new in expected]
    texts = pipe(PROMPTS, max_new_tokens=NEW, do_sample=False)
    assert texts == [[{"generated_text": text + hf_text(tokenizer, prompt, new)}]
                     for text, (prompt, new) in zip(PROMPTS, expected)]
    # batch_size cuts the inputs into several calls; greedy tokens do not change.
    calls.clear()
    assert pipe(PROMPTS, max_new_tokens=NEW, do_sample=False, batch_size=1) == texts
    assert len(calls) == 2


def test_chat_messages_are_rendered_with_the_template_and_answered(loaded):
    model, tokenizer, pipe = loaded
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    (prompt, new), = generated_rows(model, [rendered])
    answer = hf_text(tokenizer, prompt, new)
    assert answer.strip() == tokenizer.decode(new, skip_special_tokens=True)
    assert pipe(MESSAGES, max_new_tokens=NEW, do_sample=False) == [
        {"generated_text": MESSAGES + [{"role": "assistant", "content": answer}]}]
    assert pipe(MESSAGES, max_new_tokens=NEW, do_sample=False, return_full_text=False) == [{"generated_text": answer}]
    assert pipe([MESSAGES, MESSAGES], max_new_tokens=NEW, do_sample=False, return_tensors=True) == [
        [{"generated_token_ids": prompt + new}]] * 2
    # A conversation ending with the assistant's message is continued (HF's continue_final_message default).
    prefill = MESSAGES + [{"role": "assistant", "content": "w60"}]
    continued = tokenizer.apply_chat_template(prefill, continue_final_message=True)
    (prompt, new), = generated_rows(model, [continued])
    result = pipe(prefill, max_new_tokens=NEW, do_sample=False)[0]["generated_text"]
    assert result == MESSAGES + [{"role": "assistant", "content": "w60" + hf_text(tokenizer, prompt, new)}]


def test_an_empty_prompt_starts_from_bos_as_generate_does(loaded):
    model, _, pipe = loaded
    sequence = model.generate(np.zeros([1, 0], np.int32), max_new_tokens=NEW, do_sample=False)[0].numpy().tolist()
    assert sequence[0] == model.generation_config.bos_token_id and 2 not in sequence
    assert pipe("", max_new_tokens=NEW, do_sample=False, return_tensors=True) == [{"generated_token_ids": sequence}]


def test_a_plain_string_on_a_chat_model_is_continued_as_text(loaded, calls):
    """HF's pipeline templates messages only; the CLI's chat default does not apply to the Python API."""
    _, tokenizer, pipe = loaded
    pipe(PROMPTS[0], max_new_tokens=NEW, do_sample=False)
    assert calls[0]["input_ids"] == [tokenizer.encode(PROMPTS[0])]


def test_without_a_length_the_answer_budget_applies_and_a_cut_answer_warns(loaded, calls):
    model, tokenizer, pipe = loaded
    assert not config_sets_length(model.generation_config)
    # eos (2) banned: the answer runs to its budget, the rest of the tiny model's 64 positions.
    with pytest.warns(UserWarning, match=r"1 of 1 answers: the answer was cut at 60 new tokens.*max_new_tokens="):
        (record,) = pipe(PROMPTS[0], do_sample=False, suppress_tokens=[2], return_tensors=True)
    assert calls[0]["max_new_tokens"] == 60 == len(record["generated_token_ids"]) - 4


def test_defaults_given_to_pipeline_apply_to_every_call(loaded, calls):
    model, tokenizer, pipe = loaded
    with_defaults = tfgen.pipeline("text-generation", model=model, tokenizer=tokenizer, max_new_tokens=NEW,
                                   do_sample=False, return_full_text=False)
    assert with_defaults(PROMPTS[1]) == pipe(PROMPTS[1], max_new_tokens=NEW, do_sample=False, return_full_text=False)
    assert calls[0]["max_new_tokens"] == NEW and calls[0]["do_sample"] is False


@pytest.mark.parametrize("arguments, error, words", [
    (dict(task="summarization"), ValueError, "task 'summarization' is not supported"),
    (dict(clean_up_tokenization_spaces=True), ValueError, "clean_up_tokenization_spaces: not supported"),
    (dict(stop_sequence="w5"), ValueError, "stop_strings"),
    (dict(device="cuda"), ValueError, "device: not a text-generation pipeline or generation option"),
    (dict(model=object()), TypeError, "model must be a path"),
], ids=["task", "cleanup", "stop_sequence", "unknown", "model_type"])
def test_bad_pipeline_arguments_are_refused_before_loading(arguments, error, words):
    arguments = {"task": "text-generation", "model": "/no/such/model", **arguments}
    with pytest.raises(error, match=re.escape(words)):
        tfgen.pipeline(**arguments)


def test_a_loaded_model_needs_its_tokenizer(loaded):
    with pytest.raises(ValueError, match="tokenizer: a loaded model needs its tokenizer"):
        tfgen.pipeline("text-generation", model=loaded[0])


@pytest.mark.parametrize("text_inputs, error, words", [
    (42, TypeError, "text_inputs must be a string"),
    ([], ValueError, "text_inputs is empty"),
    (["w5", [{"role": "user", "content": "w5"}]], TypeError, "only strings, or only conversations"),
    ([{"role": "user"}], ValueError, "'role' and a 'content' key"),
], ids=["int", "empty", "mixed", "no_content"])
def test_bad_text_inputs_name_the_argument(loaded, text_inputs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        loaded[2](text_inputs)


def test_chat_messages_without_a_template_are_refused(model_dir):
    pipe = tfgen.pipeline("text-generation", model=model_dir)
    with pytest.raises(ValueError, match="need a chat template"):
        pipe(MESSAGES)


@pytest.mark.parametrize("text", [["hello"], "hello", np.array([["a", "b"]])], ids=["list", "str", "array"])
def test_generate_given_text_says_to_tokenize_or_use_the_pipeline(tiny_model, text):
    with pytest.raises(TypeError, match=re.escape("input_ids holds text (str); tokenize it first (tokenizer(...)) or "
                                                  "use tfgen.pipeline('text-generation', ...)")):
        tiny_model.generate(text)


@pytest.fixture
def registered_name(chat_model_dir, monkeypatch, tmp_path):
    """"smollm2-135m-instruct" not cached (an empty tfgen cache, no Hub snapshot), its pull giving the tiny chat
    model; the names pulled, in order."""
    from tfgen.hub import pull as model_pull

    pulled = []
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_pull, "hub_snapshot", lambda *args, **options: None)
    monkeypatch.setattr(model_pull, "pull", lambda name, **options: pulled.append(name) or chat_model_dir)
    return pulled


def test_from_pretrained_takes_a_registered_name_as_the_cli_does(registered_name, loaded, caplog):
    with caplog.at_level("INFO", logger="tfgen.hub.pull"):
        tokenizer = tfgen.AutoTokenizer.from_pretrained("smollm2-135m-instruct")
        model = tfgen.AutoModelForCausalLM.from_pretrained("smollm2-135m-instruct")
    assert registered_name == ["smollm2-135m-instruct"] * 2
    assert "smollm2-135m-instruct is not in the cache" in caplog.text
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert all(np.array_equal(mine, theirs) for mine, theirs in zip(model.get_weights(), loaded[0].get_weights()))
    pipe = tfgen.pipeline("text-generation", model="smollm2-135m-instruct", max_new_tokens=NEW, do_sample=False)
    assert pipe(MESSAGES) == loaded[2](MESSAGES, max_new_tokens=NEW, do_sample=False)
    assert registered_name == ["smollm2-135m-instruct"] * 3  # the pipeline resolves the name once


def test_a_registered_name_with_hub_options_or_offline_is_refused_without_a_pull(registered_name):
    with pytest.raises(ValueError, match=re.escape("pass its Hub id 'HuggingFaceTB/SmolLM2-135M-Instruct' instead")):
        tfgen.AutoModelForCausalLM.from_pretrained("smollm2-135m-instruct", revision="main")
    with pytest.raises(OSError, match="not in the cache .* local_files_only is set: pull it first"):
        tfgen.AutoTokenizer.from_pretrained("smollm2-135m-instruct", local_files_only=True)
    assert registered_name == []


# A TensorFlow C++ log line in absl's format ("I0000 00:00:1795452449.924579    3605 cudart_stub.cc:31] ...") or in
# TensorFlow 2.20's own ("2026-11-27 02:56:09.694922: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:31] ..."),
# or absl's notice.
TF_LOG_LINE = re.compile(r"^([IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] |[\d-]+ [\d:.]+: [IWEF] \S+:\d+\] "
                         r"|WARNING: All log messages before absl)", re.M)
# The first import of TensorFlow goes through tfgen (the lazy name), then an op starts the devices (cuInit).
FIRST_IMPORT = ("import tfgen; tfgen.TFGenerationMixin; import tensorflow as tf; tf.constant(1) + 1; "
                "import os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))")


@pytest.mark.parametrize("level", [None, "0"], ids=["quiet", "level_0_shows_them"])
def test_import_tfgen_keeps_tensorflows_start_up_lines_quiet(level):
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", FIRST_IMPORT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = TF_LOG_LINE.findall(done.stderr)
    if level is None:
        assert lines == [], done.stderr
        assert done.stdout.split() == ["None"]  # set for TensorFlow's import only: child processes get the user's
    else:
        assert lines, done.stderr  # oneDNN's and the CPU notices at least
        assert done.stdout.split() == ["0"]
