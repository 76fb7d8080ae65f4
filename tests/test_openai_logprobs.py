"""OpenAI's `logprobs` / `top_logprobs` on `tfgen serve`'s routes, driven by the official `openai` client: each
chosen token's log-probability is the raw one (log-softmax of the model's logits at its position, before
temperature and the warpers, vLLM's default), the alternatives come most likely first, streaming gives the same
values, completions answer in the legacy format, and what cannot be answered is a 400 naming the field — an
export made before the slot state recorded log-probabilities included.
"""

from __future__ import annotations

import concurrent.futures
import json
import os

import numpy as np
import openai
import pytest
import tensorflow as tf
from conftest import CHAT_TEMPLATE, word_level_tokenizer

from tfgen.cli import main
from tfgen.serving import ModelServer, load_export, start_in_thread

MODEL = "tiny-chat"
BUFFER = 8
MESSAGES = [{"role": "user", "content": "w30 w31 w32"}]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    chat_tokenizer = word_level_tokenizer()
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    return chat_tokenizer


def export(chat_model_dir, root, *flags) -> str:
    assert main(["export", str(root), "--model", str(chat_model_dir), "--max-new-tokens", str(BUFFER), "--no-text",
                 "--signatures", "greedy", "--slots", "2", "--slot-length", "32", *flags]) in (0, None)
    return str(root)


def serve(export_dir):
    served = load_export(export_dir, warmup=False, batching={"steps_per_call": 2})
    http_server = ModelServer(served, port=0)
    start_in_thread(http_server)
    return served, http_server


@pytest.fixture(scope="module")
def export_dir(chat_model_dir, tmp_path_factory):
    return export(chat_model_dir, tmp_path_factory.mktemp("logprobs") / MODEL, "--slot-logprobs", "20")


@pytest.fixture(scope="module")
def client(export_dir):
    served, http_server = serve(export_dir)
    yield openai.OpenAI(base_url=http_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    http_server.shutdown()
    http_server.server_close()
    served.close()


def raw_logprobs(model, prompt: list, tokens: list) -> np.ndarray:
    """float64 `[len(tokens), V]`: log-softmax of the in-process model's logits at each new token's position."""
    logits = model(np.array([prompt + tokens], np.int32)).logits[0, len(prompt) - 1:-1]
    return tf.nn.log_softmax(tf.cast(logits, tf.float64)).numpy()


def ids_of(tokenizer, texts: list) -> list:
    return [tokenizer.token_to_id(text) for text in texts]


def check_chat_content(content, expected: np.ndarray, tokenizer, top: int, greedy: bool) -> None:
    for entry, reference in zip(content, expected):
        token = tokenizer.token_to_id(entry.token)
        assert abs(entry.logprob - reference[token]) < TOLERANCE
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == top
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, np.sort(reference)[::-1][:top], atol=TOLERANCE)
        for alternative in entry.top_logprobs:
            assert abs(alternative.logprob - reference[tokenizer.token_to_id(alternative.token)]) < TOLERANCE
        if greedy:
            assert entry.top_logprobs[0].token == entry.token


def test_greedy_chat_logprobs_equal_the_model_and_streaming_gives_the_same(client, tiny_model, tokenizer):
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=6,
                                            logprobs=True, top_logprobs=5)
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens >= 1
    tokens = ids_of(tokenizer, [entry.token for entry in content])
    check_chat_content(content, raw_logprobs(tiny_model, prompt, tokens), tokenizer, 5, greedy=True)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=6,
                                                 logprobs=True, top_logprobs=5, stream=True))
    streamed = [entry for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs.content]
    assert [entry.model_dump() for entry in streamed] == [entry.model_dump() for entry in content]


