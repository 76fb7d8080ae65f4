"""Streaming from the compiled loop: chunked generation hands over exactly the tokens of a single call."""

from __future__ import annotations

import io
import logging
import threading

import numpy as np
import pytest
from conftest import left_padded_batch, word_level_tokenizer

from tfgen.generation.streaming import BaseStreamer, TextIteratorStreamer, TextStreamer, TokenCallbackStreamer

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90], [7, 7, 21, 64, 15]]


@pytest.fixture(scope="module")
def word_tokenizer():
    return word_level_tokenizer()


class RecordingStreamer(BaseStreamer):
    def __init__(self, chunk_steps):
        self.chunk_steps = chunk_steps
        self.puts = []
        self.ended = 0

    def put(self, token_ids):
        self.puts.append(np.array(token_ids))

    def end(self):
        self.ended += 1


@pytest.mark.parametrize(
    "options",
    [
        dict(do_sample=False),
        dict(do_sample=True, seed=[3, 1], top_k=0, temperature=1.3),
        dict(do_sample=False, penalty_alpha=0.6, top_k=4),
    ],
    ids=["greedy", "seeded_sampling", "contrastive"],
)
def test_streamed_tokens_equal_a_single_call(tiny_model, options):
    ids, mask = left_padded_batch(PROMPTS)
    common = dict(attention_mask=mask, max_new_tokens=11, eos_token_id=None, **options)
    expected = tiny_model.generate(ids, **common).numpy()
    streamer = RecordingStreamer(chunk_steps=3)
    streamed = tiny_model.generate(ids, streamer=streamer, **common).numpy()
    np.testing.assert_array_equal(streamed, expected)
    np.testing.assert_array_equal(streamer.puts[0], ids)
    steps = np.concatenate(streamer.puts[1:], axis=1)
    np.testing.assert_array_equal(steps, expected[:, ids.shape[1] :])
    assert streamer.ended == 1 and all(put.shape == (3, 1) for put in streamer.puts[1:])


def test_streaming_stops_when_rows_finish_and_does_not_recompile(tiny_model):
    ids, mask = left_padded_batch(PROMPTS)
    free = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=11, eos_token_id=None).numpy()
    # Every row stops on its own first new token: the loop must end after one step.
    first_tokens = sorted(set(free[:, ids.shape[1]].tolist()))
    expected = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=11, eos_token_id=first_tokens).numpy()
    seen = []
    streamed = tiny_model.generate(
        ids, attention_mask=mask, max_new_tokens=11, eos_token_id=first_tokens, streamer=seen.append
    ).numpy()
    np.testing.assert_array_equal(streamed, expected)
    assert len(seen) == 1
    # Both streaming programs (start, chunk) exist after one full run; other budgets and eos ids reuse them.
    tiny_model.generate(ids, attention_mask=mask, max_new_tokens=11, eos_token_id=None, streamer=seen.append)
    traces = tiny_model.generate_trace_count
    tiny_model.generate(ids, attention_mask=mask, max_new_tokens=9, eos_token_id=[5, 6], streamer=seen.append)
    assert tiny_model.generate_trace_count == traces


def test_token_callback_gets_one_call_per_step(tiny_model):
    calls = []
    out = tiny_model.generate(
        np.array([PROMPTS[0]]), max_new_tokens=6, eos_token_id=None, streamer=TokenCallbackStreamer(calls.append, 2)
    ).numpy()
    assert [int(c[0]) for c in calls] == out[0, len(PROMPTS[0]) :].tolist()


def test_text_streamer_prints_the_decoded_text(tiny_model, word_tokenizer):
    prompt = word_tokenizer("w5 w17 w33", return_tensors="np")
    expected = tiny_model.generate(prompt["input_ids"], max_new_tokens=10, eos_token_id=None).numpy()
    printed = io.StringIO()
    streamer = TextStreamer(word_tokenizer, stream=printed, chunk_steps=4)
    tiny_model.generate(prompt["input_ids"], max_new_tokens=10, eos_token_id=None, streamer=streamer)
    assert printed.getvalue() == word_tokenizer.decode(expected[0], skip_special_tokens=True) + "\n"


def test_text_iterator_streamer_in_a_thread(tiny_model, word_tokenizer):
    prompt = word_tokenizer("w44 w3 w90", return_tensors="np")
    options = dict(max_new_tokens=10, eos_token_id=None, do_sample=True, seed=[8, 8])
    expected = tiny_model.generate(prompt["input_ids"], **options).numpy()
    streamer = TextIteratorStreamer(word_tokenizer, skip_prompt=True, timeout=120)
    worker = threading.Thread(target=tiny_model.generate, args=(prompt["input_ids"],),
                              kwargs={**options, "streamer": streamer})
    worker.start()
    pieces = list(streamer)
    worker.join()
    assert len(pieces) >= 2
    assert "".join(pieces) == word_tokenizer.decode(expected[0, 3:], skip_special_tokens=True)


def test_first_call_announces_compilation_later_calls_are_quiet(tiny_model, caplog):
    ids = np.array([[5, 6, 7, 8, 9]])
    with caplog.at_level(logging.INFO, logger="tfgen"):
        # An n-gram size no other test uses makes this a new program.
        tiny_model.generate(ids, max_new_tokens=4, no_repeat_ngram_size=7)
        first = caplog.text
        # The figures asked for, with the buckets compiled for beside them.
        assert "compiling generate for batch 1, prompt length 5 (bucket 16), 4 new tokens (bucket 16) ..." in first
        assert "compiled generate in" in first
        caplog.clear()
        tiny_model.generate(ids, max_new_tokens=4, no_repeat_ngram_size=7)
        assert "compiling" not in caplog.text


def test_streamer_rejections(tiny_model, word_tokenizer):
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(TypeError, match="streamer"):
        tiny_model.generate(ids, max_new_tokens=2, streamer=42)
    with pytest.raises(ValueError, match="batch size 1"):
        tiny_model.generate(ids, max_new_tokens=2, streamer=TextStreamer(word_tokenizer, stream=io.StringIO()))
    traces = tiny_model.generate_trace_count
    with pytest.raises(ValueError, match="streamer: beam_search .* cannot stream"):
        tiny_model.generate(ids, max_new_tokens=2, num_beams=2, streamer=lambda tokens: None)
    assert tiny_model.generate_trace_count == traces
