"""Chat templates: tfgen's `Tokenizer.apply_chat_template` against HF transformers 4.55's on the templates of
published models (tests/chat_templates.py), byte for byte and id for id; where a template is read from and written
to; and the errors (no template, bad Jinja, raise_exception, malformed messages, options that cannot apply)."""

from __future__ import annotations

import json

import chat_templates
import jinja2
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tfgen.text.chat_template import MissingChatTemplateError, compile_chat_template
from tfgen.text.tokenizer import Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|begin_of_text|>", "</s>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "</s>", "pad_token": "<|endoftext|>",
          "tokenizer_class": "PreTrainedTokenizerFast"}
CORPUS = ["You are a helpful assistant.", "What is the capital of France?", "The capital of France is Paris.",
          "Hello! How can I help you today?", "user assistant system tool", "get_weather location Paris unit celsius"]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris."}
FOLLOW_UP = {"role": "user", "content": "  And of Italy? <b>é</b>  "}
PARTIAL = {"role": "assistant", "content": "The capital of Italy is "}  # trailing space: trimmed by some templates
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place <now> & \"here\" (°C)",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}]
TOOL_TURNS = [
    USER,
    {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Rome"}}}]},
    {"role": "tool", "content": "18 °C"},
    {"role": "tool", "content": "24 °C"},
]

CONVERSATIONS = {
    "one_user": [USER],
    "system": [SYSTEM, USER],
    "multi_turn": [SYSTEM, USER, ANSWER, FOLLOW_UP],
}
# (template, conversation, options): every rendering compared with HF's, text and ids.
CASES = [
    (name, conversation, options)
    for name in ("SMOLLM2", "QWEN2_5", "LLAMA3", "NAMESPACE", "ENVIRONMENT")
    for conversation in CONVERSATIONS
    for options in ({}, {"add_generation_prompt": True})
] + [
    (name, "continued", {"continue_final_message": True})
    for name in ("SMOLLM2", "QWEN2_5", "LLAMA3", "NAMESPACE", "MISTRAL")
] + [
    ("QWEN2_5", "tools", {"tools": TOOLS, "add_generation_prompt": True}),
    ("QWEN2_5", "tools", {"tools": TOOLS, "add_generation_prompt": False}),
    ("MISTRAL", "alternating", {}),
    ("ENVIRONMENT", "multi_turn", {"documents": [{"title": "Città", "text": "<p>Roma & Milano</p>"}],
                                   "enable_thinking": False, "max_turns": 2}),
]
EXTRA_CONVERSATIONS = {
    "continued": [USER, ANSWER, FOLLOW_UP, PARTIAL],
    "tools": TOOL_TURNS,
    "alternating": [USER, ANSWER, FOLLOW_UP],
}


def _train_backend():
    """A byte-level BPE whose post-processor adds <|begin_of_text|>: a rendered template must not get it twice."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS * 4, trainer)
    bos = CONFIG["bos_token"]
    backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                           special_tokens=[(bos, backend.token_to_id(bos))])
    return backend


@pytest.fixture(scope="module")
def backend():
    return _train_backend()


def write_checkpoint(directory, backend, template=None, where="jinja"):
    """A tokenizer directory with `template` in chat_template.jinja ("jinja"), tokenizer_config.json as a string
    ("config") or as HF's list of named templates ("config_list")."""
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config = dict(CONFIG)
    if where == "jinja" and template is not None:
        (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    elif where == "config":
        config["chat_template"] = template
    elif where == "config_list":
        config["chat_template"] = [{"name": "tool_use", "template": "{{ 'tools' }}"},
                                   {"name": "default", "template": template}]
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def tokenizers_by_template(backend, tmp_path_factory):
    """{template name: (tfgen Tokenizer, HF PreTrainedTokenizerFast)} loaded from the same directory."""
    loaded = {}
    for name in ("SMOLLM2", "QWEN2_5", "LLAMA3", "MISTRAL", "NAMESPACE", "ENVIRONMENT"):
        directory = write_checkpoint(tmp_path_factory.mktemp(name), backend, getattr(chat_templates, name))
        loaded[name] = Tokenizer.from_pretrained(directory), PreTrainedTokenizerFast.from_pretrained(directory)
    return loaded


@pytest.mark.parametrize("name, conversation, options", CASES,
                         ids=[f"{n}-{c}-{'_'.join(o) or 'plain'}" for n, c, o in CASES])
def test_rendering_and_ids_match_hf(tokenizers_by_template, name, conversation, options):
    ours, hf = tokenizers_by_template[name]
    messages = CONVERSATIONS.get(conversation) or EXTRA_CONVERSATIONS[conversation]
    text = ours.apply_chat_template(messages, tokenize=False, **options)
    assert text == hf.apply_chat_template(messages, tokenize=False, **options)
    ids = ours.apply_chat_template(messages, **options)
    assert ids == hf.apply_chat_template(messages, **options)
    assert ids.count(ours.bos_token_id) == text.count(ours.bos_token)  # the template's bos only, never doubled


def test_arrays_dicts_and_batches_match_hf(tokenizers_by_template):
    ours, hf = tokenizers_by_template["SMOLLM2"]
    conversations = [CONVERSATIONS["one_user"], CONVERSATIONS["multi_turn"]]
    assert ours.apply_chat_template(conversations, tokenize=False) == hf.apply_chat_template(conversations,
                                                                                             tokenize=False)
    assert ours.apply_chat_template(conversations) == hf.apply_chat_template(conversations)
    single = CONVERSATIONS["system"]
    array = ours.apply_chat_template(single, add_generation_prompt=True, return_tensors="np")
    np.testing.assert_array_equal(array, hf.apply_chat_template(single, add_generation_prompt=True,
                                                                return_tensors="np"))
    assert array.shape[0] == 1 and array.dtype == np.int32
    encoded = ours.apply_chat_template(single, return_dict=True)
    expected = hf.apply_chat_template(single, return_dict=True)
    assert encoded == {"input_ids": expected["input_ids"], "attention_mask": expected["attention_mask"]}
    padded = ours.apply_chat_template(conversations, padding=True, return_tensors="np", return_dict=True)
    assert padded["input_ids"].shape == padded["attention_mask"].shape
    assert padded["attention_mask"][0, 0] == 0 and padded["attention_mask"][:, -1].all()  # left padding


def test_strftime_now_is_todays_date(tokenizers_by_template):
    from datetime import datetime

    ours, _ = tokenizers_by_template["ENVIRONMENT"]
    text = ours.apply_chat_template([USER], tokenize=False)
    assert f"Today is {datetime.now().strftime('%d %B %Y')}." in text


def test_a_template_argument_replaces_the_tokenizers(tokenizers_by_template):
    ours, hf = tokenizers_by_template["SMOLLM2"]
    template = "{% for m in messages %}{{ m.role | upper }}={{ m.content }};{% endfor %}"
    assert ours.apply_chat_template([USER], chat_template=template, tokenize=False) == \
        hf.apply_chat_template([USER], chat_template=template, tokenize=False) == f"USER={USER['content']};"


def test_compiled_templates_are_cached(tokenizers_by_template):
    ours, _ = tokenizers_by_template["QWEN2_5"]
    ours.apply_chat_template([USER], tokenize=False)
    before = compile_chat_template.cache_info()
    for _ in range(3):
        ours.apply_chat_template([USER], tokenize=False)
    after = compile_chat_template.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (3, 0)


# --- where templates are read from and written to ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["jinja", "config", "config_list"])
def test_template_locations_load_as_in_hf(backend, tmp_path, where):
    directory = write_checkpoint(tmp_path / where, backend, chat_templates.MISTRAL, where)
    ours = Tokenizer.from_pretrained(directory)
    assert ours.chat_template == chat_templates.MISTRAL
    hf = PreTrainedTokenizerFast.from_pretrained(directory)
    conversation = EXTRA_CONVERSATIONS["alternating"]
    assert ours.apply_chat_template(conversation) == hf.apply_chat_template(conversation)


def test_named_templates_besides_the_default_are_warned_about(backend, tmp_path, caplog):
    """HF would render the "tool_use" template when tools are given; tfgen keeps the default only, and says so."""
    directory = write_checkpoint(tmp_path / "named", backend, chat_templates.MISTRAL, "config_list")
    assert Tokenizer.from_pretrained(directory).chat_template == chat_templates.MISTRAL
    assert "only the 'default' chat template" in caplog.text and "['tool_use']" in caplog.text


def test_chat_template_jinja_wins_over_the_config(backend, tmp_path):
    directory = write_checkpoint(tmp_path / "both", backend, chat_templates.LLAMA3, "config")
    (directory / "chat_template.jinja").write_text(chat_templates.SMOLLM2, encoding="utf-8")
    assert Tokenizer.from_pretrained(directory).chat_template == chat_templates.SMOLLM2
    assert PreTrainedTokenizerFast.from_pretrained(directory).chat_template == chat_templates.SMOLLM2


def test_save_pretrained_round_trips_the_template_to_hf(backend, tmp_path):
    ours = Tokenizer.from_pretrained(write_checkpoint(tmp_path / "source", backend, chat_templates.QWEN2_5, "config"))
    ours.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "chat_template.jinja").read_text(encoding="utf-8") == chat_templates.QWEN2_5
    hf = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert hf.chat_template == chat_templates.QWEN2_5
    assert Tokenizer.from_pretrained(tmp_path / "saved").chat_template == chat_templates.QWEN2_5
    assert ours.apply_chat_template(TOOL_TURNS, tools=TOOLS) == hf.apply_chat_template(TOOL_TURNS, tools=TOOLS)


def test_save_pretrained_without_a_template_removes_a_stale_one(backend, tmp_path):
    stale = write_checkpoint(tmp_path / "stale", backend, chat_templates.LLAMA3)
    Tokenizer(backend, eos_token="</s>").save_pretrained(stale)
    assert not (stale / "chat_template.jinja").exists()
    assert AutoTokenizer.from_pretrained(stale).chat_template is None
    assert Tokenizer.from_pretrained(stale).chat_template is None


@pytest.mark.parametrize("value, error", [
    (42, "chat_template must be a template string"),
    ([{"name": "default"}], "chat_template must be a template string"),
])
def test_a_malformed_config_entry_is_named(backend, tmp_path, value, error):
    directory = write_checkpoint(tmp_path / "bad", backend, value, "config")
    with pytest.raises(ValueError, match=error) as caught:
        Tokenizer.from_pretrained(directory)
    assert "tokenizer_config.json" in str(caught.value)


def test_named_templates_without_a_default_give_none(backend, tmp_path, caplog):
    directory = write_checkpoint(tmp_path / "named", backend)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "x"}]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_pretrained(directory).chat_template is None
    assert "tool_use" in caplog.text and "default" in caplog.text


