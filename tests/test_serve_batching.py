"""Continuous batching in `tfgen serve`: the slot signatures of an export, the scheduler, and the server answering
through them — every row's tokens equal a lone `generate()` call's, whoever shares the batch; streaming over
server-sent events; a client that hangs up frees its slot; a full queue answers 503.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from test_export import bpe_tokenizer

from tfgen.engine.scheduler import EngineFull, Row, SlotEngine
from tfgen.engine.slot_state import SlotState
from tfgen.export import export_saved_model
from tfgen.serving import ModelServer, load_export, start_in_thread
from tfgen.serving.batching import engine_signatures
from tfgen.serving.served_model import warm_up_version

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 10
SLOT_LENGTH = 32
SLOTS = 4
MODEL = "batched"
# Prompts of different widths (some left padded, as a client sends a batch), budgets and sampling knobs.
PROMPTS = [[5, 6, 7], [0, 0, 3, 4, 5, 6, 7], [9, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19], [40], [7, 7, 7, 7]]


def row_request(index: int) -> tuple[str, dict]:
    """(signature, columnar inputs) of the index-th single-row request: greedy and sampling alternate."""
    prompt = PROMPTS[index % len(PROMPTS)]
    ids = [prompt]
    mask = [[int(token != 0) for token in prompt]]
    budget = [3 + index % (MAX_NEW_TOKENS - 2)]
    if index % 2 == 0:
        return "greedy", {"input_ids": ids, "attention_mask": mask, "max_new_tokens": budget}
    return "sample", {"input_ids": ids, "attention_mask": mask, "max_new_tokens": budget,
                      "seed": [[index, 7 * index + 1]], "temperature": [0.6 + 0.1 * (index % 5)],
                      "top_k": [[0, 5, 20][index % 3]], "top_p": [[1.0, 0.9][index % 2]]}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model):
    config = tiny_model.generation_config.copy()
    config.update(do_sample=True, top_k=8, temperature=0.9)
    root = tmp_path_factory.mktemp("batched") / MODEL
    export_saved_model(tiny_model, root, config, max_new_tokens=MAX_NEW_TOKENS, tokenizer=bpe_tokenizer(),
                       signatures=["serving_default", "greedy", "sample", "generate_text"], slots=SLOTS,
                       slot_length=SLOT_LENGTH)
    return str(root)


@pytest.fixture(scope="module")
def served(export_dir):
    # No warm-up replay: the tests compile what they use (the whole-call references use other shapes anyway).
    model = load_export(export_dir, warmup=False, batching={"steps_per_call": 3})
    yield model
    model.close()


def test_the_warm_up_compiles_the_engine_and_skips_the_records_it_decodes(served, caplog):
    """A warm-up record of a signature the engine decodes (one short row, which fits a slot) would compile a whole-call
    program that no request runs: such records are skipped, the engine's programs are warmed instead."""
    assert engine_signatures(served) == {"serving_default", "greedy", "sample", "generate_text"}
    with caplog.at_level(logging.INFO, logger="tfgen"):
        warm_up_version(served)
    assert "warm-up: 0 requests" in caplog.text
    assert "skipped 4 of generate_text, greedy, sample, serving_default" in caplog.text
    assert "continuous batching: warm-up" in caplog.text


@pytest.fixture(scope="module")
def server(served):
    http_server = ModelServer(served, port=0)
    start_in_thread(http_server)
    yield http_server
    http_server.shutdown()
    http_server.server_close()


