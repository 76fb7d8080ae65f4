"""`tfgen serve`'s OpenAI-compatible routes, driven by the official `openai` client: an export carries its tokenizer
and chat template (`assets.extra/tokenizer/`), the server renders and tokenizes server-side, greedy answers equal
in-process `generate()` token for token, sampling follows `seed`, `n`, `stop`, streaming and usage; what the server
does not honour is a 4xx naming the field.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import openai
import pytest
from conftest import CHAT_TEMPLATE, word_level_tokenizer

from tfgen.cli import main
from tfgen.serving import ModelServer, load_export, start_in_thread
from tfgen.serving.openai_protocol import seed_pair

pytestmark = pytest.mark.slow

MODEL = "tiny-chat"
BUFFER = 8
MESSAGES = [{"role": "system", "content": "w20 w21"},
            {"role": "user", "content": [{"type": "text", "text": "w30 "}, {"type": "text", "text": "w31 w32"}]}]
# The conversation the template renders: text parts joined.
RENDERED = [{"role": "system", "content": "w20 w21"}, {"role": "user", "content": "w30 w31 w32"}]


@pytest.fixture(scope="module")
def tokenizer():
    chat_tokenizer = word_level_tokenizer()
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    return chat_tokenizer


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, model_dir):
    """`tfgen export --no-text` of the tiny model whose folder has a tokenizer and a chat template."""
    source = tmp_path_factory.mktemp("chat_model")
    shutil.copytree(model_dir, source, dirs_exist_ok=True)
    (source / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    root = tmp_path_factory.mktemp("openai") / MODEL
    assert main(["export", str(root), "--model", str(source), "--max-new-tokens", str(BUFFER), "--no-text",
                 "--signatures", "greedy", "--slots", "4", "--slot-length", "32"]) in (0, None)
    return str(root)


@pytest.fixture(scope="module")
def server(export_dir):
    served = load_export(export_dir, warmup=False, batching={"steps_per_call": 2})
    http_server = ModelServer(served, port=0)
    start_in_thread(http_server)
    yield http_server
    http_server.shutdown()
    http_server.server_close()
    served.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy_tokens(model, prompt_ids: list, max_new_tokens: int) -> list:
    """In-process `generate()`'s new tokens for one prompt, up to and with the first eos."""
    sequence = model.generate(np.array([prompt_ids], np.int32), max_new_tokens=max_new_tokens,
                              do_sample=False)[0].numpy().tolist()
    new = sequence[len(prompt_ids):]
    eos = model.generation_config.eos_token_ids()
    for index, token in enumerate(new):
        if token in eos:
            return new[:index + 1]
    return new


def test_the_export_carries_its_tokenizer_and_chat_template(export_dir, server, tokenizer):
    files = os.listdir(os.path.join(export_dir, "1", "assets.extra", "tokenizer"))
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(files)
    served = server.model
    assert served.tokenizer.chat_template == CHAT_TEMPLATE
    assert served.tokenizer.encode("w5 w6 w7") == tokenizer.encode("w5 w6 w7")


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert models.data[0].object == "model"


def test_greedy_chat_equals_in_process_generate(client, tiny_model, tokenizer):
    prompt = tokenizer.apply_chat_template(RENDERED, add_generation_prompt=True)
    expected = greedy_tokens(tiny_model, prompt, 6)
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=6)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-") and answer.created > 0
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(expected, skip_special_tokens=True)
    assert choice.finish_reason == ("length" if len(expected) == 6 else "stop")
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(prompt), len(expected))
    assert answer.usage.total_tokens == len(prompt) + len(expected)


def test_completions_take_a_list_of_prompts_and_n(client, tiny_model, tokenizer):
    prompts = ["w5 w6 w7", "w40 w41"]
    answer = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=5)
    assert answer.object == "text_completion"
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    expected = [greedy_tokens(tiny_model, tokenizer.encode(prompt), 5) for prompt in prompts]
    texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in expected]
    assert [choice.text for choice in answer.choices] == [texts[0], texts[0], texts[1], texts[1]]
    assert answer.usage.prompt_tokens == 5
    assert answer.usage.completion_tokens == 2 * sum(len(tokens) for tokens in expected)