# --- errors -----------------------------------------------------------------------------------------------------


def test_no_template_is_a_clear_value_error(backend):
    with pytest.raises(MissingChatTemplateError, match="no chat template") as caught:
        Tokenizer(backend).apply_chat_template([USER])
    assert isinstance(caught.value, ValueError)


def test_raise_exception_carries_the_templates_message(tokenizers_by_template):
    ours, hf = tokenizers_by_template["MISTRAL"]
    for conversation, message in (([SYSTEM, USER], "Conversation roles must alternate"),
                                  ([USER, {"role": "tool", "content": "x"}], "Only user and assistant roles")):
        with pytest.raises(ValueError, match=message):
            ours.apply_chat_template(conversation)
        with pytest.raises(jinja2.TemplateError, match=message):
            hf.apply_chat_template(conversation)


@pytest.mark.parametrize("template, message", [
    ("{% for message in messages %}{{ message.content }}", r"not valid Jinja \(line 1\).*endfor"),
    ("{{ messages[0].content + 1 }}", "the chat template failed"),
    ("{{ messages.append(1) }}", "the chat template failed.*unsafe"),  # the sandbox: templates cannot mutate
    ("{{ messages[7].content }}", "the chat template failed"),
])
def test_template_errors_are_value_errors(tokenizers_by_template, template, message):
    ours, _ = tokenizers_by_template["SMOLLM2"]
    with pytest.raises(ValueError, match=message):
        ours.apply_chat_template([USER], chat_template=template)