def post(server, path: str, body: dict) -> tuple[int, dict, dict]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    try:
        connection.request("POST", f"/v1/models/{MODEL}{path}", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def whole_call(served, signature: str, inputs: dict) -> dict:
    """The signature run as one call, bypassing the engine (the reference)."""
    outputs = served.signatures[signature](**{name: tf.constant(value) for name, value in inputs.items()})
    return {name: value.numpy().tolist() for name, value in outputs.items()}


def test_export_has_slot_signatures_for_a_driver_outside_tfgen(export_dir, served, tiny_model):
    """The contract of docs/serving.md, driven from the loaded SavedModel alone: init, insert two rows into
    chosen slots, step until done; each row holds what generate() gives it alone."""
    signatures = served.signatures
    assert {"slot_init", "slot_insert", "slot_steps"} <= set(signatures)
    info = json.load(open(f"{served.directory}/assets.extra/tfgen_export.json"))["slots"]
    assert info["slots"] == SLOTS and info["length"] == SLOT_LENGTH and info["max_new_tokens"] == MAX_NEW_TOKENS
    assert info["row_buckets"] == [1, 2, 4] and {"slot_steps_1", "slot_steps_2"} <= set(signatures)
    state = signatures["slot_init"]()
    assert state["tokens"].shape == [SLOTS, SLOT_LENGTH] and bool(tf.reduce_all(state["finished"]))
    ids = np.array([[11, 12, 13, 14], [0, 0, 20, 21]], np.int32)
    mask = (ids != 0).astype(np.int32)
    state = signatures["slot_insert"](
        **state, new_input_ids=ids, new_attention_mask=mask, new_width=np.array([4, 4], np.int32),
        new_slot=np.array([3, 1], np.int32), new_max_new_tokens=np.array([MAX_NEW_TOKENS, 6], np.int32),
        new_seed=np.array([[0, 0], [3, 4]], np.int32), new_do_sample=np.array([False, True]),
        new_temperature=np.array([1.0, 0.8], np.float32), new_top_k=np.array([0, 10], np.int32),
        new_top_p=np.array([1.0, 0.95], np.float32))
    while not bool(tf.reduce_all(state["finished"])):
        state = signatures["slot_steps"](**state, max_steps=tf.constant(4), release=tf.zeros([SLOTS], tf.bool),
                                         record_logprobs=tf.ones([SLOTS], tf.bool))
    greedy = tiny_model.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 eos_token_id=tiny_model.generation_config.eos_token_id).numpy()[0]
    sampled = tiny_model.generate(ids[1:], attention_mask=mask[1:], max_new_tokens=6, do_sample=True, seed=[[3, 4]],
                                  temperature=0.8, top_k=10, top_p=0.95).numpy()[0]
    for slot, expected in ((3, greedy), (1, sampled)):
        length = int(state["length"][slot])
        np.testing.assert_array_equal(state["tokens"][slot, :length].numpy(), expected[:length])
        assert length == 4 + int(state["generated"][slot])


def test_interleaved_concurrent_requests_equal_lone_calls(server, served):
    """The load test: 32 single-row requests from 16 concurrent clients (greedy and sampling, different widths,
    budgets and knobs) answer what each request's signature answers alone, token for token."""
    engine = served.engine
    before = dict(engine.counts)
    requests = [row_request(index) for index in range(32)]

    def ask(index):
        signature, inputs = requests[index]
        return post(server, ":predict", {"signature_name": signature, "inputs": inputs})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(32)))
    for (signature, inputs), (status, _, body) in zip(requests, answers):
        assert status == 200, body
        assert body["outputs"] == whole_call(served, signature, inputs)
    # They were batched: fewer steps calls than rows times their tokens, every row admitted through the engine.
    assert engine.counts["rows"] - before["rows"] == 32
    assert engine.busy_slots == 0 and engine.queued == 0


def test_multi_row_predict_and_text_match_the_signatures(server, served):
    ids = [[0, 5, 6, 7], [3, 4, 5, 6], [0, 0, 9, 8]]
    inputs = {"input_ids": ids, "attention_mask": [[int(t != 0) for t in row] for row in ids],
              "seed": [[1, 2], [3, 4], [5, 6]], "temperature": [0.7, 1.0, 1.5], "top_k": [5, 0, 1],
              "top_p": [0.9, 1.0, 1.0], "max_new_tokens": [MAX_NEW_TOKENS, 5, 0]}
    status, _, body = post(server, ":predict", {"signature_name": "sample", "inputs": inputs})
    assert status == 200 and body["outputs"] == whole_call(served, "sample", inputs)
    default = {name: inputs[name] for name in ("input_ids", "attention_mask")}
    status, _, body = post(server, ":predict", {"inputs": default})
    assert status == 200 and body["outputs"] == whole_call(served, "serving_default", default)
    texts = ["the quick brown", "lazy dog"]
    status, _, body = post(server, ":generate", {"text": texts})
    expected = [text.decode() for text in whole_call(served, "generate_text", {"text": texts})["text"]]
    assert status == 200 and body == {"text": expected}