def test_steps_record_logprobs_only_when_a_running_slot_wants_them(export_dir):
    """`record_logprobs`: a call where no running slot wants log-probabilities skips their top-K and leaves the
    state's entries as they were; one slot wanting them has its entries written."""
    signatures = tf.saved_model.load(os.path.join(export_dir, "1")).signatures
    ids = np.array([[5, 6, 7], [8, 9, 10]], np.int32)
    state = signatures["slot_insert"](
        **signatures["slot_init"](), new_input_ids=ids, new_attention_mask=np.ones_like(ids),
        new_width=np.array([3, 3], np.int32), new_slot=np.array([0, 1], np.int32),
        new_max_new_tokens=np.array([BUFFER, BUFFER], np.int32), new_seed=np.zeros([2, 2], np.int32),
        new_do_sample=np.array([False, False]), new_temperature=np.ones([2], np.float32),
        new_top_k=np.zeros([2], np.int32), new_top_p=np.ones([2], np.float32))
    before = {name: state[name].numpy() for name in state if name.startswith("logprobs_")}
    assert set(before) == {"logprobs_chosen", "logprobs_top_ids", "logprobs_top"}
    assert (before["logprobs_chosen"][:, 3] != 0).all()  # the first new token's, chosen at insert

    def step(state, wanted):
        return signatures["slot_steps"](**state, max_steps=tf.constant(1), release=tf.zeros([2], tf.bool),
                                        record_logprobs=tf.constant(wanted))

    skipped = step(state, [False, False])
    assert int(skipped["length"][0]) == 5  # it decoded: the token at column 4 was chosen
    for name, value in before.items():
        np.testing.assert_array_equal(skipped[name].numpy(), value)
    recorded = step(skipped, [True, False])
    assert recorded["logprobs_chosen"].numpy()[0, 5] != 0
    np.testing.assert_array_equal(recorded["logprobs_chosen"].numpy()[:, :5], before["logprobs_chosen"][:, :5])


def test_a_request_with_logprobs_beside_requests_without(client, tiny_model, tokenizer):
    """Rows that want no log-probabilities share the engine's calls with one that does: its values stay exact."""
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        plain = [pool.submit(client.chat.completions.create, model=MODEL, messages=MESSAGES, temperature=0.9,
                             seed=seed, max_tokens=BUFFER) for seed in (1, 2)]
        asking = pool.submit(client.chat.completions.create, model=MODEL, messages=MESSAGES, temperature=0,
                             max_tokens=6, logprobs=True, top_logprobs=3)
        answers = [future.result() for future in plain]
        content = asking.result().choices[0].logprobs.content
    assert all(answer.choices[0].logprobs is None for answer in answers)
    tokens = ids_of(tokenizer, [entry.token for entry in content])
    check_chat_content(content, raw_logprobs(tiny_model, prompt, tokens), tokenizer, 3, greedy=True)


def test_sampled_tokens_get_the_raw_logprobs_before_temperature(client, tiny_model, tokenizer):
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.7, top_p=0.9, seed=7,
                                            max_tokens=BUFFER, logprobs=True)
    content = answer.choices[0].logprobs.content
    tokens = ids_of(tokenizer, [entry.token for entry in content])
    check_chat_content(content, raw_logprobs(tiny_model, prompt, tokens), tokenizer, 0, greedy=False)


def test_completions_answer_the_legacy_object(client, tiny_model, tokenizer):
    prompt = tokenizer.encode("w5 w6 w7")
    answer = client.completions.create(model=MODEL, prompt="w5 w6 w7", temperature=0, max_tokens=5, logprobs=3)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == answer.usage.completion_tokens
    expected = raw_logprobs(tiny_model, prompt, ids_of(tokenizer, logprobs.tokens))
    offset = 0
    for token, logprob, top, text_offset, reference in zip(logprobs.tokens, logprobs.token_logprobs,
                                                           logprobs.top_logprobs, logprobs.text_offset, expected):
        assert abs(logprob - reference[tokenizer.token_to_id(token)]) < TOLERANCE
        assert len(top) == 3 and next(iter(top)) == token  # greedy: the chosen token is the most likely
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert text_offset == offset
        offset += len(token)
    streamed = list(client.completions.create(model=MODEL, prompt="w5 w6 w7", temperature=0, max_tokens=5,
                                              logprobs=3, stream=True))
    pieces = [chunk.choices[0].logprobs for chunk in streamed if chunk.choices[0].logprobs]
    assert sum((piece.tokens for piece in pieces), []) == logprobs.tokens
    assert sum((piece.token_logprobs for piece in pieces), []) == logprobs.token_logprobs
    assert sum((piece.text_offset for piece in pieces), []) == logprobs.text_offset