@pytest.mark.parametrize("messages, error, named", [
    ("hello", TypeError, "messages must be a non-empty list"),
    ([], TypeError, "messages must be a non-empty list"),
    (["hello"], TypeError, r"messages\[0\] must be a dict"),
    ([{"content": "hi"}], ValueError, r"messages\[0\] needs a string 'role'"),
    ([USER, {"role": "assistant", "content": 5}], ValueError, r"messages\[1\]\['content'\] must be a string"),
    ([{"role": "assistant", "content": None}], ValueError, r"messages\[0\]\['content'\]"),
    ([[USER], "hello"], TypeError, r"messages\[1\] must be a non-empty list"),
    ([[USER], [USER, {"role": 1, "content": "x"}]], ValueError, r"messages\[1\]\[1\] needs a string 'role'"),
], ids=["string", "empty", "not_a_dict", "no_role", "bad_content", "no_content", "batch_row", "batch_role"])
def test_malformed_messages_are_named(tokenizers_by_template, messages, error, named):
    ours, _ = tokenizers_by_template["SMOLLM2"]
    with pytest.raises(error, match=named):
        ours.apply_chat_template(messages)


def test_content_blocks_and_tool_calls_are_accepted(tokenizers_by_template):
    ours, hf = tokenizers_by_template["QWEN2_5"]
    continued = [USER, {"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "Paris is"}]}]
    template = "{% for m in messages %}{{ m.content if m.content is string else m.content[-1].text }}{% endfor %}"
    options = dict(chat_template=template, continue_final_message=True, tokenize=False)
    assert ours.apply_chat_template(continued, **options) == hf.apply_chat_template(continued, **options)


@pytest.mark.parametrize("options, named", [
    ({"tools": [len]}, "tools must be a list of JSON schemas"),
    ({"tools": {"name": "x"}}, "tools must be a list"),
    ({"documents": ["text"]}, "documents must be a list of dicts"),
    ({"add_generation_prompt": True, "continue_final_message": True}, "exclude each other"),
    ({"tokenize": False, "return_tensors": "np"}, "return_tensors need tokenize=True"),
    ({"tokenize": False, "return_dict": True, "max_length": 8}, "max_length, return_dict need tokenize=True"),
    ({"return_assistant_tokens_mask": True}, "does not support return_assistant_tokens_mask"),
    ({"tokenizer_kwargs": {}}, "does not support tokenizer_kwargs"),
    ({"return_tensors": "pt"}, "return_tensors must be"),
])
def test_options_that_cannot_apply_are_refused(tokenizers_by_template, options, named):
    ours, _ = tokenizers_by_template["QWEN2_5"]
    with pytest.raises((TypeError, ValueError), match=named):
        ours.apply_chat_template([USER], **options)


def test_continue_final_message_needs_the_text_in_the_rendering(tokenizers_by_template):
    ours, _ = tokenizers_by_template["SMOLLM2"]
    with pytest.raises(ValueError, match="does not appear"):
        ours.apply_chat_template([USER, PARTIAL], chat_template="{{ messages | length }}",
                                 continue_final_message=True)