def read_events(response) -> list[dict]:
    """Server-sent events of a response, until the stream ends: [{"event": ..., "data": {...}}]."""
    events, kind = [], "message"
    for raw in response:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            events.append({"event": kind, "data": json.loads(line[len("data: "):])})
            kind = "message"
    return events


def test_streaming_sends_the_text_in_pieces(server, served):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    connection.request("POST", f"/v1/models/{MODEL}:generate", json.dumps({"text": "over the fox", "stream": True}))
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    events = read_events(response)
    connection.close()
    pieces = [event["data"]["text"] for event in events if "text" in event["data"]]
    assert events[-1]["data"] == {"done": True} and len(pieces) >= 2
    expected = whole_call(served, "generate_text", {"text": ["over the fox"]})["text"][0].decode()
    assert "".join(pieces) == expected
    status, _, body = post(server, ":generate", {"text": "over the fox", "stream": False})
    assert status == 200 and body == {"text": expected}
    for bad in ({"text": ["a", "b"], "stream": True}, {"text": "a", "stream": "yes"}, {"text": "", "stream": True}):
        status, _, body = post(server, ":generate", bad)
        assert status == 400 and "stream" in body["error"] or "text" in body["error"]


class _GatedPrograms:
    """Slot programs whose every call waits for the test to open a gate (to hold the engine busy), writing no
    tokens (the buffer stays pad): rows end when their budget of steps is spent."""

    slots, length, budget_cap, row_buckets = 2, 128, 100, [1, 2]

    def __init__(self):
        self.gate = threading.Event()

    def init(self):
        zeros = np.zeros(2, np.int32)
        return SlotState(tokens=np.zeros([2, 128], np.int32), mask=np.zeros([2, 128], np.int32), width=zeros,
                         length=zeros, position=zeros, generated=zeros, budget=zeros, finished=np.ones(2, bool),
                         seed=np.zeros([2, 2], np.int32), do_sample=np.zeros(2, bool), knobs={}, cache=())

    def insert(self, state, rows):
        self.gate.wait()
        generated, finished, budgets = state.generated.copy(), state.finished.copy(), state.budget.copy()
        for slot, budget in zip(rows["slot"], rows["max_new_tokens"]):
            generated[slot], finished[slot], budgets[slot] = 0, budget <= 0, budget
        return state._replace(generated=generated, finished=finished, budget=budgets)

    def steps(self, state, max_steps, release, rows):
        self.gate.wait()
        assert not (~state.finished[rows:]).any(), "a running slot outside the row bucket"
        finished = state.finished | release
        generated = np.minimum(state.generated + ~finished * max_steps, state.budget)
        return state._replace(generated=generated, finished=finished | (generated >= state.budget))


def test_a_full_queue_refuses_and_a_cancelled_row_frees_its_slot():
    programs = _GatedPrograms()
    engine = SlotEngine(programs, steps_per_call=1, max_queue=2)
    rows = [Row(np.ones([1], np.int32), np.ones([1], np.int32), max_new_tokens=50) for _ in range(4)]
    engine.submit(rows[:2])  # the thread takes them into the two slots (and waits at the gate)
    deadline = time.monotonic() + 10
    while engine.queued and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.submit(rows[2:4])  # two more wait: the queue is full
    with pytest.raises(EngineFull, match="limit is 2"):
        engine.submit([Row(np.ones([1], np.int32), np.ones([1], np.int32), max_new_tokens=1)])
    engine.cancel(rows[0])
    engine.cancel(rows[3])  # still queued: it leaves the queue at once
    assert rows[3].done.is_set() and engine.queued == 1
    programs.gate.set()
    for row in rows[1:3]:
        assert row.wait(10) == [0] * 50  # the gated programs leave pad; each row ends on its budget
    assert rows[0].done.is_set() and rows[0].error is not None
    assert engine.busy_slots == 0
    engine.close()