def test_a_row_cut_at_a_stop_string_has_its_logprobs_cut_too(client, tokenizer):
    whole = client.completions.create(model=MODEL, prompt="w60 w61 w62", temperature=0, max_tokens=BUFFER)
    words = whole.choices[0].text.split()
    if len(words) < 3:
        pytest.fail(f"the tiny model's greedy answer is too short for this test: {words}")
    cut = words.index(words[2])
    for stream in (False, True):
        answer = client.completions.create(model=MODEL, prompt="w60 w61 w62", temperature=0, stop=words[2],
                                           logprobs=1, stream=stream)
        choices = [chunk.choices[0] for chunk in answer] if stream else answer.choices
        tokens = sum((choice.logprobs.tokens for choice in choices if choice.logprobs), [])
        assert tokens == words[:cut] + [words[2]]  # the tokens the row generated up to its stop string


def test_the_limits_themselves_are_answered(client):
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, logprobs=True,
                                            top_logprobs=20)
    assert all(len(entry.top_logprobs) == 20 for entry in answer.choices[0].logprobs.content)
    answer = client.completions.create(model=MODEL, prompt="w5", max_tokens=2, logprobs=5)
    assert all(len(top) == 5 for top in answer.choices[0].logprobs.top_logprobs)


@pytest.mark.parametrize("route, options, param, words", [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "in [0, 20]"),
    ("chat", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ("chat", {"logprobs": 1}, "logprobs", "true or false"),
    ("text", {"logprobs": 6}, "logprobs", "in [0, 5]"),
    ("chat", {"logprobs": True, "response_format": {"type": "json_object"}}, "logprobs", "response_format"),
])
def test_logprobs_out_of_range_are_a_400_naming_the_field(client, route, options, param, words):
    with pytest.raises(openai.BadRequestError) as raised:
        if route == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=options)
        else:
            client.completions.create(model=MODEL, prompt="w5", extra_body=options)
    assert raised.value.body["param"] == param and words in raised.value.body["message"]


def test_an_export_without_logprobs_refuses_them_and_serves_the_rest(chat_model_dir, tmp_path_factory):
    # An export made before the slot state had log-probabilities: no `logprobs_*` state entries, no K in its info.
    root = export(chat_model_dir, tmp_path_factory.mktemp("old") / MODEL, "--slot-logprobs", "0")
    info_path = os.path.join(root, "1", "assets.extra", "tfgen_export.json")
    with open(info_path, encoding="utf-8") as file:
        info = json.load(file)
    del info["slots"]["top_logprobs"]
    with open(info_path, "w", encoding="utf-8") as file:
        json.dump(info, file)
    served, http_server = serve(root)
    try:
        inputs = served.signatures["slot_steps"].structured_input_signature[1]
        assert not any(name.startswith("logprobs_") for name in inputs) and "tokens" in inputs
        old = openai.OpenAI(base_url=http_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as raised:
            old.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True)
        assert raised.value.body["param"] == "logprobs"
        assert "export the model again" in raised.value.body["message"]
        answer = old.completions.create(model=MODEL, prompt="w5 w6", temperature=0, max_tokens=3)
        assert answer.choices[0].logprobs is None and answer.usage.completion_tokens >= 1
    finally:
        http_server.shutdown()
        http_server.server_close()
        served.close()