def test_the_default_budget_is_the_export_buffer(client, tiny_model, tokenizer):
    answer = client.completions.create(model=MODEL, prompt="w9 w8", temperature=0)
    expected = greedy_tokens(tiny_model, tokenizer.encode("w9 w8"), BUFFER)
    assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert answer.usage.completion_tokens == len(expected)


def test_streamed_chat_matches_the_whole_answer_and_reports_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=7)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=7,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_streamed_completion(client):
    whole = client.completions.create(model=MODEL, prompt="w50 w51", temperature=0, max_tokens=6)
    chunks = list(client.completions.create(model=MODEL, prompt="w50 w51", temperature=0, max_tokens=6, stream=True))
    assert all(chunk.object == "text_completion" for chunk in chunks)
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_same_seed_same_text(client):
    def sampled(seed):
        answer = client.completions.create(model=MODEL, prompt="w5 w6", temperature=1.0, top_p=0.95, seed=seed,
                                           n=2, max_tokens=BUFFER)
        return [choice.text for choice in answer.choices]

    first = sampled(1234)
    assert sampled(1234) == first
    assert any(sampled(seed) != first for seed in (1, 2, 3))  # the seed is honoured, not ignored


def test_seed_pair_mapping():
    assert seed_pair(0, 0) == (0, 0)
    assert seed_pair(5, 1) == (0, 6)
    assert seed_pair(-1, 0) == (-1, -1)
    assert seed_pair(2**32 + 7, 0) == (1, 7)


def test_stop_cuts_the_text_before_the_stop_string(client, tiny_model, tokenizer):
    prompt = tokenizer.encode("w60 w61 w62")
    expected = greedy_tokens(tiny_model, prompt, BUFFER)
    words = tokenizer.decode(expected, skip_special_tokens=True).split()
    if len(words) < 3:
        pytest.fail(f"the tiny model's greedy answer is too short for this test: {words}")
    stop = words[2]
    cut = words.index(stop)
    answer = client.completions.create(model=MODEL, prompt="w60 w61 w62", temperature=0, stop=[stop, "w999"])
    (choice,) = answer.choices
    assert choice.text == " ".join(words[:cut]) + " "
    assert choice.finish_reason == "stop"
    assert answer.usage.completion_tokens == cut + 1
    streamed = client.completions.create(model=MODEL, prompt="w60 w61 w62", temperature=0, stop=stop, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == choice.text


@pytest.mark.parametrize("options, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"max_tokens": BUFFER + 1}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"n": 0}, "n"),
    ({"extra_body": {"best_guess": 1}}, "best_guess"),
    ({"messages": [{"role": "tool", "content": "w5"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "w5 " * 40}]}, "messages"),  # longer than a slot
    ({"stop": ["w5"] * 5}, "stop"),
])
def test_what_is_not_honoured_is_a_400_naming_the_field(client, options, param):
    request = {"model": MODEL, "messages": MESSAGES, **options}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**request)
    assert raised.value.status_code == 400
    assert raised.value.body["param"] == param and param in raised.value.body["message"]


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-4o", prompt="w5")
    assert raised.value.body["code"] == "model_not_found" and raised.value.body["param"] == "model"


def test_ignored_fields_are_only_those_openai_ignores(client):
    answer = client.completions.create(model=MODEL, prompt="w5", temperature=0, max_tokens=2, user="someone",
                                       presence_penalty=0, logprobs=None)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_the_curl_example_in_the_docs_runs(server):
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "serving.md"), encoding="utf-8").read()
    section = docs[docs.index("### OpenAI-compatible API"):]
    command = re.search(r"```bash\n(curl .*?)```", section, re.S).group(1)
    host, port = server.server_address[:2]
    command = command.replace("localhost:8501", f"{host}:{port}").replace('"model": "gpt2"', f'"model": "{MODEL}"')
    if shutil.which("curl") is None:
        pytest.fail("curl is needed to run the docs' example")
    answer = json.loads(subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                                       timeout=120).stdout)
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1