def test_a_client_that_hangs_up_mid_stream_frees_its_slot(server, served, monkeypatch):
    engine = served.engine
    steps, cancelled = engine.programs.steps, []

    def slow_steps(*args):  # a row of 10 tokens now takes about a second: time to hang up mid-way
        time.sleep(0.25)
        return steps(*args)

    def spy_cancel(row):
        cancelled.append((row, len(row.tokens), row.done.is_set()))
        return real_cancel(row)

    real_cancel = engine.cancel
    monkeypatch.setattr(engine.programs, "steps", slow_steps)
    monkeypatch.setattr(engine, "cancel", spy_cancel)
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    connection.request("POST", f"/v1/models/{MODEL}:generate", json.dumps({"text": "the lazy", "stream": True}))
    response = connection.getresponse()
    assert response.status == 200
    response.fp.readline()  # the first event's first line: the row is decoding
    connection.sock.close()
    connection.close()
    deadline = time.monotonic() + 30
    while (not cancelled or engine.busy_slots) and time.monotonic() < deadline:
        time.sleep(0.05)
    (row, tokens, was_done), = cancelled
    assert not was_done and tokens < MAX_NEW_TOKENS  # cut short, not finished
    assert engine.busy_slots == 0 and isinstance(row.error, Exception)
    # The server keeps serving, through the engine.
    monkeypatch.undo()
    signature, inputs = row_request(0)
    status, _, body = post(server, ":predict", {"signature_name": signature, "inputs": inputs})
    assert status == 200 and body["outputs"] == whole_call(served, signature, inputs)


def test_slots_apply_the_prompt_penalty_of_the_export_config(tmp_path, tiny_model):
    """An export whose config sets `encoder_repetition_penalty` (HF: over a decoder-only model's prompt): its slot
    programs read each row's prompt as sent, so a slot decodes what generate() does."""
    config = tiny_model.generation_config.copy()
    config.update(do_sample=False, encoder_repetition_penalty=3.0)
    root = tmp_path / "penalised"
    export_saved_model(tiny_model, root, config, max_new_tokens=MAX_NEW_TOKENS, signatures=["greedy"], slots=2,
                       slot_length=SLOT_LENGTH)
    signatures = tf.saved_model.load(str(next(root.iterdir()))).signatures
    ids = np.array([[0, 0, 20, 21, 20, 22]], np.int32)
    mask = (ids != 0).astype(np.int32)
    state = signatures["slot_insert"](
        **signatures["slot_init"](), new_input_ids=ids, new_attention_mask=mask, new_width=np.array([6], np.int32),
        new_slot=np.array([1], np.int32), new_max_new_tokens=np.array([MAX_NEW_TOKENS], np.int32),
        new_seed=np.zeros([1, 2], np.int32), new_do_sample=np.array([False]),
        new_temperature=np.array([1.0], np.float32), new_top_k=np.array([0], np.int32),
        new_top_p=np.array([1.0], np.float32))
    while not bool(tf.reduce_all(state["finished"])):
        state = signatures["slot_steps"](**state, max_steps=tf.constant(4), release=tf.zeros([2], tf.bool),
                                         record_logprobs=tf.zeros([2], tf.bool))
    eos = tiny_model.generation_config.eos_token_id
    expected = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                   eos_token_id=eos, encoder_repetition_penalty=3.0).numpy()[0]
    plain = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                eos_token_id=eos).numpy()[0]
    assert (expected != plain).any()  # the penalty changes the tokens
    length = int(state["length"][1])
    np.testing.assert_array_equal(state["tokens"][1, :length].numpy(), expected[:length])
